"""Control-flow primitives inside compiled graphs: ``scan``, ``cond``, ``while_loop``, ``fori_loop``.

Each primitive carries its body as a sub-graph (an attribute of the equation), has a shape rule, a
numpy kernel (the body compiled once by the numpy executor and called per step), autodiff rules and
a batching rule, following the structured control flow of JAX's ``lax`` (Frostig et al., SysML
2018) and XLA's While/Conditional.

Reverse mode through ``scan`` stores what the backward pass needs: the body's VJP is traced once and
split by partial evaluation (Griewank & Walther, "Evaluating Derivatives", 2nd ed., sec. 4.6, "tape"
of intermediate values) into a forward part that also emits the residuals the backward part reads
(stacked over the steps by a forward scan) and a backward part run by a reverse scan that
accumulates the gradients of loop-invariant operands.  ``while_loop`` has a forward-mode rule only;
reverse mode raises an error naming ``scan`` (a loop whose trip count is unknown cannot pre-size
its tape).

The IR's equations have one output each, so a control-flow equation returns its outputs packed
into one flat vector of their common dtype; the wrappers unpack it with slice/reshape/cast
equations (views in the compiled schedule).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .transforms import autodiff as AD
from . import primitives as P
from .backends.numpy.executor import Executable
from .core.nonfinite import SWITCH as _NAN_SWITCH
from .core.ir import EngineError, Graph, Literal, ShapedArray, ShapeError, Var, is_float
from .core.pytree import tree_flatten, tree_unflatten
from .core.tracing import Tracer, aval_of, bind, eval_graph, register, trace_flat
from .transforms.vmap import vmap

# ----------------------------------------------------------------------------- packing


def _layout(avals: Sequence[ShapedArray]) -> tuple:
    return tuple((av.shape, av.dtype.name) for av in avals)


def _pack_dtype(layout: tuple) -> np.dtype:
    if not layout:
        return np.dtype(np.float64)
    dt = np.result_type(*[np.dtype(d) for _, d in layout])
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _total(layout: tuple) -> int:
    return int(sum(int(np.prod(s, dtype=np.int64)) for s, _ in layout))


def _unpack(flat: Any, layout: tuple) -> list:
    """Split a packed vector into arrays of ``layout`` (slice, reshape, cast equations)."""
    out, off = [], 0
    for shape, dt in layout:
        n = int(np.prod(shape, dtype=np.int64))
        piece = bind(P.slice_p, flat, starts=(off,), limits=(off + n,), strides=(1,))
        piece = P.reshape(piece, tuple(shape))
        if aval_of(piece).dtype != np.dtype(dt):
            piece = P.cast(piece, np.dtype(dt))
        out.append(piece)
        off += n
    return out


def _unpack_np(flat: np.ndarray, layout: tuple) -> list:
    out, off = [], 0
    for shape, dt in layout:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(flat[off : off + n].reshape(shape).astype(dt, copy=False))
        off += n
    return out


def _write_packed(out: np.ndarray, values: Sequence[np.ndarray]) -> np.ndarray:
    off = 0
    for v in values:
        n = v.size
        out[off : off + n] = v.reshape(-1)
        off += n
    return out


def _pack(values: Sequence[Any], dtype: np.dtype) -> Any:
    """Pack traced/eager values into one flat vector (the inverse of ``_unpack``)."""
    parts = []
    for v in values:
        if isinstance(v, (bool, int, float)) and not isinstance(v, np.generic):
            v = np.asarray(v, dtype)
        v = P.reshape(v, (int(np.prod(aval_of(v).shape, dtype=np.int64)),))
        if aval_of(v).dtype != dtype:
            v = P.cast(v, dtype)
        parts.append(v)
    if not parts:
        return np.zeros((0,), dtype)
    return bind(P.concatenate_p, *parts, axis=0) if len(parts) > 1 else P.reshape(parts[0], aval_of(parts[0]).shape)


def _as_value(x: Any) -> Any:
    if isinstance(x, Tracer):
        return x
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return np.asarray(x)
    return np.asarray(x)


def _trace_fn(fn: Callable[[list], list], avals: Sequence[ShapedArray]) -> tuple[Graph, list]:
    return trace_flat(fn, list(avals))


_eval = eval_graph  # a sub-graph run through bind (eager, or inlined into the active trace)


def _read(env: dict, a: Any) -> Any:
    if isinstance(a, Literal):
        return a.value if a.weak else np.asarray(a.value, a.aval.dtype)[()]
    return env[a]


def _coerce_outs(outs: Sequence[Any], avals: Sequence[ShapedArray], what: str) -> list:
    """Cast/broadcast body outputs to the declared carry types (weak scalars, literals)."""
    res = []
    for o, av in zip(outs, avals):
        if isinstance(o, (bool, int, float)) and not isinstance(o, np.generic):
            o = np.asarray(o, av.dtype)
        oav = aval_of(o)
        if oav.shape != av.shape:
            raise ShapeError(f"{what}: the carry changed shape from {av.str_short()} to {oav.str_short()}; it must keep its type")
        if oav.dtype != av.dtype:
            raise ShapeError(f"{what}: the carry changed dtype from {av.str_short()} to {oav.str_short()}; cast it explicitly")
        res.append(o)
    return res


class _Compiled:
    """A sub-graph compiled once by the numpy executor (built lazily, shared by kernels); while the
    NaN debugger is on (``engine.debug_nans``), a checking build of it runs instead."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._exe: Executable | None = None
        self._checked: Executable | None = None

    def __call__(self, *args: Any) -> list:
        if _NAN_SWITCH.on:
            if self._checked is None:
                self._checked = Executable(self.graph, validate=False, check_finite=True)
            return self._checked(*args)
        if self._exe is None:
            self._exe = Executable(self.graph, validate=False)
        return self._exe(*args)


