"""Primitive registry, tracers and ``bind``: how calls on arrays become IR equations.

Every operation goes through :func:`bind`.  With concrete numpy inputs it runs the primitive's
numpy kernel at once (eager mode); when a :class:`Tracer` is among the inputs it records an
equation in the innermost active :class:`Trace` (tracing by operator overloading, as in JAX's
dynamic tracing).  Tracers of outer traces seen by an inner trace are captured as extra graph
inputs, which is what lets ``grad`` be nested and close over traced values.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .interpreter import interpret
from .nonfinite import SWITCH as _NAN_SWITCH
from .nonfinite import check as _check_finite
from .ir import Eqn, Graph, LeakedTracerError, Literal, ShapedArray, ShapeError, TracerControlFlowError, UnknownPrimitiveError, Var, check_dtype


class Primitive:
    """A primitive operation and its rules (filled in by ``primitives.py``).

    ``abstract_eval(in_avals, attrs, weak) -> ShapedArray`` is the shape/dtype rule,
    ``impl(*arrays, **attrs)`` the numpy kernel, ``emit`` the code generator for the compiled
    executor, ``vjp(need, ct, out, *ins, **attrs)`` the reverse-mode rule returning one cotangent
    (or ``None``) per input, ``jvp(tangents, out, *ins, **attrs)`` the forward-mode rule.

    A primitive with ``multiple_results`` (the control-flow primitives) has equations with several
    outputs, each with its own shape and dtype: its ``abstract_eval`` returns a list of avals, its
    ``impl`` a list of arrays, ``bind`` a list of values; its ``vjp`` receives the list of output
    cotangents (``None`` for an output without one) and the list of outputs, its ``jvp`` the list of
    outputs and returns a list of tangents (``None`` for none), and its ``batch`` rule returns a list
    of values, all batched on axis 0.

    ``batch(prim, vals, batched, size, **attrs)`` is the batching rule of ``vmap`` (``vals[i]`` has its
    batch axis in front when ``batched[i]``; returns the result batched on axis 0); a primitive without
    a specialised rule declares ``primitives.base.loop_batching``.  ``cuda(eqn, lib)`` is the cupy
    backend's step rule (``lib``: the backend's kernel library; returns a step spec, ``None`` for the
    host kernel on this equation); ``cuda_expr(ins, in_dtypes, out_dtype, attrs, weak)`` is an
    elementwise primitive's C expression of one element for the generated kernels;
    ``primitives.base.host_only`` declares a primitive run on the host on that backend.

    A linear primitive declares ``transpose(need, ct, out, *ins, **attrs)`` (the transposed linear map:
    one cotangent per operand, ``None`` for a non-linear one such as an index) and how it is linear
    (``linearity``: in its first operand, jointly in all, or in each of two); its JVP is then the
    primitive applied to the tangents and its VJP is the transpose (reverse mode = JVP + transposition,
    as in JAX).
    """

    def __init__(self, name: str):
        self.name = name
        self.abstract_eval: Callable = None  # type: ignore[assignment]
        self.impl: Callable = None  # type: ignore[assignment]
        self.emit: Callable | None = None
        self.vjp: Callable | None = None
        self.jvp: Callable | None = None
        self.batch: Callable | None = None
        self.cuda: Callable | None = None
        self.cuda_expr: Callable | None = None
        self.transpose: Callable | None = None
        # the numpy executor's form of the primitive on 0-d numpy scalars (a format string over the
        # operands, or ``form(ctx, attrs) -> format string``); None: no scalar form
        self.scalar_emit: str | Callable | None = None
        self.linearity: str | None = None  # "first", "joint" or "bilinear" (see primitives.base.LINEARITY)
        self.multiple_results = False  # True: abstract_eval/impl/bind/rules give a list, one entry per output
        self.differentiable = True  # False: outputs carry no gradient (comparisons, argmax, ...)
        self.traits: frozenset = frozenset()  # see TRAITS
        self.in_place_operands: tuple | None = None  # operands the output may overwrite, when not all/none
        # optional pair for primitives whose reverse rule needs values computed with the output
        # (custom_vjp's residuals): ``vjp_forward(ins, **attrs) -> (out, residuals)`` replaces the
        # primitive in a differentiated forward pass, ``vjp_saved(residuals, need, ct, out, *ins, **attrs)``
        # is then its VJP
        self.vjp_forward: Callable | None = None
        self.vjp_saved: Callable | None = None

    def __repr__(self) -> str:
        return self.name


PRIMITIVES: dict[str, Primitive] = {}

TRAITS = {
    "elementwise": "a broadcasting op computed by one numpy ufunc call that writes into the output buffer "
    "(the executor lets such a call broadcast its operands and take 0-d scalars; vmap aligns batch axes)",
    "in_place": "the output may take over the buffer of any operand of its size and dtype (one ufunc pass)",
    "fusible": "the fusion pass may put it in a fused elementwise body",
    "view": "the executor may return a view of the first operand instead of a copy",
    "typed_scalars": "emitted as one ufunc call on its operands, to which the numpy executor passes a Python-scalar "
    "literal operand as a 0-d constant of the operation's type",
    "predicate": "its result is boolean whatever the operands' dtype (a comparison, logical operation or value test)",
    "transcendental": "computed by a C math-library call per element (exp, log, tanh, pow, ...), slower per element "
    "than numpy's vectorised loops on long arrays",
}
"""The traits a primitive may carry; every op set of the compiler and backend is derived from them."""


def names_with(trait: str) -> frozenset:
    """Names of the registered primitives that carry ``trait`` (see TRAITS)."""
    if trait not in TRAITS:
        raise KeyError(f"unknown primitive trait {trait!r}; known: {', '.join(sorted(TRAITS))}")
    return frozenset(n for n, p in PRIMITIVES.items() if trait in p.traits)


def register(name: str) -> Primitive:
    if name in PRIMITIVES:
        raise ValueError(f"primitive {name!r} registered twice")
    p = Primitive(name)
    PRIMITIVES[name] = p
    return p


def get_primitive(name: str) -> Primitive:
    try:
        return PRIMITIVES[name]
    except KeyError:
        raise UnknownPrimitiveError(f"unknown primitive {name!r}; registered: {', '.join(sorted(PRIMITIVES))}") from None


# ----------------------------------------------------------------------------- traces


class Trace:
    """Records equations while a function runs on tracers."""

    def __init__(self, parent: "Trace | None"):
        self.parent = parent
        self.level = 0 if parent is None else parent.level + 1
        self.eqns: list[Eqn] = []
        self.invars: list[Var] = []
        self.constvars: list[Var] = []
        self.consts: list[np.ndarray] = []
        self._const_ids: dict[int, tuple[Any, Var]] = {}
        self.captured: list[Any] = []  # outer tracers, in the order of self.captured_vars
        self.captured_vars: list[Var] = []
        self._captured_ids: dict[int, Var] = {}
        self.alive = True
        self.source_override: str | None = None

    def new_input(self, aval: ShapedArray) -> "Tracer":
        v = Var(aval)
        self.invars.append(v)
        return Tracer(self, v)

    def atom(self, x: Any) -> Any:
        """The IR atom (Var or Literal) standing for ``x`` in this trace."""
        if isinstance(x, Tracer):
            if x.trace is self:
                return x.var
            if not x.trace.alive:
                raise LeakedTracerError(
                    "a traced value escaped the function that was being traced (stored in a global or "
                    "closure?); return it from the function instead"
                )
            v = self._captured_ids.get(id(x))
            if v is None:
                v = Var(x.aval)
                self._captured_ids[id(x)] = v
                self.captured.append(x)
                self.captured_vars.append(v)
            return v
        if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
            return Literal(x, weak=True)
        if isinstance(x, np.generic):
            check_dtype(x.dtype, "constant")
            return Literal(x, dtype=x.dtype)
        # the constant-capture rule: a closed-over array is copied now (baked at trace time), so
        # mutating it later never reaches the compiled program (see docs/engine.md)
        hit = self._const_ids.get(id(x))
        if hit is not None:
            return hit[1]
        arr = np.array(x, copy=True)
        check_dtype(arr.dtype, "constant")
        v = Var(ShapedArray(arr.shape, arr.dtype))
        self._const_ids[id(x)] = (x, v)  # holding x keeps its id from being reused while tracing
        self.constvars.append(v)
        self.consts.append(arr)
        return v

    def to_graph(self, outs: Sequence[Any]) -> Graph:
        outvars = [self.atom(o) for o in outs]
        return Graph(self.invars + self.captured_vars, self.constvars, self.consts, self.eqns, outvars)


class _ThreadStack(threading.local):
    """A stack of its own in every thread: tracing in one thread never sees (or pops) another's traces, as
    JAX keeps its trace state per thread. ``bool``, ``len``, ``[-1]``, ``append`` and ``pop`` as a list."""

    def __init__(self) -> None:
        self.items: list = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def append(self, item: Any) -> None:
        self.items.append(item)

    def pop(self) -> Any:
        return self.items.pop()


_TRACE_STACK = _ThreadStack()
_EAGER_SOURCE = _ThreadStack()  # source lines eager calls are attributed to (replayed / backward equations)


def current_trace() -> Trace | None:
    return _TRACE_STACK[-1] if _TRACE_STACK else None


class new_trace:
    """Context manager: push a fresh trace (a child of the current one)."""

    def __enter__(self) -> Trace:
        t = Trace(current_trace())
        _TRACE_STACK.append(t)
        self.trace = t
        return t

    def __exit__(self, *exc: Any) -> None:
        popped = _TRACE_STACK.pop()
        assert popped is self.trace
        popped.alive = False


# ----------------------------------------------------------------------------- tracers

_CONTROL_FLOW_MSG = (
    "cannot use a traced value as a Python {what} (Python control flow such as `if`, `while`, "
    "`and`/`or`, int()/float() needs a concrete value, but this value is only known when the "
    "compiled graph runs). Use the engine's control-flow primitives instead: ops.where(cond, a, b) "
    "(also ops.maximum / ops.minimum / ops.clip) for data-dependent selection; loops over a static "
    "count unroll in Python; engine.cond / engine.while_loop / engine.fori_loop / engine.scan for "
    "data-dependent branches and loops; or mark the argument static with "
    "jit(fn, static_argnums=..., static_argnames=...)."
)


class Tracer:
    """A stand-in for an array while a function is traced; operators record equations."""

    __slots__ = ("trace", "var")
    __array_priority__ = 1000  # numpy defers binary operators to us

    def __init__(self, trace: Trace, var: Var):
        self.trace = trace
        self.var = var

    @property
    def aval(self) -> ShapedArray:
        return self.var.aval

    @property
    def shape(self) -> tuple:
        return self.var.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.var.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.var.aval.shape)

    @property
    def size(self) -> int:
        return self.var.aval.size

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d traced array")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:
        raise TracerControlFlowError(_CONTROL_FLOW_MSG.format(what="bool"))

    def __int__(self) -> int:
        raise TracerControlFlowError(_CONTROL_FLOW_MSG.format(what="int"))

    def __float__(self) -> float:
        raise TracerControlFlowError(_CONTROL_FLOW_MSG.format(what="float"))

    def __index__(self) -> int:
        raise TracerControlFlowError(_CONTROL_FLOW_MSG.format(what="index"))

    def __array__(self, *a: Any, **k: Any) -> np.ndarray:
        raise TracerControlFlowError(_CONTROL_FLOW_MSG.format(what="numpy array (np.asarray)"))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"Tracer<{self.aval.str_short()}>"

    # operator methods are attached in ops.py (they call the public ops).


# ----------------------------------------------------------------------------- bind

_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fedarena/engine


def user_source() -> str | None:
    """``file:line`` of the innermost caller outside the engine package."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_ENGINE_DIR):
        f = f.f_back
    if f is None:
        return None
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def _weak_flags(args: Sequence[Any]) -> list[bool]:
    return [isinstance(a, (bool, int, float)) and not isinstance(a, np.generic) for a in args]


