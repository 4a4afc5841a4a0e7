"""``cond``: one of two branches, as one equation with one output per branch output."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..core.ir import Graph, ShapeError, is_float
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import Tracer, aval_of, bind, register
from ..transforms import autodiff as AD
from ..transforms.vmap import vmap
from .common import as_value, compiled, eval_sub, fit, graph_jvp, owned, trace_fn, unify

cond_p = register("cond")
cond_p.multiple_results = True


def _cond_rule(avals, attrs, weak):
    pred = avals[0]
    if pred.shape != () or pred.dtype.kind not in "biu":
        raise ShapeError(f"cond: the predicate must be a scalar bool or integer, got {pred.str_short()}")
    for br in attrs["branches"]:
        if [v.aval for v in br.invars] != list(avals[1:]):
            raise ShapeError("cond: operands do not match the branch inputs")
    return [a.aval for a in attrs["branches"][0].outvars]


def _cond_np(pred: Any, ops: Sequence[Any], branches: tuple) -> list:
    br = branches[0] if bool(pred) else branches[1]
    return owned(compiled(br)(*ops), ops)


class _CondKernel:
    """The compiled executor's call of one cond equation (its branches bound)."""

    def __init__(self, attrs: dict):
        self.branches = attrs["branches"]

    def __call__(self, pred: Any, *ops: Any) -> list:
        return _cond_np(pred, ops, self.branches)


def _cond_impl(pred, *ops, branches):
    return _cond_np(pred, [np.asarray(o) for o in ops], branches)


cond_p.abstract_eval = _cond_rule
cond_p.impl = _cond_impl
cond_p.emit = lambda ctx, ins, attrs, in_avals, out_avals: P.expr(f"{ctx.const(_CondKernel(attrs))}({', '.join(ins)})")


def bind_cond(pred: Any, true_fn: Callable[[list], list], false_fn: Callable[[list], list], ops: Sequence[Any]) -> list:
    """Bind one ``cond`` equation for branches over flat lists; return its outputs."""
    ops = [as_value(o) for o in ops]
    avals = [aval_of(o) for o in ops]
    (gt, gf), caps = unify([trace_fn(lambda a: list(true_fn(a)), avals), trace_fn(lambda a: list(false_fn(a)), avals)], len(ops))
    t_av = [a.aval for a in gt.outvars]
    f_av = [a.aval for a in gf.outvars]
    if t_av != f_av:
        raise ShapeError(
            f"cond: the branches return different types: {[a.str_short() for a in t_av]} vs {[a.str_short() for a in f_av]}"
        )
    return bind(cond_p, as_value(pred), *ops, *caps, branches=(gt, gf))


def _cond_vjp(need, cts, outs, pred, *ops, branches):
    active = [is_float(aval_of(o).dtype) for o in ops]

    def bwd(g: Graph):
        def f(a):
            env, live = AD.forward(g, a, active)
            c = [x if is_float(v.aval.dtype) else None for x, v in zip(cts, g.outvars)]
            gi = AD.backward(g, env, live, c)
            return [(P.zeros_like_aval(aval_of(o)) if x is None else fit(x, aval_of(o))) for x, o, act in zip(gi, ops, active) if act]

        return f

    grads = iter(bind_cond(pred, bwd(branches[0]), bwd(branches[1]), list(ops)))
    return (None,) + tuple(next(grads) if act else None for act in active)


def _cond_jvp(ts, outs, pred, *ops, branches):
    tans = list(ts[1:])
    out_float = [is_float(a.aval.dtype) for a in branches[0].outvars]

    def jf(g: Graph):
        def f(a):
            _, touts = graph_jvp(g, a, tans)
            return [t for t, fl in zip(touts, out_float) if fl]

        return f

    it = iter(bind_cond(pred, jf(branches[0]), jf(branches[1]), list(ops)))
    return [next(it) if fl else None for fl in out_float]


def _cond_batch(prim, vals, batched, size, *, branches):
    pred, ops = vals[0], vals[1:]
    ops = [v if b else P.broadcast_to(as_value(v), (size,) + aval_of(v).shape) for v, b in zip(ops, batched[1:])]
    vb = [vmap(lambda *a, g=g: eval_sub(g, a)) for g in branches]
    if batched[0]:  # a predicate per example: both branches, then a select per output
        p = P.cast(pred, np.bool_) if aval_of(pred).dtype != np.bool_ else pred
        res = []
        for t, f in zip(vb[0](*ops), vb[1](*ops)):
            res.append(P.select(P.reshape(p, (size,) + (1,) * (len(aval_of(t).shape) - 1)), t, f))
        return res
    return bind_cond(pred, lambda a: vb[0](*a), lambda a: vb[1](*a), ops)


cond_p.vjp = _cond_vjp
cond_p.jvp = _cond_jvp
cond_p.batch = _cond_batch
cond_p.cuda = lambda e, lib: lib.control_step("cond", e)  # its step runs the cupy backend's sub-executables


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as one equation; both
    branches must return the same pytree of types.  Differentiable (reverse and forward)."""
    leaves, td = tree_flatten(list(operands))
    out_td: list = []

    def branch(fn):
        def g(a):
            out = fn(*tree_unflatten(td, a))
            ol, otd = tree_flatten(out)
            out_td.append(otd)
            return [o if isinstance(o, Tracer) else as_value(o) for o in ol]

        return g

    outs = bind_cond(pred, branch(true_fn), branch(false_fn), leaves)
    if len(out_td) >= 2 and out_td[0] != out_td[1]:
        raise ShapeError("cond: the branches return different pytree structures")
    return tree_unflatten(out_td[0], outs)


__all__ = ["bind_cond", "cond", "cond_p"]
