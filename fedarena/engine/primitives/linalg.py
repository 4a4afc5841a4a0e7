"""Linear algebra (the linear-algebra family): ``matmul`` with numpy's batch broadcasting; float16 /
bfloat16 operands multiply with float32 accumulation.
"""

from __future__ import annotations

import numpy as np

from ..core import cext
from ..core.ir import LOW_PRECISION, ShapeError, ShapedArray
from .emit import expr, stmt
from . import sharding as _sharding
from .base import _define, _swap_last, broadcast_shapes, matmul, promote, shape_of, unbroadcast
from .elementwise import _sum_tangents

# ============================================================================ matmul

# Products of more than this many multiply-adds (M*K*N) go through the engine's thread pool
# (``_parallel.c``; it splits them when it has several threads).  Up to 4 * 65536 OpenBLAS itself
# runs one thread (its GEMM_MULTITHREAD_THRESHOLD), so those never wake its pool and stay a plain
# np.dot: the 64x64x64 products of an RL network's step pay no extra call.
POOL_GEMM_MIN = 1 << 18


def _matmul_rule(avals, attrs, weak):
    a, b = avals
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError("matmul primitive needs operands of rank >= 2 (ops.matmul handles vectors)")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"contracting dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return ShapedArray(batch + (a.shape[-2], b.shape[-1]), promote(avals, weak))


def _matmul_vjp(need, ct, out, x, y):
    gx = unbroadcast(matmul(ct, _swap_last(y)), shape_of(x)) if need[0] else None
    gy = unbroadcast(matmul(_swap_last(x), ct), shape_of(y)) if need[1] else None
    return (gx, gy)


def _matmul_jvp(ts, out, x, y):
    a = None if ts[0] is None else matmul(ts[0], y)
    b = None if ts[1] is None else matmul(x, ts[1])
    return _sum_tangents(out, a, b)


def _low_precision_matmul(x, y):
    """float16/bfloat16 operands multiplied with float32 accumulation, the product stored back."""
    dt = np.result_type(x.dtype, y.dtype)
    return np.matmul(x.astype(np.float32), y.astype(np.float32)).astype(dt)


def _matmul_impl(x, y):
    if x.dtype in LOW_PRECISION or y.dtype in LOW_PRECISION:
        return _low_precision_matmul(x, y)
    return np.matmul(x, y)


def _matmul_emit(ctx, ins, attrs, in_avals, out_aval):
    a, b = in_avals
    if a.dtype in LOW_PRECISION or b.dtype in LOW_PRECISION:
        return expr(f"{ctx.const(_low_precision_matmul)}({ins[0]}, {ins[1]})")
    if a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype == out_aval.dtype:
        dot = f"np.dot({ins[0]}, {ins[1]}, {{o}})"  # much lower call overhead than matmul
        if cext.available() and a.dtype in cext.FLOATS and a.shape[0] * a.shape[1] * b.shape[1] > POOL_GEMM_MIN:
            # split over the engine's threads when it has several (engine.set_num_threads)
            return stmt(f"if not {ctx.const(cext._native.gemm)}({ins[0]}, {ins[1]}, {{o}}): {dot}")
        return stmt(dot)
    return stmt(f"np.matmul({ins[0]}, {ins[1]}, {{o}})")


matmul_p = _define("matmul", _matmul_rule, _matmul_impl, _matmul_emit, _matmul_vjp, _matmul_jvp)


def _matmul_shard(in_avals, attrs, out_aval, n):
    """Megatron's and MindSpore's matmul partitions of ``[..., M, K] @ [..., K, N]``: rows of the left operand
    (data parallelism) split the output's rows; columns of the right operand split its columns; the
    contracting axis split on both leaves a partial sum; a batch axis both operands have splits the output's;
    a partial operand times a replicated one is a partial product."""
    a, b = in_avals
    S, R = _sharding.S, _sharding.R
    r = len(out_aval.shape)
    out = [_sharding.Strategy((R, R), R)]
    if _sharding.splittable(a.shape[-2], n):
        out.append(_sharding.Strategy((S(a.ndim - 2), R), S(r - 2)))
    if _sharding.splittable(b.shape[-1], n):
        out.append(_sharding.Strategy((R, S(b.ndim - 1)), S(r - 1)))
    if _sharding.splittable(a.shape[-1], n):
        out.append(_sharding.Strategy((S(a.ndim - 1), S(b.ndim - 2)), _sharding.PSUM))
    for ax in range(r - 2):  # batch axes
        ia, ib = ax - (r - a.ndim), ax - (r - b.ndim)
        if not _sharding.splittable(out_aval.shape[ax], n):
            continue
        la = S(ia) if ia >= 0 and a.shape[ia] == out_aval.shape[ax] else R
        lb = S(ib) if ib >= 0 and b.shape[ib] == out_aval.shape[ax] else R
        out.append(_sharding.Strategy((la, lb), S(ax)))
    out += [_sharding.Strategy((_sharding.PSUM, R), _sharding.PSUM), _sharding.Strategy((R, _sharding.PSUM), _sharding.PSUM)]
    return out


matmul_p.shard = _matmul_shard
