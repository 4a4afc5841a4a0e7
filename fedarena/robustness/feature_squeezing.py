"""Feature squeezing, a detector of adversarial examples (W. Xu, D. Evans, Y. Qi, "Feature Squeezing: Detecting
Adversarial Examples in Deep Neural Networks", NDSS 2018).

A squeezer maps an input to a coarser one that legitimate inputs survive: bit-depth reduction to ``b`` bits
(``round(x (2^b - 1)) / (2^b - 1)`` for pixels in [0, 1]) and median smoothing over a ``size x size`` window
(scipy's ``median_filter`` with ``mode="reflect"``, the filter Xu et al. use; for an even ``size`` it returns the
upper of the two middle values, and the window covers offsets ``-(size // 2) .. size - 1 - size // 2``). The score
of an input ``x`` under squeezer ``s`` is the L1 distance between the model's softmax outputs,
``||softmax(f(x)) - softmax(f(s(x)))||_1`` (in [0, 2]); the joint detector takes the maximum over the squeezers and
flags ``x`` as adversarial when it exceeds a threshold chosen on clean inputs so that at most a chosen fraction of
them is flagged (Xu et al. use 5%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedarena import engine
from fedarena.engine import ops
from fedarena.robustness.attacks import ApplyFn

SQUEEZERS = ("bit_depth", "median")


@dataclass(frozen=True)
class Squeezer:
    """``kind`` "bit_depth" with ``param`` bits, or "median" with ``param`` the window size."""

    kind: str
    param: int

    def __post_init__(self) -> None:
        if self.kind not in SQUEEZERS:
            raise ValueError(f"kind: must be one of {SQUEEZERS}, got {self.kind!r}")
        if isinstance(self.param, bool) or int(self.param) != self.param or not 1 <= self.param <= 16:
            raise ValueError(f"param: {self.kind} needs an integer in [1, 16], got {self.param!r}")

    @property
    def name(self) -> str:
        return f"bit_depth_{self.param}" if self.kind == "bit_depth" else f"median_{self.param}x{self.param}"

    def __call__(self, x: np.ndarray, image_shape: tuple[int, int]) -> np.ndarray:
        if self.kind == "bit_depth":
            return bit_depth_reduce(x, self.param)
        return median_smooth(x, self.param, image_shape)


def bit_depth_reduce(x: np.ndarray, bits: int) -> np.ndarray:
    """Each value in [0, 1] rounded to the nearest of ``2^bits`` evenly spaced levels."""
    levels = 2 ** int(bits) - 1
    return (np.round(np.asarray(x) * levels) / levels).astype(np.asarray(x).dtype)


def median_smooth(x: np.ndarray, size: int, image_shape: tuple[int, int]) -> np.ndarray:
    """Median filter of every image of the batch ``x`` (flattened or not) over a ``size x size`` window."""
    from scipy.ndimage import median_filter

    x = np.asarray(x)
    images = x.reshape((len(x), *image_shape))
    out = median_filter(images, size=(1, int(size), int(size)), mode="reflect")
    return out.reshape(x.shape)


def squeezing_scores(apply: ApplyFn, params: Any, x: np.ndarray, squeezers: Sequence[Squeezer],
                     image_shape: tuple[int, int]) -> np.ndarray:
    """``scores[i, j] = ||softmax(f(x_i)) - softmax(f(squeezer_j(x_i)))||_1``, shape (n, len(squeezers))."""
    probs = engine.jit(lambda p, a: ops.softmax(apply(p, a), axis=-1))
    base = np.asarray(probs(params, x), dtype=np.float64)
    cols = [np.sum(np.abs(base - np.asarray(probs(params, s(x, image_shape)), dtype=np.float64)), axis=1)
            for s in squeezers]
    return np.stack(cols, axis=1)


def fit_threshold(clean_scores: np.ndarray, false_positive_rate: float) -> float:
    """The smallest clean score ``t`` with at most ``false_positive_rate`` of ``clean_scores`` strictly above it."""
    s = np.sort(np.asarray(clean_scores, dtype=np.float64).ravel())
    if s.size == 0 or not np.all(np.isfinite(s)):
        raise ValueError("clean_scores: need a non-empty array of finite scores")
    if not 0 <= false_positive_rate < 1:
        raise ValueError(f"false_positive_rate: must lie in [0, 1), got {false_positive_rate!r}")
    allowed = int(np.floor(false_positive_rate * s.size))  # scores that may lie above the threshold
    return float(s[s.size - 1 - allowed])


@dataclass(frozen=True)
class FeatureSqueezingDetector:
    """The joint detector: adversarial when ``max_j score_j > threshold``."""

    squeezers: tuple[Squeezer, ...]
    threshold: float
    image_shape: tuple[int, int]

    @classmethod
    def fit(cls, apply: ApplyFn, params: Any, clean_x: np.ndarray, squeezers: Sequence[Squeezer],
            image_shape: tuple[int, int], false_positive_rate: float = 0.05) -> "FeatureSqueezingDetector":
        """Threshold the joint score at ``false_positive_rate`` on the clean inputs ``clean_x``."""
        if not squeezers:
            raise ValueError("squeezers: need at least one squeezer")
        scores = squeezing_scores(apply, params, clean_x, squeezers, image_shape).max(axis=1)
        return cls(tuple(squeezers), fit_threshold(scores, false_positive_rate), tuple(image_shape))

    def scores(self, apply: ApplyFn, params: Any, x: np.ndarray) -> np.ndarray:
        """Joint score (max over the squeezers) of each input."""
        return squeezing_scores(apply, params, x, self.squeezers, self.image_shape).max(axis=1)

    def detect(self, apply: ApplyFn, params: Any, x: np.ndarray) -> np.ndarray:
        """Boolean per input: flagged as adversarial."""
        return self.scores(apply, params, x) > self.threshold
