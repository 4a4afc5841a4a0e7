"""The engine's intermediate representation: a typed SSA graph of primitive equations.

A :class:`Graph` is a list of equations ``outs = primitive[attrs](ins)`` over typed variables
(shape + dtype), with graph inputs, captured constants and outputs.  It prints as one equation
a line, in the style of JAX's jaxpr (Frostig et al., "Compiling machine learning programs via
high-level tracing", SysML 2018), and :meth:`Graph.validate` re-type-checks every equation.
Transformations (autodiff, executors, later passes and vmap) are interpreters of this IR.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

# ----------------------------------------------------------------------------- errors


class EngineError(Exception):
    """Base class of the engine's user-facing errors."""


class ShapeError(EngineError, ValueError):
    """Operands of a primitive have incompatible shapes (the message names primitive and shapes)."""


class UnsupportedDtypeError(EngineError, TypeError):
    """An array's dtype is not one the engine computes with."""


class UnknownPrimitiveError(EngineError, KeyError):
    """A primitive is not in the registry or has no kernel for the requested backend."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TracerControlFlowError(EngineError, TypeError):
    """Python control flow (``if``/``while``/``bool``/``int``) was applied to a traced value."""


class LeakedTracerError(EngineError, RuntimeError):
    """A traced value was used after the trace that created it had finished."""


class GraphValidationError(EngineError, ValueError):
    """A graph is not well formed (SSA violation or an equation whose types do not check)."""


# ----------------------------------------------------------------------------- dtypes

class _DtypeSet:
    """A fixed set of dtypes by name (native byte order), so that bfloat16 can be a member without importing
    ml_dtypes (about 0.7 s) before a bfloat16 array exists: ml_dtypes registers its dtype as ``bfloat16``."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def __contains__(self, dtype: Any) -> bool:
        return isinstance(dtype, np.dtype) and dtype.isnative and dtype.name in self.names and \
            (dtype.name != "bfloat16" or dtype.type.__module__.startswith("ml_dtypes"))

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"_DtypeSet({list(self.names)})"


def __getattr__(name: str) -> Any:
    if name == "BFLOAT16":  # imported on first use
        import ml_dtypes  # bfloat16 as a numpy dtype

        return np.dtype(ml_dtypes.bfloat16)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LOW_PRECISION = _DtypeSet(("float16", "bfloat16"))
"""Storage-only float dtypes: matmuls and sums over them accumulate in float32 (``accumulator``)."""

SUPPORTED_DTYPES = _DtypeSet(("bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64", "float16",
                              "bfloat16"))
_SHORT = {
    "bool": "bool",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
}


def check_dtype(dtype: Any, what: str = "array") -> np.dtype:
    """Return ``np.dtype(dtype)`` or raise :class:`UnsupportedDtypeError` saying what is allowed."""
    try:
        if isinstance(dtype, str) and dtype == "bfloat16":
            import ml_dtypes  # noqa: F401  (registers the name)
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise UnsupportedDtypeError(f"{what}: {dtype!r} is not a dtype") from exc
    if dt not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise UnsupportedDtypeError(f"{what}: dtype {dt} is not supported by the engine (supported: {names})")
    return dt


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype in _BF16


_BF16 = _DtypeSet(("bfloat16",))


def accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype products and sums of ``dtype`` values accumulate in (float32 for float16/bfloat16)."""
    return np.dtype(np.float32) if dtype in LOW_PRECISION else np.dtype(dtype)


# ----------------------------------------------------------------------------- types and variables


class ShapedArray:
    """The abstract value of an array: its shape and dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShapedArray) and self.shape == other.shape and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype))

    def str_short(self) -> str:
        return f"{_SHORT.get(self.dtype.name, self.dtype.name)}[{','.join(map(str, self.shape))}]"

    __repr__ = str_short


class Var:
    """An SSA variable: defined once (graph input, constant or equation output)."""

    __slots__ = ("aval", "count")
    _counter = 0

    def __init__(self, aval: ShapedArray):
        self.aval = aval
        Var._counter += 1
        self.count = Var._counter

    def __repr__(self) -> str:
        return f"Var#{self.count}:{self.aval.str_short()}"


class Literal:
    """A scalar written inline in an equation.

    ``weak`` literals come from Python scalars and take the dtype of the array they meet
    (numpy's NEP 50 rule); strong literals come from numpy scalars and keep theirs.
    """

    __slots__ = ("value", "aval", "weak")

    def __init__(self, value: Any, dtype: Any = None, weak: bool = False):
        if weak:
            self.value = value
            self.aval = ShapedArray((), np.result_type(value) if dtype is None else dtype)
        else:
            arr = np.asarray(value, dtype=dtype)
            self.value = arr.item()
            self.aval = ShapedArray((), arr.dtype)
        self.weak = weak

    def __repr__(self) -> str:
        v = repr(self.value)
        return v if self.weak else f"{v}:{self.aval.str_short()}"


Atom = Var | Literal


