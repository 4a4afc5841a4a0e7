"""backends.numpy: the numpy executor (generated code over preallocated buffers)."""
