"""Elementwise primitives (the elementwise family): unary and binary arithmetic, comparisons and
logic, select/cast/clip/stop_gradient, full, and ``floor_divide``, ``mod`` (numpy's ``remainder``),
``isnan``, ``isfinite``, ``erf``; each with its shape/dtype rule (broadcasting, numpy 2 promotion
with weak Python scalars), numpy kernel, emit rule, VJP and JVP (Griewank & Walther, "Evaluating
Derivatives", 2nd ed., ch. 3-4; reverse rules sum cotangents over broadcast axes).

Each is defined here completely: shape/dtype rule (broadcasting, numpy 2 promotion with weak
Python scalars), numpy kernel and emitter, VJP/JVP and batching rule.  ``mod``'s derivative is
1 in ``x`` and ``-floor(x / y)`` in ``y`` (away from the jumps); ``floor_divide`` is piecewise
constant, so its gradient is zero (JAX's convention).
"""

from __future__ import annotations

import math

import numpy as np

from ..core import cext
from ..core.ir import ShapeError, ShapedArray, is_float
from ..core.tracing import aval_of, bind
from . import cuda as C
from .emit import Code, expr, stmt
from .base import sum_tangents as _sum_tangents  # noqa: F401  (the families' JVPs import it from here)
from .base import _bcast_tangent, _define, loop_batching, _floatify, add, broadcast_shapes, cast, div, dtype_of, eq, exp, full, ge, gt, le, log, logical_and, mul, neg, promote, reshape, select, shape_of, sign, sub, unbroadcast
from . import sharding as _sharding

# ============================================================================ elementwise


def batch_elementwise(prim, vals, batched, size, **attrs):
    """Batching rule of any broadcasting elementwise primitive: batched operands get their batch
    axis in front of as many unit axes as the unbatched rank needs, numpy broadcasting does the rest."""
    rank = max((len(aval_of(v).shape) - (1 if b else 0) for v, b in zip(vals, batched)), default=0)
    out = []
    for v, b in zip(vals, batched):
        s = aval_of(v).shape
        if b and len(s) - 1 < rank:
            v = reshape(v, (s[0],) + (1,) * (rank - (len(s) - 1)) + s[1:])
        out.append(v)
    return bind(prim, *out, **attrs)



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


def _ew_shard(partial: str = ""):
    """Sharding rule of a broadcasting elementwise primitive (``partial``: how it is linear, see
    ``sharding.elementwise``)."""

    def shard(in_avals, attrs, out_aval, n):
        return _sharding.elementwise(in_avals, out_aval, n, partial)

    return shard


def expit(x, out=None):
    """``scipy.special.expit`` (the logistic function); scipy.special is imported on first use, as importing it
    costs about 0.3 s (it pulls in scipy's array-API layer, numpy.testing and numpy.f2py)."""
    from scipy.special import expit as f

    return f(x) if out is None else f(x, out)


_F32 = np.dtype(np.float32)


def tanh(x, out=None):
    """``np.tanh``, except in float32 when the C extension is built: the engine's own float32 tanh
    (``_tanhf.h``: vectorised; within 1.32 ulp of the exact value over [-10, 10], numpy's within 1.37),
    which the whole-graph C code (``compiler/codegen_c.py``) and the elementwise VM compute too, so
    every executor gives the same bits.  It is the engine's definition of tanh rather than a kernel
    choice, so ``FEDARENA_NATIVE=0`` does not change it.  ``out`` (positional, as for a ufunc) may be ``x``."""
    native = cext._native
    # Python numbers and other arrays (cupy) are numpy's; float32 of either byte order is ours
    if native is None or not isinstance(x, (np.ndarray, np.generic)) or x.dtype.char != "f":
        return np.tanh(x) if out is None else np.tanh(x, out)
    if out is None:
        res = np.empty(x.shape, _F32)
        if not native.tanh(x, res):  # a strided, misaligned or byte-swapped operand: a contiguous copy
            native.tanh(np.ascontiguousarray(x, _F32), res)
        return res if x.ndim else res[()]  # as a ufunc: a scalar for a 0-d operand
    if not native.tanh(x, out):  # as above, or an output of another layout or dtype: through a copy
        res = np.empty(x.shape, _F32)
        native.tanh(np.ascontiguousarray(x, _F32), res)
        np.copyto(out, res, casting="same_kind")
    return out


