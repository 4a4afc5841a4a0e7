"""The context the numpy executor's emit rules share: :class:`EmitState` (one code generation over a
graph: the names, storage classes and build-time values of its variables, the generated lines, the
buffers), :class:`Step` (one equation being lowered) and :class:`OutputRecycler` (the fresh arrays of
large graph outputs, used by the executor's placement and by rules that place outputs themselves).

An emit rule is a function ``rule(state, step)`` in one of the ``emit_*`` modules, one module per
family of primitives: it reads the state and either defines the equation's outputs itself (the rules
of ``executor.DEFINE_RULES``), rewrites the operands (``OPERAND_RULES``), or chooses the kernel
(``KERNEL_RULES``: sets ``step.code``).  The primitive's own emit rule (``prim.emit``, written next to
the primitive) gives the kernel when no rule chose one; the executor then places the result
(buffer, in place, fresh array or build-time constant).
"""

from __future__ import annotations

import math
from sys import getrefcount as _refcount
from typing import Any

import numpy as np

from ...compiler.memory_plan import VIEW_PRIMITIVES, BufferPlanner, nbytes
from ...core.ir import Eqn, Graph, Literal, Var
from ...primitives.elementwise import expit
from ...primitives.emit import CLIP, Code, EmitContext


RECYCLE_MIN_BYTES = 64 * 1024
RECYCLE_MAX_BYTES = 32 * 1024 * 1024
"""Outputs of this size come from an :class:`OutputRecycler` (below: small ones are cheap to allocate;
above: keeping spares would hold too much memory)."""


class OutputRecycler:
    """Fresh output arrays of one shape and dtype for successive calls, reusing one that nobody
    references any more.

    A graph output must be a new array the caller may keep.  Allocating a large one every call
    costs page faults: glibc's malloc returns big freed blocks to the system (``mmap`` or a heap
    trim) and the next call touches fresh pages (an MLP 784-512-512-10 Adam step: ~950 minor faults,
    a fifth of its time).  So the recycler keeps the arrays it handed out (at most ``KEEP``) and
    hands one out again only when its reference count says that only the recycler still holds it:
    no caller variable, no view (a view references its base), no buffer export.  In a training
    loop that passes the outputs back in, the outputs of the call before last are free again.
    """

    KEEP = 2
    __slots__ = ("shape", "dtype", "pool")

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.pool: list = []

    def take(self) -> np.ndarray:
        for a in self.pool:
            if _refcount(a) == 3:  # the pool's list, the loop variable and getrefcount's argument
                return a
        a = np.empty(self.shape, self.dtype)
        if len(self.pool) < self.KEEP:
            self.pool.append(a)
        return a

    def copy(self, x: np.ndarray) -> np.ndarray:
        a = self.take()
        np.copyto(a, x)
        return a


