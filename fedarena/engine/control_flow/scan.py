"""``scan``: a loop over the leading axis of its inputs, as one equation with one output per carry
and per stacked ``y``.

Reverse mode through ``scan`` stores what the backward pass needs: the body's VJP is traced once and
split by partial evaluation (Griewank & Walther, "Evaluating Derivatives", 2nd ed., sec. 4.6, "tape"
of intermediate values) into a forward part that also emits the residuals the backward part reads
(stacked over the steps by a forward scan) and a backward part run by a reverse scan that
accumulates the gradients of loop-invariant operands.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..core.ir import Graph, ShapedArray, ShapeError, Var, is_float
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import Tracer, aval_of, bind, register, trace_flat
from ..transforms import autodiff as AD
from ..transforms.vmap import vmap
from .common import as_value, coerce_outs, compiled, eval_sub, fit, graph_jvp, owned, read, trace_fn

scan_p = register("scan")
scan_p.multiple_results = True


def _scan_rule(avals, attrs, weak):
    nc, nx, T = attrs["n_carry"], attrs["n_x"], attrs["length"]
    body: Graph = attrs["body"]
    if len(avals) != len(body.invars):
        raise ShapeError(f"scan: {len(avals)} operands for a body with {len(body.invars)} inputs")
    for k, (av, bv) in enumerate(zip(avals, body.invars)):
        want = ((T,) + bv.aval.shape) if nc <= k < nc + nx else bv.aval.shape
        if av.shape != want or av.dtype != bv.aval.dtype:
            raise ShapeError(f"scan: operand {k} is {av.str_short()} but the body expects {ShapedArray(want, bv.aval.dtype).str_short()}")
    outs = [a.aval for a in body.outvars]
    return outs[:nc] + [ShapedArray((T,) + av.shape, av.dtype) for av in outs[nc:]]


def _scan_np(ins: Sequence[Any], body: Graph, n_carry: int, n_x: int, length: int, reverse: bool) -> list:
    run = compiled(body)
    carry = list(ins[:n_carry])
    xs = ins[n_carry : n_carry + n_x]
    consts = list(ins[n_carry + n_x :])
    ys = [np.empty((length,) + a.aval.shape, a.aval.dtype) for a in body.outvars[n_carry:]]
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        outs = run(*carry, *[x[t] for x in xs], *consts)
        carry = outs[:n_carry]
        for buf, y in zip(ys, outs[n_carry:]):
            buf[t] = y
    return owned(carry, ins) + ys


class _ScanKernel:
    """The compiled executor's call of one scan equation (its attributes bound)."""

    def __init__(self, attrs: dict):
        self.attrs = attrs

    def __call__(self, *ins: Any) -> list:
        return _scan_np(ins, **self.attrs)


def _scan_impl(*ins, **attrs):
    return _scan_np([np.asarray(a) for a in ins], **attrs)


def _scan_emit(ctx, ins, attrs, in_avals, out_avals):
    return P.expr(f"{ctx.const(_ScanKernel(attrs))}({', '.join(ins)})")


scan_p.abstract_eval = _scan_rule
scan_p.impl = _scan_impl
scan_p.emit = _scan_emit