def _tanh_emit(ctx, ins, attrs, in_avals, out_aval):
    """float32: the engine's tanh (see :func:`tanh`); other dtypes numpy's loop."""
    if out_aval.dtype != _F32 or cext._native is None:
        return _ufunc_emit("np.tanh")(ctx, ins, attrs, in_avals, out_aval)
    f = ctx.const(tanh)
    return Code(f"{f}({ins[0]}, {{o}})", "stmt", f"{f}({ins[0]})")


def erf(x, out=None):
    """``scipy.special.erf``, imported on first use (see :func:`expit`)."""
    from scipy.special import erf as f

    return f(x) if out is None else f(x, out)


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


UFUNC = ("elementwise", "in_place", "fusible")  # traits of a plain numpy ufunc


def _unary(name, uf, uf_name, kind, cuda_expr, vjp_from_out=None, vjp_from_x=None, scalar_emit=None):
    """A unary elementwise primitive whose derivative is ``d(x, out)``; its JVP is the same
    diagonal scaling as its VJP."""
    d = vjp_from_out or vjp_from_x

    def vjp(need, ct, out, x, **attrs):
        return (d(ct, x, out),)

    def jvp(tangents, out, x, **attrs):
        t = tangents[0]
        return d(t, x, out)

    p = _define(name, _ew_rule(kind), _ufunc_impl(uf), _ufunc_emit(uf_name), vjp if d else None, jvp if d else None, traits=UFUNC, batch=batch_elementwise, cuda_expr=cuda_expr,
                   scalar_emit=scalar_emit)
    p.shard = _ew_shard()
    return p


neg_p = _define(
    "neg", _ew_rule("promote"), _ufunc_impl(np.negative), _ufunc_emit("np.negative"),
    transpose=lambda need, ct, out, x: (neg(ct),), linearity="first",
    traits=UFUNC, batch=batch_elementwise, cuda_expr=C.unary(lambda x, o: f"(-{x})"), scalar_emit="(-{0})",
)
neg_p.shard = _ew_shard("unary")
exp_p = _unary("exp", np.exp, "np.exp", "float", C.math_fn("exp"), vjp_from_out=lambda ct, x, out: mul(ct, out), scalar_emit="np.exp({0})")
log_p = _unary("log", np.log, "np.log", "float", C.math_fn("log"), vjp_from_x=lambda ct, x, out: div(ct, x), scalar_emit="np.log({0})")
log1p_p = _unary("log1p", np.log1p, "np.log1p", "float", C.math_fn("log1p"), vjp_from_x=lambda ct, x, out: div(ct, add(x, 1.0)), scalar_emit="np.log1p({0})")
tanh_p = _unary("tanh", tanh, "np.tanh", "float", C.math_fn("tanh"), vjp_from_out=lambda ct, x, out: mul(ct, sub(1.0, mul(out, out))),
               scalar_emit=lambda ctx, attrs: f"{ctx.const(tanh)}({{0}})")
tanh_p.emit = _tanh_emit
logistic_p = _unary(
    "logistic", expit, "_expit", "float",
    C.float_only(lambda x, o: f"({C.c_literal(1, o)} / ({C.c_literal(1, o)} + {C.c_fn('exp', o)}(-{x[0]})))", "logistic"),
    vjp_from_out=lambda ct, x, out: mul(ct, mul(out, sub(1.0, out))),
    scalar_emit="_expit({0})",
)
sqrt_p = _unary("sqrt", np.sqrt, "np.sqrt", "float", C.math_fn("sqrt"), vjp_from_out=lambda ct, x, out: div(ct, mul(out, 2.0)), scalar_emit="np.sqrt({0})")
sin_p = _unary("sin", np.sin, "np.sin", "float", C.math_fn("sin"), vjp_from_x=lambda ct, x, out: mul(ct, bind(cos_p, x)), scalar_emit="np.sin({0})")
cos_p = _unary("cos", np.cos, "np.cos", "float", C.math_fn("cos"), vjp_from_x=lambda ct, x, out: neg(mul(ct, bind(sin_p, x))), scalar_emit="np.cos({0})")
abs_p = _unary(
    "abs", np.abs, "np.absolute", "promote",
    C.unary(lambda x, o: f"{C.c_fn('fabs', o)}({x})" if o.kind == "f" else f"({x} < 0 ? ({C.CTYPE[o]})(-{x}) : {x})"),
    vjp_from_x=lambda ct, x, out: mul(ct, sign(x)),
    scalar_emit="np.absolute({0})",
)
sign_p = _define("sign", _ew_rule("promote"), _ufunc_impl(np.sign), _ufunc_emit("np.sign"), differentiable=False,
                 batch=batch_elementwise, cuda_expr=C.helper("fe_sign"), scalar_emit="np.sign({0})")
