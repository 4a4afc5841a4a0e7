"""The numpy backend's whole-graph native executable: one generated C function per compiled
signature (:mod:`fedarena.engine.compiler.codegen_c`), built with the system C compiler and cached
on disk (:mod:`fedarena.engine.compiler.cbuild`).

:func:`native_executable` returns a :class:`NativeExecutable` when every equation of the graph
lowers to C and a compiler is there, else ``None`` (the caller keeps the per-equation
:class:`~.executor.Executable`).  It is the default for the numpy backend; ``FEDARENA_NATIVE_GRAPH=0``
turns it off.  Without a working C compiler the engine warns once and uses the per-equation
executor.  The native function takes only C-contiguous arrays of the compiled dtypes (numpy
scalars and Python numbers for 0-d inputs); any other call (a non-contiguous view, a subclass
refusing the buffer) runs the per-equation executor of the same graph, built on first need.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ...compiler import cbuild, codegen_c
from ...core.ir import Graph
from .executor import Executable

_WARNED = False


def enabled() -> bool:
    """Whether jit tries the whole-graph native path (``FEDARENA_NATIVE_GRAPH`` not ``0``)."""
    return os.environ.get("FEDARENA_NATIVE_GRAPH", "1") != "0"


class NativeExecutable:
    """A compiled graph run by one C function: ``exe(*flat_inputs) -> list of outputs``.

    The interface of :class:`~.executor.Executable` that jit's fast path uses: ``_pool`` holds the
    callables of free buffer sets (each with an arena of its own), ``_build()`` makes another,
    ``source`` is the generated C.  ``memory`` is ``None`` (the arena is ``arena_bytes``)."""

    native = True

    def __init__(self, graph: Graph, lowered: codegen_c.Lowered, module: Any, donated: frozenset = frozenset()):
        self.graph = graph
        self.source = lowered.source
        self.arena_bytes = lowered.arena_bytes
        self.memory = None
        self._module = module
        self._consts = lowered.consts  # the module reads their memory
        self._fallback: Executable | None = None
        self._donated = donated
        self._pool: list = [self._build()]

    def _build(self):
        run, arena = self._module.run, bytearray(self.arena_bytes)

        def call(*args):
            try:
                return run(arena, *args)
            except TypeError:
                return self._slow(*args)

        return call

    def _slow(self, *args):
        if self._fallback is None:
            self._fallback = Executable(self.graph, donated=self._donated)
        return self._fallback(*args)

    def __call__(self, *args: Any) -> list:
        pool = self._pool
        try:
            run = pool.pop()
        except IndexError:
            run = self._build()
        try:
            return run(*args)
        finally:
            pool.append(run)


def native_executable(graph: Graph, donated: frozenset = frozenset()) -> NativeExecutable | None:
    """The whole-graph native executable of ``graph`` (validated, dead code removed), or ``None``
    when an equation has no C lowering or no compiler is available (warned once per process)."""
    global _WARNED
    from ...compiler.passes import dead_code_elimination

    graph.validate()
    graph = dead_code_elimination(graph)
    try:
        lowered = codegen_c.lower(graph)
    except codegen_c.Unsupported:
        return None
    try:
        module = cbuild.build(lowered)
    except cbuild.BuildError as err:
        if not _WARNED:
            _WARNED = True
            warnings.warn(f"fedarena.engine: whole-graph native code is off ({err}); using the per-equation executor", RuntimeWarning, stacklevel=3)
        return None
    return NativeExecutable(graph, lowered, module, donated)


__all__ = ["NativeExecutable", "enabled", "native_executable"]
