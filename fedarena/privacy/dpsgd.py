"""DP-SGD for engine models: Poisson-sampled batches, per-example gradient clipping, Gaussian noise.

M. Abadi, A. Chu, I. Goodfellow, H. B. McMahan, I. Mironov, K. Talwar, L. Zhang, "Deep Learning with Differential
Privacy", CCS 2016, Algorithm 1: each example joins a batch with probability q (Poisson sampling, as the sampled
Gaussian accountant assumes), each per-example gradient is clipped to L2 norm C over all parameters, the clipped
gradients are summed, N(0, sigma^2 C^2 I) is added, and the result is divided by the expected batch size q N.
The per-example gradients (``engine.vmap`` of ``engine.grad``), their global norms, the clipping and the sum
run in ONE compiled program per batch-size bucket (:func:`fused_clipped_sum`): Poisson batch sizes vary from
step to step, so the batch is padded with zero rows to the next of two bucket sizes placed above the
expected batch size (:func:`poisson_buckets`), and the validity mask of ``jit(..., shape_buckets=...)`` keeps
the padded rows out of the sum (docs/engine.md, "Shape buckets"); a batch larger than the largest bucket is
summed in chunks of it. The program computes in the parameters' dtype. The Gaussian noise is drawn on the
host (the engine has no CSPRNG) and added outside the program: the sum is widened to float64, the float64
noise added and the result divided by q N and rounded once to the parameters' dtype, as the loop path does
(one numpy add per parameter array; passing the noise into the program would save nothing measurable and
would need it split across the chunks of an oversized batch). :func:`per_example_gradients` and :func:`clip_and_sum`
(a loop over examples) stay as the reference path (``DPSGD(..., fused=False)``).
The noisy gradient then goes to any engine optimizer (post-processing).

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
from fedarena.engine import ops


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


def poisson_buckets(expected: float, sample_rate: float, avoid: Any = ()) -> tuple[int, ...]:
    """Batch-size buckets for Poisson batches of mean ``expected`` = q N: 2 and 4 standard deviations
    ``sqrt(q N (1 - q))`` above the mean, rounded up (at least 1), skipping the sizes in ``avoid`` (the
    parameters' leading lengths, which a bucketed jit would take for the batch axis).

    By the normal approximation a batch exceeds the first bucket with probability about 2.3% and the second
    with about 3e-5 (such a batch is summed in chunks of the second), so a training compiles at most two
    programs. Two rather than more: on the digits MLP (q N = 64, 300 steps) a third bucket at the mean would
    save about 15 ms of padded rows (about 7 us a row, half the steps, 15 rows) and cost a compile of about
    40 ms (measured on a loaded 2-core machine)."""
    std = math.sqrt(expected * (1.0 - sample_rate))
    avoid = {int(a) for a in avoid}
    out: list[int] = []
    for k in (2.0, 4.0):
        b = max(1, math.ceil(expected + k * std - 1e-9))
        while b in avoid:
            b += 1
        if b not in out:
            out.append(b)
    return tuple(sorted(out))


def fused_clipped_sum(loss_fn: Callable[..., Any], clip_norm: float, buckets: Any, max_compiles: int | None = None
                      ) -> Callable[[Any, np.ndarray, np.ndarray], tuple[Any, np.ndarray]]:
    """``fn(params, x, y) -> (sum_i clip(g_i), norms)`` as one bucketed ``engine.jit`` program per bucket.

    ``g_i`` is the gradient of ``loss_fn(params, x[i:i+1], y[i:i+1])``, computed for all examples at once
    by ``engine.vmap`` of ``engine.grad``; ``norms[i]`` is its global L2 norm over all parameter arrays (one
    batched dot product per array) and ``f_i = C / max(norms[i], C)`` its clip factor (``min(1, C / norm)``,
    and 1 for a zero gradient). The clipped sum ``sum_i f_i g_i`` is then taken as the gradient of
    ``sum_i f_i loss_i`` with the factors held constant: one batched backward pass that contracts the batch
    axis in its products, instead of scaling every per-example gradient and reducing them. The sum over the
    batch is a masked reduction of the bucketed jit, so the zero rows padded onto the batch contribute
    nothing; ``norms`` keeps the valid rows only. The batch may have at most ``max(buckets)`` rows
    (:class:`DPSGD` splits larger ones)."""
    clip = float(clip_norm)

    def per_example(p, xi, yi):
        return engine.grad(loss_fn)(p, xi[None], yi[None])

    def example_loss(p, xi, yi):
        return loss_fn(p, xi[None], yi[None])

    def clipped_sum(params, x, y):
        per = engine.vmap(per_example, in_axes=(None, 0, 0))(params, x, y)
        squares = None
        for g in engine.tree_leaves(per):
            if g.ndim > 1:  # one batched dot product per example: a single pass over the per-example gradients
                flat = ops.reshape(g, (g.shape[0], -1))
                s = ops.reshape(ops.matmul(ops.reshape(flat, (g.shape[0], 1, -1)),
                                           ops.reshape(flat, (g.shape[0], -1, 1))), (g.shape[0],))
            else:
                s = g * g
            squares = s if squares is None else squares + s
        norms = ops.sqrt(squares)
        factor = ops.stop_gradient(clip / ops.maximum(norms, clip))

        def weighted(p):  # sum_i factor_i loss_i: its gradient is sum_i factor_i g_i, the clipped sum
            return ops.sum(factor * engine.vmap(example_loss, in_axes=(None, 0, 0))(p, x, y))

        return engine.grad(weighted)(params), norms

    clipped_sum.__name__ = "dpsgd_clipped_sum"
    return engine.jit(clipped_sum, shape_buckets=tuple(buckets), bucket_argnums=(1, 2), max_compiles=max_compiles)


class DPSGD:
    """Computes DP-SGD's noisy gradient for a model with per-batch-mean loss ``loss_fn(params, x, y)``.

    ``fused`` (default): the clipped sum comes from :func:`fused_clipped_sum`, compiled for the buckets of
    :func:`poisson_buckets` on the first call (they avoid the parameters' leading lengths); ``False``: from
    the per-example loop of :func:`per_example_gradients` and :func:`clip_and_sum`."""

    def __init__(self, loss_fn: Callable[..., Any], config: DPSGDConfig, dataset_size: int, fused: bool = True):
        if dataset_size < 1:
            raise ValueError(f"dataset_size: must be >= 1, got {dataset_size}")
        self.config = config
        self.dataset_size = int(dataset_size)
        self.fused = bool(fused)
        self._loss_fn = loss_fn
        self._per_example = None if self.fused else per_example_gradients(loss_fn)
        self._clipped_sum: Any = None  # the bucketed program, built on the first fused call
        self._leading: set[int] = set()
        self.buckets: tuple[int, ...] = ()  # the fused path's batch-size buckets, set on its first call
        self._secure = SecureRandom()
        if config.insecure_seeded_noise:
            warn_insecure("DPSGD")

    @property
    def compiles(self) -> int:
        """Programs the fused path has compiled so far (at most one per bucket; 0 for the loop path)."""
        return self._clipped_sum.compiles if self._clipped_sum is not None else 0

    def _fused_sum(self, params: Any, x: np.ndarray, y: np.ndarray) -> tuple[Any, np.ndarray]:
        leading = {int(np.shape(leaf)[0]) for leaf in engine.tree_leaves(params) if np.ndim(leaf)}
        if self._clipped_sum is None or not leading <= self._leading:
            cfg = self.config
            self._leading = leading
            self.buckets = poisson_buckets(cfg.sample_rate * self.dataset_size, cfg.sample_rate, leading)
            self._clipped_sum = fused_clipped_sum(self._loss_fn, cfg.clip_norm, self.buckets,
                                                  max_compiles=max(len(self.buckets), 4))
        top = self.buckets[-1]
        if len(x) <= top:
            return self._clipped_sum(params, x, y)
        parts = [self._clipped_sum(params, x[i:i + top], y[i:i + top]) for i in range(0, len(x), top)]
        summed = engine.tree_map(lambda *a: np.sum([np.asarray(b, np.float64) for b in a], axis=0),
                                 *[p for p, _ in parts])
        return summed, np.concatenate([n for _, n in parts])

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
        if len(x) and self.fused:
            summed, norms = self._fused_sum(params, x, y)
        elif len(x):
            summed, norms = clip_and_sum(self._per_example(params, x, y), cfg.clip_norm)
        else:  # an empty Poisson batch still releases noise
            summed, norms = engine.tree_map(lambda p: np.zeros(np.shape(p)), params), np.zeros(0)
        std = cfg.noise_multiplier * cfg.clip_norm
        leaves, treedef = engine.tree_flatten(summed)
        noise = np.asarray(rng.normal(0.0, std, size=sum(int(np.size(s)) for s in leaves)), np.float64)
        out, start = [], 0  # one draw for all parameters (fewer os.urandom calls), split in leaf order
        for s, p in zip(leaves, engine.tree_leaves(params)):
            size = int(np.size(s))
            noisy = (np.asarray(s, np.float64) + noise[start:start + size].reshape(np.shape(s))) / expected
            out.append(noisy.astype(np.asarray(p).dtype))
            start += size
        grads = engine.tree_unflatten(treedef, out)
        stats = {"batch_size": int(len(x)),
                 "clipped_fraction": float(np.mean(norms > cfg.clip_norm)) if norms.size else 0.0,
                 "mean_grad_norm": float(norms.mean()) if norms.size else 0.0}
        return grads, stats
