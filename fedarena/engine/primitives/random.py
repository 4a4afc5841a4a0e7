"""Counter-based random numbers from explicit keys (the random family).

A key is an int64 array of shape ``(..., 2)``: the 128-bit key of a Philox-4x64-10 generator
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the generator numpy
calls ``np.random.Philox``.  Block ``b`` of a key's stream is Philox-4x64-10 of the counter
``(b + 1, 0, 0, top)`` (numpy's ``Philox(key=key)`` steps its counter before each block, so its
``random_raw()`` words are exactly these with ``top = 0``); a block gives four 64-bit words, word
``i`` of the stream is word ``i % 4`` of block ``i // 4``.  The words are computed for all keys
and blocks at once: by the C kernel of ``_native.c`` when the extension is built, else by the
numpy code below (the same integer arithmetic, so the same words).

The numbers a key draws depend on nothing else, so a key gives the same values eagerly, under
``jit`` and, key by key, under ``vmap``.  Sampling uses ``top = 0``; ``random_split`` uses
``top = 2^63``, a range no sampling call reaches, so child keys and samples never share blocks.

Transforms of the words (sample ``j`` of a draw of ``n``):

- uniform float64: ``(w[j] >> 11) * 2^-53`` (numpy's ``Generator.random``, bit for bit);
- uniform float32: the 32-bit halves of the words, low half first, ``(h[j] >> 8) * 2^-24``
  (numpy's ``Generator.random(dtype=np.float32)``, bit for bit);
- normal (both dtypes): the Box-Muller transform (Box and Muller, 1958) of the pair of words
  ``w[2i], w[2i+1]``: ``u1 = 1 - (w[2i] >> 11) * 2^-53`` in ``(0, 1]``, ``u2 = (w[2i+1] >> 11) *
  2^-53``, ``r = sqrt(-2 log u1)``, samples ``2i`` and ``2i+1`` are ``r cos(2 pi u2)`` and
  ``r sin(2 pi u2)``, computed in float64 (float32 rounds the float64 result; an odd ``n`` drops
  the last sine).  ``|z|`` is at most ``sqrt(-2 log 2^-53)`` = 8.5717.  This is not numpy's
  (ziggurat) normal stream.

The uniforms and split keys are the same bits with and without the extension.  The normals use
the C library's ``log``/``cos``/``sin`` in the kernel and numpy's ufuncs in the fallback; the two
can differ in the last bit of a float64 (numpy's ``log`` is its own SIMD code), so a normal
draw is bit-identical between eager, ``jit`` and ``vmap`` with one configuration and equal to
within a few ulps across configurations.

Leading key axes are batch axes: ``random_normal`` on keys of shape ``(B, 2)`` gives ``(B, *shape)``,
which is also the batching rule.  None of these primitives has a gradient (keys are integers).
"""

from __future__ import annotations

import math

import numpy as np

from ..core import cext
from ..core.ir import ShapedArray, ShapeError
from ..core.tracing import bind
from .base import _define
from .emit import expr

PHILOX_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
"""Philox-4x64 round multipliers (Salmon et al. 2011, table 2)."""
PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
"""Philox-4x64 key increments (Weyl sequence constants: the golden ratio and sqrt(3) - 1)."""
ROUNDS = 10
SPLIT_TOP = 1 << 63
"""Top counter word of ``random_split``'s blocks (sampling uses 0)."""
_SPLIT_COUNTER = np.array([0, 0, 0, SPLIT_TOP], dtype=np.uint64)  # numpy's Philox(counter=...) for split
KINDS = {"uniform": 0, "normal": 1}
"""The native kernel's code for each transform."""

_U64 = np.uint64
_LO32 = _U64(0xFFFFFFFF)
_S32, _S11, _S8 = _U64(32), _U64(11), _U64(8)


def _check_key(av: ShapedArray, what: str) -> None:
    if av.dtype != np.int64 or not av.shape or av.shape[-1] != 2:
        raise ShapeError(f"{what}: a key is an int64 array of shape (..., 2) from engine.random.key, got {av.str_short()}")


def _generator(key: np.ndarray, counter: np.ndarray | None = None) -> np.random.Generator:
    """numpy's own generator for one key (the reference the tests compare the stream with)."""
    k = np.ascontiguousarray(key, dtype=np.int64).view(np.uint64)
    return np.random.Generator(np.random.Philox(key=k, counter=counter))


def _mulhilo(a: np.uint64, b: np.ndarray) -> tuple:
    """Low and high 64-bit words of the 128-bit product ``a * b`` (four 32x32-bit products)."""
    a0, a1 = a & _LO32, a >> _S32
    b0, b1 = b & _LO32, b >> _S32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _S32) + (p01 & _LO32) + (p10 & _LO32)
    return a * b, p11 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)


