"""Memory planning: liveness analysis of a graph's schedule, buffer assignment by lifetime with
in-place execution, and a report of planned vs unplanned bytes.

This is the one planner of the engine: :func:`plan_memory` analyses a graph on its own (every
non-view equation output owns a buffer), and the numpy executor drives the same
:class:`BufferPlanner` while it generates code, asking it for a buffer only for the values it
really keeps in one (not for graph outputs, which get fresh arrays, nor for values it allocates per
call) -- its plan (``Executable.memory``) is therefore exactly what the generated code holds.

Views (reshape, transpose, slices, broadcasts) alias the buffer of their operand and extend its
lifetime.  Planning takes two passes over the schedule.  The first assigns buffers greedily in
schedule order (the interval-colouring / linear-scan view of register allocation; Poletto &
Sarkar, "Linear scan register allocation", TOPLAS 1999; Chen et al., "Training deep nets with
sublinear memory cost", 2016, sec. 3 for in-place and sharing in dataflow graphs): an output takes
the buffer of an operand that dies at that equation when the primitive may write over that operand
(in place), otherwise the smallest free buffer that is large enough, otherwise a new one.  It
records which values need memory and which run in place.  The second (:meth:`BufferPlanner.pack`)
places those values, with the values that overwrite them in place, at byte offsets of one arena,
largest first, each in the smallest gap left by the values whose lifetimes overlap its own
(Pisarchyk & Lee, "Efficient memory management for deep neural net inference", 2020); a value is
a typed, reshaped view of its range of the arena, so any dtype reuses any bytes.  Values fixed at
build time (constant folding) get dedicated buffers outside the arena: never shared.

"Unplanned" is one buffer per planned value (what a naive executor allocates); "planned" is the
arena plus the dedicated buffers (unpacked: the total size of the buffers); "lower bound" is the
most bytes ever live at once between two equations (values defined before and read after that
point, plus dedicated buffers), which no plan of these values can beat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import primitives as _primitives  # noqa: F401  (the registry the op sets derive from)
from ..core.ir import Graph, Var
from ..core.tracing import PRIMITIVES, names_with

VIEW_PRIMITIVES = names_with("view")
ELEMENTWISE = names_with("elementwise") | {"fused_elementwise"}
# Which operands an equation may overwrite with its output (same size and dtype) comes from the
# primitive: the "in_place" trait (one ufunc pass: numpy ufuncs are safe when an input is exactly
# the output) allows every operand; ``in_place_operands`` names fewer (select copies its false
# operand into the output first, so only that one).  Fused elementwise kernels use the output as
# scratch while they still read their inputs, so never.


def in_place_operands(prim_name: str, n_inputs: int) -> tuple:
    """Indices of the operands whose buffer the output of ``prim_name`` may take over."""
    p = PRIMITIVES.get(prim_name)
    if p is None:
        return ()
    if "in_place" in p.traits:
        return tuple(range(n_inputs))
    return tuple(p.in_place_operands or ())


ALIGN = 16  # bytes: arena offsets are multiples of this (the alignment of numpy's own allocations)


def size_of(v: Var) -> int:
    """Elements of ``v`` (``math.prod``: the build loops ask often, ``np.prod`` costs ~4 us)."""
    return math.prod(v.aval.shape)


def nbytes(v: Var) -> int:
    return size_of(v) * v.aval.dtype.itemsize


@dataclass
class MemoryPlan:
    """A buffer assignment: from :func:`plan_memory` (analysis of a graph) or ``Executable.memory``
    (what the executor's generated code holds, per concurrently running buffer set)."""

    buffer_of: dict = field(default_factory=dict)  # Var -> buffer id
    buffer_bytes: list = field(default_factory=list)  # buffer id -> size in bytes
    offset: dict = field(default_factory=dict)  # buffer id -> byte offset in the arena (packed plans)
    arena_bytes: int = 0  # size of the arena holding every non-dedicated buffer (packed plans)
    live: dict = field(default_factory=dict)  # Var (buffer owner) -> (first, last) equation index
    in_place: list = field(default_factory=list)  # equation indices computed in place
    dedicated: set = field(default_factory=set)  # buffer ids never shared (values fixed at build time)
    unplanned_bytes: int = 0
    planned_bytes: int = 0
    lower_bound_bytes: int = 0
    fresh_bytes: int | None = None  # executor only: bytes the generated code allocates each call (outputs, tiny temporaries)

    def report(self) -> str:
        saved = 1 - self.planned_bytes / self.unplanned_bytes if self.unplanned_bytes else 0.0
        if self.arena_bytes:
            k = len(self.buffer_bytes) - len(self.offset)
            where = f"{len(self.offset)} blocks of one {self.arena_bytes:,} B arena" + (f" + {k} dedicated buffers" if k else "")
        else:
            where = f"{len(self.buffer_bytes)} buffers"
        text = (
            f"memory plan: {len(self.buffer_of)} intermediate values in {where}; "
            f"unplanned {self.unplanned_bytes:,} B, planned {self.planned_bytes:,} B ({saved:.0%} less), "
            f"live-bytes lower bound {self.lower_bound_bytes:,} B; {len(self.in_place)} equations in place"
        )
        if self.fresh_bytes is not None:
            text += f"; {self.fresh_bytes:,} B allocated per call (outputs, tiny temporaries)"
        return text


def liveness(graph: Graph) -> tuple[dict, dict]:
    """``(alias_root, interval)``: the buffer-owning variable behind each view, and for every
    buffer-owning equation output the (definition, last use) equation indices (graph outputs live
    to the end, index ``len(graph.eqns)``)."""
    root: dict = {}
    interval: dict = {}
    n = len(graph.eqns)
    for i, e in enumerate(graph.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                r = root.get(a, a)
                if r in interval:
                    interval[r] = (interval[r][0], i)
        if e.prim.name in VIEW_PRIMITIVES and e.inputs and isinstance(e.inputs[0], Var):
            root[e.outputs[0]] = root.get(e.inputs[0], e.inputs[0])
        else:
            for o in e.outputs:
                interval[o] = (i, i)
    for a in graph.outvars:
        if isinstance(a, Var):
            r = root.get(a, a)
            if r in interval:
                interval[r] = (interval[r][0], n)
    return root, interval


class BufferPlanner:
    """Buffer assignment over a graph's schedule, driven one equation output at a time (in schedule
    order) by :func:`plan_memory` or by the executor; :meth:`finish` gives the plan.

    Two passes: the first (``packing=None``) assigns online by linear scan and records each
    request -- which values need a buffer and which run in place; :meth:`pack` then re-assigns
    those values offline, largest first, and a second pass given ``packing=pack()`` replays that
    assignment for the same requests.  ``reuse=False`` gives every value a buffer of its own (the
    unplanned baseline, for testing)."""

    def __init__(self, graph: Graph, reuse: bool = True, packing: tuple | None = None):
        self.reuse = reuse
        self.root, self.interval = liveness(graph)
        self.n = len(graph.eqns)
        self.plan = MemoryPlan()
        self.requests: list = []  # (equation, value, in-place donor or None, dedicated)
        self._packing = packing
        self._holder: dict = {}  # buffer id -> the variable whose value it currently holds
        self._free: list = []  # buffer ids free for reuse
        self._busy: list = []  # (last use, buffer id) of shared buffers in use

    def dies_at(self, v: Var, i: int) -> bool:
        """Whether buffer-owning ``v``, with every view of it, is last read by equation ``i``."""
        return self.interval.get(v, (0, -1))[1] == i

    def _release_before(self, i: int) -> None:
        keep = []
        for t, b in self._busy:
            if t < i:
                self._free.append(b)
            else:
                keep.append((t, b))
        self._busy = keep

    def assign(self, i: int, v: Var, candidates: tuple = (), dedicated: bool = False) -> tuple[int, Var | None]:
        """A buffer for ``v``, the output of equation ``i``: ``(buffer id, operand)`` where
        ``operand`` is the candidate whose buffer ``v`` takes over in place (``None`` otherwise).
        ``candidates``: operands the caller's kernel may overwrite (same size and dtype as ``v``,
        each owning its buffer); one is taken only if its value (with every view of it) dies here.
        ``dedicated``: a buffer of its own, never shared (values fixed at build time)."""
        if self._packing is not None:
            return self._replay(i, v)
        self._release_before(i)
        plan, size = self.plan, nbytes(v)
        chosen, donor = None, None
        if not dedicated and self.reuse:
            for a in candidates:
                b = plan.buffer_of.get(a)
                if (
                    b is not None
                    and b not in plan.dedicated
                    and self._holder.get(b) is a
                    and self.dies_at(a, i)
                    and plan.buffer_bytes[b] >= size
                ):
                    chosen, donor = b, a
                    self._busy = [(t, bb) for t, bb in self._busy if bb != b]
                    plan.in_place.append(i)
                    break
            if chosen is None:
                fits = [(plan.buffer_bytes[b], b) for b in self._free if plan.buffer_bytes[b] >= size]
                if fits:
                    chosen = min(fits)[1]
                    self._free.remove(chosen)
        if chosen is None:
            chosen = len(plan.buffer_bytes)
            plan.buffer_bytes.append(size)
            if dedicated:
                plan.dedicated.add(chosen)
        plan.buffer_of[v] = chosen
        s, t = self.interval.get(v, (i, i))
        plan.live[v] = (s, t)
        self._holder[chosen] = v
        if not dedicated:
            self._busy.append((t, chosen))
        self.requests.append((i, v, donor, dedicated))
        return chosen, donor

    def pack(self) -> tuple:
        """Offline re-assignment of the recorded requests into one byte arena: each value joins
        the block of the operand it overwrites in place; blocks (lifetime: the union of their
        members', size: the largest member) are placed largest
        first at the (aligned) offset of the smallest gap left by the already placed blocks whose
        lifetimes overlap theirs, else above them all -- the "greedy by size for offset
        calculation" strategy of Pisarchyk & Lee, "Efficient memory management for deep neural net
        inference" (2020).  Dedicated values get blocks of their own outside the arena.  Should
        alignment padding make the arena larger than one buffer per block (tiny graphs), every
        block gets its own buffer instead."""
        plan = self.plan
        group: dict = {}
        for _, v, donor, _ in self.requests:
            group[v] = group[donor] if donor is not None else v
        members: dict = {}
        for v, r in group.items():
            members.setdefault(r, []).append(v)
        items = []
        for r, vs in members.items():
            s = min(plan.live[v][0] for v in vs)
            t = max(plan.live[v][1] for v in vs)
            items.append((-max(nbytes(v) for v in vs), s, t, r, plan.buffer_of[r] in plan.dedicated))
        items.sort(key=lambda it: it[:3])
        sizes: list = []
        offset: dict = {}
        dedicated: set = set()
        buffer_of: dict = {}
        placed: list = []  # (offset, end, first, last) of arena blocks
        for neg, s, t, r, ded in items:
            b = len(sizes)
            sizes.append(-neg)
            if ded:
                dedicated.add(b)
            else:
                size = -neg
                busy = sorted((o, e) for o, e, s2, t2 in placed if not (t2 < s or t < s2))
                best, top = None, 0
                for o, e in busy:
                    start = -(-top // ALIGN) * ALIGN
                    if o - start >= size and (best is None or o - start < best[0]):
                        best = (o - start, start)
                    top = max(top, e)
                off = -(-top // ALIGN) * ALIGN if best is None else best[1]
                offset[b] = off
                placed.append((off, off + size, s, t))
            for v in members[r]:
                buffer_of[v] = b
        arena = max((e for _, e, _, _ in placed), default=0)
        if arena > sum(sizes[b] for b in offset):
            offset, arena = {}, 0
        return buffer_of, sizes, dedicated, {v: d for _, v, d, _ in self.requests}, offset, arena

    def _replay(self, i: int, v: Var) -> tuple[int, Var | None]:
        buffer_of, sizes, dedicated, donors, offset, arena = self._packing
        plan = self.plan
        if not plan.buffer_bytes:
            plan.buffer_bytes = list(sizes)
            plan.dedicated = set(dedicated)
            plan.offset = dict(offset)
            plan.arena_bytes = arena
        b, donor = buffer_of[v], donors[v]
        plan.buffer_of[v] = b
        plan.live[v] = self.interval.get(v, (i, i))
        if donor is not None:
            plan.in_place.append(i)
        self.requests.append((i, v, donor, b in dedicated))
        return b, donor

    def finish(self) -> MemoryPlan:
        plan = self.plan
        plan.unplanned_bytes = sum(nbytes(v) for v in plan.buffer_of)
        if plan.arena_bytes:  # packed: the arena plus the dedicated blocks
            plan.planned_bytes = plan.arena_bytes + sum(plan.buffer_bytes[b] for b in plan.dedicated)
        else:
            plan.planned_bytes = sum(plan.buffer_bytes)
        delta = [0] * (self.n + 2)
        fixed = 0
        for v, b in plan.buffer_of.items():
            if b in plan.dedicated:
                fixed += nbytes(v)
                continue
            s, t = plan.live[v]
            # live on [s, t): after equation s wrote it, until equation t has read it (an output
            # may take a dying operand's buffer, so the two need not coexist)
            delta[s] += nbytes(v)
            delta[max(t, s + 1)] -= nbytes(v)
        cur = peak = 0
        for d in delta:
            cur += d
            peak = max(peak, cur)
        plan.lower_bound_bytes = peak + fixed
        return plan


def plan_memory(graph: Graph, reuse: bool = True) -> MemoryPlan:
    """The plan of a graph on its own: every non-view equation output gets a buffer, elementwise
    outputs in place over a dying operand of the same size and dtype; see the module docstring."""

    def run(packing):
        planner = BufferPlanner(graph, reuse, packing)
        interval = planner.interval
        for i, e in enumerate(graph.eqns):
            if len(e.outputs) > 1:  # several outputs: a buffer each, none in place
                for o in e.outputs:
                    planner.assign(i, o, ())
                continue
            o = e.outputs[0]
            if o not in interval:
                continue
            cands = tuple(
                a
                for k in in_place_operands(e.prim.name, len(e.inputs))
                for a in (e.inputs[k],)
                if isinstance(a, Var) and a in interval and size_of(a) == size_of(o) and a.aval.dtype == o.aval.dtype
            )
            planner.assign(i, o, cands)
        return planner

    first = run(None)
    return run(first.pack()).finish() if reuse else first.finish()


def check_plan(graph: Graph, plan: MemoryPlan) -> None:
    """Raise if two values whose lifetimes overlap share memory (a buffer, or bytes of the arena),
    except in-place handovers, or if a buffer is smaller than a value it holds."""
    for v, b in plan.buffer_of.items():
        if nbytes(v) > plan.buffer_bytes[b]:
            raise AssertionError(f"buffer {b} of {plan.buffer_bytes[b]} B holds a {nbytes(v)} B value")
    if plan.offset:
        items = [(plan.live[v], plan.offset[b], plan.offset[b] + nbytes(v), b) for v, b in plan.buffer_of.items() if b in plan.offset]
        for k, ((s1, t1), o1, e1, b1) in enumerate(items):
            if e1 > plan.arena_bytes:
                raise AssertionError(f"buffer {b1} ends at {e1}, beyond the {plan.arena_bytes} B arena")
            for (s2, t2), o2, e2, b2 in items[k + 1 :]:
                if b1 != b2 and o1 < e2 and o2 < e1 and not (t1 < s2 or t2 < s1):
                    raise AssertionError(f"buffers {b1} and {b2} overlap in the arena while both are live")
    by_buf: dict = {}
    for v, b in plan.buffer_of.items():
        by_buf.setdefault(b, []).append(plan.live[v])
    for b, ivs in by_buf.items():
        if b in plan.dedicated and len(ivs) > 1:
            raise AssertionError(f"dedicated buffer {b} holds {len(ivs)} values")
        ivs.sort()
        for (s1, t1), (s2, t2) in zip(ivs, ivs[1:]):
            if s2 < t1 or (s2 == t1 and s2 not in plan.in_place):
                raise AssertionError(f"buffer {b}: lifetimes {(s1, t1)} and {(s2, t2)} overlap")
