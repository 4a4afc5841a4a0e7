"""Run one rank's part of a sharded program on the engine's compiled executor: the program's local equations
are cut into segments at its host steps (the redistribution collectives, which call the transports, and the
local kernels that depend on the rank), each segment is compiled once by ``engine.jit`` (the numpy backend's
compiled schedule, or whole-graph native code where the segment is small; a segment whose intermediates are
larger than :data:`MAX_HELD_BYTES` runs eagerly, so that the buffers of a large head's activations are not held
between steps), and the host steps run between the segments as Python calls.

Segments are cut by level, the number of host steps on the longest path into an equation: a host step runs as
soon as its inputs are made, an equation in the latest segment its readers allow (so values computed from the
inputs alone for the optimizer's update are not made early and held through the step), and a program runs as
many segments as its longest chain of host steps plus one, not one per collective (a data-parallel step: the
forward pass, the loss's all-reduce, the backward pass, the gradients' all-reduces, the update: three). GSPMD (Xu et al., 2021) and MindSpore (Su et al., 2021)
compile each rank's program whole with the collectives as operators of the device program; here the
collectives run over the host's transports, so they are the cut points.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ..core.interpreter import interpret, literal_value
from ..core.ir import Eqn, Graph, Literal, Var
from ..core.tracing import bind_rule, eval_graph
from ..compiler.passes import DEFAULT_PIPELINE
from ..jit import jit


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


def execution_order(steps: Sequence[Any], outputs: Sequence[Any] = ()) -> list[tuple[int, list[int]]]:
    """``[(level, [step indices])]``: each level's equations (one segment), then the host steps that read
    values of that level, in program order within each group; the groups alternate segment, host steps. A host
    step runs as early as its inputs allow; an equation as late as its readers allow (its level is the least
    level any reader needs it by), so a value computed from the inputs alone for the optimizer's update is not
    made in the first segment and held through the whole step."""
    asap = levels(steps)
    last = max([lv + 1 if is_host_step(s) else lv for lv, s in zip(asap, steps)], default=0)
    need: dict = {a: last for a in outputs if isinstance(a, Var)}
    lv = list(asap)
    for i in range(len(steps) - 1, -1, -1):
        s = steps[i]
        if not is_host_step(s):
            lv[i] = max(asap[i], min((need.get(v, last) for v in s.outputs), default=last))
        for a in s.inputs:
            if isinstance(a, Var):
                need[a] = min(need.get(a, last), lv[i])
    groups: list[tuple[int, list[int]]] = []
    for level in range(last + 1):
        seg = [i for i, s in enumerate(steps) if lv[i] == level and not is_host_step(s)]
        host = [i for i, s in enumerate(steps) if lv[i] == level and is_host_step(s)]
        if seg:
            groups.append((level, seg))
        if host:
            groups.append((level, host))
    return groups


MAX_HELD_BYTES = 16 << 20
"""Largest total of intermediate values (after the compiler's default passes: fusion keeps an elementwise
chain's temporaries out) a segment runs compiled with: a compiled program holds its buffers between calls, so a
segment with more (the activations of a large head) runs eagerly instead, one numpy kernel an equation with
each value freed after its last use, where its arithmetic, milliseconds an equation, dwarfs the dispatch."""


def held_bytes(graph: Graph) -> int:
    """Bytes of the values a graph computes and does not return, after the compiler's default passes."""
    g = DEFAULT_PIPELINE(graph)
    outs = set(a for a in g.outvars if isinstance(a, Var))
    return sum(v.aval.size * v.aval.dtype.itemsize for e in g.eqns for v in e.outputs if v not in outs)


class Segment:
    """A run of local equations compiled as one graph: reads ``invars`` (program variables), writes
    ``outvars``. The inputs listed in ``donated`` (values that die here and that the program made, not its
    caller's inputs) are given up to the compiled program, whose outputs may take their memory
    (``engine.jit``'s ``donate_argnums``).
    A segment whose intermediates exceed :data:`MAX_HELD_BYTES` runs eagerly (``compiled`` is False)."""

    def __init__(self, graph: Graph, invars: list, outvars: list, donated: Sequence[int] = ()) -> None:
        self.graph, self.invars, self.outvars = graph, invars, outvars
        self.compiled = held_bytes(graph) <= MAX_HELD_BYTES
        self.donate(donated)

    def donate(self, donated: Sequence[int]) -> None:
        """Compile (on the next call) giving up the inputs at positions ``donated``."""
        self.donated = tuple(donated) if self.compiled else ()
        self.fn = jit(self._evaluate, donate_argnums=self.donated) if self.compiled else self._eager

    def _evaluate(self, *xs: Any) -> list:
        return eval_graph(self.graph, xs)

    def _eager(self, *xs: Any) -> list:  # each value freed after its last use
        return interpret(self.graph, xs, bind_rule, free=True)[0]

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

        groups = execution_order(steps, program.outputs)
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
            if kind == "segment":  # what dies here was made by the program: its memory may hold the outputs
                dying = set(self.frees[-1])
                it.donate([i for i, a in enumerate(it.invars) if a in dying])

    def run(self, comm: Any, env: dict, profile: list | None = None, hosts: list | None = None) -> None:
        """Run on ``env`` (program variable -> this rank's array; inputs and constants filled in), adding
        every value a later item or the program's outputs read. Given a list ``profile``, the seconds of each
        segment's call in this step are appended, in order: the measured compute of the segments as the step
        runs them (the same compiled program, its donated inputs, its caches), dispatch included. Given a list
        ``hosts``, the seconds of each host step's own call (a collective's ``run``, a kernel) are appended."""
        rank, n = comm.rank, comm.world_size

        def read(a: Any) -> Any:
            return np.asarray(literal_value(a)) if isinstance(a, Literal) else env[a]

        for (kind, it), free in zip(self.items, self.frees):
            if kind == "segment":
                xs = [env[a] for a in it.invars]
                t0 = time.perf_counter()
                got = it(*xs)
                if profile is not None:
                    profile.append(time.perf_counter() - t0)
                del xs
                for v, x in zip(it.outvars, got):
                    env[v] = np.asarray(x)  # 0-d results as arrays: a numpy scalar would be a static argument
                del got
            elif it.collective is not None:
                x = np.asarray(read(it.inputs[0]))
                t0 = time.perf_counter()
                y = it.collective.run(comm, x)
                if hosts is not None:
                    hosts.append(time.perf_counter() - t0)
                env[it.outputs[0]] = np.asarray(y)
                del x, y
            else:
                xs = [read(a) for a in it.inputs]
                t0 = time.perf_counter()
                y = it.kernel(rank, n, *xs, **it.attrs)
                if hosts is not None:
                    hosts.append(time.perf_counter() - t0)
                env[it.outputs[0]] = np.asarray(y)
                del xs, y
            for a in free:
                env.pop(a, None)


__all__ = ["LocalProgram", "MAX_HELD_BYTES", "Segment", "held_bytes", "execution_order", "is_host_step", "levels"]
