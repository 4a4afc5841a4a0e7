"""The one interpreter of the IR: walk a graph's equations in order, computing each output from
its inputs' values with a rule, over any value domain.

Eager evaluation and inlining (``tracing.eval_graph``: the rule is ``bind``), the autodiff
forward replay (values plus which of them carry a gradient), forward mode (primal and tangent
pairs), batching (value and whether it has a batch axis) and the profiler's per-equation timing
(``profiler.profile_graph``: each numpy kernel call timed) are rules given to :func:`interpret`;
only the rule and the lifting of constants into the domain differ.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .ir import Eqn, Graph, Literal, Var

Rule = Callable[[Eqn, list], Any]


def literal_value(a: Literal) -> Any:
    """A literal as the value bind expects: Python scalars stay weak, numpy ones keep their dtype."""
    return a.value if a.weak else np.asarray(a.value, a.aval.dtype)[()]


def interpret(
    graph: Graph,
    args: Sequence[Any],
    rule: Rule,
    lift: Callable[[Any], Any] = lambda v: v,
    free: bool = False,
) -> tuple[list, dict]:
    """Run ``graph`` on ``args`` (already in the domain): ``rule(eqn, input_values)`` gives the
    value of the equation's output (a sequence of values, one per output, for a primitive with
    ``multiple_results``); ``lift`` brings constants and literals into the domain.
    Returns the output values and the environment (variable -> value). ``free``: each value is
    dropped from the environment after its last reader (the graph's outputs are kept), so a large
    graph does not hold all its intermediates at once; the environment returned then holds less."""
    env: dict[Var, Any] = {v: lift(c) for v, c in zip(graph.constvars, graph.consts)}
    env.update(zip(graph.invars, args))
    dead: list = [()] * len(graph.eqns)
    if free:
        last = {a: i for i, e in enumerate(graph.eqns) for a in e.inputs if isinstance(a, Var)}
        keep = set(graph.outvars)
        dead = [[a for a in dict.fromkeys(e.inputs) if isinstance(a, Var) and last[a] == i and a not in keep]
                for i, e in enumerate(graph.eqns)]

    def read(a: Any) -> Any:
        return lift(literal_value(a)) if isinstance(a, Literal) else env[a]

    for e, gone in zip(graph.eqns, dead):
        out = rule(e, [read(a) for a in e.inputs])
        if e.prim.multiple_results:
            out = list(out)
            if len(out) != len(e.outputs):
                raise ValueError(f"{e.prim.name}: the rule gave {len(out)} values for {len(e.outputs)} outputs")
            env.update(zip(e.outputs, out))
        else:
            env[e.outputs[0]] = out
        for a in gone:
            env.pop(a, None)
    return [read(a) for a in graph.outvars], env


__all__ = ["interpret", "literal_value"]
