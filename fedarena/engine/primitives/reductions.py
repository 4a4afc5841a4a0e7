"""Reductions and scans along axes beyond sum/max/min: ``reduce_prod``, ``cumsum`` and ``argsort``.

Each primitive is defined here completely (rule, kernel, emitter, VJP/JVP, batching).  The
product's gradient is the product of the other elements, computed without dividing by zero:
with no zero in a group it is ``prod / x``; with exactly one zero, the zero's entry gets the
product of the others and every other entry 0; with two or more zeros all entries get 0.
``cumsum``'s transpose is the reversed cumulative sum; ``argsort`` is stable (numpy's
``kind="stable"``), and ``ops.sort`` is ``take_along_axis(x, argsort(x))`` so it inherits the
gather's gradient.
"""

from __future__ import annotations

import numpy as np

from ..ir import ShapedArray, ShapeError
from ..tracing import bind
from . import (
    _define,
    _expand_reduced,
    _norm_axes,
    _reduce_rule,
    broadcast_to,
    cast,
    div,
    dtype_of,
    eq,
    expr,
    logical_and,
    mul,
    reduce_sum,
    select,
    shape_of,
    stmt,
)

# ---------------------------------------------------------------------------- reduce_prod


_prod_rule = _reduce_rule("sum")  # bool/int products accumulate in int64, as numpy's


def _prod_impl(x, axes, keepdims):
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.multiply.reduce(x, axis=tuple(axes), keepdims=keepdims, dtype=dt)


def _prod_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.multiply.reduce({ins[0]}, {tuple(attrs['axes'])!r}, {ctx.const(out_aval.dtype)}, {{o}}, {attrs['keepdims']})")


def reduce_prod(x, axes, keepdims=False):
    return bind(reduce_prod_p, x, axes=tuple(axes), keepdims=bool(keepdims))


def _others_product(x, axes):
    """For each element, the product of the other elements of its reduction group (no division by 0)."""
    xs, dt = shape_of(x), dtype_of(x)
    zero = eq(x, 0)
    n_zero = reduce_sum(cast(zero, np.int64), axes, keepdims=True)
    safe = select(zero, np.ones((), dt), x)
    p_safe = broadcast_to(reduce_prod(safe, axes, keepdims=True), xs)
    none = broadcast_to(eq(n_zero, 0), xs)
    one_here = logical_and(broadcast_to(eq(n_zero, 1), xs), zero)
    return select(none, div(p_safe, safe), select(one_here, p_safe, np.zeros((), dt)))


def _prod_vjp(need, ct, out, x, axes, keepdims):
    c = _expand_reduced(ct, shape_of(x), axes, keepdims)
    return (mul(broadcast_to(c, shape_of(x)), _others_product(x, axes)),)


def _prod_jvp(ts, out, x, axes, keepdims):
    return reduce_sum(mul(ts[0], _others_product(x, axes)), axes, keepdims)


def _shift_axes_batch(prim, vals, batched, size, **attrs):
    return bind(prim, vals[0], **{**attrs, "axes": tuple(a + 1 for a in attrs["axes"])})


reduce_prod_p = _define("reduce_prod", _prod_rule, _prod_impl, _prod_emit, _prod_vjp, _prod_jvp)
reduce_prod_p.batch = _shift_axes_batch

# ---------------------------------------------------------------------------- cumsum


def _cumsum_rule(avals, attrs, weak):
    av = avals[0]
    _norm_axes((attrs["axis"],), av.ndim)
    dt = np.dtype(np.int64) if av.dtype.kind in "biu" else av.dtype
    return ShapedArray(av.shape, dt)


def _cumsum_impl(x, axis, reverse):
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis, dtype=dt), axis)
    return np.cumsum(x, axis, dtype=dt)


def _cumsum_emit(ctx, ins, attrs, in_avals, out_aval):
    if attrs["reverse"]:
        return expr(f"{ctx.const(_cumsum_impl)}({ins[0]}, {attrs['axis']}, True)")
    return stmt(f"np.cumsum({ins[0]}, {attrs['axis']}, {ctx.const(out_aval.dtype)}, {{o}})")


def cumsum(x, axis, reverse=False):
    (axis,) = _norm_axes((axis,), len(shape_of(x)))
    return bind(cumsum_p, x, axis=axis, reverse=bool(reverse))


def _cumsum_vjp(need, ct, out, x, axis, reverse):
    return (cumsum(ct, axis, not reverse),)


def _cumsum_jvp(ts, out, x, axis, reverse):
    return cumsum(ts[0], axis, reverse)


def _axis_batch(prim, vals, batched, size, **attrs):
    return bind(prim, vals[0], **{**attrs, "axis": attrs["axis"] + 1})


cumsum_p = _define("cumsum", _cumsum_rule, _cumsum_impl, _cumsum_emit, _cumsum_vjp, _cumsum_jvp)
cumsum_p.batch = _axis_batch

# ---------------------------------------------------------------------------- argsort


def _argsort_rule(avals, attrs, weak):
    av = avals[0]
    _norm_axes((attrs["axis"],), av.ndim)
    if av.dtype == np.bool_:
        raise ShapeError("argsort of bool values: cast them to an integer type first")
    return ShapedArray(av.shape, np.int64)


def _argsort_impl(x, axis):
    return np.argsort(x, axis=axis, kind="stable")


def _argsort_emit(ctx, ins, attrs, in_avals, out_aval):
    return expr(f"np.argsort({ins[0]}, {attrs['axis']}, 'stable')")


argsort_p = _define("argsort", _argsort_rule, _argsort_impl, _argsort_emit, differentiable=False)
argsort_p.batch = _axis_batch

