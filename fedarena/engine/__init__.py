"""fedarena.engine."""
