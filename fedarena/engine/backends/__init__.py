"""backends: one package per execution target."""