def aval_of(x: Any) -> ShapedArray:
    if isinstance(x, Tracer):
        return x.var.aval
    if isinstance(x, np.ndarray):
        return ShapedArray(x.shape, x.dtype)
    if isinstance(x, bool):
        return ShapedArray((), np.bool_)
    if isinstance(x, int) and not isinstance(x, np.generic):
        return ShapedArray((), np.int64)
    if isinstance(x, float):
        return ShapedArray((), np.float64)
    a = np.asarray(x)
    return ShapedArray(a.shape, a.dtype)


def _describe(avals: Sequence[ShapedArray], weak: Sequence[bool]) -> str:
    return ", ".join("python scalar" if w else av.str_short() for av, w in zip(avals, weak))


def abstract_eval(prim: Primitive, args: Sequence[Any], attrs: dict, source: str | None = None) -> Any:
    avals = [aval_of(a) for a in args]
    weak = _weak_flags(args)
    for av, w in zip(avals, weak):
        if not w:
            check_dtype(av.dtype, f"input of {prim.name}")
    try:
        return prim.abstract_eval(avals, attrs, weak)
    except ShapeError as exc:
        where = f" (at {source})" if source else ""
        raise ShapeError(f"{prim.name}: {exc}; inputs: {_describe(avals, weak)}{where}") from None


