"""Every primitive of the engine, with its shape/dtype rule, numpy kernel, code emitter,
VJP rule and (where simple) JVP rule — adding a primitive touches only this module.

The rule tables follow JAX's per-primitive design (``jax/_src/lax``); gradient formulas are
the standard ones (Griewank & Walther, "Evaluating Derivatives", 2nd ed., ch. 3-4).  Broadcasting
follows numpy semantics; reverse rules sum cotangents over broadcast axes.  Convolution uses
im2col + matmul (Chellapilla et al., "High performance convolutional neural networks for
document processing", 2006) in NCHW layout with OIHW weights.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import scipy.special
from numpy.lib.stride_tricks import as_strided

from ..ir import LOW_PRECISION, ShapedArray, ShapeError, is_float
from .. import cext
from ..tracing import Primitive, aval_of, bind, register, user_source
from .emit import CLIP, Code, EmitContext, expr, stmt  # noqa: F401  (the emit vocabulary, re-exported)

# ============================================================================ helpers


def shape_of(x: Any) -> tuple:
    return aval_of(x).shape


def dtype_of(x: Any) -> np.dtype:
    return aval_of(x).dtype


def _stand_in(av: ShapedArray) -> Any:
    return 0.0 if is_float(av.dtype) else {"b": False, "i": 0, "u": 0}[av.dtype.kind]


def promote(avals: Sequence[ShapedArray], weak: Sequence[bool]) -> np.dtype:
    """numpy's result type, with Python scalars weak (NEP 50)."""
    parts = [_stand_in(av) if w else av.dtype for av, w in zip(avals, weak)]
    return np.result_type(*parts)


def broadcast_shapes(*shapes: tuple) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(s) for s in shapes)} do not broadcast") from None


def _floatify(dt: np.dtype) -> np.dtype:
    return dt if is_float(dt) else np.dtype(np.float64)


def _define(
    name: str,
    rule: Callable,
    impl: Callable,
    emit: Callable | None,
    vjp: Callable | None = None,
    jvp: Callable | None = None,
    differentiable: bool = True,
) -> Primitive:
    p = register(name)
    p.abstract_eval = rule
    p.impl = impl
    p.emit = emit
    p.vjp = vjp
    p.jvp = jvp
    p.differentiable = differentiable
    return p


# Internal binders used by the rules (public, numpy-named versions live in ops.py).


def add(x, y):
    return bind(add_p, x, y)


def sub(x, y):
    return bind(sub_p, x, y)


def mul(x, y):
    return bind(mul_p, x, y)


def div(x, y):
    return bind(div_p, x, y)


def neg(x):
    return bind(neg_p, x)


def exp(x):
    return bind(exp_p, x)


def log(x):
    return bind(log_p, x)


def sign(x):
    return bind(sign_p, x)


def select(p, a, b):
    return bind(select_p, p, a, b)


def eq(x, y):
    return bind(eq_p, x, y)


def gt(x, y):
    return bind(gt_p, x, y)


def ge(x, y):
    return bind(ge_p, x, y)


def le(x, y):
    return bind(le_p, x, y)


def logical_and(x, y):
    return bind(and_p, x, y)


def cast(x, dtype):
    dtype = np.dtype(dtype)
    if dtype_of(x) == dtype and not isinstance(x, (bool, int, float)):
        return x
    return bind(cast_p, x, dtype=dtype)


def reduce_sum(x, axes, keepdims=False):
    return bind(reduce_sum_p, x, axes=tuple(axes), keepdims=bool(keepdims))


def reshape(x, shape):
    shape = tuple(int(s) for s in shape)
    if shape_of(x) == shape:
        return x
    return bind(reshape_p, x, shape=shape)


def broadcast_to(x, shape):
    shape = tuple(int(s) for s in shape)
    if shape_of(x) == shape and not isinstance(x, (bool, int, float)):
        return x
    return bind(broadcast_to_p, x, shape=shape)


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind(transpose_p, x, perm=perm)


def matmul(x, y):
    return bind(matmul_p, x, y)


def full(shape, dtype, value=0):
    return bind(full_p, shape=tuple(int(s) for s in shape), dtype=np.dtype(dtype), value=value)


def zeros_like_aval(av: ShapedArray):
    return full(av.shape, av.dtype, 0)


def unbroadcast(ct, shape: tuple):
    """Sum ``ct`` over the axes along which a value of ``shape`` was broadcast."""
    cs = shape_of(ct)
    shape = tuple(shape)
    if cs == shape:
        return ct
    lead = len(cs) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and cs[i + lead] != 1)
    r = reduce_sum(ct, axes) if axes else ct
    return reshape(r, shape)


def _bcast_tangent(t, shape):
    return broadcast_to(t, shape) if shape_of(t) != tuple(shape) else t


def _swap_last(x):
    n = len(shape_of(x))
    return transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))


# ============================================================================ elementwise


def _ew_rule(kind: str):
    """Shape/dtype rule for elementwise primitives: broadcast shapes; dtype by ``kind``."""

    def rule(avals, attrs, weak):
        shape = broadcast_shapes(*[a.shape for a in avals])
        if kind == "promote":
            dt = promote(avals, weak)
        elif kind == "float":
            dt = _floatify(promote(avals, weak))
        elif kind == "bool":
            promote(avals, weak)
            dt = np.dtype(np.bool_)
        elif kind == "logical":
            for a, w in zip(avals, weak):
                if a.dtype != np.bool_:
                    raise ShapeError(f"logical operations need bool operands, got {a.dtype}")
            dt = np.dtype(np.bool_)
        else:  # pragma: no cover
            raise AssertionError(kind)
        return ShapedArray(shape, dt)

    return rule


def _ufunc_impl(uf):
    def impl(*args, **attrs):
        return uf(*args)

    return impl


def _ufunc_emit(uf_name: str):
    def emit(ctx, ins, attrs, in_avals, out_aval):
        if uf_name in ("np.maximum", "np.minimum"):  # numpy deprecates positional out for these
            return stmt(f"{uf_name}({', '.join(ins)}, out={{o}})")
        return Code(f"{uf_name}({', '.join(ins)}, {{o}})", "stmt", f"{uf_name}({', '.join(ins)})")  # positional out

    return emit


def _unary(name, uf, uf_name, kind, vjp_from_out=None, vjp_from_x=None):
    """A unary elementwise primitive whose derivative is ``d(x, out)``; its JVP is the same
    diagonal scaling as its VJP."""
    d = vjp_from_out or vjp_from_x

    def vjp(need, ct, out, x, **attrs):
        return (d(ct, x, out),)

    def jvp(tangents, out, x, **attrs):
        t = tangents[0]
        return d(t, x, out)

    return _define(name, _ew_rule(kind), _ufunc_impl(uf), _ufunc_emit(uf_name), vjp if d else None, jvp if d else None)


neg_p = _unary("neg", np.negative, "np.negative", "promote", vjp_from_x=lambda ct, x, out: neg(ct))
exp_p = _unary("exp", np.exp, "np.exp", "float", vjp_from_out=lambda ct, x, out: mul(ct, out))
log_p = _unary("log", np.log, "np.log", "float", vjp_from_x=lambda ct, x, out: div(ct, x))
log1p_p = _unary("log1p", np.log1p, "np.log1p", "float", vjp_from_x=lambda ct, x, out: div(ct, add(x, 1.0)))
tanh_p = _unary("tanh", np.tanh, "np.tanh", "float", vjp_from_out=lambda ct, x, out: mul(ct, sub(1.0, mul(out, out))))
logistic_p = _unary(
    "logistic", scipy.special.expit, "_expit", "float", vjp_from_out=lambda ct, x, out: mul(ct, mul(out, sub(1.0, out)))
)
sqrt_p = _unary("sqrt", np.sqrt, "np.sqrt", "float", vjp_from_out=lambda ct, x, out: div(ct, mul(out, 2.0)))
sin_p = _unary("sin", np.sin, "np.sin", "float", vjp_from_x=lambda ct, x, out: mul(ct, bind(cos_p, x)))
cos_p = _unary("cos", np.cos, "np.cos", "float", vjp_from_x=lambda ct, x, out: neg(mul(ct, bind(sin_p, x))))
abs_p = _unary("abs", np.abs, "np.absolute", "promote", vjp_from_x=lambda ct, x, out: mul(ct, sign(x)))
sign_p = _define("sign", _ew_rule("promote"), _ufunc_impl(np.sign), _ufunc_emit("np.sign"), differentiable=False)


def _rsqrt_impl(x, **attrs):
    return 1.0 / np.sqrt(x)


def _rsqrt_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.sqrt({ins[0]}, {{o}}); np.reciprocal({{o}}, {{o}})")


rsqrt_p = _define(
    "rsqrt",
    _ew_rule("float"),
    _rsqrt_impl,
    _rsqrt_emit,
    vjp=lambda need, ct, out, x: (mul(ct, div(mul(out, -0.5), x)),),
    jvp=lambda ts, out, x: mul(ts[0], div(mul(out, -0.5), x)),
)


def _relu_impl(x):
    return np.maximum(x, 0)


