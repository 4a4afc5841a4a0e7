"""Emit rule of the shape family: a ``broadcast_to`` that only elementwise ufuncs read is not run at
all (a ufunc writing into a full-shape output broadcasts its operands by itself)."""

from __future__ import annotations

from ...core.ir import Var
from ...core.tracing import names_with
from .emit_state import EmitState, Step

ELEMENTWISE = names_with("elementwise")  # derived from the primitives' traits


def elided_broadcast(st: EmitState, step: Step) -> bool:
    e, out = step.e, step.out
    if not (
        e.prim.name == "broadcast_to"
        and out not in st.outs
        and all(c.prim.name in ELEMENTWISE for c in st.consumers.get(out, ()))
        and not any(c.outputs[0] in st.escapes for c in st.consumers.get(out, ()))
    ):
        return False
    # (not when the consumer's result escapes: that one is allocated by the ufunc)
    x0 = e.inputs[0]
    st.names[out] = st.atom(x0)
    st.phys[out] = st.phys.get(x0, x0.aval.shape) if isinstance(x0, Var) else ()
    if isinstance(x0, Var):
        st.storage[out] = st.storage[x0]
        st.root[out] = st.root.get(x0, x0)
        if x0 in st.static:
            st.static.add(out)
    else:
        st.storage[out] = "const"
        st.static.add(out)
    return True


__all__ = ["elided_broadcast"]