sign_p.shard = _ew_shard()


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
    batch=batch_elementwise,
    cuda_expr=C.float_only(lambda x, o: f"({C.c_literal(1, o)} / {C.c_fn('sqrt', o)}({x[0]}))", "rsqrt"),
)
rsqrt_p.shard = _ew_shard()


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
    batch=batch_elementwise,
    cuda_expr=C.unary(lambda x, o: f"fe_max<{C.CTYPE[o]}>({x}, ({C.CTYPE[o]})0)"),
)
relu_p.shard = _ew_shard()

# ---------------------------------------------------------------------------- binary


_BINARY_LINEAR = {"add": "all", "sub": "all", "mul": "one", "div": "first"}  # partial-sum strategies (sharding)


def _binary(name, uf, uf_name, kind, cuda_expr, vjp=None, jvp=None, differentiable=True, transpose=None, linearity=None, scalar_emit=None):
    p = _define(name, _ew_rule(kind), _ufunc_impl(uf), _ufunc_emit(uf_name), vjp, jvp, differentiable, traits=UFUNC + ("typed_scalars",),
                   batch=batch_elementwise, cuda_expr=cuda_expr, transpose=transpose, linearity=linearity, scalar_emit=scalar_emit)
    p.shard = _ew_shard(_BINARY_LINEAR.get(name, ""))
    return p


def _add_transpose(need, ct, out, x, y):
    return (unbroadcast(ct, shape_of(x)) if need[0] else None, unbroadcast(ct, shape_of(y)) if need[1] else None)


def _sub_transpose(need, ct, out, x, y):
    return (unbroadcast(ct, shape_of(x)) if need[0] else None, unbroadcast(neg(ct), shape_of(y)) if need[1] else None)


def _mul_transpose(need, ct, out, x, y):
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


# add and sub are linear (their VJP is their transpose) but keep their own JVP: a missing tangent adds
# nothing (no zero array is materialised) and each tangent is broadcast to the output's shape.
def _add_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], ts[1])


def _sub_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], None if ts[1] is None else neg(ts[1]))


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


add_p = _binary("add", np.add, "np.add", "promote", C.infix("+", "||"), jvp=_add_jvp, transpose=_add_transpose, linearity="joint", scalar_emit="({0} + {1})")
sub_p = _binary("sub", np.subtract, "np.subtract", "promote", C.infix("-"), jvp=_sub_jvp, transpose=_sub_transpose, linearity="joint", scalar_emit="({0} - {1})")
mul_p = _binary("mul", np.multiply, "np.multiply", "promote", C.infix("*", "&&"), transpose=_mul_transpose, linearity="bilinear", scalar_emit="({0} * {1})")
div_p = _binary("div", np.true_divide, "np.true_divide", "float", C.infix("/"), _div_vjp, _div_jvp, scalar_emit="({0} / {1})")
pow_p = _define("pow", _ew_rule("promote"), _ufunc_impl(np.power), _pow_emit, _pow_vjp, _pow_jvp,
                batch=batch_elementwise, cuda_expr=C.float_or_int("pow", "fe_ipow"), scalar_emit="({0} ** {1})")
max_p = _binary("maximum", np.maximum, "np.maximum", "promote", C.helper("fe_max"), _minmax_vjp(True), _minmax_jvp(True), scalar_emit="np.maximum({0}, {1})")
min_p = _binary("minimum", np.minimum, "np.minimum", "promote", C.helper("fe_min"), _minmax_vjp(False), _minmax_jvp(False), scalar_emit="np.minimum({0}, {1})")
eq_p = _binary("eq", np.equal, "np.equal", "bool", C.compare("=="), differentiable=False, scalar_emit="({0} == {1})")
ne_p = _binary("ne", np.not_equal, "np.not_equal", "bool", C.compare("!="), differentiable=False, scalar_emit="({0} != {1})")
lt_p = _binary("lt", np.less, "np.less", "bool", C.compare("<"), differentiable=False, scalar_emit="({0} < {1})")
le_p = _binary("le", np.less_equal, "np.less_equal", "bool", C.compare("<="), differentiable=False, scalar_emit="({0} <= {1})")
gt_p = _binary("gt", np.greater, "np.greater", "bool", C.compare(">"), differentiable=False, scalar_emit="({0} > {1})")
ge_p = _binary("ge", np.greater_equal, "np.greater_equal", "bool", C.compare(">="), differentiable=False, scalar_emit="({0} >= {1})")
and_p = _binary("and", np.logical_and, "np.logical_and", "logical", C.logical("&&"), differentiable=False)
or_p = _binary("or", np.logical_or, "np.logical_or", "logical", C.logical("||"), differentiable=False)
not_p = _define("not", _ew_rule("logical"), _ufunc_impl(np.logical_not), _ufunc_emit("np.logical_not"), differentiable=False,
                batch=batch_elementwise, cuda_expr=lambda ins, in_dts, o, attrs, weak: f"(!{ins[0]})")
