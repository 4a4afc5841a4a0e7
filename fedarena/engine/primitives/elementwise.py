"""Elementwise primitives of the numpy family that carry no gradient or a piecewise one:
``floor_divide``, ``mod`` (numpy's ``remainder``: the sign of the divisor), ``isnan``, ``isfinite``,
and the error function ``erf`` (d/dx erf = 2/sqrt(pi) exp(-x^2); for the exact GELU).

Each is defined here completely: shape/dtype rule (broadcasting, numpy 2 promotion with weak
Python scalars), numpy kernel and emitter, VJP/JVP and batching rule.  ``mod``'s derivative is
1 in ``x`` and ``-floor(x / y)`` in ``y`` (away from the jumps); ``floor_divide`` is piecewise
constant, so its gradient is zero (JAX's convention).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special

from ..ir import ShapeError
from ..tracing import aval_of, bind
from . import _define, _ew_rule, _sum_tangents, _ufunc_emit, _ufunc_impl, exp, expr, mul, neg, reshape, shape_of, unbroadcast


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


def _float_or_int_rule(kind):
    rule = _ew_rule(kind)

    def checked(avals, attrs, weak):
        for a in avals:
            if a.dtype == np.bool_:
                raise ShapeError("floor_divide/mod need numbers, got bool")
        return rule(avals, attrs, weak)

    return checked


floor_divide_p = _define(
    "floor_divide", _float_or_int_rule("promote"), _ufunc_impl(np.floor_divide), _ufunc_emit("np.floor_divide"), differentiable=False
)


def _mod_vjp(need, ct, out, x, y):
    gx = unbroadcast(ct, shape_of(x)) if need[0] else None
    gy = unbroadcast(neg(mul(ct, bind(floor_divide_p, x, y))), shape_of(y)) if need[1] else None
    return (gx, gy)


def _mod_jvp(ts, out, x, y):
    return _sum_tangents(out, ts[0], None if ts[1] is None else neg(mul(ts[1], bind(floor_divide_p, x, y))))


mod_p = _define("mod", _float_or_int_rule("promote"), _ufunc_impl(np.remainder), _ufunc_emit("np.remainder"), _mod_vjp, _mod_jvp)
isnan_p = _define("isnan", _ew_rule("bool"), _ufunc_impl(np.isnan), _ufunc_emit("np.isnan"), differentiable=False)
isfinite_p = _define("isfinite", _ew_rule("bool"), _ufunc_impl(np.isfinite), _ufunc_emit("np.isfinite"), differentiable=False)



def _erf_scale(x):
    return mul(exp(neg(mul(x, x))), 2.0 / math.sqrt(math.pi))


erf_p = _define(
    "erf",
    _ew_rule("float"),
    _ufunc_impl(scipy.special.erf),
    lambda ctx, ins, attrs, in_avals, out_aval: expr(f"{ctx.const(scipy.special.erf)}({ins[0]})"),
    vjp=lambda need, ct, out, x: (mul(ct, _erf_scale(x)),),
    jvp=lambda ts, out, x: mul(ts[0], _erf_scale(x)),
)

for _p in (floor_divide_p, mod_p, isnan_p, isfinite_p, erf_p):
    _p.batch = batch_elementwise
