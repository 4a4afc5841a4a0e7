"""compiler: graph passes, elementwise fusion, memory planning, native-kernel selection."""
