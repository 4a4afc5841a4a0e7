"""Counter-based random numbers from explicit keys (the random family).

A key is an int64 array of shape ``(..., 2)``: the 128-bit key of a Philox-4x64 generator
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; numpy's
``np.random.Philox``).  The numbers drawn from a key depend on nothing else, so a key gives
the same values eagerly, under ``jit`` and, key by key, under ``vmap``.  Sampling starts at
counter 0; ``random_split`` draws its child keys from the counter block whose top word is 2^63,
a range no sampling call reaches, so child keys and samples never share Philox blocks.

Leading key axes are batch axes: ``random_normal`` on keys of shape ``(B, 2)`` gives ``(B, *shape)``,
which is also the batching rule.  None of these primitives has a gradient (keys are integers).
"""

from __future__ import annotations

import numpy as np

from ..core.ir import ShapedArray, ShapeError
from ..core.tracing import bind
from .base import _define
from .emit import expr

_SPLIT_COUNTER = np.array([0, 0, 0, 1 << 63], dtype=np.uint64)


def _check_key(av: ShapedArray, what: str) -> None:
    if av.dtype != np.int64 or not av.shape or av.shape[-1] != 2:
        raise ShapeError(f"{what}: a key is an int64 array of shape (..., 2) from engine.random.key, got {av.str_short()}")


def _generator(key: np.ndarray, counter: np.ndarray | None = None) -> np.random.Generator:
    k = np.ascontiguousarray(key, dtype=np.int64).view(np.uint64)
    return np.random.Generator(np.random.Philox(key=k, counter=counter))


class Sampler:
    """``sampler(keys) -> samples``: one draw of ``shape`` per key, over the keys' leading axes."""

    def __init__(self, kind: str, shape: tuple, dtype: np.dtype):
        self.kind, self.shape, self.dtype = kind, tuple(shape), np.dtype(dtype)

    def one(self, key: np.ndarray) -> np.ndarray:
        g = _generator(key)
        if self.kind == "normal":
            return g.standard_normal(self.shape, dtype=self.dtype)
        return g.random(self.shape, dtype=self.dtype)

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        lead = keys.shape[:-1]
        out = np.empty(lead + self.shape, self.dtype)
        flat_keys = keys.reshape(-1, 2)
        flat_out = out.reshape((-1,) + self.shape)
        for i in range(flat_keys.shape[0]):
            flat_out[i] = self.one(flat_keys[i])
        return out


def _sample_rule(kind):
    def rule(avals, attrs, weak):
        _check_key(avals[0], f"random.{kind}")
        dt = np.dtype(attrs["dtype"])
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ShapeError(f"random.{kind}: dtype must be float32 or float64, got {dt}")
        return ShapedArray(avals[0].shape[:-1] + tuple(attrs["shape"]), dt)

    return rule


def _sample_emit(kind):
    def emit(ctx, ins, attrs, in_avals, out_aval):
        return expr(f"{ctx.const(Sampler(kind, attrs['shape'], attrs['dtype']))}({ins[0]})")

    return emit


def _batch(prim, vals, batched, size, **attrs):
    return bind(prim, vals[0], **attrs)


random_normal_p = _define(
    "random_normal",
    _sample_rule("normal"),
    lambda key, shape, dtype: Sampler("normal", shape, dtype)(key),
    _sample_emit("normal"),
    differentiable=False,
)
random_uniform_p = _define(
    "random_uniform",
    _sample_rule("uniform"),
    lambda key, shape, dtype: Sampler("uniform", shape, dtype)(key),
    _sample_emit("uniform"),
    differentiable=False,
)


class Splitter:
    """``splitter(keys) -> child keys``: ``num`` new keys per key, from the split counter block."""

    def __init__(self, num: int):
        self.num = num

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        flat = keys.reshape(-1, 2)
        out = np.empty((flat.shape[0], self.num, 2), np.int64)
        for i in range(flat.shape[0]):
            bits = _generator(flat[i], _SPLIT_COUNTER).bit_generator.random_raw(2 * self.num)
            out[i] = bits.view(np.int64).reshape(self.num, 2)
        return out.reshape(keys.shape[:-1] + (self.num, 2))


def _split_rule(avals, attrs, weak):
    _check_key(avals[0], "random.split")
    if attrs["num"] < 1:
        raise ShapeError(f"random.split: num must be at least 1, got {attrs['num']}")
    return ShapedArray(avals[0].shape[:-1] + (attrs["num"], 2), np.int64)


random_split_p = _define(
    "random_split",
    _split_rule,
    lambda key, num: Splitter(num)(key),
    lambda ctx, ins, attrs, in_avals, out_aval: expr(f"{ctx.const(Splitter(attrs['num']))}({ins[0]})"),
    differentiable=False,
)

for _p in (random_normal_p, random_uniform_p, random_split_p):
    _p.batch = _batch
