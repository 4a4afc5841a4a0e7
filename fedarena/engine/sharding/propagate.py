"""Sharding propagation: give every equation of a graph a strategy from its primitive's ``shard`` rule and insert
the redistributions (``all_gather``, ``all_reduce``, ``reduce_scatter``, local slices) where the layout a
value has differs from the one its consumer needs, giving a :class:`ShardedProgram` one rank runs on its blocks.

The program is sharded after differentiation: the training step's graph, forward, backward and optimizer
update, is one graph, and its backward equations get strategies like any other (MindSpore shards the whole
training graph the same way; Su et al. 2021). Equations are taken in order and each gets the strategy of least
cost (:class:`~fedarena.engine.sharding.cost.CostModel`): first the predicted time of its local compute and of
the redistributions its inputs need, plus that of the all-reduce a partial output will need, with a partial input it splits charged a whole
all-reduce and one message more and a replicated input it slices half an all-gather (the greedy order cannot see whether a later
consumer needs the value whole again, so a split is only made where it pays for that), plus, for a value the outputs want in
another layout through a chain of elementwise equations (a gradient whose parameter is returned replicated),
the redistribution to that layout, once per output the chain reaches; then the fewest whole inputs turned into split ones. So
propagation follows the splits it is given, as GSPMD's does, and splits a whole value on its own only where the compute
saved pays for the charge above (a replicated batch is sliced by the first matmul when halving the network's products
saves more than half an all-gather of the batch); a batch given split stays split through matmuls with replicated weights,
each weight's gradient a partial sum all-reduced once (data parallelism). A primitive without a rule runs replicated: its inputs are gathered, and the
program's text says so on its line. A value redistributed once is kept in each layout made, so its other
consumers reuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core.interpreter import literal_value
from ..core.ir import Eqn, EngineError, Graph, Literal, ShapedArray, Var, _namer
from ..primitives.sharding import Layout, R, Strategy, local_shape, splittable
from .cost import CostModel, nbytes
from .execute import LocalProgram
from .redistribute import Collective, plan

NO_RULE = "no sharding rule: runs replicated, inputs gathered"


class ShardingError(EngineError, ValueError):
    """A layout does not fit its tensor (an axis out of range or not divisible by the mesh size)."""


@dataclass
class Step:
    """One line of a sharded program: a primitive on local blocks (``prim``) or a redistribution
    (``collective``)."""

    outputs: tuple
    inputs: tuple
    in_layouts: tuple
    out_layouts: tuple
    prim: Any = None
    attrs: dict = field(default_factory=dict)
    kernel: Any = None
    collective: Collective | None = None
    note: str = ""


def check_layout(layout: Layout, aval: ShapedArray, n: int, what: str) -> None:
    if layout.partial is not None:
        raise ShardingError(f"{what}: a partial layout is internal to a sharded program; use R or S(axis)")
    if layout.axis is not None:
        if layout.axis >= len(aval.shape):
            raise ShardingError(f"{what}: axis {layout.axis} is out of range for shape {aval.shape}")
        if not splittable(aval.shape[layout.axis], n):
            raise ShardingError(f"{what}: axis {layout.axis} of shape {aval.shape} does not split into {n} equal blocks")


class ShardedProgram:
    """A graph sharded over ``n`` ranks: ``steps`` in order, each input's and output's layout; prints as the
    graph's text with a layout after every type (``R``, ``S<axis>``, ``Psum``/``Pmax``/``Pmin``) and the
    inserted collectives on lines of their own."""

    def __init__(self, graph: Graph, n: int, steps: list[Step], in_layouts: list[Layout], out_layouts: list[Layout],
                 outputs: list, layouts: dict, cost: CostModel) -> None:
        self.graph, self.n, self.steps = graph, n, steps
        self.in_layouts, self.out_layouts, self.outputs = in_layouts, out_layouts, outputs
        self.layouts, self.cost = layouts, cost
        self._last_use = self._lifetimes()
        self._local: LocalProgram | None = None

    # ------------------------------------------------------------------------------------------- analysis
    def _lifetimes(self) -> dict:
        last: dict = {}
        for i, st in enumerate(self.steps):
            for a in st.inputs:
                if isinstance(a, Var):
                    last[a] = i
        for a in self.outputs:
            if isinstance(a, Var):
                last[a] = len(self.steps)
        return last

    def local_aval(self, v: Var) -> ShapedArray:
        return ShapedArray(local_shape(v.aval.shape, self.layouts[v], self.n), v.aval.dtype)

    @property
    def collectives(self) -> list[Step]:
        return [s for s in self.steps if s.collective is not None and s.collective.name != "shard_slice"
                and s.collective.name != "to_partial"]

    @property
    def unsharded(self) -> list[str]:
        """Names of the primitives that ran replicated for want of a rule."""
        return [s.prim.name for s in self.steps if s.note == NO_RULE]

    def predicted_comm(self) -> tuple[float, float]:
        """``(seconds, bytes sent per rank)`` of the program's collectives under its cost model."""
        t = b = 0.0
        c = self.cost
        for s in self.collectives:
            size = nbytes(s.inputs[0].aval) if isinstance(s.inputs[0], Var) else 8
            t += s.collective.time(size, self.n, c.alpha, c.beta, c.chunk_bytes)
            b += s.collective.bytes_sent(size, self.n, c.alpha, c.beta, c.chunk_bytes)
        return t, b

    def predicted_compute(self, segment_times: Sequence[float] | None = None,
                          host_times: Sequence[float] | None = None) -> float:
        """Seconds of this rank's compute: each equation's :meth:`CostModel.compute_time`, or, given the
        measured seconds of each compiled segment's call (``cost.profile_segments``, or a profiled step:
        dispatch included, so no ``segment_time`` is added on top), their sum plus the model's time of the
        steps that run between segments (local kernels, slices) and ``host_time`` for each item of the rank's
        schedule (segment or host step) and for the call itself (the executor's Python around them). Given
        also ``host_times``, each host step's measured seconds in the order the rank runs them (a profiled
        step's ``hosts``), the local ones (rank-dependent kernels, slices) count as measured; the collectives
        stay modelled (:meth:`predicted_comm`)."""
        c = self.cost
        t = 0.0
        measured: dict = {}
        if segment_times is not None:
            t = float(sum(segment_times)) + c.host_time * (len(segment_times) + 1)
            if host_times is not None:
                hosts = [it for kind, it in self.local_program.items if kind == "host"]
                measured = {id(s): x for s, x in zip(hosts, host_times)}
        for s in self.steps:
            if segment_times is not None and s.collective is None and s.kernel is None:
                continue  # in a measured segment
            if segment_times is not None:
                t += c.host_time
            local = s.prim is not None or s.collective.name in ("shard_slice", "to_partial")
            if local and id(s) in measured:
                t += measured[id(s)]
                continue
            if s.prim is None:
                if s.collective.name in ("shard_slice", "to_partial"):  # a local copy of the block
                    out = self.local_aval(s.outputs[0])
                    t += c.compute_time("copy", [out.shape], out.shape, out.dtype.itemsize)
                continue
            ins = [self.local_aval(a) if isinstance(a, Var) else a.aval for a in s.inputs]
            out = self.local_aval(s.outputs[0])
            t += c.compute_time(s.prim.name, [a.shape for a in ins], out.shape, out.dtype.itemsize,
                                [a.dtype.itemsize for a in ins])
        return t

    def predicted_time(self, segment_times: Sequence[float] | None = None,
                       host_times: Sequence[float] | None = None) -> float:
        return self.predicted_compute(segment_times, host_times) + self.predicted_comm()[0]

    def predicted_memory(self) -> int:
        """Peak bytes of live local blocks while the program runs (inputs included, freed after last use)."""
        live = {v: self.local_aval(v) for v in list(self.graph.invars) + list(self.graph.constvars)}
        cur = sum(a.size * a.dtype.itemsize for a in live.values())
        peak = cur
        for i, s in enumerate(self.steps):
            for v in s.outputs:
                av = self.local_aval(v)
                cur += av.size * av.dtype.itemsize
            peak = max(peak, cur)
            for a in set(x for x in s.inputs if isinstance(x, Var)):
                if self._last_use.get(a) == i:
                    av = self.local_aval(a)
                    cur -= av.size * av.dtype.itemsize
        return int(peak)

    # ------------------------------------------------------------------------------------------ execution
    def run(self, comm: Any, args: Sequence[np.ndarray], profile: list | None = None,
            hosts: list | None = None) -> list[np.ndarray]:
        """Run on this rank's blocks of the inputs (``args`` in the graph's input order); returns this rank's
        blocks of the outputs. Every rank of ``comm`` (``world_size == n``) must call it together. The local
        equations run compiled (:class:`~.execute.LocalProgram`: segments compiled by ``engine.jit`` between the
        host steps), built on the first call; ``profile`` (a list) receives each segment's measured seconds
        and ``hosts`` each host step's (:meth:`LocalProgram.run`)."""
        if comm.world_size != self.n:
            raise ShardingError(f"comm: the program is sharded over {self.n} ranks, the communicator has {comm.world_size}")
        env: dict = dict(zip(self.graph.constvars, self.graph.consts))
        for i, (v, x) in enumerate(zip(self.graph.invars, args)):
            want = self.local_aval(v).shape
            if tuple(np.shape(x)) != want:
                raise ShardingError(f"argument {i}: this rank's block must have shape {want}, got {np.shape(x)}")
            env[v] = np.asarray(x)
        if self._local is None:
            self._local = LocalProgram(self)
        self._local.run(comm, env, profile, hosts)
        return [np.asarray(literal_value(a)) if isinstance(a, Literal) else np.asarray(env[a]) for a in self.outputs]

    @property
    def local_program(self) -> "LocalProgram":
        """The compiled schedule this rank runs (built on first use)."""
        if self._local is None:
            self._local = LocalProgram(self)
        return self._local

    # ------------------------------------------------------------------------------------------------ text
    def __str__(self) -> str:
        nm = _namer()

        def decl(v: Var) -> str:
            return f"{nm(v)}:{v.aval.str_short()}{{{self.layouts[v]!r}}}"

        ins = ", ".join(decl(v) for v in self.graph.invars)
        lines = [f"{{ sharded over {self.n} ranks; lambda " + ins + ". let"]
        for s in self.steps:
            outs = " ".join(decl(v) for v in s.outputs)
            if s.collective is not None:
                attrs = s.collective.attrs
                name = s.collective.name
            else:
                attrs, name = s.attrs, s.prim.name
            at = "[" + ", ".join(f"{k}={v!r}" for k, v in attrs.items()) + "]" if attrs else ""
            args = " ".join(nm(a) for a in s.inputs)
            line = f"    {outs} = {name}{at} {args}".rstrip()
            if s.kernel is not None:
                line += "  # local kernel"
            if s.note:
                line += f"  # {s.note}"
            lines.append(line)
        lines.append("  in (" + ", ".join(nm(a) for a in self.outputs) + ") }")
        return "\n".join(lines)

    __repr__ = __str__