def scan_flat(
    body_fn: Callable[[list, list, list], tuple[list, list]],
    carry: Sequence[Any],
    xs: Sequence[Any],
    consts: Sequence[Any],
    length: int,
    reverse: bool = False,
) -> tuple[list, list]:
    """Bind one ``scan`` equation for a body over flat lists; return (final carry, stacked ys)."""
    carry = [as_value(c) for c in carry]
    xs = [as_value(x) for x in xs]
    consts = [as_value(c) for c in consts]
    c_av = [aval_of(c) for c in carry]
    x_av = [ShapedArray(aval_of(x).shape[1:], aval_of(x).dtype) for x in xs]
    k_av = [aval_of(c) for c in consts]
    nc, nx = len(carry), len(xs)

    def flat(ins: list) -> list:
        new_c, ys = body_fn(ins[:nc], ins[nc : nc + nx], ins[nc + nx :])
        new_c = coerce_outs(new_c, c_av, "scan")
        ys = [y if isinstance(y, Tracer) else as_value(y) for y in ys]
        return list(new_c) + list(ys)

    body, captured = trace_fn(flat, c_av + x_av + k_av)
    operands = carry + xs + consts + list(captured)
    outs = bind(scan_p, *operands, body=body, n_carry=nc, n_x=nx, length=int(length), reverse=bool(reverse))
    return outs[:nc], outs[nc:]


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
) -> tuple[Any, Any]:
    """``carry, ys = scan(fn, init, xs)``: loop ``carry, y = fn(carry, x)`` over the leading axis of
    ``xs`` (a pytree, or ``None`` with ``length``), stacking the ``y``s; ``reverse`` runs from the
    last step to the first (``ys`` keeps the order of ``xs``).  Differentiable in both modes."""
    x_leaves, x_td = tree_flatten(xs)
    x_leaves = [as_value(x) for x in x_leaves]
    lengths = {aval_of(x).shape[0] if aval_of(x).ndim else None for x in x_leaves}
    if None in lengths:
        raise ShapeError("scan: every leaf of xs needs a leading axis to scan over")
    if length is not None:
        lengths.add(int(length))
    if len(lengths) != 1:
        raise ShapeError(f"scan: the leading axes of xs (and length) disagree: {sorted(lengths)}" if lengths else "scan: give xs or length")
    T = lengths.pop()
    c_leaves, c_td = tree_flatten(init)
    y_td: list = []

    def body(c, x, k):
        new_c, y = fn(tree_unflatten(c_td, c), tree_unflatten(x_td, x) if x_leaves else None)
        nl, ntd = tree_flatten(new_c)
        if ntd != c_td:
            raise ShapeError("scan: fn must return a carry with the same structure as init")
        yl, ytd = tree_flatten(y)
        y_td.append(ytd)
        return nl, yl

    c_out, ys = scan_flat(body, c_leaves, x_leaves, [], T, reverse)
    return tree_unflatten(c_td, c_out), tree_unflatten(y_td[0], ys)


# ----------------------------------------------------------------------------- reverse mode


def _split_body_vjp(body: Graph, nc: int, nx: int, active: Sequence[bool]):
    """Trace the body's VJP and split it into primal (no cotangent) and cotangent equations."""
    n_in = len(body.invars)
    n_out = len(body.outvars)
    out_float = [is_float(v.aval.dtype) for v in body.outvars]
    ct_avals = [v.aval for v, f in zip(body.outvars, out_float) if f]
    grad_mask: list = []

    def bwd(ins: list) -> list:
        primal, cts_f = ins[:n_in], ins[n_in:]
        env, live = AD.forward(body, primal, active)
        outs = [read(env, a) for a in body.outvars]
        it = iter(cts_f)
        cts = [next(it) if f else None for f in out_float]
        g = AD.backward(body, env, live, cts)
        grad_mask.extend(x is not None for x in g)
        return outs + [x for x in g if x is not None]

    G, captured = trace_flat(bwd, [v.aval for v in body.invars] + ct_avals)
    assert not captured
    ct_vars = set(G.invars[n_in:])
    dep: set = set(ct_vars)
    P_eqns, D_eqns = [], []
    for e in G.eqns:
        if any(isinstance(a, Var) and a in dep for a in e.inputs):
            dep.update(e.outputs)
            D_eqns.append(e)
        else:
            P_eqns.append(e)
    const_invars = set(G.invars[nc + nx : n_in])
    constvars = set(G.constvars)
    res: list = []
    seen: set = set()

    def want(a):
        if isinstance(a, Var) and a not in dep and a not in const_invars and a not in constvars and a not in seen:
            seen.add(a)
            res.append(a)

    for e in D_eqns:
        for a in e.inputs:
            want(a)
    for a in G.outvars[n_out:]:
        want(a)
    return G, P_eqns, D_eqns, res, grad_mask, out_float


