"""Runtime checks on values that are only known when a compiled graph runs.

``check_range`` passes an integer array through unchanged and raises :class:`IndexRangeError`
with the caller's message when an entry lies outside ``[lo, hi)`` (cross-entropy labels: a
numpy ``IndexError`` deep in the gather would not say which argument was wrong, and a negative
label would silently wrap around).
"""

from __future__ import annotations

import numpy as np

from ..core.ir import EngineError, ShapeError
from ..core.tracing import PRIMITIVES, bind
from .base import _define
from .emit import expr
from . import sharding as _sharding


class IndexRangeError(EngineError, IndexError):
    """An integer input (a label, an action) lies outside the range its use allows."""


def _check_rule(avals, attrs, weak):
    if avals[0].dtype.kind not in "iu":
        raise ShapeError(f"check_range needs integers, got {avals[0].dtype}")
    return avals[0]


class RangeCheck:
    """``check(idx) -> copy of idx``, raising IndexRangeError for an entry outside [lo, hi)."""

    def __init__(self, lo: int, hi: int, message: str):
        self.lo, self.hi, self.message = lo, hi, message

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.size:
            lo, hi = idx.min(), idx.max()
            if lo < self.lo or hi >= self.hi:
                bad = int(lo) if lo < self.lo else int(hi)
                raise IndexRangeError(self.message.format(value=bad, lo=self.lo, hi=self.hi))
        return np.array(idx, copy=True)


def _check_impl(idx, lo, hi, message):
    return RangeCheck(lo, hi, message)(idx)


def _check_emit(ctx, ins, attrs, in_avals, out_aval):
    return expr(f"{ctx.const(RangeCheck(attrs['lo'], attrs['hi'], attrs['message']))}({ins[0]})")


def _check_batch(prim, vals, batched, size, **attrs):
    return bind(prim, vals[0], **attrs)


def _check_xp(xp, ins, attrs, out):
    """Pass the indices through; one flag read back from the device says whether one is out of
    range, and only then the host kernel runs to raise its error."""
    x = ins[0]
    out[...] = x
    if x.size and bool(xp.any((x < attrs["lo"]) | (x >= attrs["hi"]))):
        PRIMITIVES["check_range"].impl(np.asarray(x.get() if hasattr(x, "get") else x), **attrs)


check_range_p = _define(
    "check_range", _check_rule, _check_impl, _check_emit, differentiable=False,
    batch=_check_batch, cuda=lambda e, lib: lib.xp(_check_xp, e),
)
check_range_p.shard = lambda in_avals, attrs, out_aval, n: _sharding.elementwise(in_avals, out_aval, n)


def check_range(idx, lo: int, hi: int, message: str):
    """``idx`` itself, checked when it is computed: ``message.format(value=, lo=, hi=)`` otherwise."""
    return bind(check_range_p, idx, lo=int(lo), hi=int(hi), message=str(message))
