"""Memory planning: liveness analysis of a graph's schedule, buffer assignment by lifetime with
in-place reuse, and a report of planned vs unplanned peak bytes.

Every equation output that is not a view owns a buffer; views (reshape, transpose, slices,
broadcasts) alias the buffer of their operand and extend its lifetime.  Buffers are assigned
greedily in schedule order (the interval-colouring / linear-scan view of register allocation;
Poletto & Sarkar, "Linear scan register allocation", TOPLAS 1999; Chen et al., "Training deep nets
with sublinear memory cost", 2016, sec. 3 for in-place and sharing in dataflow graphs): an output
takes the buffer of an elementwise operand that dies at that equation (in-place), otherwise the
smallest free buffer of the same dtype that is large enough, otherwise a new one.  "Unplanned" is
one buffer per intermediate value (what a naive executor allocates); "planned" is the total size of
the buffers after reuse; "lower bound" is the most bytes ever live at once between two equations
(values defined before and read after that point), which no plan can beat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Graph, Var

VIEW_PRIMITIVES = frozenset({"transpose", "reshape", "broadcast_to", "squeeze", "expand_dims", "slice", "stop_gradient"})
ELEMENTWISE = frozenset(
    {
        "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "and", "or",
        "not", "neg", "exp", "log", "log1p", "tanh", "logistic", "sqrt", "rsqrt", "abs", "sign", "sin", "cos",
        "relu", "select", "cast", "clip", "fused_elementwise",
    }
)


def nbytes(v: Var) -> int:
    return v.aval.size * v.aval.dtype.itemsize


@dataclass
class MemoryPlan:
    """Result of :func:`plan_memory`."""

    buffer_of: dict = field(default_factory=dict)  # Var -> buffer id
    buffer_bytes: list = field(default_factory=list)  # buffer id -> size
    live: dict = field(default_factory=dict)  # Var (buffer owner) -> (first, last) equation index
    in_place: list = field(default_factory=list)  # equation indices computed in place
    unplanned_bytes: int = 0
    planned_bytes: int = 0
    lower_bound_bytes: int = 0

    def report(self) -> str:
        saved = 1 - self.planned_bytes / self.unplanned_bytes if self.unplanned_bytes else 0.0
        return (
            f"memory plan: {len(self.buffer_of)} intermediate values in {len(self.buffer_bytes)} buffers; "
            f"unplanned {self.unplanned_bytes:,} B, planned {self.planned_bytes:,} B ({saved:.0%} less), "
            f"live-bytes lower bound {self.lower_bound_bytes:,} B; {len(self.in_place)} equations in place"
        )


def liveness(graph: Graph) -> tuple[dict, dict]:
    """``(alias_root, interval)``: the buffer-owning variable behind each view, and for every
    buffer-owning equation output the (definition, last use) equation indices (graph outputs live
    to the end)."""
    root: dict = {}
    interval: dict = {}
    n = len(graph.eqns)
    for i, e in enumerate(graph.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                r = root.get(a, a)
                if r in interval:
                    interval[r] = (interval[r][0], i)
        o = e.outputs[0]
        if e.prim.name in VIEW_PRIMITIVES and e.inputs and isinstance(e.inputs[0], Var):
            root[o] = root.get(e.inputs[0], e.inputs[0])
        else:
            interval[o] = (i, i)
    for a in graph.outvars:
        if isinstance(a, Var):
            r = root.get(a, a)
            if r in interval:
                interval[r] = (interval[r][0], n)
    return root, interval


def plan_memory(graph: Graph) -> MemoryPlan:
    """Assign every intermediate buffer by lifetime; see the module docstring."""
    root, interval = liveness(graph)
    plan = MemoryPlan(live=interval)
    free: list = []  # (size, dtype, buffer id)
    dtype_of: list = []
    ending: dict = {}
    for v, (s, t) in interval.items():
        ending.setdefault(t, []).append(v)
    for i, e in enumerate(graph.eqns):
        o = e.outputs[0]
        if o not in interval:
            continue
        size, dt = nbytes(o), o.aval.dtype
        chosen = None
        if e.prim.name in ELEMENTWISE:
            for a in e.inputs:
                if isinstance(a, Var) and a in interval and interval[a][1] == i and a in plan.buffer_of:
                    b = plan.buffer_of[a]
                    if plan.buffer_bytes[b] >= size and dtype_of[b] == dt and a.aval.shape == o.aval.shape:
                        chosen = b
                        plan.in_place.append(i)
                        break
        if chosen is None:
            fits = [(plan.buffer_bytes[b], b) for (sz, d, b) in free if d == dt and sz >= size]
            if fits:
                _, chosen = min(fits)
                free = [f for f in free if f[2] != chosen]
        if chosen is None:
            chosen = len(plan.buffer_bytes)
            plan.buffer_bytes.append(size)
            dtype_of.append(dt)
        plan.buffer_of[o] = chosen
        # release buffers whose owners die at this equation (after it has read them)
        for v in ending.get(i, ()):
            b = plan.buffer_of.get(v)
            if b is not None and b != chosen:
                free.append((plan.buffer_bytes[b], dtype_of[b], b))
        if interval[o][1] == i and all(f[2] != chosen for f in free):  # dead on arrival
            free.append((plan.buffer_bytes[chosen], dtype_of[chosen], chosen))
    plan.unplanned_bytes = sum(nbytes(v) for v in interval)
    plan.planned_bytes = sum(plan.buffer_bytes)
    n = len(graph.eqns)
    delta = [0] * (n + 2)
    for v, (s, t) in interval.items():
        # live on [s, t): after equation s wrote it, until equation t has read it (an output may
        # take a dying operand's buffer, so the two need not coexist)
        delta[s] += nbytes(v)
        delta[max(t, s + 1)] -= nbytes(v)
    cur = peak = 0
    for d in delta:
        cur += d
        peak = max(peak, cur)
    plan.lower_bound_bytes = peak
    return plan


def check_plan(graph: Graph, plan: MemoryPlan) -> None:
    """Raise if two values whose lifetimes overlap share a buffer (except in-place handovers)."""
    by_buf: dict = {}
    for v, b in plan.buffer_of.items():
        by_buf.setdefault(b, []).append(plan.live[v])
    for b, ivs in by_buf.items():
        ivs.sort()
        for (s1, t1), (s2, t2) in zip(ivs, ivs[1:]):
            if s2 < t1 or (s2 == t1 and s2 not in plan.in_place):
                raise AssertionError(f"buffer {b}: lifetimes {(s1, t1)} and {(s2, t2)} overlap")
