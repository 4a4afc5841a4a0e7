"""What the control-flow primitives share: tracing a body into a sub-graph, giving branches the
same inputs, compiling a sub-graph once for the numpy kernels, and forward mode through a body."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..backends.numpy.executor import Executable
from ..core.ir import Graph, Literal, ShapedArray, ShapeError, Var, is_float
from ..core.nonfinite import SWITCH as _NAN_SWITCH
from ..core.tracing import Tracer, aval_of, eval_graph, trace_flat
from ..transforms import autodiff as AD


def as_value(x: Any) -> Any:
    """A tracer as it is; anything else (Python scalars included) as a numpy array."""
    return x if isinstance(x, Tracer) else np.asarray(x)


def trace_fn(fn: Callable[[list], list], avals: Sequence[ShapedArray]) -> tuple[Graph, list]:
    return trace_flat(fn, list(avals))


eval_sub = eval_graph  # a sub-graph run through bind (eager, or inlined into the active trace)


def read(env: dict, a: Any) -> Any:
    if isinstance(a, Literal):
        return a.value if a.weak else np.asarray(a.value, a.aval.dtype)[()]
    return env[a]


def coerce_outs(outs: Sequence[Any], avals: Sequence[ShapedArray], what: str) -> list:
    """Body outputs as the declared carry types (Python scalars take the carry's dtype); a change
    of shape or dtype is an error naming ``what``."""
    res = []
    for o, av in zip(outs, avals):
        if isinstance(o, (bool, int, float)) and not isinstance(o, np.generic):
            o = np.asarray(o, av.dtype)
        oav = aval_of(o)
        if oav.shape != av.shape:
            raise ShapeError(f"{what}: the carry changed shape from {av.str_short()} to {oav.str_short()}; it must keep its type")
        if oav.dtype != av.dtype:
            raise ShapeError(f"{what}: the carry changed dtype from {av.str_short()} to {oav.str_short()}; cast it explicitly")
        res.append(o)
    return res


def owned(outs: Sequence[np.ndarray], ins: Sequence[Any]) -> list:
    """The kernel's results as arrays nobody else holds: a sub-graph passes an input straight
    through as the very same array object, which the caller's executor may later overwrite."""
    return [np.array(o) if any(o is x for x in ins) else o for o in outs]


class Compiled:
    """A sub-graph compiled once by the numpy executor (built lazily, shared by kernels); while the
    NaN debugger is on (``engine.debug_nans``), a checking build of it runs instead."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._exe: Executable | None = None
        self._checked: Executable | None = None

    def __call__(self, *args: Any) -> list:
        if _NAN_SWITCH.on:
            if self._checked is None:
                self._checked = Executable(self.graph, validate=False, check_finite=True)
            return self._checked(*args)
        if self._exe is None:
            self._exe = Executable(self.graph, validate=False)
        return self._exe(*args)


def compiled(graph: Graph) -> Compiled:
    """The sub-graph's compiled form, cached on the graph object (dies with it)."""
    c = getattr(graph, "_compiled_body", None)
    if c is None:
        c = Compiled(graph)
        graph._compiled_body = c  # type: ignore[attr-defined]
    return c


def unify(traced: Sequence[tuple[Graph, list]], n: int) -> tuple[list[Graph], list]:
    """Give sub-graphs that captured different outer values the same inputs: the ``n`` declared
    inputs followed by every graph's captures (unused dummies where a graph did not capture it)."""
    caps: list = []
    for _, c in traced:
        caps.extend(c)
    graphs = []
    off = 0
    for g, c in traced:
        before = [Var(aval_of(x)) for x in caps[:off]]
        after = [Var(aval_of(x)) for x in caps[off + len(c) :]]
        graphs.append(Graph(g.invars[:n] + before + g.invars[n:] + after, g.constvars, g.consts, g.eqns, g.outvars))
        off += len(c)
    return graphs, caps


def fit(g: Any, av: ShapedArray) -> Any:
    """``g`` cast and broadcast to ``av``."""
    gav = aval_of(g)
    if gav.dtype != av.dtype:
        g = P.cast(g, av.dtype)
    if gav.shape != av.shape:
        g = P.broadcast_to(g, av.shape)
    return g


def tangent_aval(av: ShapedArray) -> ShapedArray:
    """The type of a tangent of a value of type ``av`` (float64 for integer and bool values)."""
    return ShapedArray(av.shape, av.dtype if is_float(av.dtype) else np.float64)


def graph_jvp(graph: Graph, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """Forward mode through a sub-graph (same rules as ``autodiff.jvp``); zero tangents where none."""
    outs, tans = AD.jvp_graph(graph, primals, tangents)
    touts = [t if t is not None else P.zeros_like_aval(tangent_aval(aval_of(o))) for t, o in zip(tans, outs)]
    return outs, touts
