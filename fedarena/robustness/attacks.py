"""Evasion attacks on engine models: FGSM and PGD under an L-inf or L2 budget, with a seeded random start.

- FGSM (Goodfellow, Shlens, Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015):
  ``x' = clip(x + epsilon * sign(grad_x L(x, y)))``.
- PGD (Madry, Makelov, Schmidt, Tsipras, Vladu, "Towards Deep Learning Models Resistant to Adversarial Attacks",
  ICLR 2018): from a random start inside the epsilon ball, ``steps`` ascent steps of size ``step_size`` on the
  loss (the gradient's sign for L-inf, the gradient divided by its per-example L2 norm for L2), each followed by
  projection onto the epsilon ball around ``x`` and clipping to the input domain ``[clip_min, clip_max]``.

The loss is softmax cross-entropy summed over the batch, so each example's gradient does not depend on the batch
it is in. Random starts: L-inf draws ``U(-epsilon, epsilon)`` per coordinate; L2 draws uniformly from the L2 ball
(a Gaussian direction, radius ``epsilon * u^(1/d)``). A caller may pass the start perturbation explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine import ops

ApplyFn = Callable[[Any, Any], Any]
"""``apply(params, x) -> logits``, e.g. ``model.apply`` of an engine ``nn.Module``."""

NORMS = ("linf", "l2")


def input_gradient(apply: ApplyFn) -> Callable[[Any, np.ndarray, np.ndarray], np.ndarray]:
    """Compiled ``g(params, x, y) = d/dx sum_i CE(apply(params, x)_i, y_i)`` (the gradient the attacks ascend)."""

    def loss(params, x, y):
        return ops.cross_entropy(apply(params, x), y, reduction="sum")

    return engine.jit(engine.grad(loss, argnums=1))


@dataclass(frozen=True)
class PGDConfig:
    """Budget ``epsilon`` in the ``norm`` ball, ``steps`` steps of ``step_size``, optional random start."""

    epsilon: float
    step_size: float
    steps: int
    norm: str = "linf"
    random_start: bool = True
    clip_min: float = 0.0
    clip_max: float = 1.0

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm: must be one of {NORMS}, got {self.norm!r}")
        if not (np.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon: must be a finite number >= 0, got {self.epsilon!r}")
        if not (np.isfinite(self.step_size) and self.step_size > 0):
            raise ValueError(f"step_size: must be a finite number > 0, got {self.step_size!r}")
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"steps: must be an integer >= 1, got {self.steps!r}")
        if not self.clip_min < self.clip_max:
            raise ValueError(f"clip_min: must be below clip_max, got {self.clip_min!r} >= {self.clip_max!r}")


def _flat_norm(a: np.ndarray) -> np.ndarray:
    """Per-example L2 norm, shaped to broadcast against ``a``."""
    return np.sqrt(np.sum(a.reshape(len(a), -1) ** 2, axis=1)).reshape((len(a),) + (1,) * (a.ndim - 1))


def project(delta: np.ndarray, epsilon: float, norm: str) -> np.ndarray:
    """Projection of perturbations ``delta`` (batch first) onto the ``norm`` ball of radius ``epsilon``."""
    if norm == "linf":
        return np.clip(delta, -epsilon, epsilon)
    n = _flat_norm(delta)
    return delta * np.minimum(1.0, epsilon / np.maximum(n, 1e-12))


def random_start(shape: tuple, epsilon: float, norm: str, seed: int | np.random.Generator,
                 dtype: Any = np.float32) -> np.ndarray:
    """A start perturbation drawn uniformly from the ``norm`` ball of radius ``epsilon`` (one per example)."""
    rng = np.random.default_rng(seed)
    if norm == "linf":
        return rng.uniform(-epsilon, epsilon, size=shape).astype(dtype)
    direction = rng.standard_normal(shape)
    direction /= np.maximum(_flat_norm(direction), 1e-12)
    d = int(np.prod(shape[1:]))
    radius = epsilon * rng.random(shape[0]) ** (1.0 / d)
    return (direction * radius.reshape((shape[0],) + (1,) * (len(shape) - 1))).astype(dtype)


def fgsm(grad_fn: Callable, params: Any, x: np.ndarray, y: np.ndarray, epsilon: float,
         clip_min: float = 0.0, clip_max: float = 1.0) -> np.ndarray:
    """FGSM adversarial examples ``clip(x + epsilon sign(grad))``; ``grad_fn`` from :func:`input_gradient`."""
    if not (np.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon!r}")
    g = np.asarray(grad_fn(params, x, y))
    return np.clip(x + epsilon * np.sign(g), clip_min, clip_max).astype(x.dtype)


def pgd(grad_fn: Callable, params: Any, x: np.ndarray, y: np.ndarray, config: PGDConfig,
        seed: int | np.random.Generator = 0, start: np.ndarray | None = None) -> np.ndarray:
    """PGD adversarial examples under ``config``; ``start`` (a perturbation of x's shape) overrides the random one."""
    cfg = config
    if start is not None:
        if np.shape(start) != np.shape(x):
            raise ValueError(f"start: shape {np.shape(start)} does not match x {np.shape(x)}")
        delta = np.asarray(start, dtype=x.dtype)
    elif cfg.random_start:
        delta = random_start(x.shape, cfg.epsilon, cfg.norm, seed, x.dtype)
    else:
        delta = np.zeros_like(x)
    adv = np.clip(x + project(delta, cfg.epsilon, cfg.norm), cfg.clip_min, cfg.clip_max).astype(x.dtype)
    for _ in range(int(cfg.steps)):
        g = np.asarray(grad_fn(params, adv, y))
        if cfg.norm == "linf":
            step = np.sign(g)
        else:
            step = g / np.maximum(_flat_norm(g), 1e-12)
        adv = adv + cfg.step_size * step
        adv = np.clip(x + project(adv - x, cfg.epsilon, cfg.norm), cfg.clip_min, cfg.clip_max).astype(x.dtype)
    return adv
