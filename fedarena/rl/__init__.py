"""fedarena.rl."""