def _relu_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.maximum({ins[0]}, 0, out={{o}})")


relu_p = _define(
    "relu",
    _ew_rule("promote"),
    _relu_impl,
    _relu_emit,
    vjp=lambda need, ct, out, x: (mul(ct, gt(out, 0)),),
    jvp=lambda ts, out, x: mul(ts[0], gt(out, 0)),
)

# ---------------------------------------------------------------------------- binary


def _binary(name, uf, uf_name, kind, vjp=None, jvp=None, differentiable=True):
    return _define(name, _ew_rule(kind), _ufunc_impl(uf), _ufunc_emit(uf_name), vjp, jvp, differentiable)


def _add_vjp(need, ct, out, x, y):
    return (unbroadcast(ct, shape_of(x)) if need[0] else None, unbroadcast(ct, shape_of(y)) if need[1] else None)


def _sub_vjp(need, ct, out, x, y):
    return (unbroadcast(ct, shape_of(x)) if need[0] else None, unbroadcast(neg(ct), shape_of(y)) if need[1] else None)


def _mul_vjp(need, ct, out, x, y):
    return (
        unbroadcast(mul(ct, y), shape_of(x)) if need[0] else None,
        unbroadcast(mul(ct, x), shape_of(y)) if need[1] else None,
    )


def _div_vjp(need, ct, out, x, y):
    return (
        unbroadcast(div(ct, y), shape_of(x)) if need[0] else None,
        unbroadcast(neg(div(mul(ct, out), y)), shape_of(y)) if need[1] else None,
    )


def _pow_vjp(need, ct, out, x, y):
    gx = gy = None
    if need[0]:
        if isinstance(y, (int, float)) and not isinstance(y, bool):
            if y == 2:
                d = mul(x, 2.0)
            elif y == 1:
                d = None
            else:
                d = mul(bind(pow_p, x, y - 1), y)
        else:
            d = mul(y, bind(pow_p, x, sub(y, 1)))
        gx = unbroadcast(ct if d is None else mul(ct, d), shape_of(x))
    if need[1]:
        gy = unbroadcast(mul(ct, mul(out, log(x))), shape_of(y))
    return (gx, gy)


def _sum_tangents(out, *terms):
    acc = None
    for t in terms:
        if t is None:
            continue
        t = _bcast_tangent(t, shape_of(out))
        acc = t if acc is None else add(acc, t)
    return acc


def _add_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], ts[1])


def _sub_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], None if ts[1] is None else neg(ts[1]))


def _mul_jvp(ts, out, x, y):
    return _sum_tangents(out, None if ts[0] is None else mul(ts[0], y), None if ts[1] is None else mul(x, ts[1]))


def _div_jvp(ts, out, x, y):
    return _sum_tangents(
        out, None if ts[0] is None else div(ts[0], y), None if ts[1] is None else neg(div(mul(ts[1], out), y))
    )


def _pow_jvp(ts, out, x, y):
    a = None if ts[0] is None else mul(ts[0], mul(y, bind(pow_p, x, sub(y, 1))))
    b = None if ts[1] is None else mul(ts[1], mul(out, log(x)))
    return _sum_tangents(out, a, b)


def _minmax_weights(x, y, bigger: bool):
    """Share of the cotangent going to x for maximum (bigger) / minimum; ties split 0.5/0.5
    (PyTorch's convention).  bool masks multiply as 0/1."""
    win = gt(x, y) if bigger else bind(lt_p, x, y)
    dt = _floatify(dtype_of(y) if isinstance(x, (bool, int, float)) else dtype_of(x))
    return add(mul(eq(x, y), dt.type(0.5)), win)


def _minmax_vjp(bigger):
    def vjp(need, ct, out, x, y):
        gx_full = mul(ct, _minmax_weights(x, y, bigger))
        gx = unbroadcast(gx_full, shape_of(x)) if need[0] else None
        gy = unbroadcast(sub(ct, gx_full), shape_of(y)) if need[1] else None
        return (gx, gy)

    return vjp


def _minmax_jvp(bigger):
    def jvp(ts, out, x, y):
        w = _minmax_weights(x, y, bigger)
        return _sum_tangents(out, None if ts[0] is None else mul(ts[0], w), None if ts[1] is None else mul(ts[1], sub(1.0, w)))

    return jvp


def _pow_emit(ctx, ins, attrs, in_avals, out_aval):
    if ins[1] == "2":
        return stmt(f"np.multiply({ins[0]}, {ins[0]}, {{o}})")
    return stmt(f"np.power({ins[0]}, {ins[1]}, {{o}})")


add_p = _binary("add", np.add, "np.add", "promote", _add_vjp, _add_jvp)
sub_p = _binary("sub", np.subtract, "np.subtract", "promote", _sub_vjp, _sub_jvp)
mul_p = _binary("mul", np.multiply, "np.multiply", "promote", _mul_vjp, _mul_jvp)
div_p = _binary("div", np.true_divide, "np.true_divide", "float", _div_vjp, _div_jvp)
pow_p = _define("pow", _ew_rule("promote"), _ufunc_impl(np.power), _pow_emit, _pow_vjp, _pow_jvp)
max_p = _binary("maximum", np.maximum, "np.maximum", "promote", _minmax_vjp(True), _minmax_jvp(True))
min_p = _binary("minimum", np.minimum, "np.minimum", "promote", _minmax_vjp(False), _minmax_jvp(False))
eq_p = _binary("eq", np.equal, "np.equal", "bool", differentiable=False)
ne_p = _binary("ne", np.not_equal, "np.not_equal", "bool", differentiable=False)
lt_p = _binary("lt", np.less, "np.less", "bool", differentiable=False)
le_p = _binary("le", np.less_equal, "np.less_equal", "bool", differentiable=False)
gt_p = _binary("gt", np.greater, "np.greater", "bool", differentiable=False)
ge_p = _binary("ge", np.greater_equal, "np.greater_equal", "bool", differentiable=False)
and_p = _binary("and", np.logical_and, "np.logical_and", "logical", differentiable=False)
or_p = _binary("or", np.logical_or, "np.logical_or", "logical", differentiable=False)
not_p = _define("not", _ew_rule("logical"), _ufunc_impl(np.logical_not), _ufunc_emit("np.logical_not"), differentiable=False)


# ---------------------------------------------------------------------------- select, cast, clip, stop_gradient


def _select_rule(avals, attrs, weak):
    if avals[0].dtype != np.bool_:
        raise ShapeError(f"the condition must be bool, got {avals[0].dtype}")
    shape = broadcast_shapes(*[a.shape for a in avals])
    return ShapedArray(shape, promote(avals[1:], weak[1:]))


def _select_impl(p, a, b):
    return np.where(p, a, b)


def _select_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.copyto({{o}}, {ins[2]}); np.copyto({{o}}, {ins[1]}, where={ins[0]})")


def _select_vjp(need, ct, out, p, a, b):
    # ct * mask (bool as 0/1) instead of select: much faster in numpy, equal for finite ct.
    return (
        None,
        unbroadcast(mul(ct, p), shape_of(a)) if need[1] else None,
        unbroadcast(mul(ct, bind(not_p, p)), shape_of(b)) if need[2] else None,
    )


def _select_jvp(ts, out, p, a, b):
    ta = full(shape_of(out), dtype_of(out), 0) if ts[1] is None else _bcast_tangent(ts[1], shape_of(out))
    tb = full(shape_of(out), dtype_of(out), 0) if ts[2] is None else _bcast_tangent(ts[2], shape_of(out))
    return select(p, ta, tb)


select_p = _define("select", _select_rule, _select_impl, _select_emit, _select_vjp, _select_jvp)


def _cast_rule(avals, attrs, weak):
    return ShapedArray(avals[0].shape, attrs["dtype"])


def _cast_impl(x, dtype):
    return np.asarray(x).astype(dtype)


def _cast_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.copyto({{o}}, {ins[0]}, casting='unsafe')")


def _cast_vjp(need, ct, out, x, dtype):
    return (cast(ct, dtype_of(x)) if is_float(dtype_of(x)) and is_float(dtype) else None,)


def _cast_jvp(ts, out, x, dtype):
    return cast(ts[0], dtype) if is_float(dtype) else None


cast_p = _define("cast", _cast_rule, _cast_impl, _cast_emit, _cast_vjp, _cast_jvp)


def _same_rule(avals, attrs, weak):
    return avals[0]


def _clip_impl(x, lo, hi):
    return np.clip(x, lo, hi)


def _clip_emit(ctx, ins, attrs, in_avals, out_aval):
    lo = attrs["lo"] if np.isfinite(attrs["lo"]) else ctx.const(attrs["lo"])
    hi = attrs["hi"] if np.isfinite(attrs["hi"]) else ctx.const(attrs["hi"])
    return stmt(f"_clip({ins[0]}, {lo!r}, {hi!r}, {{o}})" if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else f"_clip({ins[0]}, {lo}, {hi}, {{o}})")


def _clip_mask(x, lo, hi):
    return logical_and(ge(x, lo), le(x, hi))


