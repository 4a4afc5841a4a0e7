"""Conformance of sharded training: an MLP classifier's Adam step sharded by each of the classic layouts
(replicated, data parallel, column- and row-sharded dense layers, a class-sharded softmax cross-entropy head,
and the hybrid of a data-parallel body with a class-sharded head:
the partitions of Megatron-LM, Shoeybi et al. 2019, and MindSpore's hybrid parallelism, Su et al. 2021) against
the same step run in one process by ``engine.jit``. Each rank runs :func:`check_strategies` with its
communicator (threads, or one process per rank through ``collectives.launch.spawn``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import ops, optim
from ..jit import jit
from ..core.pytree import tree_flatten, tree_unflatten
from ..transforms.autodiff import value_and_grad
from ..primitives.sharding import Layout, R, S
from .api import Mesh, block, layouts_for, shard_jit
from .cost import CostModel

STRATEGIES = ("replicated", "data_parallel", "column", "row", "class", "hybrid")


def init_mlp(features: int, hidden: int, classes: int, seed: int = 0, dtype: Any = np.float32) -> dict:
    """A two-layer classifier ``tanh(x W1 + b1) W2 + b2`` (Glorot-scaled normal weights)."""
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(dtype),
            "b1": (0.1 * rng.standard_normal(hidden)).astype(dtype),
            "w2": (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(dtype),
            "b2": (0.1 * rng.standard_normal(classes)).astype(dtype)}


def loss_fn(params: dict, x: Any, y: Any) -> Any:
    h = ops.tanh(ops.matmul(x, params["w1"]) + params["b1"])
    return ops.cross_entropy(ops.matmul(h, params["w2"]) + params["b2"], y)


def make_step(lr: float = 1e-2) -> tuple[Any, Any]:
    """``(optimizer, step)``: ``step(params, state, x, y) -> (params, state, loss)`` with per-leaf Adam moments
    (``fused=False``: a flat moment vector would mix leaves of different layouts)."""
    opt = optim.adam(lr, fused=False)

    def step(params: dict, state: dict, x: Any, y: Any) -> tuple:
        loss, grads = value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(grads, state, params)
        return params, state, loss

    return opt, step


def layouts(strategy: str) -> tuple[dict | Layout, Layout]:
    """``(parameter layouts, batch layout)`` of a named strategy."""
    table = {
        "replicated": (R, R),
        "data_parallel": (R, S(0)),
        "column": ({"w1": S(1), "b1": S(0), "w2": R, "b2": R}, R),
        "row": ({"w1": S(1), "b1": S(0), "w2": S(0), "b2": R}, R),
        "class": ({"w1": R, "b1": R, "w2": S(1), "b2": S(0)}, R),
        "hybrid": ({"w1": R, "b1": R, "w2": S(1), "b2": S(0)}, S(0)),  # MindSpore's: body data parallel, head split
    }
    if strategy not in table:
        raise ValueError(f"strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    return table[strategy]


def local_tree(tree: Any, spec: Any, rank: int, n: int) -> Any:
    leaves, td = tree_flatten(tree)
    return tree_unflatten(td, [block(a, lay, rank, n) for a, lay in zip(leaves, layouts_for(spec, tree, "tree"))])


def global_tree(blocks_per_rank: Sequence[Any], spec: Any) -> Any:
    """Reassemble a tree from every rank's blocks."""
    first, td = tree_flatten(blocks_per_rank[0])
    lays = layouts_for(spec, blocks_per_rank[0], "tree")
    per = [tree_flatten(b)[0] for b in blocks_per_rank]
    return tree_unflatten(td, [np.concatenate([p[i] for p in per], axis=lay.axis) if lay.axis is not None else first[i]
                               for i, lay in enumerate(lays)])


def check_strategies(comm: Any, strategies: Sequence[str] = STRATEGIES, steps: int = 10, batch: int = 8,
                     features: int = 8, hidden: int = 16, classes: int = 12, seed: int = 0,
                     cost: CostModel | None = None) -> dict:
    """Train ``steps`` Adam steps sharded by each strategy on ``comm``'s ranks and once in this process with
    ``engine.jit``; returns per strategy this rank's final parameter blocks, the matching blocks of the
    single-process parameters and the sharded program's text."""
    n, rank = comm.world_size, comm.rank
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, features)).astype(np.float32)
    y = rng.integers(0, classes, batch)
    params = init_mlp(features, hidden, classes, seed)
    opt, step = make_step()
    ref_p, ref_s = params, opt.init(params)
    single = jit(step)
    for _ in range(steps):
        ref_p, ref_s, _ = single(ref_p, ref_s, x, y)
    out = {}
    for name in strategies:
        pspec, xspec = layouts(name)
        sspec = {"count": R, "mu": pspec, "nu": pspec}
        fn = shard_jit(step, Mesh(comm), in_shardings=(pspec, sspec, xspec, xspec), out_shardings=(pspec, sspec, R),
                       cost=cost)
        p, s = local_tree(params, pspec, rank, n), local_tree(opt.init(params), sspec, rank, n)
        xb, yb = block(x, xspec, rank, n), block(y, xspec, rank, n)
        losses = []
        for _ in range(steps):
            p, s, loss = fn(p, s, xb, yb)
            losses.append(float(loss))
        out[name] = {"params": p, "reference": local_tree(ref_p, pspec, rank, n), "losses": losses,
                     "program": str(fn.lower(p, s, xb, yb)[0])}
    return out


__all__ = ["STRATEGIES", "check_strategies", "global_tree", "init_mlp", "layouts", "local_tree", "loss_fn", "make_step", "state_layouts"]


def state_layouts(pspec: Any) -> dict:
    """Layouts of the Adam state of parameters laid out as ``pspec``."""
    return {"count": R, "mu": pspec, "nu": pspec}
