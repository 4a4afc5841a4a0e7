"""``while_loop`` (one equation with one output per carry) and ``fori_loop`` (``scan`` with
Python-int bounds, ``while_loop`` with traced ones).

``while_loop`` has a forward-mode rule only; reverse mode raises an error naming ``scan`` (a loop
whose trip count is unknown cannot pre-size its tape).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..core.ir import EngineError, ShapeError, is_float
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import aval_of, bind, register
from ..transforms.vmap import vmap
from .common import as_value, coerce_outs, compiled, eval_sub, fit, graph_jvp, owned, tangent_aval, trace_fn, unify
from .scan import scan

while_p = register("while")
while_p.multiple_results = True


def _while_rule(avals, attrs, weak):
    nc = attrs["n_carry"]
    cg, bg = attrs["cond"], attrs["body"]
    if [v.aval for v in bg.invars] != list(avals) or [v.aval for v in cg.invars] != list(avals):
        raise ShapeError("while_loop: operands do not match the cond/body inputs")
    if [a.aval for a in bg.outvars] != list(avals[:nc]):
        raise ShapeError("while_loop: the body must return the carry with unchanged types")
    return list(avals[:nc])


def _while_np(ins: Sequence[Any], cond: Any, body: Any, n_carry: int) -> list:
    c_run, b_run = compiled(cond), compiled(body)
    carry = list(ins[:n_carry])
    consts = list(ins[n_carry:])
    while bool(c_run(*carry, *consts)[0]):
        carry = b_run(*carry, *consts)
    return owned(carry, ins)


class _WhileKernel:
    """The compiled executor's call of one while equation (its cond and body bound)."""

    def __init__(self, attrs: dict):
        self.attrs = attrs

    def __call__(self, *ins: Any) -> list:
        return _while_np(ins, **self.attrs)


def _while_impl(*ins, cond, body, n_carry):
    return _while_np([np.asarray(a) for a in ins], cond, body, n_carry)


while_p.abstract_eval = _while_rule
while_p.impl = _while_impl
while_p.emit = lambda ctx, ins, attrs, in_avals, out_avals: P.expr(f"{ctx.const(_WhileKernel(attrs))}({', '.join(ins)})")


def bind_while(cond_fn: Callable[[list], Any], body_fn: Callable[[list], list], init: Sequence[Any], consts: Sequence[Any] = ()) -> list:
    """Bind one ``while`` equation (``cond_fn``/``body_fn`` see the carry followed by ``consts``);
    return the final carry."""
    init = [as_value(c) for c in init]
    consts = [as_value(c) for c in consts]
    nc = len(init)
    c_av = [aval_of(c) for c in init]
    avals = c_av + [aval_of(c) for c in consts]

    def cflat(a):
        p = as_value(cond_fn(a))
        pav = aval_of(p)
        if pav.shape != () or pav.dtype.kind not in "biu":
            raise ShapeError(f"while_loop: cond_fun must return a scalar bool, got {pav.str_short()}")
        return [p]

    def bflat(a):
        return coerce_outs(list(body_fn(a)), c_av, "while_loop")

    (cg, bg), caps = unify([trace_fn(cflat, avals), trace_fn(bflat, avals)], len(avals))
    return bind(while_p, *init, *consts, *caps, cond=cg, body=bg, n_carry=nc)


def _while_vjp(need, cts, outs, *ins, **attrs):
    raise EngineError(
        "while_loop: reverse-mode differentiation is not supported (the trip count is only known at run "
        "time, so the backward pass cannot size the stored intermediates); use scan(fn, init, xs, length=N) "
        "with a fixed number of steps, or fori_loop with Python-int bounds (which lowers to scan)"
    )