def _replay(eqns: Sequence, env: dict) -> None:
    """Bind ``eqns`` again on the values of ``env`` (into the active trace), defining their outputs."""
    for e in eqns:
        out = bind(e.prim, *[read(env, a) for a in e.inputs], **e.attrs)
        if e.prim.multiple_results:
            env.update(zip(e.outputs, out))
        else:
            env[e.outputs[0]] = out


def _scan_vjp(need, cts, outs, *ins, body, n_carry, n_x, length, reverse):
    nc, nx = n_carry, n_x
    n_in = len(ins)
    active = [is_float(aval_of(a).dtype) for a in ins]
    G, P_eqns, D_eqns, res, grad_mask, out_float = _split_body_vjp(body, nc, nx, active)
    carry0, xs, consts = list(ins[:nc]), list(ins[nc : nc + nx]), list(ins[nc + nx :])
    n_out = len(body.outvars)

    def fwd_res(c, x, k):
        env = dict(zip(G.constvars, G.consts))
        env.update(zip(G.invars[:n_in], list(c) + list(x) + list(k)))
        _replay(P_eqns, env)
        outs_ = [read(env, a) for a in G.outvars[:n_out]]
        return outs_[:nc], outs_[nc:] + [env[r] for r in res]

    _, stacked = scan_flat(fwd_res, carry0, xs, consts, length, reverse)
    residuals = stacked[n_out - nc :]
    # an output without a cotangent (None) contributes zeros
    cts = [P.zeros_like_aval(aval_of(o)) if c is None and f else c for c, o, f in zip(cts, outs, out_float)]
    ct_carry, ct_ys = cts[:nc], cts[nc:]
    fl_c = [k for k in range(nc) if out_float[k]]
    fl_y = [k for k in range(n_out - nc) if out_float[nc + k]]
    # the gradient outputs of G, in order, belong to these inputs
    g_inputs = [i for i, m in enumerate(grad_mask) if m]
    g_const = [i for i in g_inputs if i >= nc + nx]
    acc0 = [P.zeros_like_aval(aval_of(ins[i])) for i in g_const]
    bc0 = [ct_carry[k] for k in fl_c]

    def bwd_body(c, x, k):
        ct_c, acc = c[: len(fl_c)], c[len(fl_c) :]
        r, ct_y = x[: len(res)], x[len(res) :]
        env = dict(zip(G.constvars, G.consts))
        env.update(zip(G.invars[nc + nx : n_in], k))
        env.update(zip(res, r))
        env.update(zip(G.invars[n_in:], list(ct_c) + list(ct_y)))
        _replay(D_eqns, env)
        grads = dict(zip(g_inputs, [read(env, a) for a in G.outvars[n_out:]]))
        new_ct_c = []
        for k_ in fl_c:
            g = grads.get(k_)
            new_ct_c.append(P.zeros_like_aval(aval_of(ins[k_])) if g is None else fit(g, aval_of(ins[k_])))
        new_acc = [P.add(a, fit(grads[i], aval_of(ins[i]))) for a, i in zip(acc, g_const)]
        gx = []
        for j in range(nx):
            i = nc + j
            if active[i]:
                av = ShapedArray(aval_of(ins[i]).shape[1:], aval_of(ins[i]).dtype)
                gx.append(P.zeros_like_aval(av) if grads.get(i) is None else fit(grads[i], av))
        return new_ct_c + new_acc, gx

    b_xs = list(residuals) + [ct_ys[k] for k in fl_y]
    b_c, b_ys = scan_flat(bwd_body, bc0 + acc0, b_xs, consts, length, not reverse)
    res_cts: list = [None] * n_in
    for k_, g in zip(fl_c, b_c[: len(fl_c)]):
        res_cts[k_] = g
    for i, g in zip(g_const, b_c[len(fl_c) :]):
        res_cts[i] = g
    it = iter(b_ys)
    for j in range(nx):
        if active[nc + j]:
            res_cts[nc + j] = next(it)
    return tuple(res_cts[i] if need[i] else None for i in range(n_in))


