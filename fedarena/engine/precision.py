"""Mixed-precision training for the engine: parameters and optimiser state in float32, the loss
computed in float16 or bfloat16, and dynamic loss scaling for float16, after Micikevicius et al.,
"Mixed Precision Training" (ICLR 2018), sec. 3.

The loss scaler follows the semantics documented for PyTorch's ``torch.amp.GradScaler``: the loss
is multiplied by ``scale`` before differentiation and the gradients divided by it; a step whose
unscaled gradients hold an inf or NaN is skipped (parameters and optimiser state unchanged) and
the scale multiplied by ``backoff_factor`` (the count of good steps reset to 0); after
``growth_interval`` consecutive finite steps the scale is multiplied by ``growth_factor``.

Everything is a traceable function of arrays (the skip is a ``where``, not a Python branch), so a
step built by :func:`mixed_precision_step` compiles as one graph on every backend — on the cupy
backend one CUDA graph, with the float16/bfloat16 arithmetic in its generated kernels and the
matmuls on tensor cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import ops
from .core.ir import check_dtype, is_float
from .core.pytree import tree_leaves, tree_map
from .transforms.autodiff import value_and_grad


@dataclass(frozen=True)
class Policy:
    """Which dtype parameters are kept in (``param_dtype``) and the loss is computed in
    (``compute_dtype``); ``loss_scaling``: whether the step scales the loss (on for float16,
    whose range underflows small gradients; off for bfloat16, which has float32's range)."""

    param_dtype: Any = np.float32
    compute_dtype: Any = np.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_dtype", check_dtype(self.param_dtype, "Policy.param_dtype"))
        object.__setattr__(self, "compute_dtype", check_dtype(self.compute_dtype, "Policy.compute_dtype"))

    @property
    def loss_scaling(self) -> bool:
        return self.compute_dtype == np.float16

    def cast_to_compute(self, tree: Any) -> Any:
        """Float leaves of ``tree`` cast to ``compute_dtype`` (integer leaves unchanged)."""
        return tree_map(lambda x: ops.astype(x, self.compute_dtype) if is_float(np.dtype(x.dtype)) else x, tree)


def policy(name: str) -> Policy:
    """``"float32"``, ``"bfloat16"`` (bf16 compute, float32 parameters) or ``"float16"`` (fp16
    compute with loss scaling, float32 parameters)."""
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"precision: {name!r} is not one of float32, bfloat16, float16")
    return Policy(np.float32, name)


def loss_scale_init(init_scale: float = 2.0**16) -> dict:
    """The loss scaler's state: ``scale`` (float32) and ``good_steps`` (finite steps since the last change)."""
    if not (init_scale > 0 and np.isfinite(init_scale)):
        raise ValueError(f"loss_scale_init: init_scale must be a positive finite number, got {init_scale!r}")
    return {"scale": np.asarray(init_scale, np.float32), "good_steps": np.asarray(0, np.int32)}


def update_loss_scale(state: dict, finite: Any, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                      growth_interval: int = 2000) -> dict:
    """The scaler's next state after a step whose gradients were all finite (``finite``) or not."""
    scale, good = state["scale"], state["good_steps"]
    good_next = ops.where(finite, good + 1, ops.zeros_like(good))
    grow = good_next >= growth_interval
    scale_next = ops.where(finite, ops.where(grow, scale * growth_factor, scale), scale * backoff_factor)
    return {"scale": ops.astype(scale_next, np.float32),
            "good_steps": ops.astype(ops.where(grow, ops.zeros_like(good), good_next), np.int32)}


def mixed_precision_step(loss_fn: Callable, optimizer: Any, prec: Policy, growth_factor: float = 2.0,
                         backoff_factor: float = 0.5, growth_interval: int = 2000) -> Callable:
    """``step(params, opt_state, scale_state, *batch) -> (params, opt_state, scale_state, loss, finite)``.

    ``loss_fn(params, *batch)`` sees the parameters cast to ``prec.compute_dtype``; gradients come
    back in the parameters' dtype, divided by the scale; a step with a non-finite gradient leaves
    parameters and optimiser state as they were.  Without loss scaling (``prec.loss_scaling``
    false) the scale stays 1 and only the skip of non-finite steps remains."""

    def scaled_loss(params, scale, *batch):
        loss = ops.astype(loss_fn(prec.cast_to_compute(params), *batch), np.float32)
        return loss * scale, loss

    def step(params, opt_state, scale_state, *batch):
        scale = scale_state["scale"] if prec.loss_scaling else ops.ones_like(scale_state["scale"])
        (_, loss), grads = value_and_grad(scaled_loss, has_aux=True)(params, scale, *batch)
        grads = tree_map(lambda g: g / ops.astype(scale, g.dtype), grads)
        finite = ops.all(ops.stack([ops.all(ops.isfinite(g)) for g in tree_leaves(grads)]))
        safe = tree_map(lambda g: ops.where(finite, g, ops.zeros_like(g)), grads)
        new_params, new_state = optimizer.update(safe, opt_state, params)
        params = tree_map(lambda n, o: ops.where(finite, n, o), new_params, params)
        opt_state = tree_map(lambda n, o: ops.where(finite, n, o), new_state, opt_state)
        if prec.loss_scaling:
            scale_state = update_loss_scale(scale_state, finite, growth_factor, backoff_factor, growth_interval)
        return params, opt_state, scale_state, loss, finite

    return step