def _while_jvp(ts, outs, *ins, cond, body, n_carry):
    nc = n_carry
    n = len(ins)
    tans = [t if t is not None else P.zeros_like_aval(tangent_aval(aval_of(a))) for t, a in zip(ts, ins)]
    tc, tk = tans[:nc], tans[nc:]

    def cf(a):
        return eval_sub(cond, list(a[:nc]) + list(a[2 * nc : 2 * nc + n - nc]))[0]

    def bf(a):
        prim_c, tan_c = a[:nc], a[nc : 2 * nc]
        prim_k, tan_k = a[2 * nc : 2 * nc + n - nc], a[2 * nc + n - nc :]
        outs_, touts = graph_jvp(body, list(prim_c) + list(prim_k), list(tan_c) + list(tan_k))
        return list(outs_) + [fit(t, aval_of(x)) for t, x in zip(touts, tan_c)]

    res = bind_while(cf, bf, list(ins[:nc]) + tc, list(ins[nc:]) + tk)
    return [t if is_float(aval_of(x).dtype) else None for t, x in zip(res[nc:], ins[:nc])]


def _while_batch(prim, vals, batched, size, *, cond, body, n_carry):
    nc = n_carry
    vals = [v if b else P.broadcast_to(as_value(v), (size,) + aval_of(v).shape) for v, b in zip(vals, batched)]
    vc = vmap(lambda *a: eval_sub(cond, a)[0])
    vb = vmap(lambda *a: eval_sub(body, a))

    def cf(a):  # run while any example's predicate holds
        p = P.cast(vc(*a), np.int64)
        return P.gt(bind(P.reduce_max_p, p, axes=(0,), keepdims=False), 0)

    def bf(a):  # examples whose predicate no longer holds keep their carry
        p = P.cast(vc(*a), np.bool_)
        new = vb(*a)
        res = []
        for nv, old in zip(new, a[:nc]):
            nd = len(aval_of(old).shape)
            res.append(P.select(P.reshape(p, (size,) + (1,) * (nd - 1)), nv, old))
        return res

    return bind_while(cf, bf, vals[:nc], vals[nc:])


while_p.vjp = _while_vjp
while_p.jvp = _while_jvp
while_p.batch = _while_batch
while_p.cuda = lambda e, lib: lib.control_step("while", e)  # its step runs the cupy backend's sub-executables


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any) -> Any:
    """``while cond_fun(val): val = body_fun(val)`` as one equation.  Forward mode (``jvp``) is
    supported; reverse mode raises an error that points to ``scan``/``fori_loop``."""
    leaves, td = tree_flatten(init_val)

    def cf(a):
        return cond_fun(tree_unflatten(td, a[: len(leaves)]))

    def bf(a):
        out = body_fun(tree_unflatten(td, a[: len(leaves)]))
        ol, otd = tree_flatten(out)
        if otd != td:
            raise ShapeError("while_loop: body_fun must return a value with the structure of init_val")
        return ol

    return tree_unflatten(td, bind_while(cf, bf, leaves))


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any) -> Any:
    """``for i in range(lower, upper): val = body_fun(i, val)``.  With Python-int bounds it lowers
    to ``scan`` (reverse-mode differentiable); with traced bounds to ``while_loop``."""
    static = all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in (lower, upper))
    if static:
        lo, hi = int(lower), int(upper)
        if hi <= lo:
            return init_val
        idx = np.arange(lo, hi, dtype=np.int64)
        carry, _ = scan(lambda c, i: (body_fun(i, c), None), init_val, idx)
        return carry
    i0 = as_value(lower)
    if aval_of(i0).dtype.kind not in "iu":
        raise ShapeError("fori_loop: bounds must be integers")
    i0 = P.cast(i0, np.int64)
    hi = P.cast(as_value(upper), np.int64)
    _, val = while_loop(lambda s: bind(P.lt_p, s[0], hi), lambda s: (P.add(s[0], np.int64(1)), body_fun(s[0], s[1])), (i0, init_val))
    return val


__all__ = ["bind_while", "fori_loop", "while_loop", "while_p"]