def shard_graph(graph: Graph, n: int, in_layouts: Sequence[Layout], out_layouts: Sequence[Layout],
                cost: CostModel | None = None) -> ShardedProgram:
    """Shard ``graph`` over ``n`` ranks with its inputs laid out as ``in_layouts`` and its outputs delivered
    as ``out_layouts``."""
    cost = cost or CostModel()
    if len(in_layouts) != len(graph.invars) or len(out_layouts) != len(graph.outvars):
        raise ShardingError(f"in/out layouts: the graph has {len(graph.invars)} inputs and {len(graph.outvars)} outputs, "
                            f"got {len(in_layouts)} and {len(out_layouts)} layouts")
    layouts: dict = {}
    versions: dict = {}  # original var -> {layout: var holding it}
    for i, (v, lay) in enumerate(zip(graph.invars, in_layouts)):
        check_layout(lay, v.aval, n, f"in_shardings[{i}]")
        layouts[v] = lay
        versions[v] = {lay: v}
    for v in graph.constvars:
        layouts[v] = R
        versions[v] = {R: v}
    steps: list[Step] = []

    def cheapest(a: Any, dst: Layout) -> tuple[float, Layout]:
        if isinstance(a, Literal):
            return (0.0, R)
        best = None
        for src, var in versions[a].items():
            t = 0.0 if src == dst else sum(c.time(nbytes(a.aval), n, cost.alpha, cost.beta, cost.chunk_bytes)
                                            for c in plan(src, dst))
            if best is None or t < best[0]:
                best = (t, src)
        return best

    def relayout(a: Any, dst: Layout) -> Any:
        if isinstance(a, Literal):
            if dst.replicated or dst.partial in ("max", "min"):
                return a
            cur, src = a, R
            have = None
        else:
            have = versions[a]
            if dst in have:
                return have[dst]
            src = cheapest(a, dst)[1]
            cur = have[src]
        lay = src
        for c in plan(src, dst):
            new = Var(a.aval)
            nxt = c.out_layout(lay)
            layouts[new] = nxt
            steps.append(Step((new,), (cur,), (lay,), (nxt,), collective=c))
            cur, lay = new, nxt
            if have is not None:
                have[lay] = cur
        if have is not None and lay != dst:  # R -> Pmax/Pmin: the same values
            have[dst] = cur
        return cur

    wanted = _wanted_layouts(graph, out_layouts)
    for e in graph.eqns:
        in_avals = [a.aval for a in e.inputs]
        rule = getattr(e.prim, "shard", None)
        note = ""
        strategies: list[Strategy] = []
        if rule is not None and not e.prim.multiple_results:
            strategies = [s for s in rule(in_avals, e.attrs, e.outputs[0].aval, n) if _fits(s, e, n)]
        if not strategies:
            note = NO_RULE if rule is None or e.prim.multiple_results else ""
            strategies = [Strategy((R,) * len(e.inputs), R)]
        best = min(strategies, key=lambda s: _decision_key(s, e, n, cost, cheapest, wanted.get(e.outputs[0])))
        ins = tuple(relayout(a, lay) for a, lay in zip(e.inputs, best.ins))
        outs = tuple(e.outputs)
        for v in outs:
            layouts[v] = best.out if len(outs) == 1 else R
            versions[v] = {layouts[v]: v}
        steps.append(Step(outs, ins, tuple(best.ins), tuple(layouts[v] for v in outs), prim=e.prim,
                          attrs=dict(best.attrs if best.attrs is not None else e.attrs), kernel=best.kernel, note=note))

    outputs = []
    for i, (a, lay) in enumerate(zip(graph.outvars, out_layouts)):
        if isinstance(a, Var):
            check_layout(lay, a.aval, n, f"out_shardings[{i}]")
        outputs.append(relayout(a, lay) if isinstance(a, Var) else a)
    return ShardedProgram(graph, n, steps, list(in_layouts), list(out_layouts), outputs, layouts, cost)


