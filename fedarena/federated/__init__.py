"""fedarena.federated."""
