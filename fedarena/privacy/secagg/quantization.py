"""Fixed-point quantization of float updates into Z_{2^k} for secure aggregation.

Bonawitz et al. (CCS 2017), Section 3: inputs are integer vectors mod R = 2^k. A float vector is clipped to
``[-clip, clip]`` per coordinate, scaled by ``scale`` and rounded to the nearest integer; negatives are stored in
two's complement mod 2^k. The sum of ``n`` such vectors is exact as long as ``n * round(clip * scale) < 2^(k-1)``
(checked by :func:`check_capacity`), and :func:`dequantize` maps the modular sum back to floats.
"""

from __future__ import annotations

import math

import numpy as np


def check_capacity(num_clients: int, clip: float, scale: float, modulus_bits: int) -> None:
    """Raise ValueError unless the sum of ``num_clients`` quantized inputs cannot wrap around mod 2^k."""
    if not (1 <= modulus_bits <= 32):
        raise ValueError(f"modulus_bits: must lie in 1..32, got {modulus_bits}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip: must be a finite number > 0, got {clip!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be a finite number > 0, got {scale!r}")
    bound = num_clients * round(clip * scale)
    if bound >= 2 ** (modulus_bits - 1):
        raise ValueError(
            f"modulus_bits: {num_clients} clients * round(clip * scale) = {bound} does not fit in the signed range "
            f"of 2^{modulus_bits}; raise modulus_bits or lower clip/scale")


def quantize(x: np.ndarray, clip: float, scale: float, modulus_bits: int) -> np.ndarray:
    """``round(clip_to_range(x) * scale) mod 2^k`` as uint32."""
    v = np.rint(np.clip(np.asarray(x, dtype=np.float64).ravel(), -clip, clip) * scale).astype(np.int64)
    return (v % (1 << modulus_bits)).astype(np.uint32)


def dequantize(z: np.ndarray, scale: float, modulus_bits: int) -> np.ndarray:
    """Map a modular (sum) vector back to floats, reading values >= 2^(k-1) as negative."""
    v = np.asarray(z, dtype=np.int64) % (1 << modulus_bits)
    v = np.where(v >= (1 << (modulus_bits - 1)), v - (1 << modulus_bits), v)
    return v / scale
