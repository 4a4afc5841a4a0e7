"""The numpy backend's whole-graph native executable: one generated C function per compiled
signature (:mod:`fedarena.engine.compiler.codegen_c`), built with the system C compiler and cached
on disk (:mod:`fedarena.engine.compiler.cbuild`).

:func:`native_executable` returns a :class:`NativeExecutable` when every equation of the graph
lowers to C, a :class:`SegmentedExecutable` (native segments, per-equation executors for the
equations between them: control flow, convolutions, random numbers...) when some do, and ``None``
when none does (the caller keeps the per-equation :class:`~.executor.Executable`).  It is the default for the numpy backend; ``FEDARENA_NATIVE_GRAPH=0``
turns it off.  Without a working C compiler the engine warns once and uses the per-equation
executor.  The native function takes only C-contiguous arrays of the compiled dtypes (numpy
scalars and Python numbers for 0-d inputs); any other call (a non-contiguous view, a subclass
refusing the buffer) runs the per-equation executor of the same graph, built on first need.
"""

from __future__ import annotations

import functools
import os
import types
import warnings
from typing import Any

import numpy as np

from ...compiler import cbuild, codegen_c
from ...compiler.passes import dead_code_elimination
from ...core.ir import Graph, Var
from .executor import Executable

_WARNED = False


def enabled() -> bool:
    """Whether jit tries the whole-graph native path (``FEDARENA_NATIVE_GRAPH`` not ``0``)."""
    return os.environ.get("FEDARENA_NATIVE_GRAPH", "1") != "0"


class NativeExecutable:
    """A compiled graph run by one C function: ``exe(*flat_inputs) -> list of outputs``.

    The interface of :class:`~.executor.Executable` that jit's fast path uses: ``_pool`` holds the
    callables of free buffer sets (each with an arena of its own), ``_build()`` makes another.
    ``c_source`` is the generated C; ``source`` and the callables' globals are those of the
    per-equation executor of the same graph (built with the first buffer set), so
    ``engine.profile``'s per-line table times that schedule.  ``memory`` is that executor's
    :class:`~fedarena.engine.compiler.memory_plan.MemoryPlan` (the program ``FEDARENA_NATIVE_GRAPH=0``
    runs); the C function does not follow it: its arena holds each value apart (``arena_bytes``)."""

    native = True
    checks_signature = True
    """The C function checks each array's dtype and shape (NotImplemented when they differ), so jit's
    fast path checks only the argument structure and the exact ndarray type."""
    checks_types = True
    """It checks the exact ndarray type of arrays of rank 1 and more as well (NotImplemented), and the
    pool holds it unwrapped (jit's fast path handles its TypeError)."""
    check_finite = False  # the NaN debugger's programs are per-equation executors

    def __init__(self, graph: Graph, lowered: codegen_c.Lowered, module: Any, donated: frozenset = frozenset()):
        self.graph = graph
        self.c_source = lowered.source
        self.arena_bytes = lowered.arena_bytes
        self._module = module
        self._lowered = lowered  # its constants: the arena holds their addresses
        self._fallback: Executable | None = None
        self._donated = donated
        self._pool: list = [self._build()]

    def _build(self):
        """The C function bound to an arena of its own: NotImplemented for an array of another dtype
        or shape or not exactly an ndarray, TypeError for a strided, unaligned or byte-swapped one
        (the caller runs :meth:`_slow`); its ``__globals__`` are the executor's (see the class)."""
        run = functools.partial(self._module.run, codegen_c.new_arena(self._lowered))
        run.__globals__ = self._executor()._pool[-1].__globals__
        return run

    @property
    def memory(self):
        """The per-equation executor's memory plan of this graph (see the class)."""
        return self._executor().memory

    def _executor(self) -> Executable:
        if self._fallback is None:
            self._fallback = Executable(self.graph, donated=self._donated)
        return self._fallback

    def _with_executor_globals(self, fn):
        """``fn`` with the per-equation executor's namespace as its globals (see the class)."""
        exe = self._executor()
        return types.FunctionType(fn.__code__, exe._pool[-1].__globals__, fn.__name__, fn.__defaults__, fn.__closure__)

    @property
    def source(self) -> str:
        return self._executor().source

    def _slow(self, *args):
        """The per-equation executor, for arguments of this signature in a layout the C function does not take;
        ``NotImplemented`` when an argument has another shape or dtype (the C function checks the inputs in
        order and stops at the first layout it refuses, before it has seen a later input's shape)."""
        for a, v in zip(args, self.graph.invars):
            dt = getattr(a, "dtype", None)  # a byte-swapped array of this dtype is this signature's (a layout)
            if getattr(a, "shape", None) != v.aval.shape or dt is None or dt.newbyteorder("=") != v.aval.dtype:
                return NotImplemented
        return self._executor()(*args)

    def __call__(self, *args: Any) -> list:
        pool = self._pool
        try:
            run = pool.pop()
        except IndexError:
            run = self._build()
        try:
            out = run(*args)
        except TypeError:
            if not self.checks_types:
                raise
            out = self._slow(*args)
        finally:
            pool.append(run)
        return self._executor()(*args) if out is NotImplemented else out