class EmitState:
    """One generation of code for ``graph``, taking buffers from ``planner``.

    ``names``: the source name of each variable; ``storage``: ``input`` | ``const`` | ``buffer`` |
    ``fresh`` (allocated per call); ``root``: the variable whose memory a view aliases; ``static``:
    values known once the executable is built (their names are in ``ns``); ``scalars``: 0-d values
    held as numpy scalars; ``phys``: the shape of the array a name holds when it differs from the
    variable's (elided broadcasts); ``escapes``: variables whose memory reaches a graph output
    through views; ``body``/``setup``: the generated lines of each call / of the build.
    """

    def __init__(self, graph: Graph, planner: BufferPlanner, donated: frozenset = frozenset()):
        self.graph = graph
        self.planner = planner
        self.ns: dict[str, Any] = {"np": np, "_expit": expit, "_empty": np.empty, "_clip": CLIP}
        self.ctx = EmitContext(self.ns)
        self.names: dict[Var, str] = {}
        self.storage: dict[Var, str] = {}
        self.root: dict[Var, Var] = {}
        self.static: set[Var] = set()
        self.scalars: set[Var] = set()
        self.phys: dict[Var, tuple] = {}
        self.outs = {a for a in graph.outvars if isinstance(a, Var)}
        self.consumers: dict[Var, list] = {}
        for e in graph.eqns:
            for a in e.inputs:
                if isinstance(a, Var):
                    self.consumers.setdefault(a, []).append(e)
        self.escapes = set(self.outs)
        for e in reversed(graph.eqns):
            if e.prim.name in VIEW_PRIMITIVES and e.outputs[0] in self.escapes and isinstance(e.inputs[0], Var):
                self.escapes.add(e.inputs[0])
        for i, v in enumerate(graph.invars):
            self.names[v] = f"i{i}"
            self.storage[v] = "input"
        for c, v in zip(graph.consts, graph.constvars):
            self.names[v] = self.ctx.const(c)
            self.storage[v] = "const"
            self.static.add(v)
        self.body: list[str] = []
        self.setup: list[str] = []
        self.fresh_bytes = 0  # bytes the generated code allocates per call
        self._views: dict[tuple, str] = {}  # (buffer id, shape, dtype) -> name of that view
        self._scalar_consts: dict = {}
        self._donors = _donor_last_readers(graph, {graph.invars[i] for i in donated})
        self.donations: list[Var] = []  # donated inputs this code writes an output into

    # ------------------------------------------------------------------ names

    def atom(self, a: Any) -> str:
        """Source for an operand: a variable's name, or a literal (a typed constant unless a finite
        Python number)."""
        if isinstance(a, Literal):
            val = a.value
            if a.weak and isinstance(val, (bool, int)):
                return repr(val)
            if a.weak and isinstance(val, float) and math.isfinite(val):
                return repr(val)
            return self.ctx.const(a.aval.dtype.type(val))
        return self.names[a]

    def ufunc_literal(self, a: Literal, operands: list) -> str | None:
        """A literal operand of a ufunc as a 0-d array of the dtype numpy would convert it to
        (NEP 50: a Python scalar takes the array operands' type): ufuncs take that path about
        twice as fast as a Python scalar, which they must convert on every call."""
        val = a.value
        try:
            dt = np.result_type(*[b.aval.dtype for b in operands if isinstance(b, Var)], val if a.weak else a.aval.dtype)
            c = np.asarray(val, dt)
        except (OverflowError, TypeError, ValueError):
            return None
        if c.item() != val and not (isinstance(val, float) and (math.isnan(val) or dt.kind == "f")):
            return None  # a Python int that this dtype cannot hold exactly: keep numpy's own handling
        key = (c.dtype.str, c.tobytes())
        if key not in self._scalar_consts:
            self._scalar_consts[key] = self.ctx.const(c)
        return self._scalar_consts[key]

    def all_static(self, e: Eqn) -> bool:
        """Whether every operand of ``e`` is known at build time."""
        return all(not isinstance(a, Var) or a in self.static for a in e.inputs)

    # ------------------------------------------------------------------ code and memory

    def run_now(self, line: str) -> None:
        """Run ``line`` once, at build time (its results become constants of the code)."""
        self.setup.append(line)
        exec(line, self.ns)  # noqa: S102 - our own generated code

    def buffer_for(self, n: int, out: Var, cands: tuple, dedicated: bool) -> tuple[str, Var | None]:
        """The name of a buffer view for ``out`` (equation ``n``) and the operand it takes over in
        place (or ``None``), from the planner: a buffer is a byte array (its own, or a range of the
        arena) and each value a typed, reshaped view of it made once here."""
        planner, ns = self.planner, self.ns
        bid, donor = planner.assign(n, out, cands, dedicated)
        base = ns.get(f"_b{bid}")
        if base is None:
            size, off = planner.plan.buffer_bytes[bid], planner.plan.offset.get(bid)
            if off is None:  # a block of its own (dedicated, or the first pass)
                base = np.empty(size, np.uint8)
            else:  # a range of the arena
                if "_arena" not in ns:
                    ns["_arena"] = np.empty(planner.plan.arena_bytes, np.uint8)
                base = ns["_arena"][off : off + size]
            ns[f"_b{bid}"] = base
        key = (bid, out.aval.shape, out.aval.dtype)
        if key not in self._views:
            self._views[key] = self.ctx.const(base[: nbytes(out)].view(out.aval.dtype).reshape(out.aval.shape))
        return self._views[key], donor

    def fresh_array(self, v: Var) -> str:
        """Source of a new array for ``v`` each call (a graph output the caller may keep): from an
        :class:`OutputRecycler` when it is large, else ``np.empty``."""
        if RECYCLE_MIN_BYTES <= nbytes(v) <= RECYCLE_MAX_BYTES:
            return f"{self.ctx.const(OutputRecycler(v.aval.shape, v.aval.dtype))}.take()"
        return f"_empty({v.aval.shape!r}, {self.ctx.const(np.dtype(v.aval.dtype))})"  # bfloat16 is not np.<name>

    def donor_for(self, n: int, out: Var) -> Var | None:
        """A donated input (``jit(..., donate_argnums=...)``) that equation ``n`` may write output
        ``out`` into: read by ``n`` itself and by nothing after it (nor through a view), not a
        graph output, of ``out``'s type, not taken by another output.  ``None`` if there is none."""
        e = self.graph.eqns[n]
        for a in e.inputs:
            if isinstance(a, Var) and self._donors.get(a) == n and a.aval == out.aval and a not in self.donations:
                self.donations.append(a)
                return a
        return None

    def define(self, v: Var, name: str, storage: str) -> None:
        self.names[v] = name
        self.storage[v] = storage


