"""Reductions (the reductions family): sum, max, min (ties share the cotangent, PyTorch's
convention), argmax/argmin, and ``reduce_prod``, ``cumsum``, ``argsort``.

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

from ..core.ir import LOW_PRECISION, ShapeError, ShapedArray, is_float
from ..core.tracing import bind
from ..core import cext
from .emit import expr, stmt
from .base import _define, shift_axes, broadcast_to, cast, div, dtype_of, eq, logical_and, mul, reduce_sum, reshape, select, shape_of
from . import sharding as _sharding

# ============================================================================ reductions


def _norm_axes(axes, ndim):
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"axis {a} is out of range for an array of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


def _reduce_rule(kind):
    def rule(avals, attrs, weak):
        av = avals[0]
        axes = _norm_axes(attrs["axes"], av.ndim)
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else s for i, s in enumerate(av.shape))
        else:
            shape = tuple(s for i, s in enumerate(av.shape) if i not in axes)
        dt = av.dtype
        if kind == "sum" and dt.kind in "biu":
            dt = np.dtype(np.int64)
        if kind in ("max", "min") and any(av.shape[a] == 0 for a in axes):
            raise ShapeError("max/min over an empty axis")
        return ShapedArray(shape, dt)

    return rule


def _reduce_impl(uf):
    def impl(x, axes, keepdims):
        if uf is np.add and x.dtype in LOW_PRECISION:  # float32 accumulation, stored back
            return np.add.reduce(x, axis=tuple(axes), keepdims=keepdims, dtype=np.float32).astype(x.dtype)
        return uf.reduce(x, axis=tuple(axes), keepdims=keepdims)

    return impl


_ARG_OF = {"np.maximum": "argmax", "np.minimum": "argmin"}
_TINY_REDUCE = 32  # elements of a 1-d max/min read at its argmax


def _reduce_emit(uf_name):
    def emit(ctx, ins, attrs, in_avals, out_aval):
        axes = tuple(attrs["axes"])
        av = in_avals[0]
        if uf_name == "np.add" and av.dtype in LOW_PRECISION:
            return expr(f"np.add.reduce({ins[0]}, {axes!r}, np.float32, None, {attrs['keepdims']}).astype({ctx.const(av.dtype)})")
        if uf_name == "np.add" and av.ndim == 2 and len(axes) == 1 and is_float(av.dtype) and out_aval.dtype == av.dtype:
            # a row/column sum of a matrix is a matrix-vector product: BLAS is far cheaper than ufunc.reduce
            n = av.shape[axes[0]]
            kd = attrs["keepdims"]
            if axes[0] == 1:
                ones = ctx.const(np.ones((n, 1) if kd else (n,), av.dtype))
                return stmt(f"np.dot({ins[0]}, {ones}, {{o}})")
            ones = ctx.const(np.ones((1, n) if kd else (n,), av.dtype))
            return stmt(f"np.dot({ones}, {ins[0]}, {{o}})")
        if uf_name in _ARG_OF and len(axes) == 1 and out_aval.dtype == av.dtype and cext.row_reduce_native(av, axes[0]):
            # max/min over a short last axis (a batch's logits): one native pass, ~5x cheaper
            # than numpy's reduce loop or a chain of maximum calls over strided views
            fn = ctx.const(cext._native.rowreduce)
            c = av.shape[-1]
            op = 0 if uf_name == "np.maximum" else 1
            fallback = f"{uf_name}.reduce({ins[0]}, {av.ndim - 1}, None, {{o}}, {attrs['keepdims']})"
            return stmt(f"if not {fn}({ins[0]}, {{o}}, {av.size // c}, {c}, {op}, {av.dtype == np.float64}): {fallback}")
        if uf_name in _ARG_OF and av.ndim == 1 and 0 < av.size <= _TINY_REDUCE and out_aval.ndim == 0 and out_aval.dtype == av.dtype:
            # max/min of a handful of elements (a single observation's logits): indexing at argmax
            # skips ufunc.reduce's setup, ~3x cheaper; argmax stops at the first NaN, as max propagates it
            return stmt(f"{{o}}[()] = {ins[0]}[{ins[0]}.{_ARG_OF[uf_name]}()]")
        ax = axes[0] if len(axes) == 1 else axes
        return stmt(f"{uf_name}.reduce({ins[0]}, {ax!r}, None, {{o}}, {attrs['keepdims']})")

    return emit


def _expand_reduced(ct, x_shape, axes, keepdims):
    """Reshape a reduced cotangent so it broadcasts against the input again."""
    axes = _norm_axes(axes, len(x_shape))
    if not keepdims:
        kshape = tuple(1 if i in axes else s for i, s in enumerate(x_shape))
        ct = reshape(ct, kshape)
    return ct


def _sum_transpose(need, ct, out, x, axes, keepdims):
    return (broadcast_to(_expand_reduced(ct, shape_of(x), axes, keepdims), shape_of(x)),)


def _chooser_vjp(need, ct, out, x, axes, keepdims):
    """Cotangent goes to the locations of the max/min, split evenly between ties."""
    xs = shape_of(x)
    o = _expand_reduced(out, xs, axes, keepdims)
    c = _expand_reduced(ct, xs, axes, keepdims)
    loc = cast(eq(x, o), dtype_of(x))
    cnt = reduce_sum(loc, axes, keepdims=True)
    return (mul(loc, div(c, cnt)),)


def _chooser_jvp(ts, out, x, axes, keepdims):
    xs = shape_of(x)
    o = _expand_reduced(out, xs, axes, keepdims)
    loc = cast(eq(x, o), dtype_of(x))
    cnt = reduce_sum(loc, axes, keepdims=keepdims)
    return div(reduce_sum(mul(ts[0], loc), axes, keepdims), cnt)


def _reduce_batch(prim, vals, batched, size, axes, keepdims):
    (x,) = vals
    return bind(prim, x, axes=shift_axes(axes, len(shape_of(x)) - 1), keepdims=keepdims)


def _reduce_cuda(kind: str):
    """The cupy backend's row/column reduction kernel (host for dtypes it has no C type for)."""

    def rule(e, lib):
        x, o = e.inputs[0], e.outputs[0]
        if x.aval.dtype not in lib.CTYPE or o.aval.dtype not in lib.CTYPE:
            return None
        return lib.kernel(lib.reduction_kernel(kind, x.aval, e.attrs["axes"], o.aval.dtype), [x])

    return rule