def _compiled(graph: Graph) -> _Compiled:
    """The sub-graph's compiled form, cached on the graph object (dies with it)."""
    c = getattr(graph, "_compiled_body", None)
    if c is None:
        c = _Compiled(graph)
        graph._compiled_body = c  # type: ignore[attr-defined]
    return c


# ============================================================================ scan

scan_p = register("scan")


def _scan_rule(avals, attrs, weak):
    nc, nx, T = attrs["n_carry"], attrs["n_x"], attrs["length"]
    body: Graph = attrs["body"]
    if len(avals) != len(body.invars):
        raise ShapeError(f"scan: {len(avals)} operands for a body with {len(body.invars)} inputs")
    for k, (av, bv) in enumerate(zip(avals, body.invars)):
        want = ((T,) + bv.aval.shape) if nc <= k < nc + nx else bv.aval.shape
        if av.shape != want or av.dtype != bv.aval.dtype:
            raise ShapeError(f"scan: operand {k} is {av.str_short()} but the body expects {ShapedArray(want, bv.aval.dtype).str_short()}")
    layout = attrs["layout"]
    return ShapedArray((_total(layout),), _pack_dtype(layout))


def _scan_np(ins, body: Graph, n_carry: int, n_x: int, length: int, reverse: bool, layout: tuple, out: np.ndarray) -> np.ndarray:
    run = _compiled(body)
    carry = list(ins[:n_carry])
    xs = ins[n_carry : n_carry + n_x]
    consts = list(ins[n_carry + n_x :])
    ys_layout = layout[n_carry:]
    ys = [np.empty((length,) + tuple(s[1:]), dt) for s, dt in ys_layout]
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        outs = run(*carry, *[x[t] for x in xs], *consts)
        carry = outs[:n_carry]
        for buf, y in zip(ys, outs[n_carry:]):
            buf[t] = y
    return _write_packed(out, list(carry) + ys)


class _ScanKernel:
    def __init__(self, attrs: dict):
        self.attrs = attrs

    def __call__(self, *args: Any) -> np.ndarray:
        *ins, out = args
        return _scan_np(ins, out=out, **self.attrs)


