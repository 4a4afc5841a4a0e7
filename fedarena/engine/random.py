"""Explicit PRNG keys, in JAX's style: ``key = random.key(0)``, ``k1, k2 = random.split(key)``,
``random.normal(k1, (3,))``.

A key is an int64 array of shape ``(2,)`` (a Philox-4x64-10 key, see ``primitives/random.py``,
which defines the stream and its transforms); the same key gives the same numbers eagerly, under
``jit`` and under ``vmap`` (where each key of a batch draws what it would draw alone), all keys of
a batch in one vectorised call.  Uniforms are numpy's ``Generator(Philox(key=key)).random`` bit
for bit; normals are the Box-Muller transform of the key's words (not numpy's ziggurat stream).
Reusing a key reuses its numbers: split it instead.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import ops
from .primitives import random as R
from .core.tracing import aval_of, bind

Key = Any  # int64 array of shape (2,) (or a tracer of one)


def key(seed: int) -> np.ndarray:
    """A key from an integer seed (mixed by numpy's SeedSequence, so nearby seeds are unrelated)."""
    if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"random.key: seed must be an integer, got {seed!r}")
    return np.random.SeedSequence(int(seed) % (1 << 128)).generate_state(2, np.uint64).view(np.int64)


def split(key: Key, num: int = 2) -> Any:
    """``num`` new independent keys, shape ``(num, 2)`` (unpack them: ``k1, k2 = split(key)``)."""
    return bind(R.random_split_p, _key(key), num=int(num))


def _key(k: Key) -> Any:
    if isinstance(k, (list, tuple)):
        k = np.asarray(k, dtype=np.int64)
    return k


def _shape(shape: Sequence[int] | int) -> tuple:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def normal(key: Key, shape: Sequence[int] | int = (), dtype: Any = np.float32) -> Any:
    """Standard normal samples of ``shape`` (Box-Muller, computed in float64; ``|z| < 8.572``)."""
    return bind(R.random_normal_p, _key(key), shape=_shape(shape), dtype=np.dtype(dtype))


def uniform(key: Key, shape: Sequence[int] | int = (), dtype: Any = np.float32, minval: Any = 0.0, maxval: Any = 1.0) -> Any:
    """Uniform samples in ``[minval, maxval)``."""
    u = bind(R.random_uniform_p, _key(key), shape=_shape(shape), dtype=np.dtype(dtype))
    python = isinstance(minval, (int, float)) and isinstance(maxval, (int, float))
    if python and (minval, maxval) == (0.0, 1.0):
        return u
    span = maxval - minval if python else ops.subtract(maxval, minval)  # Python numbers stay weak
    return ops.add(ops.multiply(u, span), minval)


def bernoulli(key: Key, p: Any = 0.5, shape: Sequence[int] | int | None = None) -> Any:
    """Booleans that are True with probability ``p`` (``shape`` defaults to ``p``'s shape)."""
    sh = aval_of(p).shape if shape is None else _shape(shape)
    dt = aval_of(p).dtype if aval_of(p).dtype.kind == "f" and not isinstance(p, float) else np.float64
    return ops.less(uniform(key, sh, dt), p)


def categorical(key: Key, logits: Any, axis: int = -1, shape: Sequence[int] | None = None) -> Any:
    """Samples of ``softmax(logits)`` along ``axis`` (the Gumbel-max trick: argmax of logits plus
    Gumbel noise; Gumbel 1954, Maddison et al. 2014); the result drops ``axis``.  ``shape``, if
    given, is the batch shape of the samples (it must broadcast with the logits' other axes)."""
    lav = aval_of(logits)
    ax = axis % lav.ndim
    batch = lav.shape[:ax] + lav.shape[ax + 1 :]
    out_batch = batch if shape is None else _shape(shape)
    noise_shape = out_batch[: len(out_batch)] + (lav.shape[ax],)
    dt = lav.dtype if lav.dtype.kind == "f" else np.float64
    u = uniform(key, noise_shape, dt, minval=float(np.finfo(dt).tiny), maxval=1.0)
    gumbel = ops.negative(ops.log(ops.negative(ops.log(u))))
    moved = ops.moveaxis(logits, ax, -1) if ax != lav.ndim - 1 else logits
    return ops.argmax(ops.add(moved, gumbel), axis=-1)


__all__ = ["bernoulli", "categorical", "key", "normal", "split", "uniform"]