pow_p.shard = _ew_shard()
not_p.shard = _ew_shard()


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


select_p = _define(
    "select", _select_rule, _select_impl, _select_emit, _select_vjp, _select_jvp, batch=batch_elementwise,
    cuda_expr=lambda ins, in_dts, o, attrs, weak: f"({ins[0]} ? {C.c_cast(ins[1], o)} : {C.c_cast(ins[2], o)})",
)
select_p.shard = _ew_shard()


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


def _cast_cuda(ins, in_dts, o, attrs, weak):
    return f"({ins[0]} != 0)" if o == np.bool_ else C.c_cast(ins[0], o)


def _cast_scalar(ctx, attrs):
    dt = attrs["dtype"] if isinstance(attrs["dtype"], np.dtype) else np.dtype(attrs["dtype"])
    return ctx.const(dt.type) + "({0})"


cast_p = _define(
    "cast", _cast_rule, _cast_impl, _cast_emit, _cast_vjp, _cast_jvp, batch=batch_elementwise, cuda_expr=_cast_cuda,
    scalar_emit=_cast_scalar,
)


def _cast_shard(in_avals, attrs, out_aval, n):
    # a float -> float cast of a partial sum is the partial sum of the casts (up to rounding)
    linear = is_float(in_avals[0].dtype) and is_float(attrs["dtype"])
    return _sharding.elementwise(in_avals, out_aval, n, "unary" if linear else "")


cast_p.shard = _cast_shard


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


def _clip_cuda(ins, in_dts, o, attrs, weak):
    ct, x = C.CTYPE[o], C.c_cast(ins[0], o)
    return f"fe_min<{ct}>(fe_max<{ct}>({x}, {C.c_literal(attrs['lo'], o)}), {C.c_literal(attrs['hi'], o)})"


clip_p = _define(
    "clip",
    _same_rule,
    _clip_impl,
    _clip_emit,
    vjp=lambda need, ct, out, x, lo, hi: (mul(ct, _clip_mask(x, lo, hi)),),
    jvp=lambda ts, out, x, lo, hi: mul(ts[0], _clip_mask(x, lo, hi)),
    batch=batch_elementwise,
    cuda_expr=_clip_cuda,
)
clip_p.shard = _ew_shard()


def _identity_emit(ctx, ins, attrs, in_avals, out_aval):
    return expr(ins[0])


stop_gradient_p = _define(
    "stop_gradient", _same_rule, lambda x: np.array(x, copy=True), _identity_emit, differentiable=False,
    batch=batch_elementwise, cuda=lambda e, lib: lib.view(lambda xp, x: x, e),
)
stop_gradient_p.shard = lambda in_avals, attrs, out_aval, n: _sharding.elementwise(in_avals, out_aval, n, "unary") + [
    _sharding.Strategy((_sharding.Layout(partial=p),), _sharding.Layout(partial=p)) for p in ("max", "min")]


def _full_rule(avals, attrs, weak):
    return ShapedArray(attrs["shape"], attrs["dtype"])


def _full_impl(shape, dtype, value):
    return np.full(shape, value, dtype)


def _full_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"{{o}}.fill({attrs['value']!r})")


full_p = _define(
    "full", _full_rule, _full_impl, _full_emit, differentiable=False,
    batch=loop_batching,  # never called: full has no operands, so it is never batched
    cuda=lambda e, lib: lib.xp(lambda xp, ins, attrs, out: out.fill(attrs["value"]), e),
)