MAX_ARENA_BYTES = 2 << 20
"""Largest graph (bytes of all its values) taken natively: above it the arithmetic dominates the
per-equation dispatch, and the per-equation executor's memory plan (shared buffers, in-place
updates) wins -- measured on MLP 784-512-512-10 B=128 (12 MB of values): native 0.47x the executor."""
MAX_PYTHON_RUNS = 2
"""Most per-equation runs a segmented graph may have (a label check, a loop); a graph whose
unlowered equations are spread through it (a CNN: convolutions and pooling in every layer) pays a
hop into C and copies out at each and keeps the per-equation executor (digits CNN: 0.95x)."""
MIN_SEGMENT = 3
"""Fewest equations a native segment of a partly lowered graph takes (a shorter run stays in the
per-equation executor: the hop into C and the copies out cost about what it saves)."""


class SegmentedExecutable(NativeExecutable):
    """A graph with equations that have no C lowering (control flow, convolutions, random
    numbers...): runs of lowered equations are native segments, the rest run in per-equation
    executors, in graph order; values cross between segments as arrays."""

    checks_types = False  # its pool holds Python functions that run the steps and handle TypeError

    checks_signature = False  # the per-equation segments take what they are given

    def __init__(self, graph: Graph, segments: list, donated: frozenset = frozenset()):
        # segments: [(kind, subgraph, module or None, lowered or None)]
        self.graph = graph
        self.segments = segments
        self.c_source = "\n".join(lo.source for _, _, _, lo in segments if lo is not None)
        self._fallback = None
        self._donated = donated
        ids = {v: k for k, v in enumerate(graph.invars)}
        self._plan = []
        slot = dict(ids)
        for kind, sub, module, lowered in segments:
            ins = [slot[v] for v in sub.invars]
            outs = []
            for v in sub.outvars:
                slot[v] = len(slot)
                outs.append(slot[v])
            self._plan.append((kind, sub, module, lowered, ins, outs))
        self._slots = len(slot)
        consts = dict(zip(graph.constvars, graph.consts))
        self._results = [
            ("v", slot[a]) if a in slot else ("c", np.asarray(consts[a] if a in consts else a.value, a.aval.dtype)) for a in graph.outvars
        ]
        self._pool = [self._build()]

    def _build(self):
        steps = []
        for kind, sub, module, lowered, ins, outs in self._plan:
            if kind == "native":
                run, arena = module.run, codegen_c.new_arena(lowered)
                steps.append((functools.partial(run, arena), ins, outs))
            else:
                steps.append((Executable(sub), ins, outs))
        n_slots, results, array = self._slots, self._results, np.array  # (the globals are the executor's)

        def call(*args):
            env = list(args) + [None] * (n_slots - len(args))
            try:
                for fn, ins, outs in steps:
                    got = fn(*[env[k] for k in ins])
                    for k, v in zip(outs, got):
                        env[k] = v
            except TypeError:
                return self._slow(*args)
            return [env[k] if tag == "v" else array(k) for tag, k in results]

        return self._with_executor_globals(call)


