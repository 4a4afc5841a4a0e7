"""Linear algebra (the linear-algebra family): ``matmul`` with numpy's batch broadcasting; float16 /
bfloat16 operands multiply with float32 accumulation.
"""

from __future__ import annotations

import numpy as np

from ..core import cext
from ..core.ir import LOW_PRECISION, ShapeError, ShapedArray
from .emit import expr, stmt
from ..core.tracing import bind
from .base import _define, _swap_last, broadcast_shapes, matmul, mul, promote, reshape, shape_of, transpose, unbroadcast
from . import sharding as _sharding

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


def _matmul_transpose(need, ct, out, x, y):
    gx = unbroadcast(matmul(ct, _swap_last(y)), shape_of(x)) if need[0] else None
    gy = unbroadcast(matmul(_swap_last(x), ct), shape_of(y)) if need[1] else None
    return (gx, gy)


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


def _matmul_batch(prim, vals, batched, size, **attrs):
    x, y = vals
    bx, by = batched
    if bx and not by and len(shape_of(y)) == 2:
        # (B, ..., m, k) @ (k, n): one GEMM over all rows instead of B small ones
        s = shape_of(x)
        out = bind(prim, reshape(x, (int(np.prod(s[:-1], dtype=np.int64)), s[-1])), y, **attrs)
        return reshape(out, s[:-1] + (shape_of(y)[1],))
    if by and not bx and len(shape_of(x)) == 2 and len(shape_of(y)) == 3:
        # (m, k) @ (B, k, n): fold the batch into the columns
        b, k, n = shape_of(y)
        yc = reshape(transpose(y, (1, 0, 2)), (k, b * n))
        out = reshape(bind(prim, x, yc, **attrs), (shape_of(x)[0], b, n))
        return transpose(out, (1, 0, 2))
    rank = max((len(shape_of(v)) - (1 if b else 0) for v, b in zip(vals, batched)), default=0)
    x, y = [reshape(v, (shape_of(v)[0],) + (1,) * (rank - (len(shape_of(v)) - 1)) + shape_of(v)[1:])
            if b and len(shape_of(v)) - 1 < rank else v for v, b in zip(vals, batched)]
    if shape_of(x)[-1] == 1 and len(shape_of(x)) >= 2 and len(shape_of(y)) >= 2:
        # contraction over one element (per-example outer products in backward passes): a
        # broadcast multiply is an order of magnitude cheaper than B tiny GEMMs
        return mul(x, y)
    return bind(prim, x, y, **attrs)


matmul_p = _define(
    "matmul", _matmul_rule, _matmul_impl, _matmul_emit, transpose=_matmul_transpose, linearity="bilinear",
    batch=_matmul_batch, cuda=lambda e, lib: lib.matmul(e),  # cuBLAS under cupy
)


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
