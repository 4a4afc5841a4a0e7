"""Update rules shared by the RL learners: Adam with the learning rate as a graph input, global-norm clipping.

The learning rate is an argument of the compiled step rather than a constant baked into it, so
annealing schedules (PPO) do not recompile. Adam: Kingma & Ba (2015), Algorithm 1, with epsilon added
outside the square root (PyTorch's convention, which the tests compare against). Global-norm
clipping: Pascanu, Mikolov & Bengio (2013), section 3.2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena.engine import ops, tree_leaves, tree_map


def adam_init(params: Any) -> dict[str, Any]:
    """Adam state: step count and first/second moment estimates shaped like ``params``."""
    zeros = tree_map(lambda p: np.zeros(np.shape(p), dtype=np.float32), params)
    return {"count": np.zeros((), dtype=np.float32), "mu": zeros,
            "nu": tree_map(lambda p: np.zeros(np.shape(p), dtype=np.float32), params)}


def adam_step(params: Any, grads: Any, state: dict[str, Any], lr: Any, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-5) -> tuple[Any, dict[str, Any]]:
    """One Adam update; ``lr`` may be a traced scalar. eps = 1e-5 follows the PPO/IMPALA implementations."""
    count = state["count"] + 1.0
    mu = tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, state["mu"], grads)
    nu = tree_map(lambda v, g: b2 * v + (1.0 - b2) * ops.square(g), state["nu"], grads)
    c1 = 1.0 - ops.power(ops.full_like(count, b1), count)
    c2 = 1.0 - ops.power(ops.full_like(count, b2), count)
    step = lr / c1
    new_params = tree_map(lambda p, m, v: p - step * m / (ops.sqrt(v / c2) + eps), params, mu, nu)
    return new_params, {"count": count, "mu": mu, "nu": nu}


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, Any]:
    """Scale ``grads`` so their joint L2 norm is at most ``max_norm``; returns (grads, norm before clipping)."""
    norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in tree_leaves(grads)))
    scale = ops.minimum(1.0, max_norm / (norm + 1e-6))
    return tree_map(lambda g: g * scale, grads), norm
