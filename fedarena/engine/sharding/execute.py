"""Run one rank's part of a sharded program on the engine's compiled executor: the program's local equations
are cut into segments at its host steps (the redistribution collectives, which call the transports, and the
local kernels that depend on the rank), each segment is compiled once by ``engine.jit`` (the numpy backend's
compiled schedule, or whole-graph native code where the segment is small), and the host steps run between the
segments as Python calls.

Segments are cut by level, the number of host steps on the longest path into an equation: an equation runs in
the first segment after every host step it depends on, so a program runs as many segments as its longest chain
of host steps plus one (a data-parallel step: the forward and backward pass, its gradients' all-reduces, the
optimizer update: two), not one per collective. GSPMD (Xu et al., 2021) and MindSpore (Su et al., 2021)
compile each rank's program whole with the collectives as operators of the device program; here the
collectives run over the host's transports, so they are the cut points.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.interpreter import literal_value
from ..core.ir import Eqn, Graph, Literal, ShapedArray, Var
from ..core.tracing import eval_graph
from ..jit import jit
from .cost import timed_median


def is_host_step(step: Any) -> bool:
    """A step that runs in Python between compiled segments: a redistribution or a rank-dependent kernel."""
    return step.collective is not None or step.kernel is not None


def levels(steps: Sequence[Any]) -> list[int]:
    """Per step, the number of host steps on the longest path into it (a host step counts itself for what
    reads its outputs, not for itself)."""
    level: dict = {}
    out = []
    for s in steps:
        lv = max((level.get(a, 0) for a in s.inputs if isinstance(a, Var)), default=0)
        out.append(lv)
        for v in s.outputs:
            level[v] = lv + 1 if is_host_step(s) else lv
    return out


def execution_order(steps: Sequence[Any]) -> list[tuple[int, list[int]]]:
    """``[(level, [step indices])]``: each level's equations (one segment), then the host steps that read
    values of that level, in program order within each group; the groups alternate segment, host steps."""
    lv = levels(steps)
    groups: list[tuple[int, list[int]]] = []
    for level in range(max(lv, default=-1) + 1):
        seg = [i for i, s in enumerate(steps) if lv[i] == level and not is_host_step(s)]
        host = [i for i, s in enumerate(steps) if lv[i] == level and is_host_step(s)]
        if seg:
            groups.append((level, seg))
        if host:
            groups.append((level, host))
    return groups


class Segment:
    """A run of local equations compiled as one graph: reads ``invars`` (program variables), writes
    ``outvars``."""

    def __init__(self, graph: Graph, invars: list, outvars: list) -> None:
        self.graph, self.invars, self.outvars = graph, invars, outvars
        self.fn = jit(self._evaluate)

    def _evaluate(self, *xs: Any) -> list:
        return eval_graph(self.graph, xs)

    def __call__(self, *xs: Any) -> list:
        return self.fn(*xs)


class LocalProgram:
    """The compiled schedule of one rank: ``items`` alternate :class:`Segment` and host steps, in the order
    every rank runs them (the same on all ranks, so their collectives match)."""

    def __init__(self, program: Any) -> None:
        self.program = program
        steps = program.steps
        consts = dict(zip(program.graph.constvars, program.graph.consts))
        local: dict = {}

        def loc(a: Any) -> Any:
            if isinstance(a, Literal):
                return a
            v = local.get(a)
            if v is None:
                v = local[a] = Var(program.local_aval(a))
            return v

        groups = execution_order(steps)
        order = [i for _, idx in groups for i in idx]
        # where each value is read last in the execution order (program outputs: after the end)
        last: dict = {}
        for pos, i in enumerate(order):
            for a in steps[i].inputs:
                if isinstance(a, Var):
                    last[a] = pos
        for a in program.outputs:
            if isinstance(a, Var):
                last[a] = len(order)
        self.items: list = []
        ends: list[int] = []  # the position in ``order`` after each item
        pos = 0
        for _, idx in groups:
            if is_host_step(steps[idx[0]]):
                for i in idx:
                    pos += 1
                    self.items.append(("host", steps[i]))
                    ends.append(pos)
                continue
            made: set = set()
            ins: list = []
            cvars: list = []
            seen: set = set()
            eqns = []
            for i in idx:
                s = steps[i]
                for a in s.inputs:
                    if isinstance(a, Var) and a not in made and a not in seen:
                        seen.add(a)
                        (cvars if a in consts else ins).append(a)
                eqns.append(Eqn(s.prim, [loc(a) for a in s.inputs], [loc(v) for v in s.outputs], s.attrs, None))
                made.update(s.outputs)
            pos += len(idx)
            outs = [v for i in idx for v in steps[i].outputs if last.get(v, -1) >= pos]
            if outs:
                graph = Graph([loc(a) for a in ins], [loc(a) for a in cvars], [consts[a] for a in cvars], eqns,
                              [loc(v) for v in outs])
                self.items.append(("segment", Segment(graph, ins, outs)))
                ends.append(pos)
        self.segments = [it for kind, it in self.items if kind == "segment"]
        # the values each item reads for the last time, freed after it (the program's inputs stay the caller's)
        keep = set(program.graph.invars) | set(program.graph.constvars)
        self.frees = []
        for (kind, it), end in zip(self.items, ends):
            reads = it.invars if kind == "segment" else [a for a in it.inputs if isinstance(a, Var)]
            self.frees.append([a for a in dict.fromkeys(reads) if a not in keep and last.get(a, -1) < end])

    def run(self, comm: Any, env: dict, profile: list | None = None, repeats: int = 3, seconds: float = 0.05) -> None:
        """Run on ``env`` (program variable -> this rank's array; inputs and constants filled in), adding
        every value a later item or the program's outputs read. Given a list ``profile``, each segment is
        also run again on its inputs (at least ``repeats`` times, until ``seconds`` have passed) and its
        median seconds appended: the measured compute of this step's segments, in order."""
        rank, n = comm.rank, comm.world_size

        def read(a: Any) -> Any:
            return np.asarray(literal_value(a)) if isinstance(a, Literal) else env[a]

        for (kind, it), free in zip(self.items, self.frees):
            if kind == "segment":
                xs = [env[a] for a in it.invars]
                got = it(*xs)
                if profile is not None:
                    profile.append(timed_median(lambda: it(*xs), repeats, seconds))
                del xs
                for v, x in zip(it.outvars, got):
                    env[v] = np.asarray(x)  # 0-d results as arrays: a numpy scalar would be a static argument
            elif it.collective is not None:
                env[it.outputs[0]] = np.asarray(it.collective.run(comm, np.asarray(read(it.inputs[0]))))
            else:
                env[it.outputs[0]] = np.asarray(it.kernel(rank, n, *[read(a) for a in it.inputs], **it.attrs))
            for a in free:
                env.pop(a, None)


__all__ = ["LocalProgram", "Segment", "execution_order", "is_host_step", "levels"]
