"""The CUDA C vocabulary the primitives' cupy rules are written in: C types of numpy dtypes, exact
literals, casts, the float/double spelling of math functions, and the element-expression builders
of the elementwise family (``cuda_expr(ins, in_dtypes, out_dtype, attrs, weak) -> C expression``).
The cupy backend (``backends/cupy/kernels.py``) owns the kernel generation around these expressions
(grid-stride loops, broadcasting, the prelude of ``fe_*`` helpers the expressions call); numpy's
semantics are kept where C's differ (NaN-propagating max/min, flooring division and modulo), after
Chen et al., "TVM" (OSDI 2018), sec. 3, for the fused kernels built from them.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..core.ir import EngineError, ShapedArray
from .base import promote

CTYPE = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}
"""The C type of each dtype the generated kernels handle."""


class KernelGenerationError(EngineError):
    """An equation the CUDA generator cannot write (its message names the primitive and the dtype)."""


def ctype(dt: np.dtype, what: str) -> str:
    t = CTYPE.get(np.dtype(dt))
    if t is None:
        raise KernelGenerationError(f"{what}: dtype {np.dtype(dt)} has no CUDA kernel here (supported: {', '.join(str(d) for d in CTYPE)})")
    return t


def c_literal(value, dt: np.dtype) -> str:
    """``value`` as an exact C literal of dtype ``dt``."""
    dt = np.dtype(dt)
    if dt == np.bool_:
        return "true" if value else "false"
    if dt.kind in "iu":
        v = int(value)
        return f"(({CTYPE[dt]}){v}LL)" if v >= 0 else f"(({CTYPE[dt]})({v}LL))"
    v = float(dt.type(value))
    suffix = "_F" if dt == np.float32 else "_D"
    if math.isnan(v):
        return f"FE_NAN{suffix}"
    if math.isinf(v):
        return f"FE_INF{suffix}" if v > 0 else f"(-FE_INF{suffix})"
    text = v.hex()
    return f"{text}f" if dt == np.float32 else text


def c_fn(name: str, dt: np.dtype) -> str:
    """The C math function ``name`` for ``dt`` (``expf`` for float32, ``exp`` for float64)."""
    return f"{name}f" if dt == np.float32 else name


def c_cast(x: str, dt: np.dtype) -> str:
    return f"(({CTYPE[dt]})({x}))"


ExprRule = Callable[[list, list, np.dtype, dict, list], str]


def _operands(ins: list, out_dt: np.dtype) -> list:
    return [c_cast(v, out_dt) for v in ins]


def infix(op: str, bool_op: str | None = None) -> ExprRule:
    """``a op b`` in the result type (``bool_op`` for bool results, e.g. ``||`` for ``add``)."""

    def expr(ins, in_dts, o, attrs, weak):
        x = _operands(ins, o)
        return f"({x[0]} {bool_op if (bool_op and o == np.bool_) else op} {x[1]})"

    return expr


def compare(op: str) -> ExprRule:
    """A comparison computed in the operands' promoted type (weak Python scalars as numpy's)."""

    def expr(ins, in_dts, o, attrs, weak):
        cdt = promote([ShapedArray((), d) for d in in_dts], weak)
        a, b = (c_cast(x, cdt) for x in ins)
        return f"({a} {op} {b})"

    return expr


def logical(op: str) -> ExprRule:
    """A logical operation on bool operands."""
    return lambda ins, in_dts, o, attrs, weak: f"({ins[0]} {op} {ins[1]})"


def helper(name: str) -> ExprRule:
    """A prelude helper template ``name<T>(operands...)`` in the result type."""
    return lambda ins, in_dts, o, attrs, weak: f"{name}<{CTYPE[o]}>({', '.join(_operands(ins, o))})"


def float_or_int(float_fn: str, int_helper: str) -> ExprRule:
    """``float_fn`` (math library spelling) for float results, the prelude's ``int_helper<T>`` else."""

    def expr(ins, in_dts, o, attrs, weak):
        x = _operands(ins, o)
        if o.kind == "f":
            return f"{c_fn(float_fn, o)}({', '.join(x)})"
        return f"{int_helper}<{CTYPE[o]}>({', '.join(x)})"

    return expr


def math_fn(name: str) -> ExprRule:
    """A math-library function of a float result (``expf``/``exp``); no rule for other results."""

    def expr(ins, in_dts, o, attrs, weak):
        if o.kind != "f":
            raise KernelGenerationError(f"no CUDA rule for {name} with result dtype {o}")
        return f"{c_fn(name, o)}({', '.join(_operands(ins, o))})"

    return expr


def float_only(build: Callable[[list, np.dtype], str], what: str) -> ExprRule:
    """``build(operands cast to the result type, result dtype)`` for a float result."""

    def expr(ins, in_dts, o, attrs, weak):
        if o.kind != "f":
            raise KernelGenerationError(f"no CUDA rule for {what} with result dtype {o}")
        return build(_operands(ins, o), o)

    return expr


def unary(build: Callable[[str, np.dtype], str]) -> ExprRule:
    """``build(operand cast to the result type, result dtype)``."""
    return lambda ins, in_dts, o, attrs, weak: build(_operands(ins, o)[0], o)