def _partition(graph: Graph) -> list:
    """Consecutive runs of equations: ``[(native?, [eqns])]``, short native runs merged into the
    per-equation ones around them."""
    runs: list = []
    for e in graph.eqns:
        ok = codegen_c.lowers(e)
        if runs and runs[-1][0] == ok:
            runs[-1][1].append(e)
        else:
            runs.append((ok, [e]))
    merged: list = []
    for ok, eqns in runs:
        ok = ok and (len(eqns) >= MIN_SEGMENT or len(runs) == 1)
        if merged and merged[-1][0] == ok:
            merged[-1][1].extend(eqns)
        else:
            merged.append((ok, list(eqns)))
    return merged


def _subgraphs(graph: Graph, runs: list) -> list:
    """Each run as a graph: its inputs are the values it reads from before it (graph inputs and
    earlier runs' outputs), its outputs those read after it or returned."""
    consts = dict(zip(graph.constvars, graph.consts))
    later: list = []
    need = {v for v in graph.outvars if isinstance(v, Var)}
    for _, eqns in reversed(runs):
        later.append(set(need))
        for e in eqns:
            need.update(a for a in e.inputs if isinstance(a, Var))
    later.reverse()
    out = []
    for (ok, eqns), after in zip(runs, later):
        made = {o for e in eqns for o in e.outputs}
        ins, cvars, seen = [], [], set()
        for e in eqns:
            for a in e.inputs:
                if isinstance(a, Var) and a not in made and a not in seen:
                    seen.add(a)
                    (cvars if a in consts else ins).append(a)
        outs = [v for e in eqns for v in e.outputs if v in after]
        out.append((ok, Graph(ins, cvars, [consts[v] for v in cvars], eqns, outs)))
    return out


def _warn_once(err: Exception) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"fedarena.engine: whole-graph native code is off ({err}); using the per-equation executor", RuntimeWarning, stacklevel=4)


def native_executable(graph: Graph, donated: frozenset = frozenset()) -> NativeExecutable | None:
    """The whole-graph native executable of ``graph`` (validated, dead code removed): one C
    function, or native segments with per-equation executors between them; ``None`` when no
    equation run lowers or no compiler is available (warned once per process)."""
    graph.validate()
    graph = dead_code_elimination(graph)
    try:
        cbuild.blas_addresses()
    except cbuild.BuildError as err:
        _warn_once(err)
        return None
    values = list(graph.invars) + [o for e in graph.eqns for o in e.outputs]
    if not all(codegen_c.has_ctype(v.aval.dtype) for v in values):
        return None  # low-precision or complex values: the per-equation executor
    runs = _partition(graph)
    if not any(ok for ok, _ in runs) or sum(not ok for ok, _ in runs) > MAX_PYTHON_RUNS:
        return None
    try:
        if len(runs) == 1:
            lowered = codegen_c.lower(graph)
            if lowered.arena_bytes > MAX_ARENA_BYTES:
                return None
            return NativeExecutable(graph, lowered, cbuild.build(lowered), donated)
        results = frozenset(v for v in graph.outvars if isinstance(v, Var))
        parts = [(ok, sub, codegen_c.lower(sub, results) if ok else None) for ok, sub in _subgraphs(graph, runs)]
        if sum(lo.arena_bytes for _, _, lo in parts if lo is not None) > MAX_ARENA_BYTES:
            return None
        segments = [("native", sub, cbuild.build(lo), lo) if ok else ("python", sub, None, None) for ok, sub, lo in parts]
    except codegen_c.Unsupported:
        return None
    except cbuild.BuildError as err:
        _warn_once(err)
        return None
    return SegmentedExecutable(graph, segments, donated)


__all__ = ["MAX_ARENA_BYTES", "MAX_PYTHON_RUNS", "MIN_SEGMENT", "NativeExecutable", "SegmentedExecutable", "enabled", "native_executable"]