def _full_shard(in_avals, attrs, out_aval, n):
    out = [_sharding.Strategy((), _sharding.R)]
    shape = attrs["shape"]
    out += [_sharding.Strategy((), _sharding.S(ax), {**attrs, "shape": _sharding.with_axis(shape, ax, n)})
            for ax in range(len(shape)) if _sharding.splittable(shape[ax], n)]
    return out


full_p.shard = _full_shard





def _float_or_int_rule(kind):
    rule = _ew_rule(kind)

    def checked(avals, attrs, weak):
        for a in avals:
            if a.dtype == np.bool_:
                raise ShapeError("floor_divide/mod need numbers, got bool")
        return rule(avals, attrs, weak)

    return checked


floor_divide_p = _define(
    "floor_divide", _float_or_int_rule("promote"), _ufunc_impl(np.floor_divide), _ufunc_emit("np.floor_divide"), differentiable=False,
    batch=batch_elementwise, cuda_expr=C.float_or_int("fe_floordiv", "fe_ifloordiv"),
)


def _mod_vjp(need, ct, out, x, y):
    gx = unbroadcast(ct, shape_of(x)) if need[0] else None
    gy = unbroadcast(neg(mul(ct, bind(floor_divide_p, x, y))), shape_of(y)) if need[1] else None
    return (gx, gy)


def _mod_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], None if ts[1] is None else neg(mul(ts[1], bind(floor_divide_p, x, y))))


mod_p = _define("mod", _float_or_int_rule("promote"), _ufunc_impl(np.remainder), _ufunc_emit("np.remainder"), _mod_vjp, _mod_jvp,
                batch=batch_elementwise, cuda_expr=C.float_or_int("fe_fmod", "fe_imod"))
isnan_p = _define("isnan", _ew_rule("bool"), _ufunc_impl(np.isnan), _ufunc_emit("np.isnan"), differentiable=False, batch=batch_elementwise,
                  cuda_expr=lambda ins, in_dts, o, attrs, weak: f"({ins[0]} != {ins[0]})" if in_dts[0].kind == "f" else "false")
isfinite_p = _define("isfinite", _ew_rule("bool"), _ufunc_impl(np.isfinite), _ufunc_emit("np.isfinite"), differentiable=False, batch=batch_elementwise,
                     cuda_expr=lambda ins, in_dts, o, attrs, weak: f"fe_isfinite({ins[0]})" if in_dts[0].kind == "f" else "true")



def _erf_scale(x):
    return mul(exp(neg(mul(x, x))), 2.0 / math.sqrt(math.pi))


erf_p = _define(
    "erf",
    _ew_rule("float"),
    _ufunc_impl(erf),
    lambda ctx, ins, attrs, in_avals, out_aval: Code(f"{ctx.const(erf)}({ins[0]}, {{o}})", "stmt", f"{ctx.const(erf)}({ins[0]})"),
    vjp=lambda need, ct, out, x: (mul(ct, _erf_scale(x)),),
    jvp=lambda ts, out, x: mul(ts[0], _erf_scale(x)),
    batch=batch_elementwise,
    cuda_expr=C.math_fn("erf"),
)

for _p in (floor_divide_p, mod_p, isnan_p, isfinite_p, erf_p):
    _p.shard = _ew_shard()


# traits of the primitives not made by _unary/_binary (rsqrt is sqrt(x, out) then reciprocal(out, out):
# still one pass per element; select copies its false operand into the output first, so only that
# operand may share the output's buffer; cast is not fused; the additions above are plain ufuncs
# the fusion pass and the native VM do not know)
for _p in (sign_p, rsqrt_p, relu_p, pow_p, not_p, clip_p):
    _p.traits = frozenset(UFUNC)
select_p.traits = frozenset({"elementwise", "fusible", "typed_scalars"})
select_p.in_place_operands = (2,)
cast_p.traits = frozenset({"elementwise", "in_place"})
for _p in (floor_divide_p, mod_p, isnan_p, isfinite_p, erf_p):
    _p.traits = frozenset({"elementwise", "in_place"})
stop_gradient_p.traits = frozenset({"view"})
# value traits the compilers' op sets derive from (native VM's bool outputs and libm cost, C codegen's
# comparison dtype)
for _p in (eq_p, ne_p, lt_p, le_p, gt_p, ge_p, and_p, or_p, not_p, isnan_p, isfinite_p):
    _p.traits = _p.traits | {"predicate"}
for _p in (exp_p, log_p, log1p_p, tanh_p, logistic_p, pow_p, sin_p, cos_p, erf_p):
    _p.traits = _p.traits | {"transcendental"}