reduce_sum_p = _define(
    "reduce_sum", _reduce_rule("sum"), _reduce_impl(np.add), _reduce_emit("np.add"),
    transpose=_sum_transpose, linearity="first", batch=_reduce_batch, cuda=_reduce_cuda("sum"),
)
reduce_max_p = _define(
    "reduce_max", _reduce_rule("max"), _reduce_impl(np.maximum), _reduce_emit("np.maximum"), _chooser_vjp, _chooser_jvp,
    batch=_reduce_batch, cuda=_reduce_cuda("max"),
)
reduce_min_p = _define(
    "reduce_min", _reduce_rule("min"), _reduce_impl(np.minimum), _reduce_emit("np.minimum"), _chooser_vjp, _chooser_jvp,
    batch=_reduce_batch, cuda=_reduce_cuda("min"),
)


def _reduce_shard(kind):
    """Sharding rule of a reduction: an axis split and kept stays split (renumbered without ``keepdims``); an
    axis split and reduced leaves each rank a partial result of the same reduction; a partial operand of the
    same reduction stays partial."""

    def shard(in_avals, attrs, out_aval, n):
        av = in_avals[0]
        axes = _norm_axes(attrs["axes"], av.ndim)
        out = [_sharding.Strategy((_sharding.R,), _sharding.R)]
        for ax in range(av.ndim):
            if not _sharding.splittable(av.shape[ax], n):
                continue
            if ax in axes:
                out.append(_sharding.Strategy((_sharding.S(ax),), _sharding.Layout(partial=kind)))
            else:
                j = ax if attrs["keepdims"] else ax - sum(1 for a in axes if a < ax)
                out.append(_sharding.Strategy((_sharding.S(ax),), _sharding.S(j)))
        if is_float(av.dtype) or kind != "sum":
            out.append(_sharding.Strategy((_sharding.Layout(partial=kind),), _sharding.Layout(partial=kind)))
        return out

    return shard


