"""fedarena.privacy."""