clip_p = _define(
    "clip",
    _same_rule,
    _clip_impl,
    _clip_emit,
    vjp=lambda need, ct, out, x, lo, hi: (mul(ct, _clip_mask(x, lo, hi)),),
    jvp=lambda ts, out, x, lo, hi: mul(ts[0], _clip_mask(x, lo, hi)),
)


def _identity_emit(ctx, ins, attrs, in_avals, out_aval):
    return expr(ins[0])


stop_gradient_p = _define(
    "stop_gradient", _same_rule, lambda x: np.array(x, copy=True), _identity_emit, differentiable=False
)


def _full_rule(avals, attrs, weak):
    return ShapedArray(attrs["shape"], attrs["dtype"])


def _full_impl(shape, dtype, value):
    return np.full(shape, value, dtype)


def _full_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"{{o}}.fill({attrs['value']!r})")


full_p = _define("full", _full_rule, _full_impl, _full_emit, differentiable=False)


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


def _sum_vjp(need, ct, out, x, axes, keepdims):
    return (broadcast_to(_expand_reduced(ct, shape_of(x), axes, keepdims), shape_of(x)),)


def _sum_jvp(ts, out, x, axes, keepdims):
    return reduce_sum(ts[0], axes, keepdims)


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


reduce_sum_p = _define("reduce_sum", _reduce_rule("sum"), _reduce_impl(np.add), _reduce_emit("np.add"), _sum_vjp, _sum_jvp)
reduce_max_p = _define(
    "reduce_max", _reduce_rule("max"), _reduce_impl(np.maximum), _reduce_emit("np.maximum"), _chooser_vjp, _chooser_jvp
)
reduce_min_p = _define(
    "reduce_min", _reduce_rule("min"), _reduce_impl(np.minimum), _reduce_emit("np.minimum"), _chooser_vjp, _chooser_jvp
)


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


argmax_p = _define("argmax", _argmax_rule, _argmax_impl, _argmax_emit, differentiable=False)


# ============================================================================ matmul


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
        return stmt(f"np.dot({ins[0]}, {ins[1]}, {{o}})")  # much lower call overhead than matmul
    return stmt(f"np.matmul({ins[0]}, {ins[1]}, {{o}})")


matmul_p = _define("matmul", _matmul_rule, _matmul_impl, _matmul_emit, _matmul_vjp, _matmul_jvp)


# ============================================================================ shapes (views)


def _linear_jvp(prim):
    """JVP of a primitive linear in its single array input: apply it to the tangent."""

    def jvp(ts, out, x, **attrs):
        return bind(prim, ts[0], **attrs)

    return jvp


def _transpose_rule(avals, attrs, weak):
    av = avals[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(av.ndim)):
        raise ShapeError(f"perm {perm} is not a permutation of the {av.ndim} axes")
    return ShapedArray(tuple(av.shape[p] for p in perm), av.dtype)


def _transpose_vjp(need, ct, out, x, perm):
    inv = tuple(int(i) for i in np.argsort(perm))
    return (transpose(ct, inv),)


transpose_p = _define(
    "transpose",
    _transpose_rule,
    lambda x, perm: np.transpose(x, perm),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.transpose({attrs['perm']!r})"),
    _transpose_vjp,
)
transpose_p.jvp = _linear_jvp(transpose_p)


def _reshape_rule(avals, attrs, weak):
    av = avals[0]
    shape = attrs["shape"]
    if int(np.prod(shape, dtype=np.int64)) != av.size or any(s < 0 for s in shape):
        raise ShapeError(f"cannot reshape {av.shape} ({av.size} elements) into {shape}")
    return ShapedArray(shape, av.dtype)


reshape_p = _define(
    "reshape",
    _reshape_rule,
    lambda x, shape: np.reshape(x, shape),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({attrs['shape']!r})"),
    lambda need, ct, out, x, shape: (reshape(ct, shape_of(x)),),
)
reshape_p.jvp = _linear_jvp(reshape_p)


def _broadcast_rule(avals, attrs, weak):
    av = avals[0]
    shape = attrs["shape"]
    lead = len(shape) - av.ndim
    if lead < 0 or any(s != 1 and s != shape[lead + i] for i, s in enumerate(av.shape)):
        raise ShapeError(f"cannot broadcast {av.shape} to {shape}")
    dt = av.dtype
    if weak[0]:
        dt = np.result_type(_stand_in(av))
    return ShapedArray(shape, dt)


broadcast_to_p = _define(
    "broadcast_to",
    _broadcast_rule,
    lambda x, shape: np.broadcast_to(x, shape),
    lambda ctx, ins, attrs, ia, oa: expr(f"np.broadcast_to({ins[0]}, {attrs['shape']!r})"),
    lambda need, ct, out, x, shape: (unbroadcast(ct, shape_of(x)),),
)
broadcast_to_p.jvp = _linear_jvp(broadcast_to_p)


def _squeeze_rule(avals, attrs, weak):
    av = avals[0]
    axes = _norm_axes(attrs["axes"], av.ndim)
    for a in axes:
        if av.shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {av.shape[a]}")
    return ShapedArray(tuple(s for i, s in enumerate(av.shape) if i not in axes), av.dtype)


squeeze_p = _define(
    "squeeze",
    _squeeze_rule,
    lambda x, axes: np.squeeze(x, axis=tuple(axes)),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({oa.shape!r})"),
    lambda need, ct, out, x, axes: (reshape(ct, shape_of(x)),),
)
squeeze_p.jvp = _linear_jvp(squeeze_p)


def _expand_dims_rule(avals, attrs, weak):
    av = avals[0]
    n = av.ndim + len(attrs["axes"])
    axes = _norm_axes(attrs["axes"], n)
    it = iter(av.shape)
    return ShapedArray(tuple(1 if i in axes else next(it) for i in range(n)), av.dtype)


expand_dims_p = _define(
    "expand_dims",
    _expand_dims_rule,
    lambda x, axes: np.expand_dims(x, tuple(axes)),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({oa.shape!r})"),
    lambda need, ct, out, x, axes: (reshape(ct, shape_of(x)),),
)
expand_dims_p.jvp = _linear_jvp(expand_dims_p)


# ---------------------------------------------------------------------------- slice / pad


