"""Carlini-Wagner L2 attack (N. Carlini, D. Wagner, "Towards Evaluating the Robustness of Neural Networks",
IEEE S&P 2017), untargeted, on engine models.

Change of variables ``x' = (tanh(w) + 1) / 2`` keeps ``x'`` in [0, 1]. For each example, Adam minimises
``||x' - x||_2^2 + c * max(Z_y(x') - max_{i != y} Z_i(x'), -kappa)`` over ``w`` (``Z`` the logits) for ``steps``
iterations from ``w = atanh(2x - 1)``; a binary search over ``c`` (``binary_search_steps`` rounds, starting at
``initial_const``; a success halves the interval toward smaller ``c``, a failure raises the lower bound and, while
no upper bound is known, multiplies ``c`` by 10) keeps, per example, the successful ``x'`` of smallest L2 distance.
An example counts as a success when its logit margin ``max_{i != y} Z_i - Z_y`` is positive and at least ``kappa``;
failed examples are returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import ops
from fedarena.robustness.attacks import ApplyFn

_MASK = 1e4  # subtracted from the true class's logit to take the max over the other classes


@dataclass(frozen=True)
class CWConfig:
    steps: int = 100
    binary_search_steps: int = 5
    initial_const: float = 1.0
    learning_rate: float = 0.01
    kappa: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.steps < 1 or self.binary_search_steps < 1:
            raise ValueError(f"steps, binary_search_steps: must be >= 1, got {self.steps}, {self.binary_search_steps}")
        if not (self.initial_const > 0 and self.learning_rate > 0 and self.kappa >= 0):
            raise ValueError("initial_const, learning_rate: must be > 0; kappa: must be >= 0")


@dataclass(frozen=True)
class CWResult:
    adversarial: np.ndarray
    success: np.ndarray
    """per example: an adversarial example was found"""
    l2: np.ndarray
    """per example: L2 distance of the returned example (0 where the attack failed)"""

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success))

    @property
    def mean_l2(self) -> float:
        """Mean L2 distance over the successful examples (nan when none succeeded)."""
        return float(np.mean(self.l2[self.success])) if np.any(self.success) else float("nan")


def _margin(logits: Any, onehot: Any) -> Any:
    """``Z_y - max_{i != y} Z_i`` per example."""
    true = ops.sum(ops.multiply(logits, onehot), axis=1)
    other = ops.max(ops.subtract(logits, ops.multiply(onehot, _MASK)), axis=1)
    return ops.subtract(true, other)


def carlini_wagner_l2(apply: ApplyFn, params: Any, x: np.ndarray, y: np.ndarray, config: CWConfig = CWConfig(),
                      num_classes: int | None = None) -> CWResult:
    """Untargeted CW-L2 adversarial examples for inputs ``x`` in [0, 1] with labels ``y``."""
    cfg = config
    x = np.asarray(x)
    n = len(x)
    logits_fn = engine.jit(apply)
    if num_classes is None:
        num_classes = int(np.shape(logits_fn(params, x[:1]))[1])
    onehot = np.eye(num_classes, dtype=x.dtype)[y]

    def objective(w, const, p, x0, oh):
        adv = ops.multiply(ops.add(ops.tanh(w), 1.0), 0.5)
        dist = ops.sum(ops.reshape(ops.square(ops.subtract(adv, x0)), (n, -1)), axis=1)
        f = ops.maximum(_margin(apply(p, adv), oh), -cfg.kappa)
        return ops.sum(ops.add(dist, ops.multiply(const, f)))

    grad_w = engine.jit(engine.grad(objective))
    margin_fn = engine.jit(lambda p, a, oh: _margin(apply(p, a), oh))
    w0 = np.arctanh(np.clip(2 * x - 1, -1 + 1e-6, 1 - 1e-6)).astype(x.dtype)
    const = np.full(n, cfg.initial_const, dtype=x.dtype)
    lower, upper = np.zeros(n), np.full(n, 1e10)
    best_l2 = np.full(n, np.inf)
    best_adv = x.copy()
    for _ in range(cfg.binary_search_steps):
        w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
        found = np.zeros(n, dtype=bool)
        for t in range(1, cfg.steps + 1):
            g = np.asarray(grad_w(w, const, params, x, onehot))
            m = cfg.beta1 * m + (1 - cfg.beta1) * g
            v = cfg.beta2 * v + (1 - cfg.beta2) * g * g
            m_hat, v_hat = m / (1 - cfg.beta1 ** t), v / (1 - cfg.beta2 ** t)
            w = (w - cfg.learning_rate * m_hat / (np.sqrt(v_hat) + cfg.adam_eps)).astype(x.dtype)
            adv = (np.tanh(w) + 1) * 0.5
            margin = np.asarray(margin_fn(params, adv, onehot))
            ok = (margin < 0) & (-margin >= cfg.kappa)
            l2 = np.sqrt(np.sum((adv - x).reshape(n, -1) ** 2, axis=1))
            better = ok & (l2 < best_l2)
            best_l2[better] = l2[better]
            best_adv[better] = adv[better]
            found |= ok
        upper = np.where(found, np.minimum(upper, const), upper)
        lower = np.where(found, lower, np.maximum(lower, const))
        const = np.where(upper < 1e9, (lower + upper) / 2, const * 10).astype(x.dtype)
    success = np.isfinite(best_l2)
    return CWResult(adversarial=best_adv, success=success, l2=np.where(success, best_l2, 0.0))