class Step:
    """One equation being lowered: ``ins`` (the operands' source), the attributes and avals the
    kernel is emitted for (a rule may change them, e.g. a reduction over a squeezed operand),
    ``out_shape`` (the shape the kernel writes when not the output's own: it then writes a view
    of the output's buffer) and ``code`` (the chosen kernel, ``None`` until one is chosen)."""

    __slots__ = ("n", "e", "out", "ins", "attrs", "in_avals", "out_aval", "out_shape", "code")

    def __init__(self, n: int, e: Eqn):
        self.n = n
        self.e = e
        self.out = e.outputs[0]
        self.ins: list[str] = []
        self.attrs = e.attrs
        self.in_avals = [a.aval for a in e.inputs]
        self.out_aval = self.out.aval
        self.out_shape: tuple | None = None
        self.code: Code | None = None

    @property
    def name(self) -> str:
        """The per-call name of the equation's (first) output."""
        return f"v{self.n}"


def _donor_last_readers(graph: Graph, donated: set) -> dict:
    """For each donated input that is not (a view of which is not) a graph output: the index of
    the last equation reading it or a view of it."""
    if not donated:
        return {}
    root = {v: v for v in donated}  # a variable aliasing a donated input -> that input
    last: dict = {}
    for n, e in enumerate(graph.eqns):
        for a in e.inputs:
            if isinstance(a, Var) and a in root:
                last[root[a]] = n
        if e.prim.name in VIEW_PRIMITIVES and e.inputs and isinstance(e.inputs[0], Var) and e.inputs[0] in root:
            for o in e.outputs:
                root[o] = root[e.inputs[0]]
    returned = {root[a] for a in graph.outvars if isinstance(a, Var) and a in root}
    return {v: n for v, n in last.items() if v not in returned}


def donation_conflicts(args: tuple) -> set:
    """ids of the arguments no output may be written into: an array passed twice, a view and the
    array it views (writing one would change the other while the program still reads it)."""
    seen: set = set()
    bad: set = set()
    for a in args:
        k = id(a)
        if k in seen:
            bad.add(k)
        seen.add(k)
        b = getattr(a, "base", None)
        if b is not None:
            bad.add(k)
            bad.add(id(b))
    return bad


def donatable(a: Any, conflicts: set) -> bool:
    """Whether the donated argument ``a`` can take an output: a writeable, aligned, C-ordered
    numpy array that owns its memory and is not in ``conflicts``."""
    return type(a) is np.ndarray and a.base is None and id(a) not in conflicts and a.flags.writeable and a.flags.c_contiguous and a.flags.aligned


def safe_view(arr: np.ndarray, shape: tuple, storage: str | None) -> np.ndarray | None:
    """``arr.reshape(shape)`` if it can be made once at build time: always for constants, and for
    buffers only when it is a view (so it sees every later write)."""
    v = arr.reshape(shape)
    if storage == "const" or np.shares_memory(v, arr):
        return v
    return None


__all__ = ["RECYCLE_MAX_BYTES", "RECYCLE_MIN_BYTES", "EmitState", "OutputRecycler", "Step", "donatable", "donation_conflicts", "safe_view"]
