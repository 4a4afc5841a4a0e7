"""Platform layer: typed configs, the ``fedarena`` CLI, run folders, the experiment registry, Ray access.

It imports nothing from the higher layers of fedarena at import time; experiment kinds are found
through :mod:`fedarena.platform.registry` by lazy import.
"""
