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


def init_mlp(features: int, hidden: int | Sequence[int], classes: int, seed: int = 0, dtype: Any = np.float32) -> dict:
    """An MLP classifier: ``tanh`` hidden layers of the sizes in ``hidden`` then the head; layer ``i`` (from 1)
    has weight ``w<i>`` and bias ``b<i>`` (Glorot-scaled normal weights), the head is the last."""
    sizes = [features] + ([hidden] if isinstance(hidden, int) else list(hidden)) + [classes]
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"w{i}"] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype)
        params[f"b{i}"] = (0.1 * rng.standard_normal(b)).astype(dtype)
    return params


def loss_fn(params: dict, x: Any, y: Any) -> Any:
    """Mean softmax cross-entropy of the MLP's logits."""
    layers = len(params) // 2
    h = x
    for i in range(1, layers):
        h = ops.tanh(ops.matmul(h, params[f"w{i}"]) + params[f"b{i}"])
    return ops.cross_entropy(ops.matmul(h, params[f"w{layers}"]) + params[f"b{layers}"], y)


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
