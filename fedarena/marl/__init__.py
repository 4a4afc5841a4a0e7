"""fedarena.marl."""