# ----------------------------------------------------------------------------- forward mode


def _scan_jvp(ts, outs, *ins, body, n_carry, n_x, length, reverse):
    nc, nx = n_carry, n_x
    n_in = len(ins)
    tans = [t if t is not None else (P.zeros_like_aval(aval_of(a)) if is_float(aval_of(a).dtype) else None) for t, a in zip(ts, ins)]
    has_t = [t is not None for t in tans]
    n_out = len(body.outvars)
    out_float = [is_float(v.aval.dtype) for v in body.outvars]

    def split(lst, lo, hi):
        return [v for i, v in enumerate(lst[lo:hi], lo) if has_t[i]]

    tc = split(tans, 0, nc)
    tx = split(tans, nc, nc + nx)
    tk = split(tans, nc + nx, n_in)
    idx_c = [i for i in range(nc) if has_t[i]]
    idx_x = [i for i in range(nc, nc + nx) if has_t[i]]
    idx_k = [i for i in range(nc + nx, n_in) if has_t[i]]

    def jbody(c, x, k):
        prim_c, tan_c = c[:nc], c[nc:]
        prim_x, tan_x = x[:nx], x[nx:]
        prim_k, tan_k = k[: n_in - nc - nx], k[n_in - nc - nx :]
        primals = list(prim_c) + list(prim_x) + list(prim_k)
        t_all: list = [None] * n_in
        for i, t in zip(idx_c + idx_x + idx_k, list(tan_c) + list(tan_x) + list(tan_k)):
            t_all[i] = t
        outs_, touts = graph_jvp(body, primals, t_all)
        tc_out = [touts[i] for i in idx_c]
        return list(outs_[:nc]) + tc_out, list(outs_[nc:]) + [touts[j] for j in range(nc, n_out) if out_float[j]]

    c_out, ys = scan_flat(jbody, list(ins[:nc]) + tc, list(ins[nc : nc + nx]) + tx, list(ins[nc + nx :]) + tk, length, reverse)
    t_c = dict(zip(idx_c, c_out[nc:]))
    it = iter(ys[n_out - nc :])
    return [t_c.get(i) for i in range(nc)] + [next(it) if out_float[j] else None for j in range(nc, n_out)]


scan_p.vjp = _scan_vjp
scan_p.jvp = _scan_jvp


# ----------------------------------------------------------------------------- batching


def _scan_batch(prim, vals, batched, size, *, body, n_carry, n_x, length, reverse):
    nc, nx = n_carry, n_x
    vals = [v if b else P.broadcast_to(as_value(v), (size,) + aval_of(v).shape) for v, b in zip(vals, batched)]
    xs = [P.transpose(x, (1, 0) + tuple(range(2, len(aval_of(x).shape)))) for x in vals[nc : nc + nx]]
    vbody = vmap(lambda *a: eval_sub(body, a))

    def bbody(c, x, k):
        outs = vbody(*c, *x, *k)
        return outs[:nc], outs[nc:]

    c_out, ys = scan_flat(bbody, vals[:nc], xs, vals[nc + nx :], length, reverse)
    return list(c_out) + [P.transpose(y, (1, 0) + tuple(range(2, len(aval_of(y).shape)))) for y in ys]  # (T, B, ...) -> (B, T, ...)


scan_p.batch = _scan_batch
scan_p.cuda = lambda e, lib: lib.control_step("scan", e)  # its step runs the cupy backend's sub-executables

__all__ = ["scan", "scan_flat", "scan_p"]