class Eqn:
    """One equation ``outputs = primitive[attrs](inputs)``; ``source`` is the user's file:line."""

    __slots__ = ("prim", "inputs", "outputs", "attrs", "source")

    def __init__(self, prim: Any, inputs: Sequence[Atom], outputs: Sequence[Var], attrs: dict, source: str | None):
        self.prim = prim
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attrs = dict(attrs)
        self.source = source

    def __repr__(self) -> str:
        return f"Eqn({self.prim.name}, {self.inputs} -> {self.outputs})"


# ----------------------------------------------------------------------------- graph


def _fmt_attr(v: Any) -> str:
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def _name_of(index: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    s = ""
    index += 1
    while index > 0:
        index, r = divmod(index - 1, 26)
        s = letters[r] + s
    return s


def _namer():
    """A function naming atoms for a graph's text: a literal as its value, each variable by the order
    it is first named (``a``, ``b``, ...)."""
    names: dict[Var, str] = {}

    def nm(a: Atom) -> str:
        if isinstance(a, Literal):
            return repr(a)
        if a not in names:
            names[a] = _name_of(len(names))
        return names[a]

    return nm


class Graph:
    """A typed SSA graph: ``invars`` and ``constvars`` (with ``consts`` values) feed ``eqns``
    whose variables flow to ``outvars`` (variables or literals)."""

    def __init__(
        self,
        invars: Sequence[Var],
        constvars: Sequence[Var],
        consts: Sequence[np.ndarray],
        eqns: Sequence[Eqn],
        outvars: Sequence[Atom],
    ):
        self.invars = list(invars)
        self.constvars = list(constvars)
        self.consts = list(consts)
        self.eqns = list(eqns)
        self.outvars = list(outvars)

    @property
    def in_avals(self) -> list[ShapedArray]:
        return [v.aval for v in self.invars]

    @property
    def out_avals(self) -> list[ShapedArray]:
        return [v.aval for v in self.outvars]

    def __str__(self) -> str:
        nm = _namer()

        def decl(v: Var) -> str:
            return f"{nm(v)}:{v.aval.str_short()}"

        consts = ", ".join(decl(v) for v in self.constvars)
        ins = ", ".join(decl(v) for v in self.invars)
        head = "{ lambda " + consts + "; " + ins + ". let" if self.constvars else "{ lambda " + ins + ". let"
        lines = [head]
        for e in self.eqns:
            outs = " ".join(decl(v) for v in e.outputs)
            attrs = ""
            if e.attrs:
                attrs = "[" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in e.attrs.items()) + "]"
            args = " ".join(nm(a) for a in e.inputs)
            lines.append(f"    {outs} = {e.prim.name}{attrs} {args}".rstrip())
        lines.append("  in (" + ", ".join(nm(a) for a in self.outvars) + ") }")
        return "\n".join(lines)

    __repr__ = __str__

    def validate(self) -> None:
        """Check SSA form and re-run every equation's shape/dtype rule; raise on the first problem."""
        defined: set[Var] = set()
        for v in list(self.invars) + list(self.constvars):
            if v in defined:
                raise GraphValidationError(f"variable {v} is defined twice among the graph inputs")
            defined.add(v)
        for c, v in zip(self.consts, self.constvars):
            if tuple(np.shape(c)) != v.aval.shape or np.asarray(c).dtype != v.aval.dtype:
                raise GraphValidationError(f"constant for {v} has shape {np.shape(c)} dtype {np.asarray(c).dtype}")
        for i, e in enumerate(self.eqns):
            for a in e.inputs:
                if isinstance(a, Var) and a not in defined:
                    raise GraphValidationError(f"equation {i} ({e.prim.name}) uses {a} before it is defined")
            try:
                out_avals = e.prim.abstract_eval([a.aval for a in e.inputs], e.attrs, [isinstance(a, Literal) and a.weak for a in e.inputs])
            except ShapeError as exc:
                raise GraphValidationError(f"equation {i} ({e.prim.name}) does not type-check: {exc}") from exc
            if not isinstance(out_avals, (list, tuple)):
                out_avals = [out_avals]
            if len(out_avals) != len(e.outputs):
                raise GraphValidationError(f"equation {i} ({e.prim.name}) has {len(e.outputs)} outputs, rule gives {len(out_avals)}")
            for v, av in zip(e.outputs, out_avals):
                if v.aval != av:
                    raise GraphValidationError(
                        f"equation {i} ({e.prim.name}) output {v} declared {v.aval.str_short()}, rule gives {av.str_short()}"
                    )
                if v in defined:
                    raise GraphValidationError(f"equation {i} ({e.prim.name}) redefines {v}")
                defined.add(v)
        for a in self.outvars:
            if isinstance(a, Var) and a not in defined:
                raise GraphValidationError(f"graph output {a} is never defined")


def used_vars(eqns: Iterable[Eqn]) -> set[Var]:
    out: set[Var] = set()
    for e in eqns:
        out.update(a for a in e.inputs if isinstance(a, Var))
    return out
