"""Uniform affine quantization: integer ranges, scales and zero points, per-channel symmetric weights,
and the range observers that calibrate activations (min-max, and a percentile of a histogram).

A real value r and its integer q are related by ``r = scale * (q - zero_point)`` (Jacob et al.,
"Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference", CVPR
2018, eq. 1).  Activations are asymmetric: a range [lo, hi] (widened to contain 0, so that 0 is exact
and padding with the zero point is exact) maps onto [qmin, qmax] = [-2^(b-1), 2^(b-1) - 1].  Weights are
symmetric per output channel with the restricted range [-(2^(b-1) - 1), 2^(b-1) - 1] and zero point 0
(Krishnamoorthi, "Quantizing deep convolutional networks for efficient inference: a whitepaper", 2018,
section 2).  Every integer is stored as int8, so 2 <= bits <= 8.  Rounding is round-to-nearest-even
(``np.rint``) everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_BITS, MAX_BITS = 2, 8
OBSERVERS = ("minmax", "percentile")


def check_bits(bits: int, field: str = "bits") -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"{field}: must be an integer in [{MIN_BITS}, {MAX_BITS}] (values are stored as int8), got {bits!r}")
    return int(bits)


def activation_range(bits: int) -> tuple[int, int]:
    """(qmin, qmax) of an asymmetric ``bits``-bit activation."""
    bits = check_bits(bits)
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def weight_range(bits: int) -> int:
    """qmax of a symmetric ``bits``-bit weight (the range is [-qmax, qmax])."""
    return 2 ** (check_bits(bits, "weight_bits") - 1) - 1


@dataclass(frozen=True)
class ActivationQuant:
    """An activation's affine quantizer: ``r = scale * (q - zero_point)``, q in [qmin, qmax]."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int


def activation_params(lo: float, hi: float, bits: int) -> ActivationQuant:
    """The scale and zero point mapping [min(lo, 0), max(hi, 0)] onto the ``bits``-bit range."""
    qmin, qmax = activation_range(bits)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"activation range: need finite lo <= hi, got [{lo}, {hi}]")
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if scale == 0.0:  # an all-zero activation: any scale represents it exactly
        scale = 1.0
    scale = float(np.float32(scale))  # stored as float32 in the model file; use the stored value
    zero_point = int(np.clip(qmin - np.rint(lo / scale), qmin, qmax))
    return ActivationQuant(scale, zero_point, qmin, qmax)


def weight_scales(w: np.ndarray, bits: int, axis: int = 0) -> np.ndarray:
    """Per-channel symmetric scales ``max|w_c| / qmax`` (float32) along ``axis`` (the output channels);
    an all-zero channel gets scale 1."""
    qmax = weight_range(bits)
    red = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    amax = np.max(np.abs(w), axis=red) if w.size else np.zeros(w.shape[axis])
    scale = (amax.astype(np.float64) / qmax).astype(np.float32)
    return np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)


def quantize_weights(w: np.ndarray, bits: int, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float32 per-channel scales) for ``w`` with output channels on ``axis``."""
    qmax = weight_range(bits)
    scale = weight_scales(w, bits, axis)
    shape = [1] * w.ndim
    shape[axis % w.ndim] = -1
    q = np.clip(np.rint(w.astype(np.float64) / scale.reshape(shape).astype(np.float64)), -qmax, qmax)
    return q.astype(np.int8), scale


class MinMaxObserver:
    """The range of everything seen: [min, max]."""

    def __init__(self) -> None:
        self.lo, self.hi, self.count = np.inf, -np.inf, 0

    def observe(self, x: np.ndarray) -> None:
        if x.size:
            self.lo = min(self.lo, float(np.min(x)))
            self.hi = max(self.hi, float(np.max(x)))
            self.count += x.size

    def range(self) -> tuple[float, float]:
        if self.count == 0:
            raise ValueError("calibration: no activation values were observed (the calibration set is empty)")
        return self.lo, self.hi


class PercentileObserver:
    """A percentile range read off a histogram (the histogram calibration of Wu et al., "Integer
    quantization for deep learning inference: principles and empirical evaluation", 2020, section 4.2):
    the values are binned over their min-max range in a first pass (:class:`MinMaxObserver`), then
    [lo, hi] are the ``(100 - percentile)`` and ``percentile`` quantiles of the histogram, each read at
    a bin edge, so outliers beyond them are clipped."""

    def __init__(self, lo: float, hi: float, percentile: float = 99.99, bins: int = 2048) -> None:
        if not 50.0 < percentile <= 100.0:
            raise ValueError(f"percentile: must lie in (50, 100], got {percentile}")
        self.edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.array([lo, lo + 1.0])
        self.counts = np.zeros(len(self.edges) - 1, np.int64)
        self.percentile = percentile

    def observe(self, x: np.ndarray) -> None:
        self.counts += np.histogram(x, bins=self.edges)[0]

    def range(self) -> tuple[float, float]:
        total = int(self.counts.sum())
        if total == 0:
            raise ValueError("calibration: no activation values were observed (the calibration set is empty)")
        cdf = np.cumsum(self.counts) / total
        tail = (100.0 - self.percentile) / 100.0
        lo_bin = int(np.searchsorted(cdf, tail, side="right"))  # first bin whose cdf exceeds the tail
        hi_bin = int(np.searchsorted(cdf, 1.0 - tail, side="left"))  # first bin whose cdf reaches 1 - tail
        return float(self.edges[min(lo_bin, len(self.counts) - 1)]), float(self.edges[min(hi_bin, len(self.counts) - 1) + 1])


__all__ = [
    "MAX_BITS",
    "MIN_BITS",
    "OBSERVERS",
    "ActivationQuant",
    "MinMaxObserver",
    "PercentileObserver",
    "activation_params",
    "activation_range",
    "check_bits",
    "quantize_weights",
    "weight_range",
    "weight_scales",
]
