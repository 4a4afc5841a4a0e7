"""DP-SGD for engine models: Poisson-sampled batches, per-example gradient clipping, Gaussian noise.

M. Abadi, A. Chu, I. Goodfellow, H. B. McMahan, I. Mironov, K. Talwar, L. Zhang, "Deep Learning with Differential
Privacy", CCS 2016, Algorithm 1: each example joins a batch with probability q (Poisson sampling, as the sampled
Gaussian accountant assumes), each per-example gradient is clipped to L2 norm C over all parameters, the clipped
gradients are summed, N(0, sigma^2 C^2 I) is added, and the result is divided by the expected batch size q N.
Per-example gradients come from ``engine.vmap`` when the engine has it, otherwise from a loop over a gradient
compiled once for a batch of one. The noisy gradient then goes to any engine optimizer (post-processing).

Randomness. The accountant's epsilon holds only if the adversary cannot predict the batches or the noise.
By default both come from :class:`SecureRandom` (``os.urandom``, the kernel's CSPRNG): uniforms from 53
random bits, Gaussians by the Box-Muller transform. ``DPSGDConfig.insecure_seeded_noise`` lets a caller pass
a seeded numpy Generator instead, for reproducible tests (the inverse of Opacus's ``secure_mode``, whose default
is insecure); it emits :class:`InsecureNoiseWarning`, and anyone who knows the seed can then recompute every
batch and every noise draw, so no privacy claim holds. Not covered (see docs/security.md): floating-point
attacks on the Gaussian sampler (Mironov, CCS 2012, for Laplace; Jin et al., IEEE S&P 2022, for Gaussians).
The statistics :meth:`DPSGD.noisy_gradient` returns (batch size, clipped fraction, gradient norms) are
computed on private data and are *not* covered by the accountant: use them for debugging, never publish them.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from fedarena.privacy.secure_random import SecureRandom

from fedarena import engine


log = logging.getLogger("fedarena.privacy.dpsgd")


class InsecureNoiseWarning(UserWarning):
    """DP-SGD runs with seeded, predictable sampling and noise: its epsilon means nothing to who knows the seed."""


class RandomSource(Protocol):
    """What DP-SGD draws from: uniform [0, 1) and Gaussian arrays (numpy Generators fit, so does SecureRandom)."""

    def random(self, size: Any = None) -> np.ndarray: ...

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> np.ndarray: ...


def warn_insecure(where: str) -> None:
    """The loud warning of ``insecure_seeded_noise``: a Python warning and an error-level log line."""
    text = (f"{where}: insecure_seeded_noise is on: batches and noise come from a seeded generator, so anyone who "
            "knows the seed can recompute them and the reported epsilon gives NO privacy. Use it for tests only.")
    warnings.warn(text, InsecureNoiseWarning, stacklevel=3)
    log.error(text)


@dataclass(frozen=True)
class DPSGDConfig:
    """Clip norm C, noise multiplier sigma (noise std = sigma C) and Poisson sampling rate q."""

    clip_norm: float
    noise_multiplier: float
    sample_rate: float
    insecure_seeded_noise: bool = False
    """accept a seeded generator for sampling and noise (reproducible tests; voids the privacy guarantee)"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"clip_norm: must be a finite number > 0, got {self.clip_norm!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise ValueError(f"noise_multiplier: must be a finite number >= 0, got {self.noise_multiplier!r}")
        if not (0 < self.sample_rate <= 1):
            raise ValueError(f"sample_rate: must lie in (0, 1], got {self.sample_rate!r}")


def poisson_batch(rng: RandomSource | None, dataset_size: int, sample_rate: float) -> np.ndarray:
    """Indices of a Poisson-sampled batch: each example independently with probability ``sample_rate``.

    ``rng`` None draws from :class:`SecureRandom`."""
    return np.flatnonzero((rng or SecureRandom()).random(dataset_size) < sample_rate)


def per_example_gradients(loss_fn: Callable[..., Any], use_vmap: bool | None = None
                          ) -> Callable[[Any, np.ndarray, np.ndarray], list[Any]]:
    """``fn(params, x, y) -> [grad pytree of example i]``; ``loss_fn(params, x, y)`` must be a per-batch mean.

    ``use_vmap``: None uses ``engine.vmap`` when the engine has it; False forces the loop."""
    grad1 = engine.jit(engine.grad(loss_fn))
    vmap = getattr(engine, "vmap", None)
    if use_vmap and vmap is None:
        raise ValueError("use_vmap: the engine has no vmap")
    if vmap is not None and use_vmap is not False:
        batched = engine.jit(vmap(lambda p, xi, yi: engine.grad(loss_fn)(p, xi[None], yi[None]),
                                  in_axes=(None, 0, 0)))

        def by_vmap(params, x, y):
            stacked = batched(params, x, y)
            leaves, treedef = engine.tree_flatten(stacked)
            return [engine.tree_unflatten(treedef, [leaf[i] for leaf in leaves]) for i in range(len(x))]

        return by_vmap

    def by_loop(params, x, y):
        return [grad1(params, x[i:i + 1], y[i:i + 1]) for i in range(len(x))]

    return by_loop


def clip_and_sum(per_example: list[Any], clip_norm: float) -> tuple[Any, np.ndarray]:
    """Sum of the per-example gradients, each scaled to global L2 norm <= clip_norm; also returns the norms."""
    norms = np.empty(len(per_example))
    total = None
    for i, g in enumerate(per_example):
        leaves = engine.tree_leaves(g)
        norm = math.sqrt(sum(float(np.vdot(leaf, leaf)) for leaf in leaves))
        norms[i] = norm
        factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        scaled = engine.tree_map(lambda a: np.asarray(a, dtype=np.float64) * factor, g)
        total = scaled if total is None else engine.tree_map(np.add, total, scaled)
    return total, norms


class DPSGD:
    """Computes DP-SGD's noisy gradient for a model with per-batch-mean loss ``loss_fn(params, x, y)``."""

    def __init__(self, loss_fn: Callable[..., Any], config: DPSGDConfig, dataset_size: int):
        if dataset_size < 1:
            raise ValueError(f"dataset_size: must be >= 1, got {dataset_size}")
        self.config = config
        self.dataset_size = int(dataset_size)
        self._per_example = per_example_gradients(loss_fn)
        self._secure = SecureRandom()
        if config.insecure_seeded_noise:
            warn_insecure("DPSGD")

    def noisy_gradient(self, params: Any, x: np.ndarray, y: np.ndarray, rng: RandomSource | None = None
                       ) -> tuple[Any, dict]:
        """``(sum_i clip(g_i) + N(0, sigma^2 C^2)) / (q N)`` with the dtypes of ``params``; plus batch statistics.

        The noise comes from :class:`SecureRandom` unless ``rng`` is given, which needs
        ``insecure_seeded_noise``. The statistics are private (computed on the batch, not accounted)."""
        cfg = self.config
        if rng is None:
            rng = self._secure
        elif not cfg.insecure_seeded_noise and not isinstance(rng, SecureRandom):
            raise ValueError("rng: a caller-supplied generator needs DPSGDConfig(insecure_seeded_noise=True); "
                             "leave rng out for cryptographically secure noise")
        expected = cfg.sample_rate * self.dataset_size
        if len(x):
            summed, norms = clip_and_sum(self._per_example(params, x, y), cfg.clip_norm)
        else:  # an empty Poisson batch still releases noise
            summed, norms = engine.tree_map(lambda p: np.zeros(np.shape(p)), params), np.zeros(0)
        std = cfg.noise_multiplier * cfg.clip_norm

        def noisy(s, p):
            out = (s + rng.normal(0.0, std, size=np.shape(s))) / expected
            return out.astype(np.asarray(p).dtype)

        grads = engine.tree_map(noisy, summed, params)
        stats = {"batch_size": int(len(x)),
                 "clipped_fraction": float(np.mean(norms > cfg.clip_norm)) if norms.size else 0.0,
                 "mean_grad_norm": float(norms.mean()) if norms.size else 0.0}
        return grads, stats
