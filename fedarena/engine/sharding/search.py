"""Strategy search: pick the layouts of a program's inputs (parameters, optimizer state, batch) that minimise the
predicted step time on ``n`` ranks within a per-rank memory budget, every other operator's strategy following
by cost-driven propagation (:mod:`.propagate`).

MindSpore's auto-parallel searches per-operator strategies with a cost model of computation, communication and
memory and reduces the graph by eliminating operators and edges before a dynamic programme over what remains
(Su et al., 2021; the cost model follows Wang et al., EuroSys 2019). Here the search space is the product of a
few layouts per decision point (each layer's weight: replicated, split by columns or by rows; the batch:
replicated or split), enumerated exhaustively, and each point is scored by sharding the traced training-step
graph and evaluating the :class:`~.cost.CostModel` on the result: an exact search over that space, not the
paper's elimination over every operator's strategies.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..core.ir import ShapedArray
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import trace_flat
from ..primitives.sharding import R, S
from .api import layouts_for
from .cost import CostModel
from .propagate import ShardedProgram, ShardingError, shard_graph


@dataclass
class Plan:
    """One point of the search: its layouts, sharded program and predicted cost per rank."""

    name: str
    in_shardings: Any
    out_shardings: Any
    program: ShardedProgram
    compute_time: float
    comm_time: float
    comm_bytes: float
    memory: int
    fits: bool
    model_compute_time: float = 0.0


    @property
    def time(self) -> float:
        return self.compute_time + self.comm_time

    @property
    def model_time(self) -> float:
        """The step time with the model's compute (``model_compute_time``) instead of measured segments."""
        return self.model_compute_time + self.comm_time


def trace_global(fn: Callable, args: Any) -> tuple[Any, Any, Any]:
    """``(graph, out_value, treedef)`` of ``fn`` traced at the global types of ``args`` (a tree of arrays or
    :class:`ShapedArray`)."""
    leaves, treedef = tree_flatten(args)
    avals = [x if isinstance(x, ShapedArray) else ShapedArray(x.shape, x.dtype) for x in leaves]
    out: list = []

    def flat_fn(tracers: list) -> list:
        value = fn(*tree_unflatten(treedef, tracers))
        out.append(value)
        return tree_flatten(value)[0]

    graph, captured = trace_flat(flat_fn, avals)
    if captured:
        raise ShardingError("search: the function closes over values traced by an enclosing transformation")
    return graph, out[0], treedef


def search(fn: Callable, args: Any, n: int, candidates: Mapping[str, tuple[Any, Any]], cost: CostModel,
           memory_budget: float | None = None, baseline_bytes: float = 0.0,
           measured: Mapping[str, Sequence[float]] | None = None) -> tuple[Plan, list[Plan]]:
    """Score every candidate ``name -> (in_shardings, out_shardings)`` of ``fn`` on ``n`` ranks; return the
    fastest plan whose predicted peak memory plus ``baseline_bytes`` (what a rank's process holds besides the
    program's arrays) is within ``memory_budget`` bytes, and all plans (fastest first). Raises when none fits.
    ``measured`` maps a plan's name to the measured seconds of its compiled segments (``cost.profile_segments``,
    run where the plan will run): that plan's compute is then measured, not modelled (``model_compute_time``
    keeps the model's figure)."""
    graph, out_value, _ = trace_global(fn, args)
    plans = []
    for name, (ins, outs) in candidates.items():
        try:
            program = shard_graph(graph, n, layouts_for(ins, args, "in_shardings"),
                                  layouts_for(outs, out_value, "out_shardings"), cost)
        except ShardingError:
            continue  # a layout that does not divide these shapes on n ranks
        comm_t, comm_b = program.predicted_comm()
        mem = program.predicted_memory()
        fits = memory_budget is None or mem + baseline_bytes <= memory_budget
        model = program.predicted_compute()
        seg = (measured or {}).get(name)
        compute = model if seg is None else program.predicted_compute(seg)
        plans.append(Plan(name, ins, outs, program, compute, comm_t, comm_b, mem, fits, model))
    plans.sort(key=lambda p: p.time)
    ok = [p for p in plans if p.fits]
    if not ok:
        smallest = min(plans, key=lambda p: p.memory) if plans else None
        raise ShardingError(f"memory_budget: no strategy fits {memory_budget / 2**20:.0f} MiB per rank"
                            + (f" (the smallest needs {(smallest.memory + baseline_bytes) / 2**20:.0f} MiB)" if smallest else ""))
    return ok[0], plans


LAYER_LAYOUTS = {"R": (R, R), "col": (S(1), S(0)), "row": (S(0), R)}
"""A dense layer's layouts: ``(weight, bias)`` replicated, split by columns, split by rows."""


def layer_candidates(layers: Mapping[str, Sequence[str]], state_of: Callable[[Any], Any],
                     batch_args: int = 2) -> dict[str, tuple[Any, Any]]:
    """The product space of per-layer layouts of a dense network trained by ``step(params, state, *batch)``:
    each layer ``name`` (weight ``w<name>``, bias ``b<name>``) takes the options listed for it from
    :data:`LAYER_LAYOUTS`, times the batch replicated or split along its first axis; the optimizer state
    follows the parameters (``state_of(param_layouts)``), the step returns them in the same layouts."""
    out = {}
    names = list(layers)
    for batch in ("R", "S0"):
        xs = R if batch == "R" else S(0)
        for combo in itertools.product(*(layers[name] for name in names)):
            pspec = {}
            for name, opt in zip(names, combo):
                pspec[f"w{name}"], pspec[f"b{name}"] = LAYER_LAYOUTS[opt]
            key = f"batch:{batch} " + " ".join(f"l{name}:{opt}" for name, opt in zip(names, combo))
            out[key] = ((pspec, state_of(pspec)) + (xs,) * batch_args, (pspec, state_of(pspec), R))
    return out


__all__ = ["LAYER_LAYOUTS", "Plan", "layer_candidates", "search", "trace_global"]
