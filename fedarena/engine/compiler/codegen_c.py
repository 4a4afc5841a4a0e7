"""Whole-graph native code: lower a compiled graph to one C function.

The numpy backend's generated Python enters the interpreter once per equation (~1-3 us each), which
dominates small RL graphs.  This module lowers a graph (after the passes, as the executor gets it)
to the C source of a CPython extension whose ``run(arena, *inputs)`` computes every equation and returns the graph outputs as fresh arrays: the interpreter is
entered once per call (the "whole-program compilation" design of XLA's CPU backend and of TVM's
graph runtime; Chen et al., "TVM", OSDI 2018, sec. 4).  The generated code calls exactly the
kernels the per-equation executor calls, so results are equal bit for bit:

- a standalone elementwise equation calls numpy's own ufunc inner loop for its dtypes (looked up
  in the ufunc object when the module loads; one call over operands contiguous together, row by
  row where they broadcast; numpy casts operands of another dtype first, and so does this);
- a fused elementwise body (``fusion.py``) that the executor runs on the native elementwise VM
  (``_native.c``) is one C loop with the VM's per-element semantics (libm for transcendental
  functions, but the engine's float32 tanh of ``_tanhf.h``); one the VM declines is run op by op
  through numpy's loops, as the executor does;
- a float32 tanh is the engine's own (``_tanhf.h``, pasted into the module; vectorised, about twice
  as fast as numpy's loop with AVX2), as ``primitives.elementwise.tanh`` computes it for the executor;
- ``matmul`` of 2-D operands calls numpy's OpenBLAS (``cblas_?gemm``/``gemv``/``dot``/``syrk``,
  addresses resolved at load time) with the case analysis of numpy's ``cblas_matrixproduct``;
- sums follow the executor: a row/column sum of a matrix is a product with a ones vector (its
  emit rule), other sums numpy's reduction order (identity, then pairwise summation along an
  innermost reduced axis, sequential accumulation otherwise); max/min are order-independent;
- shape equations are strided views computed at generation time; concatenate, stack, pad,
  gather, scatter_add and the label check are loops; ``dense``/``softmax`` (operator selection)
  are the loops of ``_native.c``'s kernels, in their order of operations;
- ``scan`` is a C loop over its body lowered inline, ``cond`` an if/else over its branches,
  ``while`` (and ``fori_loop`` with traced bounds) a loop that tests its predicate graph inline.

Every value has its own range of a per-buffer-set arena (no sharing: the graphs this targets are
small); the arena starts with the addresses of the graph's constants, so programs whose C text is
the same share one compiled module.  Equations of any other kind make :func:`lower` raise
:class:`Unsupported` (:func:`lowers` asks for one equation; the caller splits the graph there).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np

from ..core import cext
from ..core.ir import Graph, Literal, Var
from ..core.tracing import names_with
from ..primitives.emit import CLIP
from . import native

ALIGN = 64  # bytes; every arena range starts on a cache line


class Unsupported(Exception):
    """The graph has an equation the C generator does not lower (the message names it)."""


# numpy ufunc (module attribute) of each elementwise primitive; ``logistic`` is scipy.special.expit
UFUNC = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide", "neg": "negative", "exp": "exp",
    "log": "log", "log1p": "log1p", "tanh": "tanh", "sqrt": "sqrt", "abs": "absolute", "sign": "sign",
    "maximum": "maximum", "minimum": "minimum", "pow": "power", "eq": "equal", "ne": "not_equal", "lt": "less",
    "le": "less_equal", "gt": "greater", "ge": "greater_equal", "and": "logical_and", "or": "logical_or",
    "not": "logical_not", "sin": "sin", "cos": "cos", "logistic": "expit", "relu": "maximum", "clip": "clip",
    "floor_divide": "floor_divide", "mod": "remainder", "isnan": "isnan", "isfinite": "isfinite",
}
_PREDICATES = names_with("predicate")  # boolean results: their operands' dtype is the loop's type
_CTYPE = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.int32): "int32_t",
    np.dtype(np.int64): "int64_t", np.dtype(np.bool_): "npy_bool",
}
_NPY = {
    np.dtype(np.float32): "NPY_FLOAT", np.dtype(np.float64): "NPY_DOUBLE", np.dtype(np.int32): "NPY_INT32",
    np.dtype(np.int64): "NPY_INT64", np.dtype(np.bool_): "NPY_BOOL",
}
COPY_PRIMS = frozenset({"concatenate", "stack", "gather", "scatter_add", "cast", "select", "pad", "check_range"})
REDUCE_PRIMS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
SELECTED = frozenset({"dense", "softmax"})
"""The operator-selection nodes of ``native.py``, computed with the loops of ``_native.c``'s kernels."""
CONTROL = frozenset({"scan", "cond", "while"})
"""Control flow lowered to C loops and branches over inline bodies."""
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "transpose", "slice", "broadcast_to", "stop_gradient"})
"""The view primitives :meth:`_Gen.view` computes strides for (equations are matched by the
``view`` trait; one with the trait but not here is refused)."""
FUSED = frozenset({"fused_elementwise", "fused_elementwise_multi"})

DENSE_BLOCK = 128
"""Bytes of output columns a dense loop accumulates at once (32 float32, 16 float64).  The block does not
change any output element's order of operations (``_native.c``'s kernel uses 16 columns).  Measured on
the PPO actor's forward pass at B=1 (dense 8-64, 64-64, 64-4, 64-1; GCC 12 -O3, one process, median of 7):
1.41 us a call at 128 bytes, 2.17 us at 64 (GCC kept the accumulators of the one-row 64x64 product partly
on the stack), 1.57 us at 32, 1.41 us at 256; the PPO step at B=64 is the same at all four."""


def ufunc_object(name: str):
    """The numpy ufunc of a ``UFUNC`` entry (``expit``: scipy.special's, imported here only, as the
    import takes ~0.3-0.9 s; ``clip``: numpy's clip ufunc, as the executor calls)."""
    if name == "expit":
        import scipy.special

        return scipy.special.expit
    return CLIP if name == "clip" else getattr(np, name)


def has_ctype(dtype) -> bool:
    """Whether values of ``dtype`` have a C type here (float32/64, int32/64, bool)."""
    return np.dtype(dtype) in _CTYPE


def supported_primitives() -> frozenset:
    """The primitives :func:`lower` takes: the elementwise ones (by trait) that have a numpy ufunc,
    the views (by trait: strides computed here), and the copy, reduction, product and fused
    families above."""
    return (names_with("elementwise") & frozenset(UFUNC)) | _VIEWS | COPY_PRIMS | REDUCE_PRIMS | FUSED | SELECTED | CONTROL | {"matmul"}


class _Val:
    """A value in C: a pointer expression, its shape and strides (in elements)."""

    __slots__ = ("ptr", "shape", "strides", "dtype")

    def __init__(self, ptr: str, shape: tuple, strides: tuple, dtype: np.dtype):
        self.ptr, self.shape, self.strides, self.dtype = ptr, tuple(shape), tuple(strides), np.dtype(dtype)

    @property
    def contiguous(self) -> bool:
        return self.strides == _c_strides(self.shape) or math.prod(self.shape) <= 1

    def at(self, offset: int) -> str:
        return f"({self.ptr} + {offset})" if offset else self.ptr


