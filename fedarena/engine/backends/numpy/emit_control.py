"""Emit rule of the primitives with several outputs: the control-flow primitives ``scan``, ``cond``,
``while``, whose emit rule gives an expression whose value is a sequence of new arrays, one per
output, unpacked into names of their own (fresh storage; run once at build time when every operand
is known then); and multi-output fused elementwise nodes, whose emit rule gives a statement writing
into one buffer per output (``{o0}, {o1}, ...``): a planned buffer each, or a fresh (recycled) array
for a value that reaches a graph output, or the donated input it is computed from
(``jit(..., donate_argnums=...)``) when nothing reads that input afterwards."""

from __future__ import annotations

import numpy as np

from ...core.ir import UnknownPrimitiveError
from ...compiler.memory_plan import nbytes
from .emit_state import EmitState, Step, donatable

# multi-output nodes whose kernels may write an output over an input they read (the VM writes each
# block's results after its reads; the numpy fallback computes into temporaries first)
_IN_PLACE_OVER_DONATED = frozenset({"fused_elementwise_multi"})


def multiple_outputs(st: EmitState, step: Step) -> bool:
    e = step.e
    if not e.prim.multiple_results:
        return False
    code = e.prim.emit(st.ctx, [st.atom(a) for a in e.inputs], e.attrs, [a.aval for a in e.inputs], [o.aval for o in e.outputs])
    if code.kind == "stmt":
        _into_buffers(st, step, code.text)
        return True
    if code.kind != "expr":  # pragma: no cover - a rule bug
        raise UnknownPrimitiveError(f"primitive {e.prim.name!r}: a multi-output emit rule must give an expression or a statement")
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


def _into_buffers(st: EmitState, step: Step, text: str) -> None:
    """A statement writing output ``k`` into ``{ok}``: the memory planner's buffer for a value the
    graph keeps to itself (none in place: the kernel writes an output while it still reads its
    inputs), a fresh array for one that reaches a graph output, a build-time array when every
    operand is known at build time (then run once, at build)."""
    e = step.e
    static = st.all_static(e)
    targets = []
    for k, o in enumerate(e.outputs):
        if static:
            name, kind = st.ctx.const(np.empty(o.aval.shape, o.aval.dtype)), "const"
        elif o in st.escapes:
            name, kind = f"{step.name}_{k}", "fresh"
            fresh = st.fresh_array(o)
            donor = st.donor_for(step.n, o) if e.prim.name in _IN_PLACE_OVER_DONATED else None
            if donor is not None:  # written over the donated input it is computed from, if that is allowed now
                x = st.names[donor]
                st.body.append(f"{name} = {x} if {st.ctx.const(donatable)}({x}, _dconf) else {fresh}")
            else:
                st.body.append(f"{name} = {fresh}")
            st.fresh_bytes += nbytes(o)
        else:
            name, kind = st.buffer_for(step.n, o, (), False)[0], "buffer"
        targets.append(name)
        st.define(o, name, kind)
    for k in reversed(range(len(targets))):  # {o10} before {o1}
        text = text.replace(f"{{o{k}}}", targets[k])
    if static:
        st.run_now(text)
        st.static.update(e.outputs)
    else:
        st.body.append(text)


__all__ = ["multiple_outputs"]