def _slice_rule(avals, attrs, weak):
    av = avals[0]
    starts, limits, strides = attrs["starts"], attrs["limits"], attrs["strides"]
    if not (len(starts) == len(limits) == len(strides) == av.ndim):
        raise ShapeError(f"slice needs one start/limit/stride per axis of {av.shape}")
    shape = []
    for s, lo, hi, st in zip(av.shape, starts, limits, strides):
        if not (0 <= lo <= hi <= s) or st < 1:
            raise ShapeError(f"slice [{lo}:{hi}:{st}] is out of bounds for an axis of size {s}")
        shape.append(max(0, (hi - lo + st - 1) // st))
    return ShapedArray(tuple(shape), av.dtype)


def _slices(starts, limits, strides):
    return tuple(slice(a, b, c) for a, b, c in zip(starts, limits, strides))


def _slice_impl(x, starts, limits, strides):
    return x[_slices(starts, limits, strides)]


def _slice_emit(ctx, ins, attrs, in_avals, out_aval):
    name = ctx.const(_slices(attrs["starts"], attrs["limits"], attrs["strides"]))
    return expr(f"{ins[0]}[{name}]")


def _slice_vjp(need, ct, out, x, starts, limits, strides):
    shape = shape_of(x)
    lows = tuple(starts)
    interior = tuple(s - 1 for s in strides)
    n_out = shape_of(ct)
    highs = tuple(dim - (lo + (n - 1) * st + 1) if n > 0 else dim - lo for dim, lo, n, st in zip(shape, lows, n_out, strides))
    return (bind(pad_p, ct, low=lows, high=highs, interior=interior),)


slice_p = _define("slice", _slice_rule, _slice_impl, _slice_emit, _slice_vjp)
slice_p.jvp = _linear_jvp(slice_p)


def _pad_rule(avals, attrs, weak):
    av = avals[0]
    low, high, interior = attrs["low"], attrs["high"], attrs["interior"]
    if not (len(low) == len(high) == len(interior) == av.ndim):
        raise ShapeError(f"pad needs low/high/interior for each axis of {av.shape}")
    if min(low + high + interior, default=0) < 0:
        raise ShapeError("pad amounts must be non-negative")
    shape = tuple(lo + hi + s + max(0, s - 1) * it for s, lo, hi, it in zip(av.shape, low, high, interior))
    return ShapedArray(shape, av.dtype)


def _pad_index(in_shape, low, interior):
    return tuple(slice(lo, lo + max(0, s - 1) * (it + 1) + 1, it + 1) for s, lo, it in zip(in_shape, low, interior))


def _pad_impl(x, low, high, interior):
    shape = _pad_rule([ShapedArray(x.shape, x.dtype)], dict(low=low, high=high, interior=interior), [False]).shape
    out = np.zeros(shape, x.dtype)
    out[_pad_index(x.shape, low, interior)] = x
    return out


def _pad_emit(ctx, ins, attrs, in_avals, out_aval):
    name = ctx.const(_pad_index(in_avals[0].shape, attrs["low"], attrs["interior"]))
    return stmt(f"{{o}}.fill(0); {{o}}[{name}] = {ins[0]}")


def _pad_vjp(need, ct, out, x, low, high, interior):
    shape = shape_of(x)
    starts = tuple(low)
    strides = tuple(i + 1 for i in interior)
    limits = tuple(lo + max(0, s - 1) * st + 1 if s > 0 else lo for s, lo, st in zip(shape, starts, strides))
    return (bind(slice_p, ct, starts=starts, limits=limits, strides=strides),)


pad_p = _define("pad", _pad_rule, _pad_impl, _pad_emit, _pad_vjp)
pad_p.jvp = _linear_jvp(pad_p)


# ---------------------------------------------------------------------------- concatenate / stack


def _concat_rule(avals, attrs, weak):
    if not avals:
        raise ShapeError("nothing to concatenate")
    nd = avals[0].ndim
    (axis,) = _norm_axes((attrs["axis"],), nd)
    for a in avals:
        if a.ndim != nd or any(s != t for i, (s, t) in enumerate(zip(a.shape, avals[0].shape)) if i != axis):
            raise ShapeError(f"all shapes must agree except along axis {axis}: {[x.shape for x in avals]}")
    shape = list(avals[0].shape)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return ShapedArray(tuple(shape), promote(avals, weak))


def _concat_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.concatenate(({', '.join(ins)},), axis={attrs['axis']}, out={{o}})")


def _concat_vjp(need, ct, out, *xs, axis):
    nd = len(shape_of(ct))
    axis = axis % nd
    res = []
    off = 0
    cshape = shape_of(ct)
    for x, nd_ in zip(xs, need):
        n = shape_of(x)[axis]
        if nd_:
            starts = tuple(off if i == axis else 0 for i in range(nd))
            limits = tuple(off + n if i == axis else cshape[i] for i in range(nd))
            res.append(bind(slice_p, ct, starts=starts, limits=limits, strides=(1,) * nd))
        else:
            res.append(None)
        off += n
    return tuple(res)


def _concat_jvp(ts, out, *xs, axis):
    ts = [zeros_like_aval(aval_of(x)) if t is None else t for t, x in zip(ts, xs)]
    return bind(concatenate_p, *ts, axis=axis)


concatenate_p = _define(
    "concatenate", _concat_rule, lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_emit, _concat_vjp, _concat_jvp
)


def _stack_rule(avals, attrs, weak):
    if not avals:
        raise ShapeError("nothing to stack")
    for a in avals:
        if a.shape != avals[0].shape:
            raise ShapeError(f"all shapes must be equal: {[x.shape for x in avals]}")
    nd = avals[0].ndim + 1
    (axis,) = _norm_axes((attrs["axis"],), nd)
    shape = list(avals[0].shape)
    shape.insert(axis, len(avals))
    return ShapedArray(tuple(shape), promote(avals, weak))


def _stack_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.stack(({', '.join(ins)},), axis={attrs['axis']}, out={{o}})")


def _stack_vjp(need, ct, out, *xs, axis):
    cshape = shape_of(ct)
    nd = len(cshape)
    axis = axis % nd
    res = []
    for i, nd_ in enumerate(need):
        if not nd_:
            res.append(None)
            continue
        starts = tuple(i if a == axis else 0 for a in range(nd))
        limits = tuple(i + 1 if a == axis else cshape[a] for a in range(nd))
        s = bind(slice_p, ct, starts=starts, limits=limits, strides=(1,) * nd)
        res.append(reshape(s, shape_of(xs[i])))
    return tuple(res)


def _stack_jvp(ts, out, *xs, axis):
    ts = [zeros_like_aval(aval_of(x)) if t is None else t for t, x in zip(ts, xs)]
    return bind(stack_p, *ts, axis=axis)


stack_p = _define("stack", _stack_rule, lambda *xs, axis: np.stack(xs, axis=axis), _stack_emit, _stack_vjp, _stack_jvp)


# ============================================================================ gather / scatter / take / one_hot


def _check_index(av: ShapedArray, what: str) -> None:
    if av.dtype.kind not in "iu":
        raise ShapeError(f"{what} indices must be integers, got {av.dtype}")


def _gather_rule(avals, attrs, weak):
    x, idx = avals
    _check_index(idx, "gather")
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    if idx.ndim != x.ndim or any(i != axis and idx.shape[i] != x.shape[i] for i in range(x.ndim)):
        raise ShapeError(f"gather along axis {axis}: indices {idx.shape} must match {x.shape} except on that axis")
    return ShapedArray(idx.shape, x.dtype)


def _grid(idx_shape, axis):
    """Open-grid index arrays for every axis but ``axis`` (``None`` at ``axis``)."""
    nd = len(idx_shape)
    g = []
    for d in range(nd):
        if d == axis:
            g.append(None)
        else:
            sh = [1] * nd
            sh[d] = idx_shape[d]
            g.append(np.arange(idx_shape[d]).reshape(sh))
    return g


def _full_index(idx, axis):
    g = _grid(idx.shape, axis % idx.ndim)
    g[axis % idx.ndim] = idx
    return tuple(g)


def _gather_impl(x, idx, axis):
    return np.take_along_axis(x, idx, axis=axis)


class FlatIndex:
    """Gather/scatter along ``axis`` through flat positions in the C-ordered array: position =
    a constant offset per element of the other axes + index * stride.  One ``np.take`` or flat
    assignment replaces fancy indexing with one index array per axis (~2-3x faster from ~1k
    elements).  Used only while every index lies in [0, size of the axis): otherwise (negative
    indices wrap, out-of-range ones raise) the fancy-indexing ``fallback`` runs."""

    def __init__(self, x_shape, idx_shape, axis):
        strides = np.cumprod((1,) + tuple(x_shape[::-1]))[:-1][::-1]
        base = np.zeros(idx_shape, np.intp)
        for d, g in enumerate(_grid(idx_shape, axis)):
            if g is not None:
                base = base + g * int(strides[d])
        self.base, self.stride, self.limit = base, int(strides[axis]), int(x_shape[axis])
        self.pos = np.empty(idx_shape, np.intp)
        self.grid, self.axis = tuple(_grid(idx_shape, axis)), axis

    def positions(self, idx):
        """Flat positions, or None when an index is outside [0, limit)."""
        u = idx.view(np.uint64 if idx.dtype.itemsize == 8 else np.uint32) if idx.dtype.kind == "i" else idx
        if u.max() >= self.limit:
            return None
        if self.stride == 1:
            np.add(idx, self.base, out=self.pos, casting="unsafe")
        else:
            np.multiply(idx, self.stride, out=self.pos, casting="unsafe")
            np.add(self.pos, self.base, out=self.pos)
        return self.pos

    def full_index(self, idx):
        g = list(self.grid)
        g[self.axis] = idx
        return tuple(g)

    def gather(self, x, idx, out):
        pos = self.positions(idx)
        if pos is None:
            out[...] = x[self.full_index(idx)]
        else:
            np.take(x, pos, out=out)
        return out

    def scatter(self, upd, idx, out):
        """out = zeros with ``upd`` placed at the indices (one index per position: no duplicates)."""
        out.fill(0)
        pos = self.positions(idx)
        if pos is None:
            out[self.full_index(idx)] = upd
        else:
            out.reshape(-1)[pos] = upd
        return out


_FLAT_INDEX_MIN = 1024  # index elements; below, one fancy-indexing call is cheaper


def _flat_index_pays(idx: ShapedArray) -> bool:
    return idx.size >= _FLAT_INDEX_MIN and idx.dtype.kind in "iu" and idx.dtype.itemsize in (4, 8)


def _gather_emit(ctx, ins, attrs, in_avals, out_aval):
    axis = attrs["axis"] % in_avals[0].ndim
    if _flat_index_pays(in_avals[1]):
        k = ctx.const(FlatIndex(in_avals[0].shape, in_avals[1].shape, axis))
        return stmt(f"{k}.gather({ins[0]}, {ins[1]}, {{o}})")
    g = _grid(in_avals[1].shape, axis)
    names = [ins[1] if a is None else ctx.const(a) for a in g]
    return expr(f"{ins[0]}[{', '.join(names)},]")


def _gather_vjp(need, ct, out, x, idx, axis):
    return (bind(scatter_add_p, ct, idx, axis=axis, shape=shape_of(x)), None)


def _gather_jvp(ts, out, x, idx, axis):
    return bind(gather_p, ts[0], idx, axis=axis)


gather_p = _define("gather", _gather_rule, _gather_impl, _gather_emit, _gather_vjp, _gather_jvp)


def _scatter_rule(avals, attrs, weak):
    upd, idx = avals
    _check_index(idx, "scatter_add")
    shape = attrs["shape"]
    if upd.shape != idx.shape:
        raise ShapeError(f"updates {upd.shape} and indices {idx.shape} must have the same shape")
    (axis,) = _norm_axes((attrs["axis"],), len(shape))
    if len(shape) != idx.ndim or any(i != axis and idx.shape[i] != shape[i] for i in range(len(shape))):
        raise ShapeError(f"scatter_add along axis {axis}: indices {idx.shape} must match {shape} except on that axis")
    return ShapedArray(shape, upd.dtype)


def _scatter_impl(upd, idx, axis, shape):
    out = np.zeros(shape, upd.dtype)
    np.add.at(out, _full_index(idx, axis), upd)
    return out


def _scatter_emit(ctx, ins, attrs, in_avals, out_aval):
    axis = attrs["axis"] % len(attrs["shape"])
    g = _grid(in_avals[1].shape, axis)
    names = ", ".join(ins[1] if a is None else ctx.const(a) for a in g)
    if in_avals[1].shape[axis] == 1:  # one index per position: no duplicates, plain assignment
        if _flat_index_pays(in_avals[1]):
            k = ctx.const(FlatIndex(tuple(attrs["shape"]), in_avals[1].shape, axis))
            return stmt(f"{k}.scatter({ins[0]}, {ins[1]}, {{o}})")
        return stmt(f"{{o}}.fill(0); {{o}}[{names},] = {ins[0]}")
    return stmt(f"{{o}}.fill(0); np.add.at({{o}}, ({names},), {ins[0]})")


def _scatter_vjp(need, ct, out, upd, idx, axis, shape):
    return (bind(gather_p, ct, idx, axis=axis), None)


scatter_add_p = _define("scatter_add", _scatter_rule, _scatter_impl, _scatter_emit, _scatter_vjp)
scatter_add_p.jvp = lambda ts, out, upd, idx, axis, shape: bind(scatter_add_p, ts[0], idx, axis=axis, shape=shape)


def _take_rule(avals, attrs, weak):
    x, idx = avals
    _check_index(idx, "take")
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    return ShapedArray(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)


def _take_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.take({ins[0]}, {ins[1]}, axis={attrs['axis']}, out={{o}})")


def _take_vjp(need, ct, out, x, idx, axis):
    return (bind(index_add_p, ct, idx, axis=axis % len(shape_of(x)), size=shape_of(x)[axis]), None)


take_p = _define("take", _take_rule, lambda x, idx, axis: np.take(x, idx, axis=axis), _take_emit, _take_vjp)
take_p.jvp = lambda ts, out, x, idx, axis: bind(take_p, ts[0], idx, axis=axis)


def _index_add_rule(avals, attrs, weak):
    upd, idx = avals
    _check_index(idx, "index_add")
    axis, size = attrs["axis"], attrs["size"]
    if upd.shape[axis : axis + idx.ndim] != idx.shape:
        raise ShapeError(f"index_add: updates {upd.shape} must contain the index shape {idx.shape} at axis {axis}")
    return ShapedArray(upd.shape[:axis] + (size,) + upd.shape[axis + idx.ndim :], upd.dtype)


def _index_add_impl(upd, idx, axis, size):
    shape = upd.shape[:axis] + (size,) + upd.shape[axis + idx.ndim :]
    out = np.zeros(shape, upd.dtype)
    np.add.at(out, (slice(None),) * axis + (idx,), upd)
    return out


def _index_add_emit(ctx, ins, attrs, in_avals, out_aval):
    pre = ctx.const((slice(None),) * attrs["axis"])
    return stmt(f"{{o}}.fill(0); np.add.at({{o}}, {pre} + ({ins[1]},), {ins[0]})")


index_add_p = _define(
    "index_add",
    _index_add_rule,
    _index_add_impl,
    _index_add_emit,
    lambda need, ct, out, upd, idx, axis, size: (bind(take_p, ct, idx, axis=axis), None),
)
index_add_p.jvp = lambda ts, out, upd, idx, axis, size: bind(index_add_p, ts[0], idx, axis=axis, size=size)


def _one_hot_rule(avals, attrs, weak):
    _check_index(avals[0], "one_hot")
    return ShapedArray(avals[0].shape + (attrs["num_classes"],), attrs["dtype"])


def _one_hot_impl(x, num_classes, dtype):
    return (np.asarray(x)[..., None] == np.arange(num_classes)).astype(dtype)


def _one_hot_emit(ctx, ins, attrs, in_avals, out_aval):
    ar = ctx.const(np.arange(attrs["num_classes"]))
    return stmt(f"np.equal({ins[0]}[..., None], {ar}, {{o}})")


one_hot_p = _define("one_hot", _one_hot_rule, _one_hot_impl, _one_hot_emit, differentiable=False)


# ============================================================================ convolution and pooling


def conv_out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _pair(v) -> tuple:
    return (int(v), int(v)) if np.isscalar(v) else tuple(int(a) for a in v)


class Im2Col:
    """im2col for fixed shapes: (N,C,H,W) -> (N, KH*KW*C, OH*OW), rows ordered (kh, kw, c) so that
    each kernel offset's block is contiguous; reuses a padded scratch buffer."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, pad_value=0.0):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        self.oh, self.ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        self.pad = ph > 0 or pw > 0
        self.xp = np.full((n, c, h + 2 * ph, w + 2 * pw), pad_value, dtype)
        self.inner = self.xp[:, :, ph : ph + h, pw : pw + w]
        self.geom = (kh, kw, sh, sw, dh, dw)
        self.view = self._view(self.xp)
        self.cols_shape = (n, kh * kw * c, self.oh * self.ow)

    def _view(self, xp):
        n, c = xp.shape[:2]
        s = xp.strides
        kh, kw, sh, sw, dh, dw = self.geom
        return as_strided(xp, (n, kh, kw, c, self.oh, self.ow), (s[0], s[2] * dh, s[3] * dw, s[1], s[2] * sh, s[3] * sw), writeable=False)

    def windows(self, x):
        """Strided (N, KH, KW, C, OH, OW) view of the padded input (valid until the next call)."""
        if self.pad:
            self.inner[...] = x
            return self.view
        return self._view(x)

    def __call__(self, x, out):
        np.copyto(_reshaped(out, self.view.shape), self.windows(x))
        return out


class PhaseGeometry:
    """The phase-plane ("polyphase") layout of a strided convolution.

    The padded input is split into SH*SW phase planes, plane (a, b) holding the padded pixels
    (SH*q + a, SW*r + b) on a (HQ, WQ) grid, HQ = ceil(Hp/SH), WQ = ceil(Wp/SW).  Kernel offset
    (i, j) then reads plane ((i*DH) % SH, (j*DW) % SW) shifted by ((i*DH)//SH, (j*DW)//SW): a
    stride-1 window, and over the flattened planes a single contiguous span of N*C*HQ*WQ elements
    starting at ``off = di*WQ + dj``.  So im2col is one contiguous copy per kernel offset (and
    col2im one contiguous add) instead of N*C*OH strided rows.  The price: the columns have
    HQ*WQ >= OH*OW entries per image; the entries with q >= OH or r >= OW are padding (they read
    whatever lies at the shifted position: finite when the input is).  The same trick is the
    sub-pixel / polyphase decomposition of strided convolutions (e.g. Shi et al., CVPR 2016).
    """

    def __init__(self, x_shape, kernel, stride, padding, dilation):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        self.n, self.c, self.h, self.w, self.sh, self.sw, self.pw = n, c, h, w, sh, sw, pw
        self.oh, self.ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        self.hq, self.wq = -(-(h + 2 * ph) // sh), -(-(w + 2 * pw) // sw)
        self.plane = self.hq * self.wq
        self.size = n * c * self.plane  # one phase, all images and channels
        self.kk = kh * kw
        self.cols_shape = (n, kh * kw * c, self.plane)
        # (phase row, phase col, span offset) of each kernel offset, in (kh, kw) order
        self.taps = [((i * dh) % sh, (j * dw) % sw, ((i * dh) // sh) * self.wq + (j * dw) // sw) for i in range(kh) for j in range(kw)]
        self.length = self.size + max(off for _, _, off in self.taps)
        # (a, b, plane rows, plane cols, image rows, image cols) of every phase that holds pixels
        self.parts = []
        for a in range(sh):
            qa, xa, na = self._phase(sh, ph, a, h)
            for b in range(sw):
                rb, xb, nb = self._phase(sw, pw, b, w)
                if na and nb:
                    self.parts.append((a, b, slice(qa, qa + na), slice(rb, rb + nb), slice(xa, None, sh), slice(xb, None, sw)))

    @staticmethod
    def _phase(s, p, a, size):
        """First plane index, first image index and count of the pixels of phase ``a``."""
        q0 = max(0, -(-(p - a) // s))
        x0 = s * q0 + a - p
        return q0, x0, len(range(x0, size, s))

    def planes(self, flat):
        """(SH, SW, N, C, HQ, WQ) view of a (SH, SW, length) phase buffer."""
        return flat[:, :, : self.size].reshape(self.sh, self.sw, self.n, self.c, self.hq, self.wq)


class PhaseIm2Col(PhaseGeometry):
    """im2col in the phase-plane layout: (N,C,H,W) -> (N, KH*KW*C, HQ*WQ) (see PhaseGeometry)."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, pad_value=0.0):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        self.flat = np.full((self.sh, self.sw, self.length), pad_value, dtype)
        pl = self.planes(self.flat)
        self.src = [self.flat[a, b, off : off + self.size].reshape(self.n, self.c * self.plane) for a, b, off in self.taps]
        self.o3 = (self.n, self.kk, self.c * self.plane)
        self.fill = [(pl[a, b, :, :, qs, rs], (Ellipsis, xs, ys)) for a, b, qs, rs, xs, ys in self.parts]

    def __call__(self, x, out):
        for dst, idx in self.fill:
            np.copyto(dst, x[idx])
        o = _reshaped(out, self.o3)
        for t, src in enumerate(self.src):
            np.copyto(o[:, t], src)
        return out


class PhaseCol2Im(PhaseGeometry):
    """The transpose of :class:`PhaseIm2Col` for columns whose padding entries are zero (as
    conv2d's backward pass produces them): one contiguous add per kernel offset into the phase
    planes (a padding entry lands on some other position and adds nothing), then the planes are
    interleaved into the image."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        self.acc = np.zeros((self.sh, self.sw, self.length), dtype)
        pl = self.planes(self.acc)
        self.dst = [self.acc[a, b, off : off + self.size].reshape(self.n, self.c * self.plane) for a, b, off in self.taps]
        self.o3 = (self.n, self.kk, self.c * self.plane)
        self.out_parts = [((Ellipsis, xs, ys), pl[a, b, :, :, qs, rs]) for a, b, qs, rs, xs, ys in self.parts]

    def __call__(self, cols, out):
        self.acc.fill(0)
        c3 = cols.reshape(self.o3)
        for t, dst in enumerate(self.dst):
            np.add(dst, c3[:, t], dst)
        for idx, src in self.out_parts:
            np.copyto(out[idx], src)
        return out


class ConvInputGrad(PhaseGeometry):
    """The input gradient of a phase-plane convolution, col2im(W2^T @ ct), without the columns.

    ``ct`` (N, O, HQ*WQ) is the output gradient, zero at the padding positions; ``w2`` (O, K) the
    GEMM weights in im2col's (kh, kw, c) row order (a trailing bias column is ignored).  With the
    phase planes laid out (C, N, HQ*WQ), kernel offset t adds W_t^T @ ct to one contiguous
    (C, N*HQ*WQ) span of them, so each offset is one GEMM that accumulates in place (BLAS
    ``gemm`` with beta = 1): no (N, K, HQ*WQ) column buffer is written and read back, and no
    separate add passes.  Then the planes are interleaved into the image as in PhaseCol2Im.
    """

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, out_channels):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        n, c, o, pl = self.n, self.c, out_channels, self.plane
        self.o = o
        self.ct = np.empty((o, n, pl), dtype)  # the gradient with (N, O) swapped: a (O, N*P) matrix
        self.wt = np.empty((self.kk, c, o), dtype)  # W_t^T per offset; W_t = wt[t].T is Fortran-ordered
        self.acc = np.zeros((self.sh, self.sw, self.length), dtype)  # planes as (C, N, HQ, WQ)
        span = c * n * pl
        # the first offset-0 kernel offset of a phase overwrites its whole span (gemm beta = 0), so
        # only phases without one are zeroed per call (phases with no kernel offset stay zero)
        self.dst, self.beta, self.zero, seen = [], [], [], set()
        for t in sorted(range(self.kk), key=lambda t: self.taps[t][2]):
            a, b, off = self.taps[t]
            self.dst.append((t, self.acc[a, b, off : off + span].reshape(c, n * pl)))
            self.beta.append(0.0 if off == 0 and (a, b) not in seen else 1.0)
            if (a, b) not in seen and off != 0:
                self.zero.append(self.acc[a, b])
            seen.add((a, b))
        planes = self.acc[:, :, : self.size].reshape(self.sh, self.sw, c, n, self.hq, self.wq)
        self.out_parts = [((Ellipsis, xs, ys), planes[a, b, :, :, qs, rs].transpose(1, 0, 2, 3)) for a, b, qs, rs, xs, ys in self.parts]
        dt = np.dtype(dtype)
        self.gemm = None
        if dt in (np.dtype(np.float32), np.dtype(np.float64)):
            from scipy.linalg import blas

            self.gemm = blas.sgemm if dt == np.float32 else blas.dgemm
        self.tmp = None if self.gemm is not None else np.empty((c, n * pl), dtype)

    def __call__(self, ct, w2, out):
        np.copyto(self.ct, ct.reshape(self.n, self.o, self.plane).transpose(1, 0, 2), casting="unsafe")
        k = self.kk * self.c
        np.copyto(self.wt, w2[:, :k].reshape(self.o, self.kk, self.c).transpose(1, 2, 0), casting="unsafe")
        for plane in self.zero:
            plane.fill(0)
        a = self.ct.reshape(self.o, -1)
        for (t, dst), beta in zip(self.dst, self.beta):
            if self.gemm is not None:
                # Fortran view: dst^T (N*P, C) = ct^T (N*P, O) @ W_t (O, C) + beta dst^T, in place
                r = self.gemm(1.0, a.T, self.wt[t].T, beta, dst.T, overwrite_c=True)
                if r.ctypes.data != dst.ctypes.data:  # pragma: no cover - a BLAS wrapper that copied
                    raise RuntimeError("conv input gradient: BLAS gemm did not accumulate in place")
            elif beta:
                np.matmul(self.wt[t], a, self.tmp)
                np.add(dst, self.tmp, dst)
            else:
                np.matmul(self.wt[t], a, dst)
        for idx, src in self.out_parts:
            np.copyto(out[idx], src)
        return out


class Col2Im:
    """The transpose of :class:`Im2Col`: scatter-add columns back into an (N,C,H,W) image.

    Strided kernels are accumulated per stride phase into contiguous planes, then interleaved.
    """

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        hp, wp = h + 2 * ph, w + 2 * pw
        hq = max(-(-hp // sh), (dh * (kh - 1)) // sh + oh)
        wq = max(-(-wp // sw), (dw * (kw - 1)) // sw + ow)
        self.acc = np.zeros((sh, sw, n, c, hq, wq), dtype)
        self.targets = [
            (i, j, self.acc[(i * dh) % sh, (j * dw) % sw, :, :, (i * dh) // sh : (i * dh) // sh + oh, (j * dw) // sw : (j * dw) // sw + ow])
            for i in range(kh)
            for j in range(kw)
        ]
        self.phased = sh > 1 or sw > 1
        if self.phased:
            self.full = np.empty((n, c, hq * sh, wq * sw), dtype)
            self.phases = [(self.full[:, :, a::sh, b::sw], self.acc[a, b]) for a in range(sh) for b in range(sw)]
            self.inner = self.full[:, :, ph : ph + h, pw : pw + w]
        else:
            self.inner = self.acc[0, 0, :, :, ph : ph + h, pw : pw + w]
        self.cols6 = (n, kh, kw, c, oh, ow)

    def __call__(self, cols, out):
        self.acc.fill(0)
        c6 = cols.reshape(self.cols6)
        for i, j, t in self.targets:
            np.add(t, c6[:, i, j], t)
        if self.phased:
            for dst, src in self.phases:
                np.copyto(dst, src)
        np.copyto(out, self.inner)
        return out


def _reshaped(a, shape):
    """A view of ``a`` with ``shape``; raises instead of silently copying (kernels write into it)."""
    v = a.view()
    v.shape = shape
    return v


class BiasRow:
    """An im2col/col2im kernel on columns with one extra, constant last row: im2col writes
    ``value`` there (1 in the forward pass, so a GEMM with the bias as an extra weight column
    adds the bias and its weight gradient sums the output gradient: no separate passes), col2im
    ignores it (the row does not depend on the image)."""

    def __init__(self, kernel, value=None):
        self.kernel, self.value = kernel, value

    def __call__(self, a, out):
        if self.value is None:  # col2im: drop the row
            return self.kernel(a[:, :-1], out)
        self.kernel(a, out[:, :-1])
        out[:, -1] = self.value
        return out


def _conv_geometry(x_shape, attrs, kernel):
    if len(x_shape) != 4:
        raise ShapeError(f"expected an NCHW input of rank 4, got shape {x_shape}")
    n, c, h, w = x_shape
    kh, kw = kernel
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
    if oh < 1 or ow < 1:
        raise ShapeError(f"kernel {kernel} (dilation {(dh, dw)}) does not fit the padded input {(h + 2 * ph, w + 2 * pw)}")
    return oh, ow


def _im2col_rule(avals, attrs, weak):
    av = avals[0]
    oh, ow = _conv_geometry(av.shape, attrs, attrs["kernel"])
    n, c, h, w = av.shape
    kh, kw = attrs["kernel"]
    rows = c * kh * kw + (attrs.get("bias_row") is not None)
    if attrs.get("phased"):
        (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
        return ShapedArray((n, rows, -(-(h + 2 * ph) // sh) * -(-(w + 2 * pw) // sw)), av.dtype)
    return ShapedArray((n, rows, oh * ow), av.dtype)


def _im2col_kernel(av_shape, dtype, attrs):
    cls = PhaseIm2Col if attrs.get("phased") else Im2Col
    k = cls(av_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], attrs["pad_value"])
    return k if attrs.get("bias_row") is None else BiasRow(k, attrs["bias_row"])


def _im2col_impl(x, **attrs):
    k = _im2col_kernel(x.shape, x.dtype, attrs)
    return k(x, np.empty(_im2col_rule([ShapedArray(x.shape, x.dtype)], attrs, [False]).shape, x.dtype))


def _im2col_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_im2col_kernel(in_avals[0].shape, in_avals[0].dtype, attrs))
    return stmt(f"{k}({ins[0]}, {{o}})")


def _col2im_attrs(attrs):
    """The col2im attributes of the transpose of an im2col (and back: _im2col_attrs)."""
    out = {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}
    if attrs.get("phased"):
        out["phased"] = True
    if attrs.get("bias_row") is not None:
        out["bias_row"] = 0.0
    return out


def _im2col_vjp(need, ct, out, x, **attrs):
    return (bind(col2im_p, ct, x_shape=shape_of(x), **_col2im_attrs(attrs)),)


def _im2col_jvp(ts, out, x, **attrs):
    if attrs.get("bias_row") is not None:
        attrs = dict(attrs, bias_row=0.0)  # the constant row has no tangent
    return bind(im2col_p, ts[0], **attrs)


im2col_p = _define("im2col", _im2col_rule, _im2col_impl, _im2col_emit, _im2col_vjp)
# im2col(x; kernel, stride, padding, dilation, pad_value, phased=False, bias_row=None): the
# convolution windows of an NCHW image as columns (N, KH*KW*C, L), rows in (kh, kw, c) order, plus
# a last row of constant ``bias_row`` if given (see BiasRow).  Plain: L = OH*OW.
# ``phased=True``: the phase-plane layout of :class:`PhaseGeometry`, L = HQ*WQ, whose entries with
# q >= OH or r >= OW are padding with unspecified (finite for finite x) values; its transpose
# (``col2im(phased=True)``) assumes those entries of its input are zero, which conv2d's backward
# pass guarantees (the cotangent is zero-padded), so use it only as ops.conv2d does.


def _col2im_rule(avals, attrs, weak):
    x_shape = attrs["x_shape"]
    exp_ = _im2col_rule([ShapedArray(x_shape, avals[0].dtype)], dict(attrs, pad_value=0.0), [False])
    if avals[0].shape != exp_.shape:
        raise ShapeError(f"col2im: columns {avals[0].shape} do not match image {x_shape} (expected {exp_.shape})")
    return ShapedArray(x_shape, avals[0].dtype)


def _col2im_kernel(x_shape, dtype, attrs):
    cls = PhaseCol2Im if attrs.get("phased") else Col2Im
    k = cls(x_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    return k if attrs.get("bias_row") is None else BiasRow(k)


def _col2im_impl(cols, **attrs):
    k = _col2im_kernel(attrs["x_shape"], cols.dtype, attrs)
    return k(cols, np.empty(attrs["x_shape"], cols.dtype))


def _col2im_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_col2im_kernel(attrs["x_shape"], in_avals[0].dtype, attrs))
    return stmt(f"{k}({ins[0]}, {{o}})")


def _col2im_vjp(need, ct, out, cols, x_shape, **attrs):
    return (bind(im2col_p, ct, pad_value=0.0, **attrs),)


col2im_p = _define("col2im", _col2im_rule, _col2im_impl, _col2im_emit, _col2im_vjp)
im2col_p.jvp = _im2col_jvp
col2im_p.jvp = lambda ts, out, c, **a: bind(col2im_p, ts[0], **a)


# conv_gemm(w2, cols, x; geometry) = w2 @ cols, where cols must be im2col(x, phased=True, ...) with
# the same geometry (ops.conv2d builds it so).  It is w2 @ im2col(x) with the columns computed once:
# its derivatives treat it as that function of (w2, x), so the input gradient skips the columns
# (conv_input_grad: GEMMs accumulating into the image's phase planes) and the cols operand gets
# no cotangent or tangent of its own.


def _conv_gemm_rule(avals, attrs, weak):
    w2, cols, x = avals
    want = _im2col_rule([x], dict(attrs, pad_value=0.0), [False]).shape
    if cols.shape != want or w2.ndim != 2 or w2.shape[1] != want[1]:
        raise ShapeError(f"conv_gemm: weights {w2.shape} and columns {cols.shape} do not fit image {x.shape} (columns {want})")
    return ShapedArray((cols.shape[0], w2.shape[0], cols.shape[2]), promote(avals[:2], weak[:2]))


def _conv_gemm_emit(ctx, ins, attrs, in_avals, out_aval):
    if in_avals[0].dtype in LOW_PRECISION:
        return expr(f"{ctx.const(_low_precision_matmul)}({ins[0]}, {ins[1]})")
    return stmt(f"np.matmul({ins[0]}, {ins[1]}, {{o}})")


def _geometry(attrs):
    return {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}


def _conv_gemm_vjp(need, ct, out, w2, cols, x, **attrs):
    g_w2 = reduce_sum(matmul(ct, transpose(cols, (0, 2, 1))), (0,)) if need[0] else None
    g_x = bind(conv_input_grad_p, ct, w2, x_shape=shape_of(x), **_geometry(attrs)) if need[2] else None
    return (g_w2, None, g_x)


def _conv_gemm_jvp(ts, out, w2, cols, x, **attrs):
    a = None if ts[0] is None else matmul(ts[0], cols)
    b = None
    if ts[2] is not None:
        extra = {"bias_row": 0.0} if attrs.get("bias_row") is not None else {}
        b = matmul(w2, bind(im2col_p, ts[2], pad_value=0.0, phased=True, **_geometry(attrs), **extra))
    return _sum_tangents(out, a, b)


def _conv_gemm_batch(prim, vals, batched, size, **attrs):
    w2, cols, x = vals
    if not batched[0] and batched[1] and batched[2]:
        cs, xs = shape_of(cols), shape_of(x)
        out = bind(prim, w2, reshape(cols, (cs[0] * cs[1],) + cs[2:]), reshape(x, (xs[0] * xs[1],) + xs[2:]), **attrs)
        return reshape(out, (cs[0], cs[1]) + shape_of(out)[1:])
    # weights batched (or cols/x not both): plain batched matmuls on the columns
    w = reshape(w2, (size, 1) + shape_of(w2)[1:]) if batched[0] else w2
    c = cols if batched[1] else broadcast_to(cols, (size,) + shape_of(cols))
    return matmul(w, c)


conv_gemm_p = _define("conv_gemm", _conv_gemm_rule, lambda w2, cols, x, **a: _matmul_impl(w2, cols), _conv_gemm_emit, _conv_gemm_vjp, _conv_gemm_jvp)
conv_gemm_p.batch = _conv_gemm_batch


def _conv_input_grad_rule(avals, attrs, weak):
    ct, w2 = avals
    x_shape = attrs["x_shape"]
    geo = PhaseGeometry(x_shape, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    if ct.shape != (x_shape[0], w2.shape[0], geo.plane) or w2.ndim != 2 or w2.shape[1] not in (geo.kk * geo.c, geo.kk * geo.c + 1):
        raise ShapeError(f"conv_input_grad: gradient {ct.shape} and weights {w2.shape} do not fit image {x_shape}")
    return ShapedArray(tuple(x_shape), promote(avals, weak))


def _conv_input_grad_kernel(x_shape, dtype, attrs, out_channels):
    return ConvInputGrad(x_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], out_channels)


def _conv_input_grad_impl(ct, w2, **attrs):
    dt = np.result_type(ct.dtype, w2.dtype)
    return _conv_input_grad_kernel(attrs["x_shape"], dt, attrs, w2.shape[0])(ct, w2, np.empty(attrs["x_shape"], dt))


def _conv_input_grad_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_conv_input_grad_kernel(attrs["x_shape"], out_aval.dtype, attrs, in_avals[1].shape[0]))
    return stmt(f"{k}({ins[0]}, {ins[1]}, {{o}})")


def _conv_input_grad_vjp(need, g, out, ct, w2, x_shape, **geo):
    # conv_input_grad(ct, w2) = col2im(w2[:, :K]^T @ ct): transpose through im2col of g
    extra = {"bias_row": 0.0} if shape_of(w2)[1] != geo["kernel"][0] * geo["kernel"][1] * x_shape[1] else {}
    cols = bind(im2col_p, g, pad_value=0.0, phased=True, **geo, **extra)
    g_ct = matmul(w2, cols) if need[0] else None
    g_w2 = reduce_sum(matmul(ct, transpose(cols, (0, 2, 1))), (0,)) if need[1] else None
    return (g_ct, g_w2)


def _conv_input_grad_jvp(ts, out, ct, w2, **attrs):
    a = None if ts[0] is None else bind(conv_input_grad_p, ts[0], w2, **attrs)
    b = None if ts[1] is None else bind(conv_input_grad_p, ct, ts[1], **attrs)
    return _sum_tangents(out, a, b)


def _conv_input_grad_batch(prim, vals, batched, size, **attrs):
    ct, w2 = vals
    xs = tuple(attrs["x_shape"])
    if batched[0] and not batched[1]:
        cs = shape_of(ct)
        out = bind(prim, reshape(ct, (cs[0] * cs[1],) + cs[2:]), w2, **dict(attrs, x_shape=(size * xs[0],) + xs[1:]))
        return reshape(out, (size,) + xs)
    outs = []
    for i in range(size):
        c = reshape(bind(slice_p, ct, starts=(i, 0, 0, 0), limits=(i + 1,) + shape_of(ct)[1:], strides=(1, 1, 1, 1)), shape_of(ct)[1:]) if batched[0] else ct
        w = reshape(bind(slice_p, w2, starts=(i, 0, 0), limits=(i + 1,) + shape_of(w2)[1:], strides=(1, 1, 1)), shape_of(w2)[1:]) if batched[1] else w2
        outs.append(bind(prim, c, w, **attrs))
    return bind(stack_p, *outs, axis=0)


conv_input_grad_p = _define(
    "conv_input_grad", _conv_input_grad_rule, _conv_input_grad_impl, _conv_input_grad_emit, _conv_input_grad_vjp, _conv_input_grad_jvp
)
conv_input_grad_p.batch = _conv_input_grad_batch


def _conv_rule(avals, attrs, weak):
    x, w = avals
    if w.ndim != 4:
        raise ShapeError(f"expected OIHW weights of rank 4, got shape {w.shape}")
    oh, ow = _conv_geometry(x.shape, attrs, w.shape[2:])
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"input has {x.shape[1]} channels but the weights expect {w.shape[1]}")
    return ShapedArray((x.shape[0], w.shape[0], oh, ow), promote(avals, weak))


def abstract_eval_conv(x_aval: ShapedArray, w_aval: ShapedArray, attrs: dict) -> ShapedArray:
    """The conv2d shape rule, raising a ShapeError that names conv2d, the shapes and the user line."""
    try:
        return _conv_rule([x_aval, w_aval], attrs, [False, False])
    except ShapeError as exc:
        raise ShapeError(f"conv2d: {exc}; inputs: {x_aval.str_short()}, {w_aval.str_short()} (at {user_source()})") from None


class Conv2dKernel:
    """conv2d = W(O, C*KH*KW) @ im2col(x)(N, C*KH*KW, OH*OW), reshaped to NCHW."""

    def __init__(self, x_shape, w_shape, dtype, stride, padding, dilation):
        self.im2col = Im2Col(x_shape, dtype, w_shape[2:], stride, padding, dilation)
        self.cols = np.empty(self.im2col.cols_shape, dtype)
        self.w2 = (w_shape[0], -1)
        self.o3 = (x_shape[0], w_shape[0], self.im2col.oh * self.im2col.ow)

    def __call__(self, x, w, out):
        self.im2col(x, self.cols)
        np.matmul(w.transpose(0, 2, 3, 1).reshape(self.w2), self.cols, out=out.reshape(self.o3))
        return out


def _conv_kernel(x_shape, w_shape, dtype, attrs):
    return Conv2dKernel(x_shape, w_shape, dtype, attrs["stride"], attrs["padding"], attrs["dilation"])


def _conv_impl(x, w, **attrs):
    dt = np.result_type(x.dtype, w.dtype)
    k = _conv_kernel(x.shape, w.shape, dt, attrs)
    out = np.empty((x.shape[0], w.shape[0], k.im2col.oh, k.im2col.ow), dt)
    return k(x, w, out)


def _conv_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_conv_kernel(in_avals[0].shape, in_avals[1].shape, out_aval.dtype, attrs))
    return stmt(f"{k}({ins[0]}, {ins[1]}, {{o}})")


def _conv_vjp(need, ct, out, x, w, stride, padding, dilation):
    n = shape_of(x)[0]
    o, c, kh, kw = shape_of(w)
    cs = shape_of(ct)
    geo = dict(kernel=(kh, kw), stride=stride, padding=padding, dilation=dilation)
    ct2 = reshape(ct, (n, o, cs[2] * cs[3]))
    gx = gw = None
    if need[1]:
        cols = bind(im2col_p, x, pad_value=0.0, **geo)
        gw2 = reduce_sum(matmul(ct2, transpose(cols, (0, 2, 1))), (0,))
        gw = transpose(reshape(gw2, (o, kh, kw, c)), (0, 3, 1, 2))
    if need[0]:
        w2t = transpose(reshape(transpose(w, (0, 2, 3, 1)), (o, kh * kw * c)), (1, 0))
        gx = bind(col2im_p, matmul(w2t, ct2), x_shape=shape_of(x), **geo)
    return (gx, gw)


def _conv_jvp(ts, out, x, w, stride, padding, dilation):
    a = None if ts[0] is None else bind(conv2d_p, ts[0], w, stride=stride, padding=padding, dilation=dilation)
    b = None if ts[1] is None else bind(conv2d_p, x, ts[1], stride=stride, padding=padding, dilation=dilation)
    return _sum_tangents(out, a, b)


conv2d_p = _define("conv2d", _conv_rule, _conv_impl, _conv_emit, _conv_vjp, _conv_jvp)


def _pool_rule(avals, attrs, weak):
    av = avals[0]
    oh, ow = _conv_geometry(av.shape, dict(attrs, dilation=(1, 1)), attrs["kernel"])
    return ShapedArray(av.shape[:2] + (oh, ow), av.dtype)


class PoolKernel:
    def __init__(self, x_shape, dtype, kernel, stride, padding, mode):
        pad_value = -np.inf if mode == "max" else 0.0
        if mode == "max" and np.dtype(dtype).kind != "f":
            pad_value = np.iinfo(dtype).min
        self.im2col = Im2Col(x_shape, dtype, kernel, stride, padding, (1, 1), pad_value)
        self.mode = mode
        self.scale = 1.0 / (kernel[0] * kernel[1])

    def __call__(self, x, out):
        win = self.im2col.windows(x)
        if self.mode == "max":
            np.maximum.reduce(win, axis=(1, 2), out=out)
        else:
            np.add.reduce(win, axis=(1, 2), out=out)
            np.multiply(out, self.scale, out=out)
        return out


def _pool_def(mode):
    def kernel(shape, dtype, attrs):
        return PoolKernel(shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], mode)

    def impl(x, **attrs):
        k = kernel(x.shape, x.dtype, attrs)
        return k(x, np.empty(x.shape[:2] + (k.im2col.oh, k.im2col.ow), x.dtype))

    def emit(ctx, ins, attrs, in_avals, out_aval):
        k = ctx.const(kernel(in_avals[0].shape, in_avals[0].dtype, attrs))
        return stmt(f"{k}({ins[0]}, {{o}})")

    def vjp(need, ct, out, x, kernel, stride, padding):
        n, c, h, w = shape_of(x)
        kh, kw = kernel
        oh, ow = shape_of(out)[2:]
        geo = dict(kernel=kernel, stride=stride, padding=padding, dilation=(1, 1))
        ct5 = reshape(ct, (n, 1, c, oh, ow))
        if mode == "max":
            patches = reshape(bind(im2col_p, x, pad_value=-np.inf, **geo), (n, kh * kw, c, oh, ow))
            loc = cast(eq(patches, reshape(out, (n, 1, c, oh, ow))), dtype_of(x))
            cnt = reduce_sum(loc, (1,), keepdims=True)
            g = mul(loc, div(ct5, cnt))
        else:
            g = broadcast_to(mul(ct5, 1.0 / (kh * kw)), (n, kh * kw, c, oh, ow))
        return (bind(col2im_p, reshape(g, (n, kh * kw * c, oh * ow)), x_shape=(n, c, h, w), **geo),)

    return impl, emit, vjp


max_pool2d_p = _define("max_pool2d", _pool_rule, *_pool_def("max"))


def _max_pool_jvp(ts, out, x, kernel, stride, padding):
    """Tangent of the window maximum: the tangent at the arg-max (averaged over ties)."""
    n, c, h, w = shape_of(x)
    kh, kw = kernel
    oh, ow = shape_of(out)[2:]
    geo = dict(kernel=kernel, stride=stride, padding=padding, dilation=(1, 1))
    patches = reshape(bind(im2col_p, x, pad_value=-np.inf, **geo), (n, kh * kw, c, oh, ow))
    loc = cast(eq(patches, reshape(out, (n, 1, c, oh, ow))), dtype_of(x))
    t_patches = reshape(bind(im2col_p, ts[0], pad_value=0.0, **geo), (n, kh * kw, c, oh, ow))
    return div(reduce_sum(mul(t_patches, loc), (1,)), reduce_sum(loc, (1,)))


max_pool2d_p.jvp = _max_pool_jvp
avg_pool2d_p = _define("avg_pool2d", _pool_rule, *_pool_def("avg"))
avg_pool2d_p.jvp = lambda ts, out, x, **a: bind(avg_pool2d_p, ts[0], **a)


# ============================================================================ the other families
# (each module defines its primitives completely: rules, kernels, VJP/JVP and batching)

from . import checks, elementwise, random, reductions  # noqa: E402,F401