def bind(prim: Primitive, *args: Any, **attrs: Any) -> Any:
    """Apply ``prim`` to ``args``: eagerly on arrays, or as a new equation when tracing."""
    trace = None
    for a in args:
        if isinstance(a, Tracer):
            trace = current_trace()
            if trace is None or not a.trace.alive:
                raise LeakedTracerError(
                    f"{prim.name}: a traced value is used outside the function being traced; "
                    "return it from the traced function instead of storing it"
                )
            break
    if PRIMITIVES.get(prim.name) is not prim:
        raise UnknownPrimitiveError(f"primitive {prim.name!r} is not registered with the engine")
    if trace is None:
        arrays = [a if isinstance(a, np.ndarray) or _weak_flags([a])[0] else np.asarray(a) for a in args]
        source = _EAGER_SOURCE[-1] if _EAGER_SOURCE else user_source()
        out_aval = abstract_eval(prim, arrays, attrs, source)
        if prim.multiple_results:
            outs = list(prim.impl(*arrays, **attrs))
            if len(outs) != len(out_aval):
                raise ShapeError(f"{prim.name}: the kernel gave {len(outs)} outputs, the shape rule {len(out_aval)}")
            outs = [_conform(o, av) for o, av in zip(outs, out_aval)]
            if _NAN_SWITCH.on:
                for o in outs:
                    _check_finite(prim.name, o, arrays, source)
            return outs
        out = _conform(prim.impl(*arrays, **attrs), out_aval)
        if _NAN_SWITCH.on:
            _check_finite(prim.name, out, arrays, source)
        return out
    source = trace.source_override or user_source()
    out_aval = abstract_eval(prim, args, attrs, source)
    ins = [trace.atom(a) for a in args]
    if prim.multiple_results:
        outs = [Var(av) for av in out_aval]
        trace.eqns.append(Eqn(prim, ins, outs, attrs, source))
        return [Tracer(trace, v) for v in outs]
    out = Var(out_aval)
    trace.eqns.append(Eqn(prim, ins, [out], attrs, source))
    return Tracer(trace, out)


