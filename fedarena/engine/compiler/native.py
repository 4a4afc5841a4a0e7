"""Operator selection into native kernels: small dense layers and softmaxes, fused elementwise
trees, row max/min.

The numpy backend pays ~0.3-1 us of call overhead per kernel, which dominates the small products
of an RL actor's single-observation forward pass (a 1x64 row times a 64x64 matrix is ~4k
multiply-adds, far less than the call).  This pass finds

- ``matmul(x, w)`` followed by a bias ``add`` and optionally ``relu`` and
- the softmax chain ``div(e, sum(e))`` with ``e = exp(q - max(q))`` over the last axis

whose operands are small, and replaces each with one ``dense`` / ``softmax`` node that the
executor runs as a single call into the C kernels of ``_native.c`` (the backend's "operator
selection" step: the same computation, a cheaper implementation chosen per shape; Chen et al.,
"TVM", OSDI 2018, sec. 4).  ``elementwise_program`` compiles a fused elementwise tree
(fusion.py) into a register program for the kernels' elementwise VM, and ``row_reduce_native``
says when a max/min over the last axis runs as the native row kernel.  Thresholds come from ``benchmarks/engine_vs_torch.py``-style
measurements: above them one BLAS call plus ufuncs is faster.  When the extension is not built,
or ``FEDARENA_NATIVE=0`` is set, the pass changes nothing.  The generated code checks at run
time that the operands are C-contiguous float buffers and otherwise runs the numpy kernels.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import primitives as P
from ..core.ir import Eqn, Graph, ShapedArray, ShapeError, Var
from ..core.tracing import names_with
from ..primitives.base import _define, host_only, loop_batching
from ..primitives.emit import stmt

from ..core import cext
from ..core.cext import FLOATS, ROW_REDUCE_MAX, _native, available, row_reduce_native  # noqa: F401  (re-exported)

# Largest dense call taken natively, by dtype: at most this many multiply-adds (M*K*N) and input
# elements (M*K).  Measured against np.dot + np.add on one core: float32 4x64x64 is 1.3x faster
# natively and 8x64x64 ties; 8x64x4 is 1.3x faster and 16x64x4 0.6x (narrow outputs keep fewer
# accumulators busy); float64 1x64x64 1.5x, 2x64x64 ties, 4x64x4 2.1x, 16x64x4 ties.
DENSE_MAX_MACS = {np.dtype(np.float32): 16384, np.dtype(np.float64): 4096}
DENSE_MAX_INPUT = {np.dtype(np.float32): 512, np.dtype(np.float64): 256}
SOFTMAX_MAX_ELEMENTS = 1024


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


def _dense_jvp(ts, out, x, w, *b, bias: bool, relu: bool):
    terms = []
    if ts[0] is not None:
        terms.append(P.matmul(ts[0], w))
    if ts[1] is not None:
        terms.append(P.matmul(x, ts[1]))
    if bias and ts[2] is not None:
        terms.append(P.broadcast_to(P.reshape(ts[2], (1, P.shape_of(out)[1])), P.shape_of(out)))
    if not terms:
        return None
    t = terms[0]
    for u in terms[1:]:
        t = P.add(t, u)
    return P.mul(t, P.gt(out, 0)) if relu else t


# made by a compiler pass after every transformation: vmap never meets it (a per-example loop if it did),
# the cupy backend runs it on the host if a graph brings it
dense_p = _define("dense", _dense_rule, _dense_impl, _dense_emit, _dense_vjp, _dense_jvp, batch=loop_batching,
                  cuda=host_only)


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


def _softmax_jvp(ts, out, x):
    # the same linear map as the VJP (the softmax Jacobian is symmetric)
    return _softmax_vjp((True,), ts[0], out, x)[0]


softmax_p = _define("softmax", _softmax_rule, _softmax_impl, _softmax_emit, _softmax_vjp, _softmax_jvp,
                    batch=loop_batching, cuda=host_only)  # as dense_p


# ----------------------------------------------------------------------------- the pass


def _float(v: Any) -> bool:
    return isinstance(v, Var) and v.aval.dtype in FLOATS


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


def _unclaimed(e: Eqn | None, replace: dict, drop: set) -> Eqn | None:
    return None if e is None or id(e) in replace or id(e) in drop else e


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
    # an equation already taken into another chain is not extended: ``add(x1 @ w1, x2 @ w2)`` with a
    # (1, n) second product matches as the bias of either matmul, and claiming it twice would drop
    # the product the surviving chain reads
    nxt = _unclaimed(only_use(last), replace, drop)
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
            nxt = _unclaimed(only_use(last), replace, drop)
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


# ----------------------------------------------------------------------------- fused elementwise

# opcodes of the elementwise virtual machine in _native.c (same order as its enum)
_OPS = (
    "add sub mul div neg exp log log1p tanh logistic sqrt rsqrt abs sign maximum minimum pow square "
    "eq ne lt le gt ge and or not select clip relu sin cos copy nonzero"
).split()
OPCODE = {name: k for k, name in enumerate(_OPS)}
_TRANSCENDENTAL = names_with("transcendental")  # op categories derived from the primitives' traits
_PREDICATES = names_with("predicate")
_MODE = {"full": 0, "scalar": 1, "bcast": 2}
VM_MAX_REGS, VM_MAX_INPUTS, VM_MAX_OUTPUTS = 64, 32, 8
# numpy's SIMD exp/log beat the VM's scalar libm calls on long arrays: fused bodies with a
# transcendental function run in the VM only up to this many elements (measured when float32 tanh
# was libm's too; it is now the engine's vectorised one in the VM and in numpy code alike)
VM_MAX_TRANSCENDENTAL_ELEMENTS = 512


class ElementwiseProgram:
    """A fused elementwise body compiled for the VM: ``program``/``consts``/``modes``/``bparams``
    bytes and the element count ``n`` of each output (see ``_native.c``; a body with several
    outputs has one result register per output)."""

    __slots__ = ("program", "consts", "modes", "bparams", "n", "double")

    def __init__(self, program: bytes, consts: bytes, modes: bytes, bparams: bytes, n: int, double: bool):
        self.program, self.consts, self.modes, self.bparams, self.n, self.double = program, consts, modes, bparams, n, double


def _input_mode(shape: tuple, out_shape: tuple) -> tuple | None:
    """How the VM reads an input of ``shape`` broadcast to ``out_shape``: ``("full",)``,
    ``("scalar",)``, ``("bcast", S, Cin)`` (output element p reads input element
    (p // S) * Cin + p % Cin), or None for a broadcast it cannot express."""
    if tuple(shape) == tuple(out_shape):
        return ("full",)
    size = int(np.prod(shape, dtype=np.int64))
    if size == 1:
        return ("scalar",)
    if len(shape) > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    # dims of the output: kept (K) or broadcast (B); size-1 output dims do not matter
    kinds = []
    for i, o in zip(padded, out_shape):
        if o == 1:
            continue
        k = "K" if i == o else "B" if i == 1 else None
        if k is None:
            return None
        if kinds and kinds[-1][0] == k:
            kinds[-1][1] *= o
        else:
            kinds.append([k, o])
    pattern = "".join(k for k, _ in kinds)
    n = int(np.prod(out_shape, dtype=np.int64))
    if pattern == "BK":  # a row repeated over leading axes
        return ("bcast", n, kinds[1][1])
    if pattern == "KB":  # a column repeated along trailing axes
        return ("bcast", kinds[1][1], 1)
    if pattern == "KBK":  # a row repeated over middle axes
        return ("bcast", kinds[1][1] * kinds[2][1], kinds[2][1])
    return None


def elementwise_program(body: Graph, scalar_inputs: frozenset = frozenset()) -> ElementwiseProgram | None:
    """Compile a fused elementwise body (fusion.py) for the native VM, or ``None`` when it uses
    something the VM does not do: dtypes other than one float type (booleans only as
    intermediate masks), a broadcast ``_input_mode`` cannot express, or a transcendental function
    on a long array.  The body may have up to ``VM_MAX_OUTPUTS`` outputs (multi-output fusion),
    distinct values computed in the body, all of one shape and dtype.  ``scalar_inputs``:
    positions of inputs passed as one element (operands known to be broadcasts of a single value)."""
    outs = body.outvars
    if not available() or not 1 <= len(outs) <= VM_MAX_OUTPUTS or not all(isinstance(o, Var) for o in outs):
        return None
    out = outs[0]
    if len(set(outs)) != len(outs) or any(o.aval != out.aval for o in outs):
        return None
    dt = out.aval.dtype
    if dt not in FLOATS or out.aval.size == 0:
        return None
    shape = out.aval.shape
    n = out.aval.size
    if len(body.invars) > VM_MAX_INPUTS:
        return None
    modes, bparams = [], []
    reg: dict = {}
    for k, v in enumerate(body.invars):
        mode = ("scalar",) if k in scalar_inputs else _input_mode(v.aval.shape, shape)
        if mode is None or v.aval.dtype != dt:
            return None
        modes.append(_MODE[mode[0]])
        bparams += list(mode[1:]) if mode[0] == "bcast" else [0, 0]
        reg[v] = k
    consts: list = []
    const_reg: dict = {}

    def constant(value: float) -> int:
        value = float(value)
        key = (value, np.signbit(value)) if value == value else ("nan",)
        if key not in const_reg:
            const_reg[key] = len(body.invars) + len(consts)
            consts.append(value)
        return const_reg[key]

    # constants are numbered first (registers ni .. ni+nc-1), so collect them in a first pass
    ops: list = []
    alias: dict = {}  # broadcast_to of an input: the input itself, read in its own mode
    inner = {x.outputs[0] for x in body.eqns}
    for e in body.eqns:
        name = e.prim.name
        o = e.outputs[0]
        if name == "broadcast_to":
            a = e.inputs[0]
            if not isinstance(a, Var) or a not in reg or o.aval.shape != shape or o.aval.dtype != dt:
                return None
            alias[o] = a
            continue
        if o.aval.shape != shape or (o.aval.dtype != dt and not (o.aval.dtype == np.bool_ and name in _PREDICATES | {"cast"})):
            return None
        if name in _TRANSCENDENTAL and n > VM_MAX_TRANSCENDENTAL_ELEMENTS:
            return None
        operands = []
        for a in e.inputs:
            if isinstance(a, Var):
                a = alias.get(a, a)
                if a.aval.dtype != dt and a.aval.dtype != np.bool_:
                    return None
                if a not in reg and a not in inner:
                    return None
                operands.append(a)
            else:
                if a.aval.dtype.kind not in "biuf":
                    return None
                operands.append(constant(a.value))
        if name == "cast":
            target = np.dtype(e.attrs["dtype"]) if "dtype" in e.attrs else o.aval.dtype
            op = "copy" if target == dt else "nonzero" if target == np.bool_ else None
            if op is None or e.inputs[0].aval.dtype not in (dt, np.dtype(np.bool_)):
                return None
        elif name == "clip":
            op = "clip"
            operands += [constant(e.attrs["lo"]), constant(e.attrs["hi"])]
        elif name == "pow" and not isinstance(e.inputs[1], Var) and float(e.inputs[1].value) == 2.0:
            op, operands = "square", operands[:1]
        elif name in OPCODE and name not in ("copy", "nonzero", "square"):
            op = name
        else:
            return None
        if o.aval.dtype == np.bool_ and op not in _PREDICATES | {"nonzero"}:
            return None
        ops.append((op, o, operands))
    ni, nc = len(body.invars), len(consts)
    temp0 = ni + nc
    last_use: dict = {}
    for q, (_, _, operands) in enumerate(ops):
        for a in operands:
            if isinstance(a, Var):
                last_use[a] = q
    for o in outs:  # a result keeps its register to the end of the block
        last_use[o] = len(ops)
    free: list = []
    next_temp = temp0
    words = []
    for q, (op, o, operands) in enumerate(ops):
        srcs = [reg[a] if isinstance(a, Var) else a for a in operands]
        for a in operands:  # operands dying here free their temporaries (the VM runs in place safely)
            if isinstance(a, Var) and last_use.get(a) == q and reg[a] >= temp0 and reg[a] not in free:
                free.append(reg[a])
        if free:
            dst = free.pop()
        else:
            dst, next_temp = next_temp, next_temp + 1
            if dst >= VM_MAX_REGS:
                return None
        reg[o] = dst
        srcs += [0] * (3 - len(srcs))
        words += [OPCODE[op], dst, *srcs[:3]]
    if any(o not in reg or reg[o] < temp0 for o in outs):
        return None
    program = np.array([temp0, *(reg[o] for o in outs), *words], np.int32).tobytes()
    return ElementwiseProgram(
        program, np.array(consts, np.float64).tobytes(), bytes(modes), np.array(bparams, np.int64).tobytes(), n, dt == np.float64
    )


__all__ = ["DENSE_MAX_INPUT", "DENSE_MAX_MACS", "FLOATS", "ElementwiseProgram", "VM_MAX_OUTPUTS", "elementwise_program", "SOFTMAX_MAX_ELEMENTS", "available", "row_reduce_native", "dense_p", "select_native_kernels", "softmax_p"]
