"""Weight initializers with explicit seeds.

Xavier/Glorot (Glorot & Bengio, AISTATS 2010), Kaiming/He (He et al., ICCV 2015), orthogonal
(Saxe et al., ICLR 2014) and LeCun-style uniform(+-1/sqrt(fan_in)) (PyTorch's default for
``nn.Linear``/``nn.Conv2d``).  Every initializer is ``init(rng, shape, dtype) -> array`` where
``rng`` is a ``numpy.random.Generator`` (use :func:`as_rng` to turn a seed into one).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

Initializer = Callable[[np.random.Generator, Sequence[int], Any], np.ndarray]


def as_rng(seed_or_rng: int | np.random.Generator) -> np.random.Generator:
    """A Generator from an int seed (or the Generator itself)."""
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng
    if isinstance(seed_or_rng, (int, np.integer)) and not isinstance(seed_or_rng, bool):
        return np.random.default_rng(int(seed_or_rng))
    raise TypeError(f"expected an int seed or numpy.random.Generator, got {type(seed_or_rng).__name__}")


def fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out). Dense weights are stored (in, out); conv weights (out, in, kh, kw)."""
    shape = tuple(shape)
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) > 2:
        receptive = int(np.prod(shape[2:]))
        return shape[1] * receptive, shape[0] * receptive
    n = shape[0] if shape else 1
    return n, n


def zeros() -> Initializer:
    return lambda rng, shape, dtype=np.float32: np.zeros(shape, dtype)


def constant(value: float) -> Initializer:
    return lambda rng, shape, dtype=np.float32: np.full(shape, value, dtype)


def uniform(bound: float) -> Initializer:
    return lambda rng, shape, dtype=np.float32: rng.uniform(-bound, bound, size=shape).astype(dtype)


def normal(std: float) -> Initializer:
    return lambda rng, shape, dtype=np.float32: (rng.standard_normal(size=shape) * std).astype(dtype)


def lecun_uniform(fan_in: int | None = None) -> Initializer:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) — PyTorch's default for Linear/Conv weights and biases."""

    def init(rng, shape, dtype=np.float32):
        fi = fan_in if fan_in is not None else fans(shape)[0]
        b = 1.0 / math.sqrt(fi) if fi > 0 else 0.0
        return rng.uniform(-b, b, size=shape).astype(dtype)

    return init


def xavier_uniform(gain: float = 1.0) -> Initializer:
    def init(rng, shape, dtype=np.float32):
        fi, fo = fans(shape)
        b = gain * math.sqrt(6.0 / (fi + fo))
        return rng.uniform(-b, b, size=shape).astype(dtype)

    return init


def xavier_normal(gain: float = 1.0) -> Initializer:
    def init(rng, shape, dtype=np.float32):
        fi, fo = fans(shape)
        return (rng.standard_normal(size=shape) * gain * math.sqrt(2.0 / (fi + fo))).astype(dtype)

    return init


def kaiming_uniform(gain: float = math.sqrt(2.0)) -> Initializer:
    """He uniform with ``gain`` (sqrt(2) for ReLU): bound = gain * sqrt(3 / fan_in)."""

    def init(rng, shape, dtype=np.float32):
        fi, _ = fans(shape)
        b = gain * math.sqrt(3.0 / fi)
        return rng.uniform(-b, b, size=shape).astype(dtype)

    return init


def kaiming_normal(gain: float = math.sqrt(2.0)) -> Initializer:
    def init(rng, shape, dtype=np.float32):
        fi, _ = fans(shape)
        return (rng.standard_normal(size=shape) * gain / math.sqrt(fi)).astype(dtype)

    return init


def orthogonal(gain: float = 1.0) -> Initializer:
    """A (semi-)orthogonal matrix from the QR decomposition of a Gaussian matrix, sign-corrected
    so the distribution is uniform (Saxe et al. 2014; Mezzadri 2007); conv weights are flattened
    to (out, in*kh*kw) first."""

    def init(rng, shape, dtype=np.float32):
        shape = tuple(shape)
        if len(shape) < 2:
            raise ValueError(f"orthogonal init needs a matrix or conv kernel, got shape {shape}")
        if len(shape) == 2:
            rows, cols = shape
        else:
            rows, cols = shape[0], int(np.prod(shape[1:]))
        a = rng.standard_normal(size=(max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return (gain * q[:rows, :cols]).reshape(shape).astype(dtype)

    return init


def get(name_or_init: str | Initializer) -> Initializer:
    if callable(name_or_init):
        return name_or_init
    table = {
        "zeros": zeros(),
        "lecun_uniform": lecun_uniform(),
        "xavier_uniform": xavier_uniform(),
        "glorot_uniform": xavier_uniform(),
        "xavier_normal": xavier_normal(),
        "kaiming_uniform": kaiming_uniform(),
        "he_uniform": kaiming_uniform(),
        "kaiming_normal": kaiming_normal(),
        "orthogonal": orthogonal(),
    }
    try:
        return table[name_or_init]
    except KeyError:
        raise ValueError(f"unknown initializer {name_or_init!r}; known: {', '.join(sorted(table))}") from None
