"""Operator selection for the cupy backend: the softmax and logsumexp chains that ``ops.softmax``
and ``ops.logsumexp`` trace into (``exp(x - max(x))`` divided by its sum, or ``log`` of the sum
plus the maximum, over the last axis) become one row-kernel equation each, run by the generated
row kernels of :mod:`.kernels` (three passes over a row in one launch instead of five launches)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.ir import Eqn, Graph, ShapedArray, Var

MIN_COLS = 32
"""Rows shorter than this stay elementwise code (the fused kernels run one thread per element;
a block of 256 threads per row of a handful of logits would mostly idle)."""


@dataclass(frozen=True)
class RowKernelOp:
    """A backend-local operation (not in the engine's registry): ``row_softmax`` or
    ``row_logsumexp`` over the last axis of its one operand, the result keeping the operand's
    shape (softmax) or the shape with the last axis 1 (logsumexp)."""

    name: str
    traits: frozenset = frozenset()
    in_place_operands: tuple = ()
    cuda_expr: None = None

    def cuda(self, e: Eqn, lib) -> tuple:
        """The cupy rule: the generated row kernel over the operand's rows."""
        x = e.inputs[0]
        rows = math.prod(x.aval.shape[:-1])
        return lib.kernel(lib.row_softmax_kernel(rows, x.aval.shape[-1], x.aval.dtype, log=self.name == "row_logsumexp"), [x])

    def abstract_eval(self, avals, attrs, weak):
        (x,) = avals
        if self.name == "row_softmax":
            return x
        return ShapedArray(x.shape[:-1] + (1,), x.dtype)

    def impl(self, x: np.ndarray) -> np.ndarray:
        import scipy.special

        if self.name == "row_softmax":
            return scipy.special.softmax(x, axis=-1).astype(x.dtype)
        return scipy.special.logsumexp(x, axis=-1, keepdims=True).astype(x.dtype)


ROW_SOFTMAX = RowKernelOp("row_softmax")
ROW_LOGSUMEXP = RowKernelOp("row_logsumexp")


def _last_axis(e: Eqn, name: str) -> bool:
    if e is None or e.prim.name != name or not e.attrs.get("keepdims"):
        return False
    nd = e.inputs[0].aval.ndim
    return tuple(a % nd for a in e.attrs["axes"]) == (nd - 1,)


def find_row_kernels(graph: Graph) -> Graph:
    """Replace ``div(e, sum(e))`` and ``add(log(sum(e)), m)`` with ``e = exp(x - m)``,
    ``m = [stop_gradient] max(x)`` over the last axis (float32/float64, rows of at least
    :data:`MIN_COLS`) by :data:`ROW_SOFTMAX` / :data:`ROW_LOGSUMEXP` equations on ``x``; the
    chain's inner equations stay for other readers and fall to dead-code elimination otherwise."""
    producer: dict = {}
    for e in graph.eqns:
        for o in e.outputs:
            producer[o] = e

    def prod(a):
        return producer.get(a) if isinstance(a, Var) else None

    def max_of(m):
        """x when m = [stop_gradient] reduce_max(x, last axis, keepdims)."""
        e = prod(m)
        if e is not None and e.prim.name == "stop_gradient":
            e = prod(e.inputs[0])
        if _last_axis(e, "reduce_max"):
            return e.inputs[0]
        return None

    def exp_shift(s):
        """(x, m) when s = reduce_sum(exp(x - m)) over the last axis with m the max of x."""
        es = prod(s)
        if not _last_axis(es, "reduce_sum"):
            return None
        ex = prod(es.inputs[0])
        if ex is None or ex.prim.name != "exp":
            return None
        sb = prod(ex.inputs[0])
        if sb is None or sb.prim.name != "sub":
            return None
        x, m = sb.inputs
        if not isinstance(x, Var) or max_of(m) is not x:
            return None
        if x.aval.dtype not in (np.float32, np.float64) or x.aval.ndim < 1 or x.aval.shape[-1] < MIN_COLS:
            return None
        return x, m, es.inputs[0]

    eqns = []
    changed = False
    for e in graph.eqns:
        new = None
        if e.prim.name == "div" and all(isinstance(a, Var) for a in e.inputs):
            got = exp_shift(e.inputs[1])
            if got is not None and got[2] is e.inputs[0] and e.outputs[0].aval == got[0].aval:
                new = Eqn(ROW_SOFTMAX, [got[0]], e.outputs, {}, e.source)
        elif e.prim.name == "add" and all(isinstance(a, Var) for a in e.inputs):
            for lg, m in (e.inputs, e.inputs[::-1]):
                le = prod(lg)
                if le is None or le.prim.name != "log":
                    continue
                got = exp_shift(le.inputs[0])
                if got is not None and (m is got[1] or max_of(m) is got[0]) and e.outputs[0].aval.shape == got[0].aval.shape[:-1] + (1,):
                    new = Eqn(ROW_LOGSUMEXP, [got[0]], e.outputs, {}, e.source)
                    break
        if new is not None:
            changed = True
            eqns.append(new)
        else:
            eqns.append(e)
    if not changed:
        return graph
    return Graph(graph.invars, graph.constvars, graph.consts, eqns, graph.outvars)
