"""Emit rules of the reduction family chosen by the executor: a reduction over an operand with unit
axes runs on the operand with those axes dropped (numpy's simpler, faster loops), and a float max/min
over a short axis of a persistent operand becomes one binary ufunc per element of that axis."""

from __future__ import annotations

import numpy as np

from ...compiler import native
from ...compiler.memory_plan import size_of
from ...core.ir import ShapedArray, Var
from ...primitives.emit import Code
from .emit_state import EmitState, Step, safe_view

UNROLL_REDUCE = {"reduce_max": "np.maximum", "reduce_min": "np.minimum"}


def drop_unit_axes(st: EmitState, step: Step) -> None:
    e, out = step.e, step.out
    pname = e.prim.name
    x0 = e.inputs[0] if e.inputs else None
    if not (
        pname in ("reduce_max", "reduce_min", "reduce_sum")
        and step.out_shape is None
        and out not in st.escapes
        and isinstance(x0, Var)
        and 1 in x0.aval.shape
        and not (pname == "reduce_sum" and x0.aval.ndim == 2 and len(e.attrs["axes"]) == 1)
        and not st.all_static(e)
    ):
        return
    axes = set(e.attrs["axes"])
    keep = [i for i, d in enumerate(x0.aval.shape) if d != 1]
    new_axes = tuple(k for k, i in enumerate(keep) if i in axes)
    in_shape = tuple(x0.aval.shape[i] for i in keep)
    out_sq = tuple(d for i, d in enumerate(x0.aval.shape) if i in keep and i not in axes)
    if new_axes:
        name = st.names[x0]
        view = safe_view(st.ns[name], in_shape, st.storage.get(x0)) if name in st.ns else None
        step.ins = [st.ctx.const(view) if view is not None else f"{name}.reshape({in_shape!r})"]
        step.attrs = dict(e.attrs, axes=new_axes, keepdims=False)
        step.in_avals = [ShapedArray(in_shape, x0.aval.dtype)]
        step.out_aval = ShapedArray(out_sq, out.aval.dtype)
        step.out_shape = out_sq


def unrolled_max_min(st: EmitState, step: Step) -> None:
    # (a float max/min over the last axis is one native call instead: the reduce emitter)
    # A max/min over a short axis of a persistent operand: one binary ufunc per element of that axis
    # over views made here (strength reduction, exact for max/min; numpy's reduce loop over a short
    # axis costs ~3.4 us for a (64, 4) max against ~1.0 us, but wins for results of under 4
    # elements).  Sums keep their kernel (a matmul).
    e, out, ns = step.e, step.out, st.ns
    pname = e.prim.name
    x0 = e.inputs[0] if e.inputs else None
    if not (
        step.code is None
        and pname in UNROLL_REDUCE
        and step.out_shape is None
        and out not in st.escapes
        and isinstance(x0, Var)
        and st.storage.get(x0) in ("buffer", "const")
        and isinstance(ns.get(st.names[x0]), np.ndarray)
        and ns[st.names[x0]].shape == x0.aval.shape  # not an elided broadcast's smaller array
        and not st.all_static(e)
        and len(e.attrs["axes"]) == 1
        and x0.aval.dtype.kind == "f"
        and x0.aval.dtype == out.aval.dtype
        and not native.row_reduce_native(x0.aval, e.attrs["axes"][0])
    ):
        return
    ax = e.attrs["axes"][0] % x0.aval.ndim
    k = x0.aval.shape[ax]
    if 2 <= k <= 8 and size_of(out) >= 4:
        base = ns[st.names[x0]]
        red = tuple(d for i, d in enumerate(x0.aval.shape) if i != ax)
        views = [base[(slice(None),) * ax + (slice(j, j + 1),)].reshape(red) for j in range(k)]
        if all(np.shares_memory(v, base) for v in views):  # views (see every later write), not copies
            parts = [st.ctx.const(v) for v in views]
            uf = UNROLL_REDUCE[pname]
            steps = [f"{uf}({parts[0]}, {parts[1]}, out={{o}})"] + [f"{uf}({{o}}, {p}, out={{o}})" for p in parts[2:]]
            step.code = Code("; ".join(steps), "stmt")
            step.out_shape = red


__all__ = ["UNROLL_REDUCE", "drop_unit_axes", "unrolled_max_min"]