def _conform(out: Any, aval: ShapedArray) -> np.ndarray:
    """A kernel's result as an array of the dtype the shape rule gave."""
    if not isinstance(out, np.ndarray) or out.dtype != aval.dtype:
        out = np.asarray(out, dtype=aval.dtype)
    return out


# ----------------------------------------------------------------------------- graphs <-> functions


def trace_flat(fn: Callable[..., Sequence[Any]], in_avals: Sequence[ShapedArray]) -> tuple[Graph, list[Any]]:
    """Trace ``fn`` (flat list of inputs -> flat list of outputs) into a graph.

    Returns ``(graph, captured)``: the graph's inputs are the ``in_avals`` inputs followed by one
    input per captured outer tracer, listed in ``captured``.
    """
    with new_trace() as t:
        ins = [t.new_input(av) for av in in_avals]
        outs = fn(ins)
        graph = t.to_graph(outs)
    return graph, list(t.captured)


class source_scope:
    """Attribute the equations recorded (or, eagerly, the calls made) inside the block to ``source``."""

    __slots__ = ("source", "trace", "saved")

    def __init__(self, source: str | None):
        self.source = source
        self.trace = current_trace()

    def __enter__(self) -> None:
        if self.trace is not None:
            self.saved = self.trace.source_override
            self.trace.source_override = self.source
        else:
            _EAGER_SOURCE.append(self.source)

    def __exit__(self, *exc: Any) -> None:
        if self.trace is not None:
            self.trace.source_override = self.saved
        else:
            _EAGER_SOURCE.pop()


def bind_rule(e: Eqn, ins: list) -> Any:
    """The interpreter rule of evaluation: ``bind`` the equation again (eagerly on arrays, or into
    the current trace, keeping the equation's source line)."""
    trace = current_trace()
    if trace is None:
        if e.source is None:
            return bind(e.prim, *ins, **e.attrs)
        _EAGER_SOURCE.append(e.source)
        try:
            return bind(e.prim, *ins, **e.attrs)
        finally:
            _EAGER_SOURCE.pop()
    saved, trace.source_override = trace.source_override, e.source
    try:
        return bind(e.prim, *ins, **e.attrs)
    finally:
        trace.source_override = saved


def eval_graph(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """Interpret ``graph`` on ``args`` through :func:`bind` (eager arrays, or inlined into the current trace)."""
    return interpret(graph, args, bind_rule)[0]