def _scan_impl(*ins, **attrs):
    layout = attrs["layout"]
    out = np.empty((_total(layout),), _pack_dtype(layout))
    return _scan_np([np.asarray(a) for a in ins], out=out, **attrs)


def _scan_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_ScanKernel(attrs))
    return P.stmt(f"{k}({', '.join(ins)}, {{o}})")


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
    carry = [_as_value(c) for c in carry]
    xs = [_as_value(x) for x in xs]
    consts = [_as_value(c) for c in consts]
    c_av = [aval_of(c) for c in carry]
    x_av = [ShapedArray(aval_of(x).shape[1:], aval_of(x).dtype) for x in xs]
    k_av = [aval_of(c) for c in consts]
    nc, nx = len(carry), len(xs)

    def flat(ins: list) -> list:
        new_c, ys = body_fn(ins[:nc], ins[nc : nc + nx], ins[nc + nx :])
        new_c = _coerce_outs(new_c, c_av, "scan")
        ys = [_as_value(y) if not isinstance(y, Tracer) else y for y in ys]
        return list(new_c) + list(ys)

    body, captured = _trace_fn(flat, c_av + x_av + k_av)
    y_av = [v.aval if isinstance(v, Var) else v.aval for v in body.outvars[nc:]]
    layout = _layout(c_av) + tuple(((length,) + av.shape, av.dtype.name) for av in y_av)
    operands = carry + xs + consts + list(captured)
    packed = bind(scan_p, *operands, body=body, n_carry=nc, n_x=nx, length=int(length), reverse=bool(reverse), layout=layout)
    outs = _unpack(packed, layout)
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
    x_leaves = [_as_value(x) for x in x_leaves]
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


# ----------------------------------------------------------------------------- scan: reverse mode


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
        outs = [_read(env, a) for a in body.outvars]
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
            dep.add(e.outputs[0])
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


def _scan_vjp(need, ct, out, *ins, body, n_carry, n_x, length, reverse, layout):
    nc, nx = n_carry, n_x
    n_in = len(ins)
    active = [is_float(aval_of(a).dtype) for a in ins]
    G, P_eqns, D_eqns, res, grad_mask, out_float = _split_body_vjp(body, nc, nx, active)
    carry0, xs, consts = list(ins[:nc]), list(ins[nc : nc + nx]), list(ins[nc + nx :])
    n_out = len(body.outvars)

    def fwd_res(c, x, k):
        env = dict(zip(G.constvars, G.consts))
        env.update(zip(G.invars[:n_in], list(c) + list(x) + list(k)))
        for e in P_eqns:
            env[e.outputs[0]] = bind(e.prim, *[_read(env, a) for a in e.inputs], **e.attrs)
        outs = [_read(env, a) for a in G.outvars[:n_out]]
        return outs[:nc], outs[nc:] + [env[r] for r in res]

    _, stacked = scan_flat(fwd_res, carry0, xs, consts, length, reverse)
    residuals = stacked[n_out - nc :]
    cts = _unpack(ct, layout)
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
        ct_in = G.invars[n_in:]
        env.update(zip(ct_in, list(ct_c) + list(ct_y)))
        for e in D_eqns:
            env[e.outputs[0]] = bind(e.prim, *[_read(env, a) for a in e.inputs], **e.attrs)
        grads = dict(zip(g_inputs, [_read(env, a) for a in G.outvars[n_out:]]))
        new_ct_c = []
        for k_ in fl_c:
            g = grads.get(k_)
            new_ct_c.append(P.zeros_like_aval(aval_of(ins[k_])) if g is None else _fit(g, aval_of(ins[k_])))
        new_acc = [P.add(a, _fit(grads[i], aval_of(ins[i]))) for a, i in zip(acc, g_const)]
        gx = []
        for j in range(nx):
            i = nc + j
            if active[i]:
                av = ShapedArray(aval_of(ins[i]).shape[1:], aval_of(ins[i]).dtype)
                gx.append(P.zeros_like_aval(av) if grads.get(i) is None else _fit(grads[i], av))
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


