"""The NaN/Inf debugger: stop at the first equation whose output is not finite.

MindInsight's debugger (MindSpore) and JAX's ``jax_debug_nans`` flag do this for their engines.
``engine.debug_nans(True)`` (or ``jit(fn, debug_nans=True)`` for one function) makes eager calls
check every primitive's output and makes ``jit`` compile a checking program (the traced graph
without the optimising passes, every value in a buffer of its own, a finiteness test after each
equation); the first float output holding NaN or +-Inf raises :class:`NonFiniteError`, naming the
primitive, the statistics of its inputs and the user's source line recorded when it was traced.
Off (the default), nothing is checked and compiled programs are the ordinary ones.

``FEDARENA_DEBUG_NANS=1`` in the environment turns it on at import (for ``fedarena run``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from .ir import EngineError, Literal, is_float


class NonFiniteError(EngineError, FloatingPointError):
    """A primitive produced NaN or Inf while the NaN debugger was on.

    ``primitive`` (its name), ``source`` (``file:line`` of the user's code, or ``None``), ``equation``
    (its index in the compiled graph, ``None`` when eager), ``inputs`` (one statistics line per operand)
    and ``output`` (how many elements are NaN / Inf).  A user error for the platform (``user_error``):
    the fix is in the model, the data or the config (a learning rate that diverges), and the message
    names the line to look at."""

    user_error = True

    def __init__(self, primitive: str, source: str | None, equation: int | None, inputs: Sequence[str], output: str):
        self.primitive = primitive
        self.source = source
        self.equation = equation
        self.inputs = tuple(inputs)
        self.output = output
        where = f"at {source}" if source else "at an unknown source line"
        eqn = "" if equation is None else f" (equation {equation} of its compiled graph)"
        ins = "; ".join(f"#{k} {s}" for k, s in enumerate(self.inputs)) or "none"
        super().__init__(f"{primitive} produced {output} {where}{eqn}; inputs: {ins}")


class _Switch:
    """Whether the debugger is on, and who must hear when that changes (jit drops its fast paths)."""

    __slots__ = ("on", "listeners")

    def __init__(self) -> None:
        self.on = os.environ.get("FEDARENA_DEBUG_NANS", "0") not in ("", "0")
        self.listeners: list[Callable[[], None]] = []


SWITCH = _Switch()


class debug_nans:
    """``debug_nans(True)`` turns the NaN/Inf debugger on for the process, ``debug_nans(False)`` off;
    ``with debug_nans():`` turns it on for a block and restores the previous setting afterwards."""

    def __init__(self, enabled: bool = True):
        self.previous = SWITCH.on
        _set(bool(enabled))

    def __enter__(self) -> "debug_nans":
        return self

    def __exit__(self, *exc: Any) -> None:
        _set(self.previous)


def _set(on: bool) -> None:
    if SWITCH.on != on:
        SWITCH.on = on
        for listener in SWITCH.listeners:
            listener()


def debugging_nans() -> bool:
    """Whether the NaN/Inf debugger is on."""
    return SWITCH.on


def is_finite(value: Any) -> bool:
    """True unless ``value`` is a float array or scalar holding NaN or Inf."""
    dt = getattr(value, "dtype", None)
    if dt is None or not is_float(dt):
        return True
    return bool(np.isfinite(value).all())


def statistics(value: Any) -> str:
    """One line: type, min/max/mean of the finite elements, and the count of NaN and Inf elements."""
    if isinstance(value, Literal):
        return f"literal {value.value!r}"
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
        return f"python scalar {value!r}"
    a = np.asarray(value)
    head = f"{a.dtype.name}{list(a.shape)}"
    if a.dtype.kind == "b":
        return f"{head} true={int(np.count_nonzero(a))}"
    if not (a.dtype.kind in "iu" or is_float(a.dtype)):
        return head
    if a.size == 0:
        return f"{head} empty"
    x = a.astype(np.float64)
    finite = np.isfinite(x)
    nan = int(np.isnan(x).sum())
    inf = int(x.size - finite.sum() - nan)
    vals = x[finite]
    if vals.size:
        body = f"min={vals.min():.6g} max={vals.max():.6g} mean={vals.mean():.6g}"
    else:
        body = "no finite element"
    return f"{head} {body} nan={nan} inf={inf}"


def describe_output(value: Any) -> str:
    x = np.asarray(value, dtype=np.float64)
    nan = int(np.isnan(x).sum())
    inf = int(np.isinf(x).sum())
    parts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n]
    return f"{' and '.join(parts)} in {x.size} element{'s' if x.size != 1 else ''}"


def raise_non_finite(primitive: str, out: Any, inputs: Sequence[Any], source: str | None, equation: int | None = None) -> None:
    raise NonFiniteError(primitive, source, equation, [statistics(a) for a in inputs], describe_output(out))


def check(primitive: str, out: Any, inputs: Sequence[Any], source: str | None, equation: int | None = None) -> None:
    """Raise :class:`NonFiniteError` if ``out`` holds NaN or Inf."""
    if not is_finite(out):
        raise_non_finite(primitive, out, inputs, source, equation)


__all__ = ["NonFiniteError", "SWITCH", "check", "debug_nans", "debugging_nans", "is_finite", "raise_non_finite", "statistics"]