def _fits(s: Strategy, e: Eqn, n: int) -> bool:
    for a, lay in zip(e.inputs, s.ins):
        if isinstance(a, Literal) and lay.axis is not None:
            return False
        if lay.axis is not None and (lay.axis >= len(a.aval.shape) or not splittable(a.aval.shape[lay.axis], n)):
            return False
    return True


def _wanted_layouts(graph: Graph, out_layouts: Sequence[Layout]) -> dict:
    """``var -> (layout, k)``: the layout a value is wanted in by ``k`` of the graph's outputs it reaches
    through chains of elementwise equations of the same shape (an optimizer update carries a parameter's
    output layout back to its gradient, which reaches the new parameter and both moments), found by one pass
    in reverse order."""
    reach: dict = {}
    for a, lay in zip(graph.outvars, out_layouts):
        if isinstance(a, Var):
            reach.setdefault(a, (lay, {a}))
    for e in reversed(graph.eqns):
        hit = reach.get(e.outputs[0]) if len(e.outputs) == 1 else None
        if hit is None or "elementwise" not in e.prim.traits and e.prim.name != "stop_gradient":
            continue
        lay, outs = hit
        for a in e.inputs:
            if isinstance(a, Var) and a.aval.shape == e.outputs[0].aval.shape:
                prev = reach.get(a)
                if prev is None:
                    reach[a] = (lay, set(outs))
                elif prev[0] == lay:
                    prev[1].update(outs)
    return {v: (lay, len(outs)) for v, (lay, outs) in reach.items()}