def philox_numpy(keys: np.ndarray, nwords: int, top: int = 0) -> np.ndarray:
    """Words ``0 .. nwords-1`` of each key's stream: ``keys`` uint64 of shape (K, 2) -> (K, nwords)
    uint64, numpy only (the fallback of :func:`philox_words`)."""
    nkeys, nblocks = keys.shape[0], -(-nwords // 4)
    c0 = np.broadcast_to(np.arange(1, nblocks + 1, dtype=_U64), (nkeys, nblocks))
    c1 = np.zeros((nkeys, nblocks), _U64)
    c2 = np.zeros((nkeys, nblocks), _U64)
    c3 = np.full((nkeys, nblocks), top, _U64)
    k0, k1 = keys[:, 0:1].copy(), keys[:, 1:2].copy()
    m0, m1, w0, w1 = (_U64(v) for v in PHILOX_M + PHILOX_W)
    with np.errstate(over="ignore"):
        for r in range(ROUNDS):
            if r:
                k0 += w0
                k1 += w1
            lo0, hi0 = _mulhilo(m0, c0)
            lo1, hi1 = _mulhilo(m1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).reshape(nkeys, 4 * nblocks)[:, :nwords]


def _flat_keys(keys: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(keys, dtype=np.int64).reshape(-1, 2)).view(np.uint64)


def philox_words(keys: np.ndarray, nwords: int, top: int = 0) -> np.ndarray:
    """``(K, nwords)`` uint64: the stream words of each key of ``keys`` (int64, shape (..., 2))."""
    flat = _flat_keys(keys)
    if cext.available() and flat.size:
        out = np.empty((flat.shape[0], nwords), _U64)
        if cext._native.philox(flat, out, flat.shape[0], nwords, top):
            return out
    return philox_numpy(flat, nwords, top)


def words_needed(kind: str, dtype: np.dtype, n: int) -> int:
    """Stream words one draw of ``n`` samples consumes."""
    if kind == "normal":
        return 2 * (-(-n // 2))
    return n if np.dtype(dtype) == np.float64 else -(-n // 2)


def transform(words: np.ndarray, kind: str, dtype: np.dtype, n: int) -> np.ndarray:
    """Samples ``(K, n)`` of ``dtype`` from stream words ``(K, words_needed(...))`` (numpy)."""
    dt = np.dtype(dtype)
    if kind == "uniform" and dt == np.float64:
        return (words >> _S11).astype(np.float64) * 2.0**-53
    if kind == "uniform":
        halves = np.stack([words & _LO32, words >> _S32], axis=-1).reshape(words.shape[0], 2 * words.shape[1])[:, :n]
        return (halves >> _S8).astype(np.float32) * np.float32(2.0**-24)
    u = (words >> _S11).astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(1.0 - u[:, 0::2]))
    t = (2.0 * math.pi) * u[:, 1::2]
    z = np.stack([r * np.cos(t), r * np.sin(t)], axis=-1).reshape(words.shape[0], 2 * r.shape[1])[:, :n]
    return z.astype(dt, copy=False)


class Sampler:
    """``sampler(keys) -> samples``: one draw of ``shape`` per key, over the keys' leading axes,
    all keys at once (the native kernel, else numpy)."""

    def __init__(self, kind: str, shape: tuple, dtype: np.dtype):
        self.kind, self.shape, self.dtype = kind, tuple(shape), np.dtype(dtype)
        self.n = math.prod(self.shape)

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys)
        lead = keys.shape[:-1]
        flat = _flat_keys(keys)
        out = None
        if cext.available() and flat.size and self.n:
            out = np.empty((flat.shape[0], self.n), self.dtype)
            if not cext._native.random(flat, out, flat.shape[0], self.n, KINDS[self.kind], self.dtype == np.float64):
                out = None
        if out is None:
            words = philox_numpy(flat, words_needed(self.kind, self.dtype, self.n))
            out = transform(words, self.kind, self.dtype, self.n)
        return out.reshape(lead + self.shape)


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


def _random_cuda(e, lib):
    """The cupy backend's Philox kernels (the same streams as the numpy kernels)."""
    return lib.kernel(lib.random_kernel(e), [e.inputs[0]])


random_normal_p = _define(
    "random_normal",
    _sample_rule("normal"),
    lambda key, shape, dtype: Sampler("normal", shape, dtype)(key),
    _sample_emit("normal"),
    differentiable=False,
    batch=_batch,
    cuda=_random_cuda,
)
random_uniform_p = _define(
    "random_uniform",
    _sample_rule("uniform"),
    lambda key, shape, dtype: Sampler("uniform", shape, dtype)(key),
    _sample_emit("uniform"),
    differentiable=False,
    batch=_batch,
    cuda=_random_cuda,
)


class Splitter:
    """``splitter(keys) -> child keys``: ``num`` new keys per key, words ``0 .. 2 num - 1`` of the
    key's split stream (``top = 2^63``), all keys at once."""

    def __init__(self, num: int):
        self.num = num

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys)
        words = philox_words(keys, 2 * self.num, SPLIT_TOP)
        return words.view(np.int64).reshape(keys.shape[:-1] + (self.num, 2))


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
    batch=_batch,
    cuda=_random_cuda,
)
