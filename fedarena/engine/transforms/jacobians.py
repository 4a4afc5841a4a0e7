"""Whole Jacobians and Hessians from the VJP/JVP transformations: ``jacrev`` (one reverse pass
per output element, vectorised with ``vmap``), ``jacfwd`` (one forward pass per input element,
vectorised) and ``hessian = jacfwd(jacrev(f))`` (forward-over-reverse; Griewank & Walther,
"Evaluating Derivatives", 2nd ed., sec. 5.1 and ch. 7).

Shapes follow JAX: for ``f: R^X -> R^S`` the Jacobian has shape ``S + X``; with a tuple of
``argnums`` a tuple of Jacobians comes back, one per argument.  Arguments and the output are
arrays (not pytrees).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import autodiff as AD
from .. import ops
from ..core.ir import EngineError, is_float
from ..core.tracing import Tracer, aval_of
from .vmap import vmap


def _argnums(argnums: int | Sequence[int], n: int) -> tuple[tuple, bool]:
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not -n <= a < n:
            raise EngineError(f"argnums {a} is out of range for {n} arguments")
    return tuple(a % n for a in nums), single


def _check_array(x: Any, what: str) -> Any:
    if not isinstance(x, (Tracer, np.ndarray, np.generic)):
        x = np.asarray(x)
    if not is_float(aval_of(x).dtype):
        raise EngineError(f"{what}: differentiate with respect to float arrays, got {aval_of(x).str_short()}")
    return x


def _basis(shape: tuple, dtype: Any) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    return np.eye(n, dtype=dtype).reshape((n,) + tuple(shape))


def jacrev(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Jacobian of ``fn`` by reverse mode: ``jacrev(f)(x)`` has shape ``f(x).shape + x.shape``."""

    def wrapped(*args: Any) -> Any:
        nums, single = _argnums(argnums, len(args))
        args = list(args)
        for a in nums:
            args[a] = _check_array(args[a], "jacrev")

        def part(*xs: Any) -> Any:
            full = list(args)
            for a, x in zip(nums, xs):
                full[a] = x
            return fn(*full)

        out, pull = AD.vjp(part, *[args[a] for a in nums])
        oav = aval_of(out)
        cts = _basis(oav.shape, oav.dtype if is_float(oav.dtype) else np.float64)
        rows = vmap(lambda c: pull(c))(cts)
        jacs = tuple(ops.reshape(r, oav.shape + aval_of(args[a]).shape) for r, a in zip(rows, nums))
        return jacs[0] if single else jacs

    wrapped.__name__ = f"jacrev({getattr(fn, '__name__', 'fn')})"
    return wrapped


def jacfwd(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Jacobian of ``fn`` by forward mode: shape ``f(x).shape + x.shape``."""

    def wrapped(*args: Any) -> Any:
        nums, single = _argnums(argnums, len(args))
        args = list(args)
        for a in nums:
            args[a] = _check_array(args[a], "jacfwd")
        jacs = []
        for a in nums:
            x = args[a]
            xav = aval_of(x)

            def along(t: Any, a: int = a) -> Any:
                def part(xa: Any) -> Any:
                    full = list(args)
                    full[a] = xa
                    return fn(*full)

                return AD.jvp(part, (args[a],), (t,))[1]

            cols = vmap(along)(_basis(xav.shape, xav.dtype))  # (n_in, *out_shape)
            oshape = aval_of(cols).shape[1:]
            nin = int(np.prod(xav.shape, dtype=np.int64))
            k = len(oshape)
            moved = ops.transpose(cols, tuple(range(1, k + 1)) + (0,)) if k else cols
            jacs.append(ops.reshape(moved, oshape + xav.shape) if (k or xav.shape != (nin,)) else moved)
        return jacs[0] if single else tuple(jacs)

    wrapped.__name__ = f"jacfwd({getattr(fn, '__name__', 'fn')})"
    return wrapped


def hessian(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Hessian of a scalar ``fn``: ``jacfwd(jacrev(fn))``, shape ``x.shape + x.shape``."""
    if not isinstance(argnums, int):
        raise EngineError("hessian: argnums must be one int (the Hessian of one argument)")
    return jacfwd(jacrev(fn, argnums), argnums)


__all__ = ["hessian", "jacfwd", "jacrev"]
