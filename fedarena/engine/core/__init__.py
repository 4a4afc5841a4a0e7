"""core: the IR, the interpreter, tracing and the registry, pytrees, BLAS threads, the C extension loader."""