def _c_strides(shape: tuple) -> tuple:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def _c_literal(value: Any, dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "1" if value else "0"
    if dtype.kind in "iu":
        return f"(({_CTYPE[dtype]}){int(value)}LL)"
    v = float(dtype.type(value))
    if v != v:
        return f"(({_CTYPE[dtype]})NAN)"
    if math.isinf(v):
        return f"(({_CTYPE[dtype]})({'-' if v < 0 else ''}INFINITY))"
    return f"(({_CTYPE[dtype]}){v!r})"


class Lowered:
    """The C source of one graph and what its module needs at load time: the numpy ufunc loops
    (name, input dtype chars, output dtype char), the constant arrays (their addresses go at the
    start of each arena: :func:`new_arena`), the arena size."""

    def __init__(self, source: str, loops: list, consts: list, arena_bytes: int, n_inputs: int, n_outputs: int):
        self.source, self.loops, self.consts = source, loops, consts
        self.arena_bytes, self.n_inputs, self.n_outputs = arena_bytes, n_inputs, n_outputs


class _Gen:
    def __init__(self, graph: Graph, results: frozenset | None = None):
        self.g = graph
        # the values the per-equation executor treats as results (its emit rules depend on it)
        self.results = frozenset(v for v in graph.outvars if isinstance(v, Var)) if results is None else results
        self.lines: list = []
        self.arena = 0
        self.vals: dict = {}
        self.loops: list = []
        self.loop_index: dict = {}
        self.consts: list = []
        self.tmp = 0
        self.tanhf = False  # whether the source needs _tanhf.h

    # ------------------------------------------------------------------ helpers

    def alloc(self, shape: tuple, dtype: np.dtype) -> _Val:
        dtype = np.dtype(dtype)
        off = self.arena
        self.arena += -(-max(1, math.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN
        return _Val(f"(({_CTYPE[dtype]} *)(A + {off}))", shape, _c_strides(shape), dtype)

    def name(self) -> str:
        self.tmp += 1
        return f"t{self.tmp}"

    def loop(self, ufunc: str, ins: list, out: np.dtype) -> int:
        if len(self.loops) >= 64 and (ufunc, tuple(np.dtype(d).char for d in ins), np.dtype(out).char) not in self.loop_index:
            raise Unsupported("more than 64 distinct ufunc loops")
        key = (ufunc, tuple(np.dtype(d).char for d in ins), np.dtype(out).char)
        if key not in self.loop_index:
            self.loop_index[key] = len(self.loops)
            self.loops.append(key)
        return self.loop_index[key]

    def const(self, value: np.ndarray) -> _Val:
        arr = np.ascontiguousarray(value)
        if arr.dtype not in _CTYPE:
            raise Unsupported(f"a constant of dtype {arr.dtype}")
        k = len(self.consts)
        self.consts.append(arr)
        return _Val(f"k{k}", arr.shape, _c_strides(arr.shape), arr.dtype)

    def val(self, a: Any) -> _Val:
        if isinstance(a, Literal):
            return self.const(np.asarray(a.value, a.aval.dtype))
        return self.vals[a]

    def nested(self, shape: tuple, operands: list, body: str, indent: str = "    ") -> None:
        """Loops over ``shape`` (C order); ``body`` uses ``o0``, ``o1``... the element offsets of
        ``operands`` (each a strides tuple aligned to ``shape``)."""
        if math.prod(shape) == 0:
            return
        shape, operands = _coalesce(shape, operands)
        nd = len(shape)
        lines = [f"{indent}{{"]
        for k in range(len(operands)):
            lines.append(f"{indent}  npy_intp o{k} = 0; (void)o{k};")
        for d, n in enumerate(shape):
            pad = indent + "  " * (d + 1)
            lines.append(f"{pad}for (npy_intp i{d} = 0; i{d} < {n}; i{d}++) {{")
        pad = indent + "  " * (nd + 1)
        offs = []
        for k, st in enumerate(operands):
            terms = [f"i{d} * {s}" for d, s in enumerate(st) if s]
            offs.append(f"{pad}o{k} = {' + '.join(terms) if terms else '0'};")
        lines += offs
        lines.append(f"{pad}{body}")
        for d in reversed(range(nd)):
            lines.append(f"{indent}{'  ' * (d + 1)}}}")
        lines.append(f"{indent}}}")
        self.lines += lines

    def bstrides(self, v: _Val, shape: tuple) -> tuple:
        """``v``'s strides broadcast to ``shape`` (0 along broadcast axes)."""
        pad = len(shape) - len(v.shape)
        out = []
        for d, n in enumerate(shape):
            if d < pad:
                out.append(0)
                continue
            m, s = v.shape[d - pad], v.strides[d - pad]
            out.append(0 if m == 1 and n != 1 else s)
        return tuple(out)

    def materialize(self, v: _Val) -> _Val:
        if v.contiguous:
            return v
        out = self.alloc(v.shape, v.dtype)
        self.nested(v.shape, [out.strides, v.strides], f"{out.ptr}[o0] = {v.ptr}[o1];")
        return out

    # ------------------------------------------------------------------ equations

    def lower(self) -> Lowered:
        g = self.g
        for k, v in enumerate(g.invars):
            if v.aval.dtype not in _CTYPE:
                raise Unsupported(f"an input of dtype {v.aval.dtype}")
            self.vals[v] = _Val(f"x{k}", v.aval.shape, _c_strides(v.aval.shape), v.aval.dtype)
        for v, c in zip(g.constvars, g.consts):
            self.vals[v] = self.const(np.asarray(c, v.aval.dtype))
        for n, e in enumerate(g.eqns):
            for o in e.outputs:
                if o.aval.dtype not in _CTYPE:
                    raise Unsupported(f"{e.prim.name}: an output of dtype {o.aval.dtype}")
            ins = ", ".join(str(a.aval) for a in e.inputs)
            self.lines.append(f"    /* [{n}] {e.prim.name}({ins}) */")
            self.equation(e)
        outs = []
        for a in g.outvars:
            outs.append(self.val(a))
        return self._module(outs)

    def equation(self, e) -> None:
        name = e.prim.name
        if name in names_with("view"):
            self.vals[e.outputs[0]] = self.view(e)
        elif name == "matmul":
            self.matmul(e)
        elif name in REDUCE_PRIMS:
            self.reduce(e)
        elif name in FUSED:
            self.fused(e)
        elif name in ("concatenate", "stack"):
            self.concat(e)
        elif name == "gather":
            self.gather(e)
        elif name == "scatter_add":
            self.scatter(e)
        elif name == "cast":
            self.cast(e)
        elif name == "pad":
            self.pad(e)
        elif name == "check_range":
            self.check_range(e)
        elif name == "scan":
            self.scan(e)
        elif name == "cond":
            self.cond(e)
        elif name == "while":
            self.while_loop(e)
        elif name == "dense":
            self.dense(e)
        elif name == "softmax":
            self.softmax(e)
        elif name == "select":
            self.select(e)
        elif name in UFUNC and name in names_with("elementwise"):
            self.ufunc(e)
        else:
            raise Unsupported(f"primitive {name!r}")

    def view(self, e) -> _Val:
        x = self.val(e.inputs[0])
        name, out = e.prim.name, e.outputs[0].aval
        if name == "stop_gradient":
            return x
        if name in ("reshape", "squeeze", "expand_dims"):
            x = self.materialize(x)
            return _Val(x.ptr, out.shape, _c_strides(out.shape), x.dtype)
        if name == "transpose":
            perm = e.attrs["perm"]
            return _Val(x.ptr, out.shape, tuple(x.strides[p] for p in perm), x.dtype)
        if name == "broadcast_to":
            st = self.bstrides(x, out.shape)
            return _Val(x.ptr, out.shape, st, x.dtype)
        if name != "slice":
            raise Unsupported(f"view primitive {name!r}")
        starts, strides = e.attrs["starts"], e.attrs["strides"] or (1,) * len(out.shape)
        off = sum(s * st for s, st in zip(starts, x.strides))
        return _Val(x.at(off), out.shape, tuple(st * k for st, k in zip(x.strides, strides)), x.dtype)

    def out_buffer(self, o: Var) -> _Val:
        v = self.alloc(o.aval.shape, o.aval.dtype)
        self.vals[o] = v
        return v

    # elementwise through numpy's own loops

    def ufunc_call(self, uname: str, ins: list, out: _Val, extra: list | None = None) -> None:
        """``out = ufunc(*ins)`` with numpy's inner loop, row by row over the broadcast shape."""
        shape = out.shape
        k = self.loop(uname, [v.dtype for v in ins], out.dtype)
        vs = ins + [out]
        sts = [self.bstrides(v, shape) for v in vs]
        if math.prod(shape) == 0:
            return
        shape, sts = _coalesce(shape, sts)  # one call over contiguous operands, as numpy makes
        nd = len(shape)
        inner = shape[-1] if nd else 1
        outer = shape[:-1] if nd else ()
        steps = ", ".join(f"{(st[-1] if nd else 0) * v.dtype.itemsize}" for v, st in zip(vs, sts))
        args = ", ".join(f"(char *)({v.ptr} + o{j})" for j, v in enumerate(vs))
        self.nested(
            outer,
            [st[:-1] if nd else () for st in sts],
            f"{{ char *a_[] = {{{args}}}; npy_intp n_ = {inner}; npy_intp s_[] = {{{steps}}}; LOOP[{k}].f(a_, &n_, s_, LOOP[{k}].d); }}",
        )

    def ufunc(self, e) -> None:
        name, o = e.prim.name, e.outputs[0]
        ins = list(e.inputs)
        dt = self.operand_dtype(e)
        vals = [self.literal_as(a, dt) if isinstance(a, Literal) else self.val(a) for a in ins]
        if name == "relu":
            vals.append(self.const(np.zeros((), dt)))
        elif name == "clip":
            vals += [self.const(np.asarray(e.attrs["lo"], dt)), self.const(np.asarray(e.attrs["hi"], dt))]
        # numpy's own loop choice for these dtypes (ints divided in float64, a boolean mask times a
        # float...): operands of another dtype are cast first, as numpy's buffered casting does
        uf = ufunc_object(UFUNC[name])
        try:
            loop = uf.resolve_dtypes(tuple(v.dtype for v in vals) + (o.aval.dtype,))
        except (TypeError, ValueError):
            raise Unsupported(f"{name}: no numpy loop for {[str(v.dtype) for v in vals]} -> {o.aval.dtype}") from None
        sig = "".join(np.dtype(d).char for d in loop[: uf.nin]) + "->" + np.dtype(loop[-1]).char
        if sig not in uf.types or np.dtype(loop[-1]) != o.aval.dtype or not all(has_ctype(d) for d in loop):
            raise Unsupported(f"{name}: numpy loop {sig} for an output of {o.aval.dtype}")
        vals = [v if v.dtype == d else self.cast_copy(v, np.dtype(d)) for v, d in zip(vals, loop)]
        if name == "tanh" and sig == "f->f" and engine_tanhf():
            self.tanh_f32(vals[0], self.out_buffer(o))
            return
        self.ufunc_call(UFUNC[name], vals, self.out_buffer(o))

    def tanh_f32(self, x: _Val, out: _Val) -> None:
        """float32 tanh with the engine's own function (``_tanhf.h``), as ``primitives.elementwise.tanh``
        computes it for the executor: one vectorised loop over a contiguous operand, else element by
        element (the executor copies such an operand first; each element gives the same bits)."""
        self.tanhf = True
        if x.contiguous and x.shape == out.shape:
            self.lines.append(f"    fa_tanhf_loop({x.ptr}, {out.ptr}, {max(1, math.prod(out.shape))});")
        else:
            self.nested(out.shape, [out.strides, self.bstrides(x, out.shape)], f"{out.ptr}[o0] = fa_tanhf({x.ptr}[o1]);")

    def operand_dtype(self, e) -> np.dtype:
        """The dtype the ufunc loop computes in (the graph's typing rules promoted the operands;
        weak literals take the other operands' dtype, as NEP 50 says)."""
        strong = [a.aval.dtype for a in e.inputs if not (isinstance(a, Literal) and a.weak)]
        if strong:
            return np.result_type(*strong)
        return e.outputs[0].aval.dtype if e.prim.name not in _PREDICATES else np.result_type(*[a.aval.dtype for a in e.inputs])

    def literal_as(self, a: Literal, dt: np.dtype) -> _Val:
        return self.const(np.asarray(a.value).astype(dt))

    def cast(self, e) -> None:
        x, o = self.val(e.inputs[0]), self.out_buffer(e.outputs[0])
        src = f"{x.ptr}[o1]"
        if o.dtype == np.bool_:
            expr = f"({src} != 0)"
        else:
            expr = f"({_CTYPE[o.dtype]}){src}"
        self.nested(o.shape, [o.strides, self.bstrides(x, o.shape)], f"{o.ptr}[o0] = {expr};")

    def cast_copy(self, x: _Val, dt: np.dtype, keep_order: bool = False) -> _Val:
        if dt not in _CTYPE:
            raise Unsupported(f"a cast to {dt}")
        o = self.alloc(x.shape, dt)
        if keep_order and len(x.shape) == 2 and not x.contiguous and x.strides == (1, x.shape[0]):
            o = _Val(o.ptr, x.shape, (1, x.shape[0]), o.dtype)  # Fortran order stays
        expr = f"({x.ptr}[o1] != 0)" if o.dtype == np.bool_ else f"({_CTYPE[o.dtype]}){x.ptr}[o1]"
        self.nested(o.shape, [o.strides, x.strides], f"{o.ptr}[o0] = {expr};")
        return o

    def scan(self, e) -> None:
        """``scan``: a C loop over the body lowered inline (its values keep arena ranges reused
        every iteration); carries in buffers of their own, each step's new carries copied in after
        the body ran, stacked outputs written row by row.  The executor runs the body as a graph
        of its own, so the body's results are its outputs (as they are for the executor's emit
        rules)."""
        a = e.attrs
        body, nc, nx, T, reverse = a["body"], a["n_carry"], a["n_x"], a["length"], a["reverse"]
        ins, carry, fresh = self.carries(e, (body,), "scan: a body constant without a C type")
        ys = [self.alloc((T,) + v.aval.shape, v.aval.dtype) for v in body.outvars[nc:]]
        t = self.name()
        xs = [_Val(f"({x.ptr} + {t} * {x.strides[0]})", x.shape[1:], x.strides[1:], x.dtype) for x in ins[nc : nc + nx]]
        inner, outs = self.inline(body, carry + xs + ins[nc + nx :])
        saved, self.lines = self.lines, inner
        # the stacked outputs and the new carries are read before any carry is overwritten (an
        # output may be a carry input or a view of one)
        for o, f in zip(outs[:nc], fresh):
            self.copy(o, f)
        for o, y in zip(outs[nc:], ys):
            size = math.prod(y.shape[1:])
            self.copy(o, _Val(f"({y.ptr} + {t} * {size})", y.shape[1:], y.strides[1:], y.dtype))
        for f, c in zip(fresh, carry):
            self.copy(f, c)
        self.lines = saved
        step = f"npy_intp {t} = {T - 1} - {t}_" if reverse else f"npy_intp {t} = {t}_"
        self.lines.append(f"    for (npy_intp {t}_ = 0; {t}_ < {T}; {t}_++) {{ {step};")
        self.lines += ["  " + line for line in inner]
        self.lines.append("    }")
        for o, v in zip(e.outputs, carry + ys):
            self.vals[o] = v

    def carries(self, e, graphs: tuple, refusal: str) -> tuple[list, list, list]:
        """The operand values of the loop ``e`` and two buffers per carry of its body (the last of
        ``graphs``): the carries, holding the initial values, and the new carries, written after
        each step; Unsupported(``refusal``) if a graph of ``graphs`` has a constant without a C type."""
        if any(g.consts and any(not has_ctype(np.asarray(c).dtype) for c in g.consts) for g in graphs):
            raise Unsupported(refusal)
        nc, body = e.attrs["n_carry"], graphs[-1]
        ins = [self.val(v) for v in e.inputs]
        carry = [self.alloc(v.aval.shape, v.aval.dtype) for v in body.invars[:nc]]
        fresh = [self.alloc(v.aval.shape, v.aval.dtype) for v in body.invars[:nc]]
        for c, x in zip(carry, ins[:nc]):
            self.copy(x, c)
        return ins, carry, fresh

    def lower_body(self, body: Graph, ins: list) -> None:
        """Bind ``body``'s inputs to the values ``ins`` and its constants, and lower its equations."""
        for v, x in zip(body.invars, ins):
            self.vals[v] = x
        for v, c in zip(body.constvars, body.consts):
            self.vals[v] = self.const(np.asarray(c, v.aval.dtype))
        for q in body.eqns:
            self.equation(q)

    def inline(self, body: Graph, ins: list) -> tuple[list, list]:
        """Lower ``body`` on the values ``ins`` into separate lines; returns (lines, output values).
        The body's results are its outputs (the executor runs it as a graph of its own)."""
        saved_lines, saved_vals, saved_results = self.lines, dict(self.vals), self.results
        self.lines = []
        self.results = frozenset(v for v in body.outvars if isinstance(v, Var))
        self.lower_body(body, ins)
        outs = [self.val(v) for v in body.outvars]
        lines = self.lines
        self.lines, self.vals, self.results = saved_lines, saved_vals, saved_results
        return lines, outs

    def while_loop(self, e) -> None:
        """``while``: a C loop that runs the predicate graph inline on the carries, leaves when it
        is false, else runs the body inline and copies its results into the carries (through
        buffers of their own, as ``scan`` does: a result may be a view of a carry).  ``fori_loop``
        with traced bounds is this loop."""
        a = e.attrs
        cg, bg, nc = a["cond"], a["body"], a["n_carry"]
        ins, carry, fresh = self.carries(e, (cg, bg), "while: a predicate or body constant without a C type")
        test, (p,) = self.inline(cg, carry + ins[nc:])
        step, outs = self.inline(bg, carry + ins[nc:])
        saved, self.lines = self.lines, []
        for o, f in zip(outs, fresh):
            self.copy(o, f)
        for f, c in zip(fresh, carry):
            self.copy(f, c)
        copies, self.lines = self.lines, saved
        self.lines.append("    for (;;) {")
        self.lines += ["  " + line for line in test]
        self.lines.append(f"      if (!{p.ptr}[0]) break;")
        self.lines += ["  " + line for line in step + copies]
        self.lines.append("    }")
        for o, c in zip(e.outputs, carry):
            self.vals[o] = c

    def cond(self, e) -> None:
        """``cond``: an if/else over the two branches lowered inline, each copying its results
        into the equation's output buffers."""
        pred, *ins = (self.val(v) for v in e.inputs)
        outs = [self.out_buffer(o) for o in e.outputs]
        self.lines.append(f"    if ({pred.ptr}[0]) {{")
        for k, br in enumerate(e.attrs["branches"]):
            lines, res = self.inline(br, ins)
            saved, self.lines = self.lines, []
            for r, o in zip(res, outs):
                self.copy(r, o)
            copies, self.lines = self.lines, saved
            self.lines += ["  " + line for line in lines + copies]
            self.lines.append("    } else {" if k == 0 else "    }")

    def copy(self, src: _Val, dst: _Val) -> None:
        if math.prod(dst.shape) == 0:
            return
        self.nested(dst.shape, [dst.strides, self.bstrides(src, dst.shape)], f"{dst.ptr}[o0] = {src.ptr}[o1];")

    def dense(self, e) -> None:
        """``dense_p``: ``_native.c``'s dense kernel, the same order of operations (each output element
        accumulated from the bias over k, then relu), in blocks of :data:`DENSE_BLOCK` bytes of columns."""
        x, w = (self.materialize(self.val(a)) for a in e.inputs[:2])
        b = self.materialize(self.val(e.inputs[2])) if e.attrs["bias"] else None
        o = self.out_buffer(e.outputs[0])
        if x.dtype.kind != "f" or w.dtype != x.dtype or o.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
            raise Unsupported("dense: operands of mixed dtypes")
        T = _CTYPE[x.dtype]
        (m, k), n = x.shape, w.shape[1]
        nb = DENSE_BLOCK // x.dtype.itemsize
        init = f"{b.ptr}[n0 + j]" if b is not None else "0"
        relu = (
            f"for (npy_intp c = 0; c < {n}; c++) row[c] = row[c] > 0 ? row[c] : (row[c] == row[c] ? 0 : row[c]);"
            if e.attrs["relu"] else ""
        )

        def block(first: str, stop: str, width: int) -> str:  # columns [first, stop) in blocks of `width`
            return (
                f"for (npy_intp n0 = {first}; n0 < {stop}; n0 += {width}) {{ {T} acc[{width}]; "
                f"for (npy_intp j = 0; j < {width}; j++) acc[j] = {init}; "
                f"for (npy_intp q = 0; q < {k}; q++) {{ const {T} xv = xr[q]; const {T} *wr = {w.ptr} + q * {n} + n0; "
                f"for (npy_intp j = 0; j < {width}; j++) acc[j] += xv * wr[j]; }} "
                f"for (npy_intp j = 0; j < {width}; j++) row[n0 + j] = acc[j]; }} "
            )

        full = n - n % nb
        blocks = (block("0", str(full), nb) if full else "") + (block(str(full), str(n), n - full) if n % nb else "")
        self.lines.append(
            f"    for (npy_intp m = 0; m < {m}; m++) {{ {T} *row = {o.ptr} + m * {n}; const {T} *xr = {x.ptr} + m * {k}; "
            f"{blocks}{relu} }}"
        )

    def softmax(self, e) -> None:
        """``softmax_p``: ``_native.c``'s row softmax (max, exp and a running sum, division)."""
        x = self.materialize(self.val(e.inputs[0]))
        o = self.out_buffer(e.outputs[0])
        if x.dtype.kind != "f":
            raise Unsupported("softmax of a non-float")
        T = _CTYPE[x.dtype]
        f = "f" if x.dtype == np.float32 else ""
        r, c = x.shape
        self.lines.append(
            f"    for (npy_intp r = 0; r < {r}; r++) {{ const {T} *xr = {x.ptr} + r * {c}; {T} *orow = {o.ptr} + r * {c}; "
            f"{T} mx = xr[0]; for (npy_intp c = 1; c < {c}; c++) if (xr[c] > mx || xr[c] != xr[c]) mx = xr[c]; "
            f"{T} s = 0; for (npy_intp c = 0; c < {c}; c++) {{ orow[c] = exp{f}(xr[c] - mx); s += orow[c]; }} "
            f"for (npy_intp c = 0; c < {c}; c++) orow[c] /= s; }}"
        )

    def check_range(self, e) -> None:
        """``primitives/checks.py``: the operand passes through; an entry outside [lo, hi) raises
        IndexRangeError with the caller's message naming the smallest (or largest) bad value."""
        x = self.val(e.inputs[0])
        lo, hi = int(e.attrs["lo"]), int(e.attrs["hi"])
        self.vals[e.outputs[0]] = x
        if math.prod(x.shape) == 0:
            return
        msg = e.attrs["message"].replace("%", "%%").format(value="%lld", lo=lo, hi=hi)
        cmsg = msg.encode("unicode_escape").decode("ascii").replace('"', '\\"')
        v = self.name()
        self.lines.append(f"    int64_t {v}_lo = INT64_MAX, {v}_hi = INT64_MIN;")
        self.nested(x.shape, [x.strides], f"{{ int64_t q_ = (int64_t){x.ptr}[o0]; if (q_ < {v}_lo) {v}_lo = q_; if (q_ > {v}_hi) {v}_hi = q_; }}")
        bad = ", ".join([f"(long long)({v}_lo < {lo}LL ? {v}_lo : {v}_hi)"] * msg.count("%lld"))
        self.lines.append(
            f"    if (UNLIKELY({v}_lo < {lo}LL || {v}_hi >= {hi}LL)) {{ PyErr_Format(RANGE_ERROR, \"{cmsg}\"{', ' if bad else ''}{bad}); goto fail; }}"
        )

    def pad(self, e) -> None:
        x, o = self.val(e.inputs[0]), self.out_buffer(e.outputs[0])
        low, interior = e.attrs["low"], e.attrs["interior"]
        self.lines.append(f"    memset({o.ptr}, 0, {max(1, math.prod(o.shape)) * o.dtype.itemsize});")
        base = sum(lo * st for lo, st in zip(low, o.strides))
        ost = tuple(st * (k + 1) for st, k in zip(o.strides, interior))
        self.nested(x.shape, [ost, x.strides], f"{o.at(base)}[o0] = {x.ptr}[o1];")

    def select(self, e) -> None:
        c, a, b = (self.val(v) for v in e.inputs)
        o = self.out_buffer(e.outputs[0])
        if a.dtype != o.dtype or b.dtype != o.dtype:
            raise Unsupported("select: operands of mixed dtypes")
        sts = [o.strides] + [self.bstrides(v, o.shape) for v in (c, a, b)]
        self.nested(o.shape, sts, f"{o.ptr}[o0] = {c.ptr}[o1] ? {a.ptr}[o2] : {b.ptr}[o3];")

    # fused elementwise bodies

    def fused(self, e) -> None:
        body = e.attrs["body"]
        ins = [self.val(a) for a in e.inputs]
        outs = [self.out_buffer(o) for o in e.outputs]
        if native.elementwise_program(body) is not None:
            self.fused_vm(body, ins, outs)
        else:
            self.fused_ops(body, ins, outs)

    def fused_vm(self, body: Graph, ins: list, outs: list) -> None:
        """One loop with the native VM's per-element semantics: every register is of the output
        dtype (masks as 0/1), transcendental functions from libm (float32 tanh: ``_tanhf.h``)."""
        dt = outs[0].dtype
        T = _CTYPE[dt]
        f = "f" if dt == np.float32 else ""
        shape = outs[0].shape
        env: dict = {}
        sts = [outs[0].strides] + [self.bstrides(v, shape) for v in ins]
        stmts = []
        for k, v in enumerate(body.invars):
            env[v] = f"(({T}){ins[k].ptr}[o{k + 1}])"
        for c, v in zip(body.consts, body.constvars):
            raise Unsupported("a fused body with captured constants")
        r = 0
        for q in body.eqns:
            name = q.prim.name
            args = [env[a] if isinstance(a, Var) else _c_literal(a.value, dt) for a in q.inputs]
            a = args[0] if args else None
            b = args[1] if len(args) > 1 else None
            if name == "broadcast_to":
                env[q.outputs[0]] = a
                continue
            x = {
                "add": f"{a} + {b}", "sub": f"{a} - {b}", "mul": f"{a} * {b}", "div": f"{a} / {b}", "neg": f"-{a}",
                "exp": f"exp{f}({a})", "log": f"log{f}({a})", "log1p": f"log1p{f}({a})",
                "logistic": f"{a} >= 0 ? 1 / (1 + exp{f}(-{a})) : exp{f}({a}) / (1 + exp{f}({a}))",
                "sqrt": f"sqrt{f}({a})", "abs": f"fabs{f}({a})",
                "sign": f"{a} != {a} ? {a} : {a} > 0 ? ({T})1 : {a} < 0 ? ({T})-1 : {a}",
                "maximum": f"{a} != {a} ? {a} : {b} != {b} ? {b} : {a} >= {b} ? {a} : {b}",
                "minimum": f"{a} != {a} ? {a} : {b} != {b} ? {b} : {a} <= {b} ? {a} : {b}",
                "eq": f"{a} == {b}", "ne": f"{a} != {b}", "lt": f"{a} < {b}", "le": f"{a} <= {b}", "gt": f"{a} > {b}",
                "ge": f"{a} >= {b}", "and": f"{a} != 0 && {b} != 0", "or": f"{a} != 0 || {b} != 0", "not": f"{a} == 0",
                "select": f"{a} != 0 ? {b} : {args[2] if len(args) > 2 else ''}",
                "relu": f"{a} > 0 ? {a} : ({a} == {a} ? 0 : {a})", "sin": f"sin{f}({a})", "cos": f"cos{f}({a})",
            }.get(name)
            if name == "tanh":
                x = self.tanh_expr(a, dt)
            elif name == "pow":
                lit = q.inputs[1]
                x = f"{a} * {a}" if isinstance(lit, Literal) and float(lit.value) == 2.0 else f"pow{f}({a}, {b})"
            elif name == "clip":
                lo, hi = _c_literal(q.attrs["lo"], dt), _c_literal(q.attrs["hi"], dt)
                x = f"{a} != {a} ? {a} : {a} < {lo} ? {lo} : {a} > {hi} ? {hi} : {a}"
            elif name == "cast":
                x = f"{a} != 0" if q.outputs[0].aval.dtype == np.bool_ else a
            if x is None:
                raise Unsupported(f"fused body: {name}")
            reg = f"r{r}"
            r += 1
            stmts.append(f"{T} {reg} = ({T})({x});")
            env[q.outputs[0]] = reg
        writes = []
        for k, (o, v) in enumerate(zip(outs, body.outvars)):
            writes.append(f"{o.ptr}[o0] = {env[v] if isinstance(v, Var) else _c_literal(v.value, dt)};")
        if any(o.strides != outs[0].strides for o in outs):
            raise Unsupported("fused outputs of different layouts")
        self.nested(shape, sts, " ".join(stmts + writes))

    def tanh_expr(self, a: str, dt: np.dtype) -> str:
        """tanh of one element as the VM computes it: float32 with ``_tanhf.h`` (its ``fa_tanhf``),
        float64 with libm."""
        if dt == np.float32 and engine_tanhf():
            self.tanhf = True
            return f"fa_tanhf({a})"
        return f"tanh({a})" if dt == np.float64 else f"tanhf({a})"

    def fused_ops(self, body: Graph, ins: list, outs: list) -> None:
        """A body the VM declines: each equation through numpy's loops, as the executor's
        generated numpy function does."""
        saved = dict(self.vals)
        self.lower_body(body, ins)
        for o, v in zip(outs, body.outvars):
            src = self.val(v)
            self.nested(o.shape, [o.strides, self.bstrides(src, o.shape)], f"{o.ptr}[o0] = {src.ptr}[o1];")
        self.vals = saved

    # reductions in numpy's order

    def reduce(self, e) -> None:
        x = self.val(e.inputs[0])
        o = self.out_buffer(e.outputs[0])
        name = e.prim.name
        if x.dtype.kind != "f":
            raise Unsupported(f"{name} of {x.dtype}")
        axes = {a % len(x.shape) for a in e.attrs["axes"]}
        T = _CTYPE[x.dtype]
        if name == "reduce_sum" and self.sum_as_product(e, x, o, axes):
            return
        # output strides aligned to the input's axes (0 along reduced ones)
        ost, k = [], 0
        kept_strides = _c_strides(tuple(n for d, n in enumerate(x.shape) if d not in axes))
        for d in range(len(x.shape)):
            if d in axes:
                ost.append(0)
            else:
                ost.append(kept_strides[k])
                k += 1
        # numpy's iterator: axes ordered by the input's strides (outer to inner), size-1 axes
        # dropped, neighbours of one kind coalesced
        dims = [d for d in range(len(x.shape)) if x.shape[d] != 1]
        dims.sort(key=lambda d: -abs(x.strides[d]))
        it = []  # [size, in stride, out stride, reduced]
        for d in dims:
            red = d in axes
            if it and it[-1][3] == red and it[-1][1] == x.strides[d] * x.shape[d] and it[-1][2] == ost[d] * x.shape[d]:
                it[-1] = [it[-1][0] * x.shape[d], x.strides[d], ost[d], red]
            else:
                it.append([x.shape[d], x.strides[d], ost[d], red])
        n_out = math.prod(o.shape)
        if name == "reduce_sum":
            self.lines.append(f"    for (npy_intp j = 0; j < {max(n_out, 1)}; j++) {o.ptr}[j] = 0;")
        else:
            if math.prod(x.shape) == 0:
                raise Unsupported(f"{name} of an empty array")
            # max/min have no identity: start from the first element along the reduced axes
            first = [0 if d in axes else s for d, s in enumerate(x.strides)]
            self.nested(tuple(x.shape[d] if d not in axes else 1 for d in range(len(x.shape))), [ost, first], f"{o.ptr}[o0] = {x.ptr}[o1];")
        if name == "reduce_sum" and it and it[-1][3]:
            n, s = it[-1][0], it[-1][1]
            self.nested(
                tuple(t[0] for t in it[:-1]),
                [tuple(t[2] for t in it[:-1]), tuple(t[1] for t in it[:-1])],
                f"{o.ptr}[o0] += pairwise_{T}({x.ptr} + o1, {n}, {s});",
            )
        elif name == "reduce_sum":
            self.nested(tuple(t[0] for t in it), [tuple(t[2] for t in it), tuple(t[1] for t in it)], f"{o.ptr}[o0] += {x.ptr}[o1];")
        else:
            op = ">=" if name == "reduce_max" else "<="
            self.nested(
                tuple(t[0] for t in it),
                [tuple(t[2] for t in it), tuple(t[1] for t in it)],
                f"{{ {T} a_ = {o.ptr}[o0], b_ = {x.ptr}[o1]; {o.ptr}[o0] = (a_ {op} b_ || a_ != a_) ? a_ : b_; }}",
            )

    def sum_as_product(self, e, x: _Val, o: _Val, axes: set) -> bool:
        """The executor's emit rules: unit axes dropped (unless already a 2-D one-axis sum, or a
        graph output), then a row/column sum of a matrix as ``np.dot`` with a ones vector."""
        shape, ax = x.shape, sorted(axes)
        kd = e.attrs["keepdims"]
        out_is_result = e.outputs[0] in self.results
        if 1 in shape and not (len(shape) == 2 and len(ax) == 1) and not out_is_result:
            keep = [d for d, n in enumerate(shape) if n != 1]
            new_axes = [k for k, d in enumerate(keep) if d in axes]
            if new_axes:
                x = _Val(x.ptr, tuple(shape[d] for d in keep), tuple(x.strides[d] for d in keep), x.dtype)
                shape, ax, kd = x.shape, new_axes, False
        if not (len(shape) == 2 and len(ax) == 1):
            return False
        n = shape[ax[0]]
        res = tuple(d for k, d in enumerate(shape) if k != ax[0] or kd)
        if ax[0] == 1:
            ones = self.const(np.ones((n, 1) if kd else (n,), x.dtype))
            self.product(x, ones, _Val(o.ptr, res, _c_strides(res), o.dtype))
        else:
            ones = self.const(np.ones((1, n) if kd else (n,), x.dtype))
            self.product(ones, x, _Val(o.ptr, res, _c_strides(res), o.dtype))
        return True

    # products: numpy's cblas_matrixproduct case analysis

    def matmul(self, e) -> None:
        a, b = (self.val(v) for v in e.inputs)
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise Unsupported("matmul: operands other than two 2-D matrices")
        self.product(a, b, self.out_buffer(e.outputs[0]))

    def product(self, a: _Val, b: _Val, o: _Val) -> None:
        """``np.dot(a, b, out=o)`` for 1-D/2-D float operands, as numpy's ``cblas_matrixproduct``."""
        if o.dtype.kind != "f":
            raise Unsupported("matmul: a non-float product")
        # operands of another dtype: numpy converts them first (a copy in the operand's own order)
        a, b = (v if v.dtype == o.dtype else self.cast_copy(v, o.dtype, keep_order=True) for v in (a, b))
        p = "s" if a.dtype == np.float32 else "d"
        T = _CTYPE[a.dtype]
        if len(a.shape) == 1:
            a = _Val(a.ptr, (1, a.shape[0]), (0, a.strides[0]), a.dtype)
            a_cls = "column" if a.shape[1] > 1 else "scalar"
        else:
            a_cls = None
        if len(b.shape) == 1:
            b = _Val(b.ptr, (b.shape[0], 1), (b.strides[0], 0), b.dtype)
            b_cls = "column" if b.shape[0] > 1 else "scalar"
        else:
            b_cls = None
        (m, k), n = a.shape, b.shape[1]
        if m * n == 0:
            return
        if k == 0:
            self.lines.append(f"    memset({o.ptr}, 0, {m * n * a.dtype.itemsize});")
            return
        a, b = self.blasable(a), self.blasable(b)
        sa = a_cls or _matrix_shape(a.shape)
        sb = b_cls or _matrix_shape(b.shape)
        L = self.lines
        if sa == "scalar" or sb == "scalar":
            # a scalar times a vector/matrix: numpy zeroes the output and adds with ?axpy (exact
            # products either way, so the product is written elementwise here)
            sc, other = (a, b) if sa == "scalar" else (b, a)
            ost = self.bstrides(_Val(o.ptr, (m, n), _c_strides((m, n)), o.dtype), (m, n))
            self.nested((m, n), [ost, self.bstrides(other, (m, n))], f"{o.ptr}[o0] = ({T})0 + {other.ptr}[o1] * {sc.ptr}[0];")
        elif sb == "column" and sa != "matrix":
            ia = a.strides[1] if a.shape[0] == 1 else a.strides[0]
            L.append(f"    {o.ptr}[0] = ({T})BLAS.{p}dot({k}, {a.ptr}, {ia}, {b.ptr}, {b.strides[0]});")
        elif sa == "matrix" and sb != "matrix":
            a = self.one_segment(a)
            order, lda = self.gemv_order(a)
            L.append(f"    BLAS.{p}gemv({order}, 111, {m}, {k}, 1.0, {a.ptr}, {lda}, {b.ptr}, {b.strides[0]}, 0.0, {o.ptr}, 1);")
        elif sa != "matrix" and sb == "matrix":
            b = self.one_segment(b)
            order, lda = self.gemv_order(b)
            inc = a.strides[1] if sa == "row" else a.strides[0]
            if a_cls is not None:
                inc = a.strides[1]
            L.append(f"    BLAS.{p}gemv({order}, 112, {k}, {n}, 1.0, {b.ptr}, {lda}, {a.ptr}, {inc}, 0.0, {o.ptr}, 1);")
        else:
            ta, lda = _trans(a)
            tb, ldb = _trans(b)
            if a.ptr == b.ptr and a.shape == b.shape[::-1] and a.strides == b.strides[::-1] and ta != tb:
                # A @ A.T: numpy calls ?syrk for the upper triangle and mirrors it
                L.append(f"    BLAS.{p}syrk(101, 121, {ta}, {m}, {k}, 1.0, {a.ptr}, {lda}, 0.0, {o.ptr}, {n});")
                L.append(f"    for (npy_intp i = 0; i < {m}; i++) for (npy_intp j = i + 1; j < {n}; j++) {o.ptr}[j * {n} + i] = {o.ptr}[i * {n} + j];")
            else:
                L.append(f"    BLAS.{p}gemm(101, {ta}, {tb}, {m}, {n}, {k}, 1.0, {a.ptr}, {lda}, {b.ptr}, {ldb}, 0.0, {o.ptr}, {n});")

    def one_segment(self, v: _Val) -> _Val:
        if v.contiguous or (v.strides[0] == 1 and v.strides[1] == v.shape[0]):
            return v
        return self.materialize(v)

    def blasable(self, v: _Val) -> _Val:
        s0, s1 = v.strides
        d0, d1 = v.shape
        if (s1 == 1 and s0 >= d1) or (s0 == 1 and s1 >= d0):
            return v
        return self.materialize(v)

    def gemv_order(self, v: _Val) -> tuple:
        """numpy: C-contiguous -> row-major with lda = columns, otherwise column-major with lda = rows."""
        if v.contiguous:
            return 101, max(v.shape[1], 1)
        if v.strides[0] == 1 and v.strides[1] == v.shape[0]:
            return 102, max(v.shape[0], 1)
        raise Unsupported("gemv operand neither C- nor Fortran-contiguous")

    # copies

    def concat(self, e) -> None:
        o = self.out_buffer(e.outputs[0])
        axis = e.attrs["axis"] % len(o.shape)
        pos = 0
        for a in e.inputs:
            x = self.val(a)
            if e.prim.name == "stack":
                x = _Val(x.ptr, x.shape[:axis] + (1,) + x.shape[axis:], x.strides[:axis] + (0,) + x.strides[axis:], x.dtype)
            off = pos * o.strides[axis]
            src = f"{x.ptr}[o1]" if x.dtype == o.dtype else f"({_CTYPE[o.dtype]}){x.ptr}[o1]"
            if x.dtype != o.dtype and o.dtype == np.bool_:
                src = f"({x.ptr}[o1] != 0)"
            self.nested(x.shape, [o.strides, x.strides], f"{o.at(off)}[o0] = {src};")
            pos += x.shape[axis]

    def index_expr(self, idx: _Val, n: int) -> str:
        return f"{{ int64_t q_ = (int64_t){idx.ptr}[o1]; if (q_ < 0) q_ += {n}; if (UNLIKELY(q_ < 0 || q_ >= {n})) {{ BAD_INDEX(q_, {n}); }}"

    def gather(self, e) -> None:
        x, idx = (self.val(v) for v in e.inputs)
        o = self.out_buffer(e.outputs[0])
        axis = e.attrs["axis"] % len(x.shape)
        if len(idx.shape) != len(x.shape) or idx.dtype.kind not in "iu":
            raise Unsupported("gather: an index array of another rank")
        xs = tuple(0 if d == axis else s for d, s in enumerate(x.strides))
        xs = self.bstrides(_Val(x.ptr, tuple(1 if d == axis else n for d, n in enumerate(x.shape)), xs, x.dtype), o.shape)
        body = self.index_expr(idx, x.shape[axis]) + f" {o.ptr}[o0] = {x.ptr}[o2 + q_ * {x.strides[axis]}]; }}"
        self.nested(o.shape, [o.strides, self.bstrides(idx, o.shape), xs], body)

    def scatter(self, e) -> None:
        upd, idx = (self.val(v) for v in e.inputs)
        o = self.out_buffer(e.outputs[0])
        axis = e.attrs["axis"] % len(o.shape)
        if len(idx.shape) != len(o.shape) or idx.dtype.kind not in "iu":
            raise Unsupported("scatter_add: an index array of another rank")
        self.lines.append(f"    memset({o.ptr}, 0, {max(1, math.prod(o.shape)) * o.dtype.itemsize});")
        shape = idx.shape
        os_ = tuple(0 if d == axis else s for d, s in enumerate(o.strides))
        body = self.index_expr(idx, o.shape[axis]) + f" {o.ptr}[o2 + q_ * {o.strides[axis]}] += {upd.ptr}[o3]; }}"
        self.nested(shape, [(0,) * len(shape), self.bstrides(idx, shape), os_, self.bstrides(upd, shape)], body)

    # ------------------------------------------------------------------ the module

    def _module(self, outs: list) -> Lowered:
        g = self.g
        ni, no = len(g.invars), len(outs)
        checks = []
        for k, v in enumerate(g.invars):
            checks.append(f"    if (UNLIKELY((got = take(args[{k + 1}], {k}, {_NPY[v.aval.dtype]}, {v.aval.ndim}, SHAPE{k}, X)) <= 0)) {{ if (got < 0) goto miss; goto fail; }}")
        shapes = "\n".join(
            f"static const npy_intp SHAPE{k}[] = {{{', '.join(str(d) for d in v.aval.shape) or '0'}}};" for k, v in enumerate(g.invars)
        )
        # inputs and constants are only read, arena ranges never overlap: restrict pointers let
        # the compiler vectorise the loops without alias checks
        for k, v in enumerate(g.invars):
            checks.append(f"    const {_CTYPE[v.aval.dtype]} *restrict x{k} = (const {_CTYPE[v.aval.dtype]} *)X[{k}]; (void)x{k};")
        for k, c in enumerate(self.consts):
            checks.append(f"    const {_CTYPE[c.dtype]} *restrict k{k} = (const {_CTYPE[c.dtype]} *)K[{k}]; (void)k{k};")
        rets = []
        for j, (a, v) in enumerate(zip(g.outvars, outs)):
            dims = ", ".join(str(d) for d in v.shape) or "0"
            rets.append(f"    {{ npy_intp d_[] = {{{dims}}}; PyObject *r_ = PyArray_EMPTY({len(v.shape)}, d_, {_NPY[v.dtype]}, 0); if (!r_) goto fail;")
            rets.append(f"      PyList_SET_ITEM(res, {j}, r_); {_CTYPE[v.dtype]} *p_ = ({_CTYPE[v.dtype]} *)PyArray_DATA((PyArrayObject *)r_); (void)p_;")
            rets.append("    " + _copy_line(v, "p_"))
            rets.append("    }")
        body = "\n".join(self.lines)
        kbytes = -(-max(1, len(self.consts)) * 8 // ALIGN) * ALIGN
        # the loops a LOOP[k] index stands for are part of the source (and of its cache key)
        loops = "\n".join(f"   LOOP[{k}]: {u} {''.join(i)}->{o}" for k, (u, i, o) in enumerate(self.loops))
        src = f"/* numpy ufunc loops:\n{loops}\n*/\n" + _PRELUDE + (tanhf_source() if self.tanhf else "") + f"""
{shapes}
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{{
    void *X[{max(ni, 1)}];
    Py_buffer views[{max(ni, 1)}];
    int held = 0, got = 1; (void)got;
    PyObject *res = NULL;
    if (nargs != {ni + 1}) {{ PyErr_SetString(PyExc_TypeError, "run(arena, {ni} inputs)"); return NULL; }}
    if (!PyByteArray_Check(args[0]) || PyByteArray_GET_SIZE(args[0]) < {self.arena + kbytes + ALIGN}) {{ PyErr_SetString(PyExc_TypeError, "run: arena"); return NULL; }}
    /* the arena: aligned, the constants' addresses first (written by the executable), then the values */
    char *A0 = (char *)(((uintptr_t)PyByteArray_AS_STRING(args[0]) + {ALIGN - 1}) & ~(uintptr_t){ALIGN - 1});
    char *const *K = (char *const *)A0; (void)K;
    char *restrict A = A0 + {kbytes}; (void)A;
    #define take(obj, k, typ, nd, shape, X) take_(obj, k, typ, nd, shape, X, views, &held)
{chr(10).join(checks)}
    #define BAD_INDEX(q, n) do {{ PyErr_Format(PyExc_IndexError, "index %lld is out of bounds for size %lld", (long long)(q), (long long)(n)); goto fail; }} while (0)
{body}
    res = PyList_New({no});
    if (!res) goto fail;
{chr(10).join(rets)}
    for (int h = 0; h < held; h++) PyBuffer_Release(&views[h]);
    return res;
miss: /* an array of another dtype or shape: NotImplemented (jit's fast path looks the signature up) */
    for (int h = 0; h < held; h++) PyBuffer_Release(&views[h]);
    Py_INCREF(Py_NotImplemented);
    return Py_NotImplemented;
fail:
    Py_XDECREF(res);
    for (int h = 0; h < held; h++) PyBuffer_Release(&views[h]);
    return NULL;
}}
""" + _EPILOGUE
        return Lowered(src, self.loops, self.consts, self.arena + kbytes + ALIGN, ni, no)


def engine_tanhf() -> bool:
    """Whether float32 tanh is the engine's own (``_tanhf.h``): when the C extension is built, as in
    ``primitives.elementwise.tanh``."""
    return cext._native is not None


@functools.lru_cache(maxsize=None)
def tanhf_source() -> str:
    """The text of ``_tanhf.h``, pasted into a module that computes a float32 tanh (so it is part of the
    module's cache key)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_tanhf.h")) as f:
        return "\n" + f.read() + "\n"


def new_arena(lowered: "Lowered") -> bytearray:
    """A buffer set for ``lowered``'s function: a bytearray whose first aligned words hold the
    addresses of the constants (which the caller keeps alive), the values after them."""
    arena = bytearray(lowered.arena_bytes)
    view = np.frombuffer(arena, np.uint8)
    off = (-view.ctypes.data) % ALIGN
    if lowered.consts:
        ptrs = np.frombuffer(arena, np.uintp, count=len(lowered.consts), offset=off)
        ptrs[:] = [c.ctypes.data for c in lowered.consts]
    del view
    return arena


def _coalesce(shape: tuple, strides: list) -> tuple:
    """``shape`` and each operand's ``strides`` with unit axes dropped and neighbouring axes merged
    where every operand steps through them as one (the loops visit the same elements in the same
    order)."""
    keep = [d for d, n in enumerate(shape) if n != 1]
    dims = [[shape[d], [st[d] for st in strides]] for d in keep]
    out: list = []
    for n, st in dims:
        if out and all(a == b * n for a, b in zip(out[-1][1], st)):
            out[-1] = [out[-1][0] * n, st]
        else:
            out.append([n, st])
    return tuple(n for n, _ in out), [tuple(d[1][k] for d in out) for k in range(len(strides))]


def _copy_line(v: _Val, dst: str) -> str:
    n = math.prod(v.shape)
    if n == 0:
        return ""
    if v.contiguous:
        return f"memcpy({dst}, {v.ptr}, {n * v.dtype.itemsize});"
    shape = v.shape
    lines = []
    for d, m in enumerate(shape):
        lines.append(f"for (npy_intp i{d} = 0; i{d} < {m}; i{d}++) ")
    off = " + ".join(f"i{d} * {s}" for d, s in enumerate(v.strides) if s) or "0"
    flat = " + ".join(f"i{d} * {s}" for d, s in enumerate(_c_strides(shape)) if s) or "0"
    return "".join(lines) + f"{dst}[{flat}] = {v.ptr}[{off}];"


def _matrix_shape(shape: tuple) -> str:
    """numpy's ``_select_matrix_shape`` for a 2-D operand."""
    d0, d1 = shape
    if d0 > 1:
        return "column" if d1 == 1 else "matrix"
    return "scalar" if d1 == 1 else "row"


def _trans(v: _Val) -> tuple:
    """(CBLAS transpose flag, leading dimension) of a blasable 2-D operand, as numpy picks them."""
    s0, s1 = v.strides
    d0, d1 = v.shape
    if s1 == 1 and s0 >= d1:
        return 111, max(s0, 1)
    return 112, max(s1, 1)


def lower(graph: Graph, results: frozenset | None = None) -> Lowered:
    """The C module of ``graph`` (raises :class:`Unsupported`).  ``results``: the values the
    per-equation executor of the enclosing graph returns (default: ``graph``'s outputs)."""
    return _Gen(graph, results).lower()


def lowers(e) -> bool:
    """Whether equation ``e`` lowers to C on its own (operands as contiguous inputs)."""
    ins = [a for a in e.inputs if isinstance(a, Var)]
    g = _Gen(Graph(ins, [], [], [e], list(e.outputs)))
    try:
        for k, v in enumerate(ins):
            if v.aval.dtype not in _CTYPE:
                return False
            g.vals[v] = _Val(f"X[{k}]", v.aval.shape, _c_strides(v.aval.shape), v.aval.dtype)
        if any(o.aval.dtype not in _CTYPE for o in e.outputs):
            return False
        g.equation(e)
    except Unsupported:
        return False
    return True


_PRELUDE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the refusal and error paths: without this GCC's static branch prediction rates the code after
 * sixteen argument checks as nearly never run, optimises it for size and vectorises none of its loops */
#if defined(__GNUC__)
#define UNLIKELY(c) __builtin_expect(!!(c), 0)
#else
#define UNLIKELY(c) (c)
#endif

typedef struct { PyUFuncGenericFunction f; void *d; } loop_t;
static loop_t LOOP[64];
static PyObject *RANGE_ERROR; /* primitives.checks.IndexRangeError */
typedef BLASINT blasint;
static struct {
    void (*sgemm)(int, int, int, blasint, blasint, blasint, float, const float *, blasint, const float *, blasint, float, float *, blasint);
    void (*dgemm)(int, int, int, blasint, blasint, blasint, double, const double *, blasint, const double *, blasint, double, double *, blasint);
    void (*sgemv)(int, int, blasint, blasint, float, const float *, blasint, const float *, blasint, float, float *, blasint);
    void (*dgemv)(int, int, blasint, blasint, double, const double *, blasint, const double *, blasint, double, double *, blasint);
    float (*sdot)(blasint, const float *, blasint, const float *, blasint);
    double (*ddot)(blasint, const double *, blasint, const double *, blasint);
    void (*saxpy)(blasint, float, const float *, blasint, float *, blasint);
    void (*daxpy)(blasint, double, const double *, blasint, double *, blasint);
    void (*ssyrk)(int, int, int, blasint, blasint, float, const float *, blasint, float, float *, blasint);
    void (*dsyrk)(int, int, int, blasint, blasint, double, const double *, blasint, double, double *, blasint);
} BLAS;

/* numpy's pairwise summation (loops_utils.h): 8 accumulators up to 128 elements, halves above */
#define PAIRWISE(T)                                                                                  \
static T pairwise_##T(const T *a, npy_intp n, npy_intp s)                                            \
{                                                                                                    \
    if (n < 8) {                                                                                     \
        T res = -0.0;                                                                                \
        for (npy_intp i = 0; i < n; i++) res += a[i * s];                                            \
        return res;                                                                                  \
    }                                                                                                \
    if (n <= 128) {                                                                                  \
        T r[8];                                                                                      \
        for (int j = 0; j < 8; j++) r[j] = a[j * s];                                                 \
        npy_intp i;                                                                                  \
        for (i = 8; i < n - (n % 8); i += 8)                                                         \
            for (int j = 0; j < 8; j++) r[j] += a[(i + j) * s];                                      \
        T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));                   \
        for (; i < n; i++) res += a[i * s];                                                          \
        return res;                                                                                  \
    }                                                                                                \
    npy_intp n2 = n / 2;                                                                             \
    n2 -= n2 % 8;                                                                                    \
    return pairwise_##T(a, n2, s) + pairwise_##T(a + n2 * s, n - n2, s);                             \
}
PAIRWISE(float)
PAIRWISE(double)

static int take_(PyObject *obj, int k, int typ, int nd, const npy_intp *shape, void **X, Py_buffer *views, int *held)
{
    /* an input: exactly an ndarray (else -1: the caller's lookup converts it), of the signature's
       dtype and shape (else -1: not this signature), C-contiguous, aligned, in native byte order
       (else TypeError: the caller runs the per-equation executor) */
    if (PyArray_CheckExact(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_TYPE(a) != typ || PyArray_NDIM(a) != nd)
            return -1;
        for (int d = 0; d < nd; d++)
            if (PyArray_DIMS(a)[d] != shape[d]) return -1;
        if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISNOTSWAPPED(a))
            goto bad;
        X[k] = PyArray_DATA(a);
        return 1;
    }
    if (nd == 0 && (PyArray_IsScalar(obj, Generic) || PyFloat_Check(obj) || PyLong_Check(obj) || PyBool_Check(obj))) {
        PyArrayObject *a = (PyArrayObject *)PyArray_FromAny(obj, PyArray_DescrFromType(typ), 0, 0, NPY_ARRAY_FORCECAST | NPY_ARRAY_CARRAY, NULL);
        if (!a) return 0;
        if (PyObject_GetBuffer((PyObject *)a, &views[*held], PyBUF_SIMPLE) != 0) { Py_DECREF(a); return 0; }
        Py_DECREF(a); /* the view holds it */
        X[k] = views[*held].buf;
        (*held)++;
        return 1;
    }
    if (nd > 0 || PyArray_Check(obj))
        return -1;
bad:
    PyErr_Format(PyExc_TypeError, "native graph: input %d is not a C-contiguous array of the compiled signature", k);
    return 0;
}
"""

_EPILOGUE = r"""
static PyObject *init(PyObject *self, PyObject *args)
{
    /* init(loops, blas, range_error): loops = [(ufunc, typechars)], blas = [address],
       range_error: the exception class of check_range */
    PyObject *loops, *blas, *range_error;
    if (!PyArg_ParseTuple(args, "OOO", &loops, &blas, &range_error)) return NULL;
    Py_XDECREF(RANGE_ERROR);
    Py_INCREF(range_error);
    RANGE_ERROR = range_error;
    Py_ssize_t nl = PyList_Size(loops), nb = PyList_Size(blas);
    if (nl > 64 || nb != 10) { PyErr_SetString(PyExc_ValueError, "init: too many loops"); return NULL; }
    for (Py_ssize_t i = 0; i < nl; i++) {
        PyObject *t = PyList_GET_ITEM(loops, i);
        PyUFuncObject *u = (PyUFuncObject *)PyTuple_GET_ITEM(t, 0);
        const char *want = PyBytes_AsString(PyTuple_GET_ITEM(t, 1));
        if (!PyObject_TypeCheck((PyObject *)u, &PyUFunc_Type) || want == NULL) { PyErr_SetString(PyExc_TypeError, "init: not a ufunc"); return NULL; }
        int found = 0, nargs = u->nin + u->nout;
        for (int j = 0; j < u->ntypes && !found; j++) {
            int ok = 1;
            for (int q = 0; q < nargs; q++) {
                PyArray_Descr *d = PyArray_DescrFromType(u->types[j * nargs + q]);
                if (!d) return NULL;
                ok &= d->type == want[q];
                Py_DECREF(d);
            }
            if (ok && u->functions[j] != NULL) {
                LOOP[i].f = u->functions[j];
                LOOP[i].d = u->data ? u->data[j] : NULL;
                found = 1;
            }
        }
        if (!found) { PyErr_Format(PyExc_TypeError, "init: ufunc %s has no loop %s", u->name, want); return NULL; }
    }
    void **slots = (void **)&BLAS;
    for (Py_ssize_t i = 0; i < nb; i++) slots[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(blas, i));
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(arena, *inputs) -> list of outputs"},
    {"init", init, METH_VARARGS, "init(loops, blas, range_error)"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, MODNAME, NULL, -1, methods};
PyMODINIT_FUNC INITFUNC(void)
{
    import_array();
    import_umath();
    return PyModule_Create(&moddef);
}
"""

BLAS_FUNCTIONS = ("sgemm", "dgemm", "sgemv", "dgemv", "sdot", "ddot", "saxpy", "daxpy", "ssyrk", "dsyrk")
"""The order of the ``BLAS`` struct's slots in the generated module."""

__all__ = ["BLAS_FUNCTIONS", "Lowered", "Unsupported", "has_ctype", "lower", "lowers", "new_arena", "supported_primitives"]
