"""Emit rule of the linear-algebra family chosen by the executor: an outer product ``(m,1)*(1,n)``
written by BLAS (as a matmul with one inner term each element is the same single product, and BLAS
writes it ~2x faster than the broadcasting ufunc).  Matmuls and the native dense/softmax chains are
emitted by their primitives' own rules (``primitives/linalg.py``, ``compiler/native.py``)."""

from __future__ import annotations

import numpy as np

from ...core.ir import Var
from ...primitives.emit import Code
from .emit_state import EmitState, Step


def outer_product(st: EmitState, step: Step) -> None:
    e, out = step.e, step.out
    if (
        step.code is None
        and e.prim.name == "mul"
        and step.out_shape is None
        and out not in st.escapes
        and out.aval.ndim == 2
        and out.aval.dtype in (np.float32, np.float64)
        and all(isinstance(a, Var) and a.aval.dtype == out.aval.dtype and st.phys.get(a, a.aval.shape) == a.aval.shape for a in e.inputs)
        and sorted(a.aval.shape for a in e.inputs) == sorted([(out.aval.shape[0], 1), (1, out.aval.shape[1])])
        and min(out.aval.shape) > 1
    ):
        col, row = (step.ins[0], step.ins[1]) if e.inputs[0].aval.shape[1] == 1 else (step.ins[1], step.ins[0])
        step.code = Code(f"np.dot({col}, {row}, {{o}})", "stmt")


__all__ = ["outer_product"]
