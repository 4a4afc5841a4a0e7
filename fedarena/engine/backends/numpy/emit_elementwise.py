"""Emit rules of the elementwise family chosen by the executor: 0-d arithmetic on numpy scalars with
Python operators, scalar literals of ufuncs as typed 0-d constants, operands viewed in the shape the
ufunc computes fastest, and 0-d casts to float by item assignment.  The ufunc calls themselves are the
primitives' own emit rules (``primitives/elementwise.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...compiler.memory_plan import nbytes, size_of
from ...core.ir import Literal, Var
from ...core.tracing import PRIMITIVES, names_with
from ...primitives.emit import Code
from .emit_state import EmitState, Step, safe_view

ELEMENTWISE = names_with("elementwise")  # derived from the primitives' traits
SCALAR_CONST_PRIMS = names_with("typed_scalars")
"""Primitives emitted as one ufunc call on their operands, whose scalar literals become 0-d constants
(derived from the primitives' traits)."""
SCALAR_EXPR = {n: p.scalar_emit for n, p in PRIMITIVES.items() if p.scalar_emit is not None}
"""0-d equations computed on numpy scalars (Python operators follow numpy's rules for them): each
primitive's ``scalar_emit`` form, given beside it in its family file."""


def _scalar_form(st: EmitState, e: Any) -> str:
    form = e.prim.scalar_emit
    return form(st.ctx, e.attrs) if callable(form) else form


def scalar_expr(st: EmitState, e: Any, out: Var) -> str | None:
    """Python source computing ``e`` on numpy scalars, if it yields ``out``'s dtype."""
    args, trial = [], []
    for a in e.inputs:
        if isinstance(a, Literal):
            args.append(st.atom(a))
            trial.append(args[-1])
        elif a in st.scalars:
            args.append(st.names[a])
        elif a in st.static:
            args.append(st.ctx.const(np.asarray(st.ns[st.names[a]])[()]))  # fixed at build time
        else:
            args.append(f"{st.names[a]}[()]")  # a 0-d array the code made (buffer, output): its scalar
        if isinstance(a, Var):
            trial.append(st.ctx.const(a.aval.dtype.type(1)))
    form = _scalar_form(st, e)
    try:
        with np.errstate(all="ignore"):
            got = eval(form.format(*trial), st.ns)  # noqa: S307 - our own generated code
    except Exception:  # noqa: BLE001 - any failure: use the ufunc path
        return None
    if not isinstance(got, np.generic) or got.dtype != out.aval.dtype:
        return None
    return form.format(*args)


def scalar_expression(st: EmitState, step: Step) -> bool:
    # Scalar arithmetic (loss scaling, Adam's bias corrections): numpy scalars and Python operators
    # cost ~0.05 us a step against ~0.25 us for a ufunc writing a 0-d array, so a 0-d value read
    # only by such steps is kept as a numpy scalar; a graph output gets a 0-d array of its own.
    # Same types as the ufuncs (NEP 50), checked here.  Not on graph inputs: callers may pass
    # Python scalars there.
    e, out = step.e, step.out
    if not (
        e.prim.scalar_emit is not None
        and out.aval.ndim == 0
        and not st.all_static(e)
        and all(isinstance(a, Literal) or a.aval.ndim == 0 and st.storage.get(a) != "input" for a in e.inputs)
        and (out in st.outs or (out not in st.escapes and st.consumers.get(out)))
        and all(c.prim.scalar_emit is not None and c.outputs[0].aval.ndim == 0 for c in st.consumers.get(out, ()))
    ):
        return False
    expr = scalar_expr(st, e, out)
    if expr is None:
        return False
    if out in st.outs:
        st.body.append(f"{step.name} = np.asarray({expr})")
    else:
        st.body.append(f"{step.name} = {expr}")
        st.scalars.add(out)
    st.define(out, step.name, "fresh")
    st.fresh_bytes += nbytes(out)
    return True


def typed_literals(st: EmitState, step: Step) -> None:
    e = step.e
    if e.prim.name in SCALAR_CONST_PRIMS and any(isinstance(a, Var) for a in e.inputs):
        for k, a in enumerate(e.inputs):
            if isinstance(a, Literal) and a.aval.ndim == 0:
                step.ins[k] = st.ufunc_literal(a, e.inputs) or step.ins[k]


def same_size_operands(st: EmitState, step: Step) -> None:
    # An operand computed per call with as many elements as the output but another shape (e.g. a
    # (64,) bias added to a (1, 64) row): compute in *its* shape, through views of the output buffer
    # and of the other (persistent) operands made once at build time.
    e, out, ns, names = step.e, step.out, st.ns, st.names
    if not (e.prim.name in ELEMENTWISE and len(e.inputs) > 1 and out not in st.escapes and not st.all_static(e)):
        return
    size = size_of(out)
    percall = {a.aval.shape for a in e.inputs if isinstance(a, Var) and names[a] not in ns and size_of(a) == size}
    fits = all(not isinstance(a, Var) or size_of(a) in (size, 1) for a in e.inputs)
    if len(percall) == 1 and fits and size > 1:
        tgt = next(iter(percall))
        if tgt != out.aval.shape:
            new_ins = list(step.ins)
            for k, a in enumerate(e.inputs):
                if not isinstance(a, Var) or a.aval.shape == tgt:
                    continue
                shp = () if size_of(a) == 1 else tgt
                if names[a] in ns:
                    view = safe_view(ns[names[a]], shp, st.storage.get(a))
                    if view is None:
                        return
                    new_ins[k] = st.ctx.const(view)
                else:
                    new_ins[k] = f"{names[a]}.reshape({shp!r})"
            step.ins = new_ins
            step.out_shape = tgt


def ranked_operands(st: EmitState, step: Step) -> None:
    # a one-element operand as 0-d (numpy's scalar fast path: ~0.3 us less a call); a persistent
    # lower-rank operand viewed with the output's rank once here (per-call operands keep their
    # rank: a reshape per call costs more than it saves in numpy 2)
    e, out, ns, names = step.e, step.out, st.ns, st.names
    if not (e.prim.name in ELEMENTWISE and len(e.inputs) > 1 and step.out_shape is None):
        return
    for k, a in enumerate(e.inputs):
        if isinstance(a, Var) and a.aval.ndim > 0 and (a.aval.ndim < out.aval.ndim or (size_of(a) == 1 < size_of(out))):
            shp = () if size_of(a) == 1 else (1,) * (out.aval.ndim - a.aval.ndim) + a.aval.shape
            if names[a] in ns:
                arr = ns[names[a]]  # may be a dropped broadcast's smaller operand
                if arr.size == 1:
                    step.ins[k] = st.ctx.const(arr.reshape(()))
                elif arr.ndim <= out.aval.ndim:
                    step.ins[k] = st.ctx.const(arr.reshape((1,) * (out.aval.ndim - arr.ndim) + arr.shape))
            elif size_of(a) == 1:
                step.ins[k] = f"{names[a]}.reshape({shp!r})"


def scalar_cast(st: EmitState, step: Step) -> None:
    # a 0-d cast to float (Adam's step sizes into the parameters' dtype): item assignment converts
    # like casting="unsafe" here, at ~0.08 us against ~0.7 us
    e, out = step.e, step.out
    x0 = e.inputs[0] if e.inputs else None
    if (
        step.code is None
        and e.prim.name == "cast"
        and out.aval.ndim == 0
        and out.aval.dtype.kind == "f"
        and isinstance(x0, Var)
        and x0.aval.dtype.kind in "biuf"
    ):
        step.code = Code(f"{{o}}[()] = {step.ins[0]}", "stmt")


__all__ = ["ELEMENTWISE", "SCALAR_CONST_PRIMS", "SCALAR_EXPR", "ranked_operands", "same_size_operands", "scalar_cast", "scalar_expr", "scalar_expression", "typed_literals"]