def _fit(g: Any, av: ShapedArray) -> Any:
    gav = aval_of(g)
    if gav.dtype != av.dtype:
        g = P.cast(g, av.dtype)
    if gav.shape != av.shape:
        g = P.broadcast_to(g, av.shape)
    return g


def _scan_jvp(ts, out, *ins, body, n_carry, n_x, length, reverse, layout):
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
        outs, touts = _graph_jvp(body, primals, t_all)
        tc_out = [touts[i] for i in idx_c]
        return list(outs[:nc]) + tc_out, list(outs[nc:]) + [touts[j] for j in range(nc, n_out) if out_float[j]]

    c_out, ys = scan_flat(jbody, list(ins[:nc]) + tc, list(ins[nc : nc + nx]) + tx, list(ins[nc + nx :]) + tk, length, reverse)
    t_c = dict(zip(idx_c, c_out[nc:]))
    t_y = ys[n_out - nc :]
    it = iter(t_y)
    pieces = []
    for i in range(nc):
        av = body.outvars[i].aval
        pieces.append(t_c.get(i, P.zeros_like_aval(ShapedArray(av.shape, _pack_dtype(layout)))))
    for j in range(nc, n_out):
        if out_float[j]:
            pieces.append(next(it))
        else:
            pieces.append(P.zeros_like_aval(ShapedArray((length,) + body.outvars[j].aval.shape, _pack_dtype(layout))))
    return _pack(pieces, _pack_dtype(layout))