reduce_sum_p.shard = _reduce_shard("sum")
reduce_max_p.shard = _reduce_shard("max")
reduce_min_p.shard = _reduce_shard("min")


def _argmax_rule(avals, attrs, weak):
    av = avals[0]
    (axis,) = _norm_axes((attrs["axis"],), av.ndim)
    if av.shape[axis] == 0:
        raise ShapeError("argmax over an empty axis")
    if attrs["keepdims"]:
        shape = tuple(1 if i == axis else s for i, s in enumerate(av.shape))
    else:
        shape = tuple(s for i, s in enumerate(av.shape) if i != axis)
    return ShapedArray(shape, np.int64)


def _argmax_impl(x, axis, keepdims):
    return np.argmax(x, axis=axis, keepdims=keepdims)


def _argmax_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.argmax({ins[0]}, axis={attrs['axis']}, keepdims={attrs['keepdims']}, out={{o}})")


def _argmax_batch(prim, vals, batched, size, axis, keepdims):
    (x,) = vals
    return bind(prim, x, axis=(int(axis) % (len(shape_of(x)) - 1)) + 1, keepdims=keepdims)


def _argmax_xp(xp, ins, attrs, out):
    out[...] = xp.argmax(ins[0], axis=attrs["axis"]).reshape(out.shape)


argmax_p = _define(
    "argmax", _argmax_rule, _argmax_impl, _argmax_emit, differentiable=False,
    batch=_argmax_batch, cuda=lambda e, lib: lib.xp(_argmax_xp, e),
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


def _prod_xp(xp, ins, attrs, out):
    out[...] = xp.prod(ins[0], axis=tuple(attrs["axes"]), dtype=out.dtype).reshape(out.shape)


reduce_prod_p = _define(
    "reduce_prod", _prod_rule, _prod_impl, _prod_emit, _prod_vjp, _prod_jvp,
    batch=_shift_axes_batch, cuda=lambda e, lib: lib.xp(_prod_xp, e),
)

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


def _cumsum_transpose(need, ct, out, x, axis, reverse):
    return (cumsum(ct, axis, not reverse),)


def _axis_batch(prim, vals, batched, size, **attrs):
    return bind(prim, vals[0], **{**attrs, "axis": attrs["axis"] + 1})


def _cumsum_xp(xp, ins, attrs, out):
    x, axis = ins[0], attrs["axis"]
    if attrs["reverse"]:
        out[...] = xp.flip(xp.cumsum(xp.flip(x, axis), axis, dtype=out.dtype), axis)
    else:
        xp.cumsum(x, axis, dtype=out.dtype, out=out)


cumsum_p = _define(
    "cumsum", _cumsum_rule, _cumsum_impl, _cumsum_emit, transpose=_cumsum_transpose, linearity="first",
    batch=_axis_batch, cuda=lambda e, lib: lib.xp(_cumsum_xp, e),
)

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


def _argsort_xp(xp, ins, attrs, out):
    out[...] = xp.argsort(ins[0], axis=attrs["axis"], kind="stable")  # cupy: a stable sort (its only kind)


def _argsort_cuda(e, lib):
    """A rank-sort kernel along axes up to ``lib.indexing.RANK_SORT_MAX`` long, the array module's stable
    sort beyond; bool keys and literal operands run on the host."""
    (x,) = e.inputs
    if lib.has_literal(e) or x.aval.dtype not in lib.CTYPE or x.aval.dtype == np.bool_:
        return None
    if x.aval.shape[e.attrs["axis"]] > lib.indexing.RANK_SORT_MAX:
        return lib.xp(_argsort_xp, e)
    return lib.kernel(lib.argsort_kernel(x.aval, e.attrs["axis"]), [x])


argsort_p = _define(
    "argsort", _argsort_rule, _argsort_impl, _argsort_emit, differentiable=False, batch=_axis_batch, cuda=_argsort_cuda
)
