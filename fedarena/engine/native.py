"""Operator selection for small operands: native dense-layer and softmax kernels.

The numpy backend pays ~0.3-1 us of call overhead per kernel, which dominates the small products
of an RL actor's single-observation forward pass (a 1x64 row times a 64x64 matrix is ~4k
multiply-adds, far less than the call).  This pass finds

- ``matmul(x, w)`` followed by a bias ``add`` and optionally ``relu`` and
- the softmax chain ``div(e, sum(e))`` with ``e = exp(q - max(q))`` over the last axis

whose operands are small, and replaces each with one ``dense`` / ``softmax`` node that the
executor runs as a single call into the C kernels of ``_native.c`` (the backend's "operator
selection" step: the same computation, a cheaper implementation chosen per shape; Chen et al.,
"TVM", OSDI 2018, sec. 4).  Thresholds come from ``benchmarks/engine_vs_torch.py``-style
measurements: above them one BLAS call plus ufuncs is faster.  When the extension is not built,
or ``FEDARENA_NATIVE=0`` is set, the pass changes nothing.  The generated code checks at run
time that the operands are C-contiguous float buffers and otherwise runs the numpy kernels.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import primitives as P
from .ir import Eqn, Graph, ShapedArray, ShapeError, Var
from .primitives import _define, stmt

try:  # built by `pip install` from _native.c; optional
    from . import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None

# Largest dense call taken natively, by dtype: at most this many multiply-adds (M*K*N) and input
# elements (M*K).  Measured against np.dot + np.add on one core: float32 4x64x64 is 1.3x faster
# natively and 8x64x64 ties; 8x64x4 is 1.3x faster and 16x64x4 0.6x (narrow outputs keep fewer
# accumulators busy); float64 1x64x64 1.5x, 2x64x64 ties, 4x64x4 2.1x, 16x64x4 ties.
DENSE_MAX_MACS = {np.dtype(np.float32): 16384, np.dtype(np.float64): 4096}
DENSE_MAX_INPUT = {np.dtype(np.float32): 512, np.dtype(np.float64): 256}
SOFTMAX_MAX_ELEMENTS = 1024


def available() -> bool:
    """Whether the native kernels are built and enabled (``FEDARENA_NATIVE`` not ``0``)."""
    return _native is not None and os.environ.get("FEDARENA_NATIVE", "1") != "0"


# ----------------------------------------------------------------------------- dense


def _dense_rule(avals, attrs, weak):
    x, w = avals[0], avals[1]
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ShapeError(f"dense: operands {x.shape} and {w.shape} are not (M, K) and (K, N)")
    if attrs["bias"] and avals[2].size != w.shape[1]:
        raise ShapeError(f"dense: bias of shape {avals[2].shape} for {w.shape[1]} outputs")
    if len({a.dtype for a in avals}) != 1:
        raise ShapeError("dense: operands must share one float dtype")
    return ShapedArray((x.shape[0], w.shape[1]), x.dtype)


def _dense_impl(x, w, *b, bias: bool, relu: bool):
    y = x @ w
    if bias:
        y = y + b[0].reshape(-1)
    return np.maximum(y, 0) if relu else y


def _dense_emit(ctx, ins, attrs, in_avals, out_aval):
    (m, k), n = in_avals[0].shape, in_avals[1].shape[1]
    b = ins[2] if attrs["bias"] else "None"
    dbl = out_aval.dtype == np.float64
    fallback = [f"np.dot({ins[0]}, {ins[1]}, {{o}})"]
    if attrs["bias"]:
        fallback.append(f"np.add({{o}}, {ins[2]}, {{o}})")
    if attrs["relu"]:
        fallback.append("np.maximum({o}, 0, out={o})")
    fn = ctx.const(_native.dense)
    return stmt(f"if not {fn}({ins[0]}, {ins[1]}, {b}, {{o}}, {m}, {k}, {n}, {int(attrs['relu'])}, {dbl}): " + "; ".join(fallback))


def _dense_vjp(need, ct, out, x, w, *b, bias: bool, relu: bool):
    if relu:
        ct = P.mul(ct, P.gt(out, 0))
    gx = P.matmul(ct, P.transpose(w, (1, 0))) if need[0] else None
    gw = P.matmul(P.transpose(x, (1, 0)), ct) if need[1] else None
    gs = [gx, gw]
    if bias:
        gs.append(P.reshape(P.reduce_sum(ct, (0,)), P.shape_of(b[0])) if need[2] else None)
    return tuple(gs)


dense_p = _define("dense", _dense_rule, _dense_impl, _dense_emit, _dense_vjp)


# ----------------------------------------------------------------------------- softmax


def _softmax_rule(avals, attrs, weak):
    (x,) = avals
    if x.ndim != 2 or x.shape[1] == 0:
        raise ShapeError(f"softmax: operand of shape {x.shape} is not a non-empty (R, C) matrix")
    return x


def _softmax_impl(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _softmax_emit(ctx, ins, attrs, in_avals, out_aval):
    r, c = in_avals[0].shape
    fn = ctx.const(_native.softmax)
    dbl = out_aval.dtype == np.float64
    ones = ctx.const(np.ones((c, 1), out_aval.dtype))
    fallback = (
        f"np.subtract({ins[0]}, np.maximum.reduce({ins[0]}, 1, None, None, True), {{o}}); np.exp({{o}}, {{o}}); "
        f"np.divide({{o}}, np.dot({{o}}, {ones}), {{o}})"
    )
    return stmt(f"if not {fn}({ins[0]}, {{o}}, {r}, {c}, {dbl}): {fallback}")


def _softmax_vjp(need, ct, out, x):
    # d softmax: y * (ct - sum(ct * y, axis))
    s = P.reduce_sum(P.mul(ct, out), (1,), keepdims=True)
    return (P.mul(out, P.sub(ct, s)),)


softmax_p = _define("softmax", _softmax_rule, _softmax_impl, _softmax_emit, _softmax_vjp)


# ----------------------------------------------------------------------------- the pass


def _float(v: Any) -> bool:
    return isinstance(v, Var) and v.aval.dtype in DENSE_MAX_MACS


def select_native_kernels(graph: Graph) -> Graph:
    """Replace small dense layers and softmaxes by single native-kernel nodes (identity when the
    native kernels are unavailable)."""
    if not available():
        return graph
    uses: dict = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                uses.setdefault(a, []).append(e)
    outs = {v for v in graph.outvars if isinstance(v, Var)}

    def only_use(v: Var):
        u = uses.get(v, ())
        return u[0] if len(u) == 1 and v not in outs else None

    producer = {o: e for e in graph.eqns for o in e.outputs}
    replace: dict = {}  # id(last equation of a chain) -> new equation
    drop: set = set()
    for e in graph.eqns:
        name = e.prim.name
        if name == "matmul" and id(e) not in drop:
            _match_dense(e, only_use, replace, drop)
        elif name == "div" and id(e) not in drop:
            _match_softmax(e, uses, outs, producer, replace, drop)
    if not replace:
        return graph
    eqns = []
    for e in graph.eqns:
        if id(e) in replace:
            eqns.append(replace[id(e)])
        elif id(e) not in drop:
            eqns.append(e)
    return Graph(graph.invars, graph.constvars, graph.consts, eqns, graph.outvars)


def _match_dense(e: Eqn, only_use, replace: dict, drop: set) -> None:
    x, w = e.inputs
    y = e.outputs[0]
    if not (_float(x) and _float(w) and x.aval.ndim == 2 and w.aval.ndim == 2 and x.aval.dtype == w.aval.dtype == y.aval.dtype):
        return
    m, k = x.aval.shape
    n = w.aval.shape[1]
    if m * k * n > DENSE_MAX_MACS[y.aval.dtype] or m * k > DENSE_MAX_INPUT[y.aval.dtype]:
        return
    chain = [e]
    ins = [x, w]
    bias = relu = False
    last = y
    nxt = only_use(last)
    if nxt is not None and nxt.prim.name == "add":
        other = nxt.inputs[1] if nxt.inputs[0] is last else nxt.inputs[0]
        if (
            nxt.inputs.count(last) == 1
            and _float(other)
            and other.aval.dtype == y.aval.dtype
            and other.aval.shape in ((n,), (1, n))
            and nxt.outputs[0].aval.shape == y.aval.shape
        ):
            chain.append(nxt)
            ins.append(other)
            bias = True
            last = nxt.outputs[0]
            nxt = only_use(last)
    if nxt is not None and nxt.prim.name == "relu" and nxt.outputs[0].aval == last.aval:
        chain.append(nxt)
        relu = True
        last = nxt.outputs[0]
    if len(chain) == 1:
        return  # a lone small matmul: np.dot is already one call
    for c in chain[:-1]:
        drop.add(id(c))
    replace[id(chain[-1])] = Eqn(dense_p, ins, [last], dict(bias=bias, relu=relu), chain[-1].source)


def _match_softmax(e: Eqn, uses: dict, outs: set, producer: dict, replace: dict, drop: set) -> None:
    """``div(u, s)``, ``s = reduce_sum(u, last axis, keepdims)``, ``u = exp(t)``,
    ``t = sub(q, g)``, ``g = [stop_gradient](reduce_max(q, last axis, keepdims))``."""
    u, s = e.inputs
    out = e.outputs[0]
    if not (_float(u) and _float(s) and out.aval.ndim == 2 and out.aval.size <= SOFTMAX_MAX_ELEMENTS):
        return
    eu, es = producer.get(u), producer.get(s)
    if eu is None or es is None or eu.prim.name != "exp" or es.prim.name != "reduce_sum":
        return
    last_axis = (1,)
    if es.inputs[0] is not u or tuple(a % 2 for a in es.attrs["axes"]) != last_axis or not es.attrs["keepdims"]:
        return
    t = eu.inputs[0]
    et = producer.get(t)
    if et is None or et.prim.name != "sub":
        return
    q, g = et.inputs
    if not _float(q) or q.aval != out.aval:
        return
    chain = [et, eu, es]
    eg = producer.get(g)
    if eg is not None and eg.prim.name == "stop_gradient":
        chain.insert(0, eg)
        g = eg.inputs[0]
        eg = producer.get(g)
    if eg is None or eg.prim.name != "reduce_max" or eg.inputs[0] is not q:
        return
    if tuple(a % 2 for a in eg.attrs["axes"]) != last_axis or not eg.attrs["keepdims"]:
        return
    chain.insert(0, eg)
    # every inner value is used only inside the chain
    members = {id(c) for c in chain} | {id(e)}
    for v in (c.outputs[0] for c in chain):
        if v in outs or any(id(c) not in members for c in uses.get(v, ())):
            return
    for c in chain:
        drop.add(id(c))
    replace[id(e)] = Eqn(softmax_p, [q], [out], {}, e.source)


__all__ = ["DENSE_MAX_INPUT", "DENSE_MAX_MACS", "SOFTMAX_MAX_ELEMENTS", "available", "dense_p", "select_native_kernels", "softmax_p"]