def _graph_jvp(graph: Graph, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """Forward-mode through a sub-graph (same rules as ``autodiff.jvp``); zero tangents where none."""
    outs, tans = AD.jvp_graph(graph, primals, tangents)
    touts = []
    for t, o in zip(tans, outs):
        av = aval_of(o)
        touts.append(t if t is not None else P.zeros_like_aval(ShapedArray(av.shape, av.dtype if is_float(av.dtype) else np.float64)))
    return outs, touts


scan_p.vjp = _scan_vjp
scan_p.jvp = _scan_jvp


# ----------------------------------------------------------------------------- scan: batching


def _scan_batch(prim, vals, batched, size, *, body, n_carry, n_x, length, reverse, layout):

    nc, nx = n_carry, n_x
    vals = [v if b else P.broadcast_to(_as_value(v), (size,) + aval_of(v).shape) for v, b in zip(vals, batched)]
    xs = [P.transpose(x, (1, 0) + tuple(range(2, len(aval_of(x).shape)))) for x in vals[nc : nc + nx]]
    vbody = vmap(lambda *a: _eval(body, a))

    def bbody(c, x, k):
        outs = vbody(*c, *x, *k)
        return outs[:nc], outs[nc:]

    c_out, ys = scan_flat(bbody, vals[:nc], xs, vals[nc + nx :], length, reverse)
    dt = _pack_dtype(layout)
    rows = [P.reshape(_cast(c, dt), (size, int(np.prod(aval_of(c).shape[1:], dtype=np.int64)))) for c in c_out]
    for y in ys:
        s = aval_of(y).shape  # (T, B, ...)
        y = P.transpose(y, (1, 0) + tuple(range(2, len(s))))
        rows.append(P.reshape(_cast(y, dt), (size, int(np.prod(s, dtype=np.int64)) // size)))
    if not rows:
        return P.full((size, 0), dt, 0)
    return bind(P.concatenate_p, *rows, axis=1) if len(rows) > 1 else rows[0]


def _cast(x: Any, dt: np.dtype) -> Any:
    return x if aval_of(x).dtype == dt else P.cast(x, dt)


scan_p.batch = _scan_batch


# ============================================================================ cond

cond_p = register("cond")


def _cond_rule(avals, attrs, weak):
    pred = avals[0]
    if pred.shape != () or pred.dtype.kind not in "biu":
        raise ShapeError(f"cond: the predicate must be a scalar bool or integer, got {pred.str_short()}")
    for br in attrs["branches"]:
        if [v.aval for v in br.invars] != list(avals[1:]):
            raise ShapeError("cond: operands do not match the branch inputs")
    layout = attrs["layout"]
    return ShapedArray((_total(layout),), _pack_dtype(layout))


def _cond_np(pred, ops, branches, layout, out):
    br = branches[0] if bool(pred) else branches[1]
    return _write_packed(out, _compiled(br)(*ops))


class _CondKernel:
    def __init__(self, attrs):
        self.attrs = attrs

    def __call__(self, pred, *args):
        *ops, out = args
        return _cond_np(pred, ops, out=out, **self.attrs)


def _cond_impl(pred, *ops, branches, layout):
    out = np.empty((_total(layout),), _pack_dtype(layout))
    return _cond_np(pred, [np.asarray(o) for o in ops], branches, layout, out)


cond_p.abstract_eval = _cond_rule
cond_p.impl = _cond_impl
cond_p.emit = lambda ctx, ins, attrs, ia, oa: P.stmt(f"{ctx.const(_CondKernel(attrs))}({', '.join(ins)}, {{o}})")


def _unify(traced: Sequence[tuple[Graph, list]], n: int) -> tuple[list[Graph], list]:
    """Give sub-graphs that captured different outer values the same inputs: the ``n`` declared
    inputs followed by every graph's captures (unused dummies where a graph did not capture it)."""
    caps: list = []
    for _, c in traced:
        caps.extend(c)
    graphs = []
    off = 0
    for g, c in traced:
        before = [Var(aval_of(x)) for x in caps[:off]]
        after = [Var(aval_of(x)) for x in caps[off + len(c) :]]
        graphs.append(Graph(g.invars[:n] + before + g.invars[n:] + after, g.constvars, g.consts, g.eqns, g.outvars))
        off += len(c)
    return graphs, caps


def _bind_cond(pred: Any, true_fn: Callable[[list], list], false_fn: Callable[[list], list], ops: Sequence[Any]) -> list:
    ops = [_as_value(o) for o in ops]
    avals = [aval_of(o) for o in ops]
    (gt, gf), caps = _unify([_trace_fn(lambda a: list(true_fn(a)), avals), _trace_fn(lambda a: list(false_fn(a)), avals)], len(ops))
    t_av = [a.aval for a in gt.outvars]
    f_av = [a.aval for a in gf.outvars]
    if [(a.shape, a.dtype) for a in t_av] != [(a.shape, a.dtype) for a in f_av]:
        raise ShapeError(
            f"cond: the branches return different types: {[a.str_short() for a in t_av]} vs {[a.str_short() for a in f_av]}"
        )
    layout = _layout(t_av)
    packed = bind(cond_p, _as_value(pred), *ops, *caps, branches=(gt, gf), layout=layout)
    return _unpack(packed, layout)


def _pack_rows(vals: Sequence[Any], size: int, dt: np.dtype) -> Any:
    rows = [P.reshape(_cast(v, dt), (size, int(np.prod(aval_of(v).shape[1:], dtype=np.int64)))) for v in vals]
    if not rows:
        return P.full((size, 0), dt, 0)
    return bind(P.concatenate_p, *rows, axis=1) if len(rows) > 1 else rows[0]


def _cond_vjp(need, ct, out, pred, *ops, branches, layout):
    active = [is_float(aval_of(o).dtype) for o in ops]
    cts = _unpack(ct, layout)

    def bwd(g):
        def f(a):
            env, live = AD.forward(g, a, active)
            c = [x if is_float(v.aval.dtype) else None for x, v in zip(cts, g.outvars)]
            gi = AD.backward(g, env, live, c)
            return [
                (P.zeros_like_aval(aval_of(o)) if x is None else _fit(x, aval_of(o))) for x, o, act in zip(gi, ops, active) if act
            ]

        return f

    grads = iter(_bind_cond(pred, bwd(branches[0]), bwd(branches[1]), list(ops)))
    return (None,) + tuple(next(grads) if act else None for act in active)


def _cond_jvp(ts, out, pred, *ops, branches, layout):
    dt = _pack_dtype(layout)
    tans = list(ts[1:])

    def jf(g):
        def f(a):
            _, touts = _graph_jvp(g, a, tans)
            return [_pack(touts, dt)]

        return f

    return _bind_cond(pred, jf(branches[0]), jf(branches[1]), list(ops))[0]


def _cond_batch(prim, vals, batched, size, *, branches, layout):

    dt = _pack_dtype(layout)
    pred, ops = vals[0], vals[1:]
    ops = [v if b else P.broadcast_to(_as_value(v), (size,) + aval_of(v).shape) for v, b in zip(ops, batched[1:])]
    vb = [vmap(lambda *a, g=g: _eval(g, a)) for g in branches]
    if batched[0]:
        rt = _pack_rows(vb[0](*ops), size, dt)
        rf = _pack_rows(vb[1](*ops), size, dt)
        p = P.reshape(P.cast(pred, np.bool_) if aval_of(pred).dtype != np.bool_ else pred, (size, 1))
        return P.select(p, rt, rf)
    outs = _bind_cond(pred, lambda a: [_pack_rows(vb[0](*a), size, dt)], lambda a: [_pack_rows(vb[1](*a), size, dt)], ops)
    return outs[0]


cond_p.vjp = _cond_vjp
cond_p.jvp = _cond_jvp
cond_p.batch = _cond_batch


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
            return [_as_value(o) if not isinstance(o, Tracer) else o for o in ol]

        return g

    outs = _bind_cond(pred, branch(true_fn), branch(false_fn), leaves)
    if len(out_td) >= 2 and out_td[0] != out_td[1]:
        raise ShapeError("cond: the branches return different pytree structures")
    return tree_unflatten(out_td[0], outs)


# ============================================================================ while_loop

while_p = register("while")


def _while_rule(avals, attrs, weak):
    nc = attrs["n_carry"]
    cg, bg = attrs["cond"], attrs["body"]
    if [v.aval for v in bg.invars] != list(avals) or [v.aval for v in cg.invars] != list(avals):
        raise ShapeError("while_loop: operands do not match the cond/body inputs")
    if [a.aval for a in bg.outvars] != list(avals[:nc]):
        raise ShapeError("while_loop: the body must return the carry with unchanged types")
    layout = attrs["layout"]
    return ShapedArray((_total(layout),), _pack_dtype(layout))


def _while_np(ins, cond, body, n_carry, layout, out):
    c_run, b_run = _compiled(cond), _compiled(body)
    carry = list(ins[:n_carry])
    consts = list(ins[n_carry:])
    while bool(c_run(*carry, *consts)[0]):
        carry = b_run(*carry, *consts)
    return _write_packed(out, carry)


class _WhileKernel:
    def __init__(self, attrs):
        self.attrs = attrs

    def __call__(self, *args):
        *ins, out = args
        return _while_np(ins, out=out, **self.attrs)


def _while_impl(*ins, cond, body, n_carry, layout):
    out = np.empty((_total(layout),), _pack_dtype(layout))
    return _while_np([np.asarray(a) for a in ins], cond, body, n_carry, layout, out)


while_p.abstract_eval = _while_rule
while_p.impl = _while_impl
while_p.emit = lambda ctx, ins, attrs, ia, oa: P.stmt(f"{ctx.const(_WhileKernel(attrs))}({', '.join(ins)}, {{o}})")


def _bind_while(cond_fn: Callable[[list], Any], body_fn: Callable[[list], list], init: Sequence[Any], consts: Sequence[Any] = ()) -> list:
    init = [_as_value(c) for c in init]
    consts = [_as_value(c) for c in consts]
    nc = len(init)
    c_av = [aval_of(c) for c in init]
    avals = c_av + [aval_of(c) for c in consts]

    def cflat(a):
        p = _as_value(cond_fn(a))
        pav = aval_of(p)
        if pav.shape != () or pav.dtype.kind not in "biu":
            raise ShapeError(f"while_loop: cond_fun must return a scalar bool, got {pav.str_short()}")
        return [p]

    def bflat(a):
        return _coerce_outs(list(body_fn(a)), c_av, "while_loop")

    (cg, bg), caps = _unify([_trace_fn(cflat, avals), _trace_fn(bflat, avals)], len(avals))
    layout = _layout(c_av)
    packed = bind(while_p, *init, *consts, *caps, cond=cg, body=bg, n_carry=nc, layout=layout)
    return _unpack(packed, layout)


def _while_vjp(need, ct, out, *ins, **attrs):
    raise EngineError(
        "while_loop: reverse-mode differentiation is not supported (the trip count is only known at run "
        "time, so the backward pass cannot size the stored intermediates); use scan(fn, init, xs, length=N) "
        "with a fixed number of steps, or fori_loop with Python-int bounds (which lowers to scan)"
    )


def _while_jvp(ts, out, *ins, cond, body, n_carry, layout):
    nc = n_carry
    n = len(ins)
    dt = _pack_dtype(layout)
    tans = [
        t if t is not None else P.zeros_like_aval(ShapedArray(aval_of(a).shape, aval_of(a).dtype if is_float(aval_of(a).dtype) else np.float64))
        for t, a in zip(ts, ins)
    ]
    tc, tk = tans[:nc], tans[nc:]

    def cf(a):
        return _eval(cond, list(a[:nc]) + list(a[2 * nc : 2 * nc + n - nc]))[0]

    def bf(a):
        prim_c, tan_c = a[:nc], a[nc : 2 * nc]
        prim_k, tan_k = a[2 * nc : 2 * nc + n - nc], a[2 * nc + n - nc :]
        outs, touts = _graph_jvp(body, list(prim_c) + list(prim_k), list(tan_c) + list(tan_k))
        return list(outs) + [_fit(t, aval_of(x)) for t, x in zip(touts, tan_c)]

    res = _bind_while(cf, bf, list(ins[:nc]) + tc, list(ins[nc:]) + tk)
    return _pack(res[nc:], dt)


def _while_batch(prim, vals, batched, size, *, cond, body, n_carry, layout):

    nc = n_carry
    dt = _pack_dtype(layout)
    vals = [v if b else P.broadcast_to(_as_value(v), (size,) + aval_of(v).shape) for v, b in zip(vals, batched)]
    vc = vmap(lambda *a: _eval(cond, a)[0])
    vb = vmap(lambda *a: _eval(body, a))

    def cf(a):
        p = P.cast(vc(*a), np.int64)
        return P.gt(bind(P.reduce_max_p, p, axes=(0,), keepdims=False), 0)

    def bf(a):
        p = P.cast(vc(*a), np.bool_)
        new = vb(*a)
        res = []
        for nv, old in zip(new, a[:nc]):
            nd = len(aval_of(old).shape)
            res.append(P.select(P.reshape(p, (size,) + (1,) * (nd - 1)), nv, old))
        return res

    # the carry of a batched loop is (carry..., consts...) so the body sees consts too
    out = _bind_while(cf, bf, vals[:nc], vals[nc:])
    return _pack_rows(out, size, dt)


while_p.vjp = _while_vjp
while_p.jvp = _while_jvp
while_p.batch = _while_batch


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

    return tree_unflatten(td, _bind_while(cf, bf, leaves))


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
    i0 = _as_value(lower)
    if aval_of(i0).dtype.kind not in "iu":
        raise ShapeError("fori_loop: bounds must be integers")
    i0 = P.cast(i0, np.int64)
    hi = P.cast(_as_value(upper), np.int64)
    _, val = while_loop(lambda s: bind(P.lt_p, s[0], hi), lambda s: (P.add(s[0], np.int64(1)), body_fun(s[0], s[1])), (i0, init_val))
    return val


__all__ = ["cond", "fori_loop", "scan", "scan_flat", "while_loop"]
