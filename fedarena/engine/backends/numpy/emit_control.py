"""Emit rule of the primitives with several outputs (the control-flow primitives ``scan``, ``cond``,
``while``): the primitive's emit rule gives an expression whose value is a sequence of new arrays, one
per output, unpacked into names of their own (fresh storage; run once at build time when every
operand is known then)."""

from __future__ import annotations

from ...core.ir import UnknownPrimitiveError
from ...compiler.memory_plan import nbytes
from .emit_state import EmitState, Step


def multiple_outputs(st: EmitState, step: Step) -> bool:
    e = step.e
    if not e.prim.multiple_results:
        return False
    code = e.prim.emit(st.ctx, [st.atom(a) for a in e.inputs], e.attrs, [a.aval for a in e.inputs], [o.aval for o in e.outputs])
    if code.kind != "expr":  # pragma: no cover - a rule bug
        raise UnknownPrimitiveError(f"primitive {e.prim.name!r}: a multi-output emit rule must give an expression")
    targets = [f"{step.name}_{k}" for k in range(len(e.outputs))]
    if st.all_static(e):
        targets = [st.ctx.const(None) for _ in e.outputs]
        if targets:
            st.run_now(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {code.text}")
        st.static.update(e.outputs)
        kind = "const"
    else:
        lhs = (", ".join(targets) + ("," if len(targets) == 1 else "")) if targets else "_"
        st.body.append(f"{lhs} = {code.text}")
        st.fresh_bytes += sum(nbytes(o) for o in e.outputs)
        kind = "fresh"
    for o, t in zip(e.outputs, targets):
        st.define(o, t, kind)
    return True


__all__ = ["multiple_outputs"]