def _decision_key(s: Strategy, e: Eqn, n: int, cost: CostModel, cheapest: Any, wanted: tuple | None) -> tuple:
    comm = 0.0
    sliced = 0
    for a, lay in zip(e.inputs, s.ins):
        t, src = cheapest(a, lay)
        if src.axis is None and lay.axis is not None:  # a split made from a whole (replicated or partial) value
            sliced += 1
            if src.partial:
                # a reduce-scatter and the all-gather a later consumer will likely need cost what the all-reduce
                # to replicated does, and one message more: charged that, so that the split is taken only where
                # the compute it saves pays for a message
                t = cost.collective_time("all_reduce", nbytes(a.aval), n) + cost.alpha
            else:
                # slicing is free, but the value may have to be gathered again: half an all-gather (the
                # alternative, gathering another operand, usually costs a whole one)
                t += 0.5 * cost.collective_time("all_gather", nbytes(a.aval), n)
        comm += t
    out = e.outputs[0]
    if wanted is not None:  # the redistribution to the layout the outputs want it in: once for a partial value
        lay, k = wanted     # (resolved before the chain), once per output the chain reaches for a split one
        times = 1 if s.out.partial is not None else k
        comm += times * sum(c.time(nbytes(out.aval), n, cost.alpha, cost.beta, cost.chunk_bytes) for c in plan(s.out, lay))
    elif s.out.partial is not None:  # the all-reduce this partial value will need
        comm += cost.collective_time("all_reduce", nbytes(out.aval), n)
    if s.out.axis is not None and all(lay.axis is None for lay in s.ins):
        sliced += 1  # a split made from no split input
    ins = [local_shape(a.aval.shape, lay, n) for a, lay in zip(e.inputs, s.ins)]
    compute = cost.compute_time(e.prim.name, ins, local_shape(out.aval.shape, s.out, n), out.aval.dtype.itemsize,
                                [a.aval.dtype.itemsize for a in e.inputs])
    return (comm + compute, sliced)


__all__ = ["NO_RULE", "ShardedProgram", "ShardingError", "Step", "check_layout", "shard_graph"]
