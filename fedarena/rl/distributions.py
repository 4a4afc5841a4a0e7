"""Action distributions for policy networks: categorical, multi-categorical, diagonal Gaussian (clipped or
tanh-squashed), each with a numpy side for acting and an engine side for differentiable losses.

Acting (``sample``, ``log_prob_np``) runs in numpy on the actor; training (``log_prob``, ``entropy``)
is written with ``fedarena.engine.ops`` so it traces into the learner's compiled step. Squashed
Gaussian log-likelihood with the tanh change of variables: Haarnoja et al. (2018), "Soft Actor-Critic",
appendix C; clipped Gaussian (sample unbounded, clip only what the environment receives): Schulman et
al. (2017), PPO's continuous-control setup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.engine import ops

_LOG_2PI = math.log(2.0 * math.pi)


def _log_softmax_np(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row by the Gumbel-max trick."""
    g = -np.log(-np.log(rng.random(logits.shape)))
    return np.argmax(logits + g, axis=-1)


@dataclass(frozen=True)
class Categorical:
    """pi(a|s) = softmax(logits)_a over ``n`` actions; the head outputs ``n`` logits."""

    n: int

    @property
    def head_size(self) -> int:
        return self.n

    def sample(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _sample_categorical(np.asarray(logits, dtype=np.float64), rng)

    def mode(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=-1)

    def log_prob_np(self, logits: np.ndarray, actions: np.ndarray) -> np.ndarray:
        lp = _log_softmax_np(np.asarray(logits, dtype=np.float64))
        return np.take_along_axis(lp, np.asarray(actions, dtype=np.int64)[:, None], axis=-1)[:, 0]

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """The action as the learner's graph consumes it: a one-hot float32 matrix."""
        return np.eye(self.n, dtype=np.float32)[np.asarray(actions, dtype=np.int64)]

    def log_prob(self, logits: Any, encoded_actions: Any) -> Any:
        return ops.sum(ops.log_softmax(logits, axis=-1) * encoded_actions, axis=-1)

    def entropy(self, logits: Any) -> Any:
        lp = ops.log_softmax(logits, axis=-1)
        return -ops.sum(ops.exp(lp) * lp, axis=-1)


@dataclass(frozen=True)
class MultiCategorical:
    """Independent categoricals, one per entry of ``nvec`` (gymnasium MultiDiscrete); logits concatenated."""

    nvec: tuple[int, ...]

    @property
    def head_size(self) -> int:
        return int(sum(self.nvec))

    def _splits(self) -> list[tuple[int, int]]:
        edges = np.concatenate([[0], np.cumsum(self.nvec)])
        return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]

    def sample(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        logits = np.asarray(logits, dtype=np.float64)
        return np.stack([_sample_categorical(logits[:, a:b], rng) for a, b in self._splits()], axis=-1)

    def mode(self, logits: np.ndarray) -> np.ndarray:
        return np.stack([np.argmax(logits[:, a:b], axis=-1) for a, b in self._splits()], axis=-1)

    def log_prob_np(self, logits: np.ndarray, actions: np.ndarray) -> np.ndarray:
        logits = np.asarray(logits, dtype=np.float64)
        actions = np.asarray(actions, dtype=np.int64)
        return sum(Categorical(b - a).log_prob_np(logits[:, a:b], actions[:, i])
                   for i, (a, b) in enumerate(self._splits()))

    def encode(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.int64)
        return np.concatenate([np.eye(n, dtype=np.float32)[actions[:, i]] for i, n in enumerate(self.nvec)], axis=-1)

    def _segment_matrix(self) -> np.ndarray:
        """(head_size, len(nvec)) 0/1 matrix summing each component's entries."""
        m = np.zeros((self.head_size, len(self.nvec)), dtype=np.float32)
        for i, (a, b) in enumerate(self._splits()):
            m[a:b, i] = 1.0
        return m

    def _log_softmax_segments(self, logits: Any) -> Any:
        # per-component log-softmax without slicing: subtract each component's logsumexp, spread back by
        # the segment matrix (a stable shift by the global row max keeps exp() in range)
        seg = self._segment_matrix()
        shift = ops.max(logits, axis=-1, keepdims=True)
        z = logits - ops.stop_gradient(shift)
        lse = ops.log(ops.matmul(ops.exp(z), seg))  # (B, k)
        return z - ops.matmul(lse, seg.T)

    def log_prob(self, logits: Any, encoded_actions: Any) -> Any:
        return ops.sum(self._log_softmax_segments(logits) * encoded_actions, axis=-1)

    def entropy(self, logits: Any) -> Any:
        lp = self._log_softmax_segments(logits)
        return -ops.sum(ops.exp(lp) * lp, axis=-1)


@dataclass(frozen=True)
class DiagGaussian:
    """N(mean, diag(exp(log_std))^2) over a Box of ``dim`` actions; the head outputs the mean, log_std is a
    free parameter. ``squash``: actions are tanh(u) rescaled to [low, high] (likelihood with the Jacobian);
    otherwise the sample is clipped to [low, high] only on its way to the environment."""

    dim: int
    low: tuple[float, ...]
    high: tuple[float, ...]
    squash: bool = False

    @property
    def head_size(self) -> int:
        return self.dim

    def to_env(self, raw: np.ndarray) -> np.ndarray:
        low, high = np.asarray(self.low), np.asarray(self.high)
        if self.squash:
            return (low + (np.tanh(raw) + 1.0) * 0.5 * (high - low)).astype(np.float32)
        return np.clip(raw, low, high).astype(np.float32)

    def sample(self, mean: np.ndarray, log_std: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A raw (unsquashed, unclipped) sample u; :meth:`to_env` maps it to the environment's action."""
        return mean + np.exp(log_std) * rng.standard_normal(np.shape(mean))

    def mode(self, mean: np.ndarray) -> np.ndarray:
        return np.asarray(mean)

    def log_prob_np(self, mean: np.ndarray, log_std: np.ndarray, raw: np.ndarray) -> np.ndarray:
        z = (raw - mean) / np.exp(log_std)
        lp = -0.5 * np.sum(z * z + 2.0 * log_std + _LOG_2PI, axis=-1)
        if self.squash:
            lp = lp - np.sum(self._log_det_np(raw), axis=-1)
        return lp

    def _log_det_np(self, raw: np.ndarray) -> np.ndarray:
        # log |d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        scale = np.log(0.5 * (np.asarray(self.high) - np.asarray(self.low)))
        return 2.0 * (math.log(2.0) - raw - np.logaddexp(0.0, -2.0 * raw)) + scale

    def encode(self, raw: np.ndarray) -> np.ndarray:
        return np.asarray(raw, dtype=np.float32)

    def log_prob(self, mean: Any, log_std: Any, raw: Any) -> Any:
        z = (raw - mean) * ops.exp(-log_std)
        lp = -0.5 * ops.sum(z * z + 2.0 * log_std + _LOG_2PI, axis=-1)
        if self.squash:
            scale = np.log(0.5 * (np.asarray(self.high) - np.asarray(self.low))).astype(np.float32)
            # softplus(-2u) = log(1 + exp(-2u)) = logaddexp(0, -2u)
            softplus = ops.softplus(-2.0 * raw)
            lp = lp - ops.sum(2.0 * (math.log(2.0) - raw - softplus) + scale, axis=-1)
        return lp

    def entropy(self, mean: Any, log_std: Any) -> Any:
        """Entropy of the Gaussian before squashing/clipping (the usual PPO bonus)."""
        per_dim = log_std + 0.5 * (1.0 + _LOG_2PI)
        return ops.sum(per_dim + 0.0 * mean, axis=-1)


Distribution = Categorical | MultiCategorical | DiagGaussian
