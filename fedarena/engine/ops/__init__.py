"""Public array operations with numpy's names and signatures, plus numerically stable composites
(``basic``), numpy indexing (``indexing``) and ``einsum`` (``einsum``); this package also installs
the tracer's operators (``+``, ``@``, ``x[key]``, ``.sum()``, ...) in terms of them.

Each function binds engine primitives, so the same call runs eagerly on numpy arrays and records
equations on tracers inside ``jit``/``grad``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.ir import TracerControlFlowError
from ..core.tracing import Tracer
from . import basic as _basic
from .basic import *  # noqa: F401,F403
from .basic import PHASED_MAX_OVERHEAD, Array, _arr, _axes, _is_weak  # noqa: F401
from .einsum import einsum  # noqa: F401
from .indexing import getitem  # noqa: F401

# ============================================================================ tracer operators


def _swap(f):
    return lambda a, b: f(b, a)


# numpy ufuncs that Python operators with an ndarray on the left reach (``a + tracer`` calls
# ``np.add(a, tracer)``, which asks the tracer's ``__array_ufunc__``): recorded as equations
_OPERATOR_UFUNCS = {
    np.add: lambda a, b: add(a, b),
    np.subtract: lambda a, b: subtract(a, b),
    np.multiply: lambda a, b: multiply(a, b),
    np.true_divide: lambda a, b: divide(a, b),
    np.power: lambda a, b: power(a, b),
    np.matmul: lambda a, b: matmul(a, b),
    np.less: lambda a, b: less(a, b),
    np.less_equal: lambda a, b: less_equal(a, b),
    np.greater: lambda a, b: greater(a, b),
    np.greater_equal: lambda a, b: greater_equal(a, b),
    np.equal: lambda a, b: equal(a, b),
    np.not_equal: lambda a, b: not_equal(a, b),
    np.logical_and: lambda a, b: logical_and(a, b),
    np.logical_or: lambda a, b: logical_or(a, b),
    np.bitwise_and: lambda a, b: logical_and(a, b),
    np.bitwise_or: lambda a, b: logical_or(a, b),
    np.floor_divide: lambda a, b: floor_divide(a, b),
    np.remainder: lambda a, b: mod(a, b),
}


def _tracer_array_ufunc(self: Tracer, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    fn = _OPERATOR_UFUNCS.get(ufunc)
    if fn is not None and method == "__call__" and not kwargs and len(inputs) == 2:
        return fn(*inputs)
    name = getattr(ufunc, "__name__", str(ufunc))
    ours = f"ops.{name}" if name in globals() else "the ops module's equivalent"
    raise TracerControlFlowError(
        f"numpy's np.{name}{'' if method == '__call__' else '.' + method} was applied to a traced value; numpy "
        f"functions need concrete arrays, but this value is only known when the compiled graph runs. "
        f"Use {ours} (fedarena.engine.ops follows numpy's names) instead."
    )


def _install_operators() -> None:
    T = Tracer
    T.__array_ufunc__ = _tracer_array_ufunc  # numpy operators on tracers record; other ufuncs refuse
    T.__add__ = add
    T.__radd__ = _swap(add)
    T.__sub__ = subtract
    T.__rsub__ = _swap(subtract)
    T.__mul__ = multiply
    T.__rmul__ = _swap(multiply)
    T.__truediv__ = divide
    T.__rtruediv__ = _swap(divide)
    T.__pow__ = power
    T.__rpow__ = _swap(power)
    T.__matmul__ = matmul
    T.__floordiv__ = floor_divide
    T.__rfloordiv__ = _swap(floor_divide)
    T.__mod__ = mod
    T.__rmod__ = _swap(mod)
    T.__rmatmul__ = _swap(matmul)
    T.__neg__ = negative
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__lt__ = less
    T.__le__ = less_equal
    T.__gt__ = greater
    T.__ge__ = greater_equal
    T.__eq__ = equal
    T.__ne__ = not_equal
    T.__and__ = logical_and
    T.__or__ = logical_or
    T.__invert__ = logical_not
    T.__getitem__ = getitem
    T.__hash__ = lambda self: id(self)
    T.T = property(lambda self: transpose(self))
    T.reshape = lambda self, *s: reshape(self, s[0] if len(s) == 1 and not isinstance(s[0], int) else s)
    T.transpose = lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else (axes or None))
    T.sum = lambda self, axis=None, keepdims=False: sum(self, axis, keepdims)
    T.mean = lambda self, axis=None, keepdims=False: mean(self, axis, keepdims)
    T.max = lambda self, axis=None, keepdims=False: max(self, axis, keepdims)
    T.min = lambda self, axis=None, keepdims=False: min(self, axis, keepdims)
    T.std = lambda self, axis=None, keepdims=False: std(self, axis, keepdims)
    T.argmax = lambda self, axis=None, keepdims=False: argmax(self, axis, keepdims)
    T.prod = lambda self, axis=None, keepdims=False: prod(self, axis, keepdims)
    T.cumsum = lambda self, axis=None: cumsum(self, axis)
    T.any = lambda self, axis=None, keepdims=False: any(self, axis, keepdims)
    T.all = lambda self, axis=None, keepdims=False: all(self, axis, keepdims)
    T.astype = astype
    T.squeeze = lambda self, axis=None: squeeze(self, axis)
    T.clip = lambda self, a_min=None, a_max=None: clip(self, a_min, a_max)
    T.flatten = lambda self: reshape(self, (-1,))
    T.ravel = T.flatten
    T.dot = dot
    T.exp = exp
    T.log = log
    T.tanh = tanh
    T.sqrt = sqrt


_install_operators()

