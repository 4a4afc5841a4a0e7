"""Graph-to-graph optimisation passes and the pipeline that runs them before compilation.

Each pass is a pure function ``Graph -> Graph`` (the input graph is not modified): dead code
elimination, common subexpression elimination (value numbering), constant folding and algebraic
simplification (identities, transpose/reshape chains, no-op broadcasts, sums of broadcasts).
These are the front-end optimisations of an AI compiler (Zomi Chen et al., "AI System", ch. 6
"front-end optimisation"; Aho, Lam, Sethi & Ullman, "Compilers", 2nd ed., sec. 8.5 and 9.1 for
value numbering, copy propagation and dead code).  ``jit(fn, passes=...)`` runs a
:class:`Pipeline`; the default one is :data:`DEFAULT_PIPELINE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..core.ir import Eqn, Graph, Literal, ShapedArray, Var, is_float
from .fusion import default_elementwise_fusion, elementwise_fusion
from .native import row_reduce_native, select_native_kernels
from ..core.tracing import PRIMITIVES, Primitive

Pass = Callable[[Graph], Graph]


# ----------------------------------------------------------------------------- helpers


def _is_scalar_const(a: Any, const_vals: dict, value: float) -> bool:
    """``a`` is a literal equal to ``value``, or a constant array filled with ``value``."""
    if isinstance(a, Literal):
        try:
            return float(a.value) == value
        except (TypeError, ValueError):
            return False
    c = const_vals.get(a)
    if c is not None and c.size > 0 and c.size <= 4096:
        return bool(np.all(c == value))
    return False


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, np.ndarray):
        return ("nd", v.shape, v.dtype.str, v.tobytes())
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


def _atom_key(a: Any) -> Any:
    if isinstance(a, Literal):
        return ("lit", repr(a.value), a.aval.dtype.str, a.weak)
    return ("var", id(a))


# ----------------------------------------------------------------------------- dead code elimination


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop equations whose outputs never reach a graph output, and constants nobody reads."""
    needed = {a for a in graph.outvars if isinstance(a, Var)}
    kept = []
    for e in reversed(graph.eqns):
        if any(o in needed for o in e.outputs):
            kept.append(e)
            needed.update(a for a in e.inputs if isinstance(a, Var))
    kept.reverse()
    cv = [(v, c) for v, c in zip(graph.constvars, graph.consts) if v in needed]
    return Graph(graph.invars, [v for v, _ in cv], [c for _, c in cv], kept, graph.outvars)


# ----------------------------------------------------------------------------- CSE


def common_subexpression_elimination(graph: Graph) -> Graph:
    """Value numbering: an equation with the same primitive, inputs and attributes as an earlier
    one reuses that one's output.  Equal constant arrays are merged first."""
    subst: dict[Var, Var] = {}
    # merge identical small constants
    const_key: dict = {}
    constvars, consts = [], []
    for v, c in zip(graph.constvars, graph.consts):
        c = np.asarray(c)
        key = ("nd", c.shape, c.dtype.str, c.tobytes()) if c.nbytes <= 1 << 16 else ("id", id(c))
        if key in const_key:
            subst[v] = const_key[key]
        else:
            const_key[key] = v
            constvars.append(v)
            consts.append(c)
    seen: dict = {}
    eqns = []

    def s(a: Any) -> Any:
        while isinstance(a, Var) and a in subst:
            a = subst[a]
        return a

    for e in graph.eqns:
        ins = [s(a) for a in e.inputs]
        key = (e.prim.name, tuple(_atom_key(a) for a in ins), _freeze(e.attrs))
        prev = seen.get(key)
        if prev is not None and len(prev.outputs) == len(e.outputs):
            for o, p in zip(e.outputs, prev.outputs):
                subst[o] = p
            continue
        ne = Eqn(e.prim, ins, e.outputs, e.attrs, e.source) if any(x is not y for x, y in zip(ins, e.inputs)) else e
        seen[key] = ne
        eqns.append(ne)
    return Graph(graph.invars, constvars, consts, eqns, [s(a) for a in graph.outvars])


# ----------------------------------------------------------------------------- constant folding

FOLD_MAX_BYTES = 1 << 22


def constant_folding(graph: Graph, max_bytes: int = FOLD_MAX_BYTES) -> Graph:
    """Evaluate equations whose inputs are all constants (literals or captured arrays) once, at
    compile time, and turn their results into graph constants (results over ``max_bytes`` and
    ``full`` fills are left to run, so folding never bloats the program)."""
    values: dict[Var, np.ndarray] = {v: np.asarray(c) for v, c in zip(graph.constvars, graph.consts)}
    constvars, consts = list(graph.constvars), list(graph.consts)
    eqns = []
    for e in graph.eqns:
        if e.prim.name != "full" and e.inputs and all(isinstance(a, Literal) or a in values for a in e.inputs):
            out = e.outputs[0]
            if out.aval.size * out.aval.dtype.itemsize <= max_bytes and len(e.outputs) == 1:
                args = []
                for a in e.inputs:
                    if isinstance(a, Literal):
                        args.append(a.value if a.weak else np.asarray(a.value, a.aval.dtype)[()])
                    else:
                        args.append(values[a])
                try:
                    val = np.asarray(e.prim.impl(*args, **e.attrs), dtype=out.aval.dtype)
                except Exception:  # noqa: BLE001 - a kernel refusing constants just stays in the graph
                    val = None
                if val is not None and val.shape == out.aval.shape:
                    values[out] = val
                    constvars.append(out)
                    consts.append(val)
                    continue
        eqns.append(e)
    g = Graph(graph.invars, constvars, consts, eqns, graph.outvars)
    return dead_code_elimination(g)


# ----------------------------------------------------------------------------- algebraic simplification


@dataclass(frozen=True)
class Simplify:
    """Algebraic simplification; ``assume_finite=True`` also rewrites ``x*0 -> 0`` (wrong for
    inf/nan inputs, hence opt-in)."""

    assume_finite: bool = False

    def __call__(self, graph: Graph) -> Graph:
        return algebraic_simplification(graph, self.assume_finite)


def _weak_number(a: Any) -> float | None:
    if isinstance(a, Literal) and a.weak and isinstance(a.value, (int, float)) and not isinstance(a.value, bool):
        return a.value
    return None


def _fold_scalar_chain(e: Eqn, ins: list, producer: dict, uses: dict) -> list | None:
    """``(x*c1)*c2 -> x*(c1*c2)``, ``-(x*c) -> x*(-c)``, ``(-x)*c -> x*(-c)`` for Python-number
    constants (weak literals keep the operand's dtype), when the inner product is used only here."""
    if not is_float(e.outputs[0].aval.dtype):
        return None
    if e.prim.name == "neg":
        inner_v, c = ins[0], -1.0
    else:
        a, b = ins
        c = _weak_number(b)
        inner_v = a
        if c is None:
            c, inner_v = _weak_number(a), b
        if c is None:
            return None
    if not isinstance(inner_v, Var) or uses.get(inner_v, 0) != 1:
        return None
    p = producer.get(inner_v)
    if p is None or p.outputs[0].aval != e.outputs[0].aval:
        return None
    if p.prim.name == "neg":
        x, c2 = p.inputs[0], -1.0
    elif p.prim.name == "mul":
        x, c2 = p.inputs[0], _weak_number(p.inputs[1])
        if c2 is None:
            c2, x = _weak_number(p.inputs[0]), p.inputs[1]
        if c2 is None:
            return None
    else:
        return None
    if not isinstance(x, Var) or x.aval.dtype != e.outputs[0].aval.dtype:
        return None
    return [x, Literal(float(c) * float(c2), weak=True)]


def _is_identity_perm(perm: Sequence[int]) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


_RESHAPES = ("reshape", "squeeze", "expand_dims")


def algebraic_simplification(graph: Graph, assume_finite: bool = False) -> Graph:
    """Rewrite ``x*1, 1*x, x/1, x+0, 0+x, x-0, x**1, --x``, casts to the same dtype, identity
    transposes, transpose-of-transpose, chains of reshape/squeeze/expand_dims, broadcasts to the
    same shape, ``sum(broadcast_to(x), broadcast axes) -> x * n``, matmuls contracting a single
    element (outer products) -> broadcast multiplies, and chains of scalar multiplies and negations
    into one multiply (``(x*a)*b -> x*(ab)``, ``-(x*a) -> x*(-a)``; the product of the constants is
    rounded once, so results can differ in the last bit); with ``assume_finite`` also ``x*0 -> 0``.  Only rewrites that keep the result's shape and dtype exactly."""
    P_ = PRIMITIVES
    const_vals = {v: np.asarray(c) for v, c in zip(graph.constvars, graph.consts)}
    producer: dict[Var, Eqn] = {}
    subst: dict[Var, Any] = {}
    eqns: list[Eqn] = []
    outset = {a for a in graph.outvars if isinstance(a, Var)}
    uses: dict = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                uses[a] = uses.get(a, 0) + 1
    for a in outset:
        uses[a] = uses.get(a, 0) + 1
    inset = set(graph.invars)  # outputs are fresh arrays: never rewrite an output into an input

    def s(a: Any) -> Any:
        while isinstance(a, Var) and a in subst:
            a = subst[a]
        return a

    def same(a: Any, out: Var) -> bool:
        return isinstance(a, Var) and a.aval == out.aval

    def emit(prim: Primitive, ins: Sequence[Any], attrs: dict, out: Var, source) -> None:
        e = Eqn(prim, ins, [out], attrs, source)
        eqns.append(e)
        producer[out] = e

    for e0 in graph.eqns:
        ins = [s(a) for a in e0.inputs]
        e = Eqn(e0.prim, ins, e0.outputs, e0.attrs, e0.source)
        out = e.outputs[0]
        name = e.prim.name
        rep: Any = None
        if name in ("mul", "neg"):
            folded = _fold_scalar_chain(e, ins, producer, uses)
            if folded is not None:
                emit(P_["mul"], folded, {}, out, e.source)
                continue
        if name == "mul":
            a, b = ins
            if _is_scalar_const(b, const_vals, 1.0) and same(a, out):
                rep = a
            elif _is_scalar_const(a, const_vals, 1.0) and same(b, out):
                rep = b
            elif assume_finite and is_float(out.aval.dtype) and (
                _is_scalar_const(a, const_vals, 0.0) or _is_scalar_const(b, const_vals, 0.0)
            ):
                emit(P_["full"], [], dict(shape=out.aval.shape, dtype=out.aval.dtype, value=0), out, e.source)
                continue
        elif name == "div":
            a, b = ins
            if _is_scalar_const(b, const_vals, 1.0) and same(a, out):
                rep = a
        elif name == "add":
            a, b = ins
            if _is_scalar_const(b, const_vals, 0.0) and same(a, out):
                rep = a
            elif _is_scalar_const(a, const_vals, 0.0) and same(b, out):
                rep = b
        elif name == "sub":
            a, b = ins
            if _is_scalar_const(b, const_vals, 0.0) and same(a, out):
                rep = a
        elif name == "pow":
            a, b = ins
            if _is_scalar_const(b, const_vals, 1.0) and same(a, out):
                rep = a
        elif name == "neg":
            p = producer.get(ins[0]) if isinstance(ins[0], Var) else None
            if p is not None and p.prim.name == "neg" and same(p.inputs[0], out):
                rep = p.inputs[0]
        elif name in ("cast", "broadcast_to"):
            if same(ins[0], out):
                rep = ins[0]
        elif name == "transpose":
            perm = tuple(e.attrs["perm"])
            p = producer.get(ins[0]) if isinstance(ins[0], Var) else None
            if _is_identity_perm(perm) and same(ins[0], out):
                rep = ins[0]
            elif p is not None and p.prim.name == "transpose":
                inner = tuple(p.attrs["perm"])
                comp = tuple(inner[i] for i in perm)
                src = p.inputs[0]
                if _is_identity_perm(comp) and same(src, out):
                    rep = src
                else:
                    emit(e.prim, [src], dict(perm=comp), out, e.source)
                    continue
        elif name in _RESHAPES:
            p = producer.get(ins[0]) if isinstance(ins[0], Var) else None
            src = ins[0]
            if p is not None and p.prim.name in _RESHAPES:
                src = p.inputs[0]
            if same(src, out):
                rep = src
            elif src is not ins[0]:
                emit(P_["reshape"], [src], dict(shape=out.aval.shape), out, e.source)
                continue
        elif name == "matmul":
            a, b = ins
            if isinstance(a, Var) and isinstance(b, Var) and a.aval.shape[-1] == 1:
                # a contraction over one element is an outer product: a broadcast multiply
                emit(P_["mul"], [a, b], {}, out, e.source)
                continue
        elif name == "reduce_sum":
            p = producer.get(ins[0]) if isinstance(ins[0], Var) else None
            if p is not None and p.prim.name == "broadcast_to" and isinstance(p.inputs[0], Var) and is_float(out.aval.dtype):
                x = p.inputs[0]
                bshape = tuple(p.attrs["shape"])
                xshape = (1,) * (len(bshape) - x.aval.ndim) + x.aval.shape
                axes = tuple(int(a) % len(bshape) for a in e.attrs["axes"])
                if x.aval.dtype == out.aval.dtype and all(xshape[a] == 1 for a in axes):
                    n = int(np.prod([bshape[a] for a in axes], dtype=np.int64))
                    # the result is x (reshaped, still broadcast on the other axes) times n
                    kd = e.attrs["keepdims"]
                    rshape = tuple(1 if i in axes else d for i, d in enumerate(xshape)) if kd else tuple(
                        d for i, d in enumerate(xshape) if i not in axes
                    )
                    cur: Any = x
                    if rshape != x.aval.shape:
                        v = Var(ShapedArray(rshape, x.aval.dtype))
                        emit(P_["reshape"], [cur], dict(shape=rshape), v, e.source)
                        cur = v
                    if rshape != out.aval.shape:
                        v = Var(ShapedArray(out.aval.shape, x.aval.dtype))
                        emit(P_["broadcast_to"], [cur], dict(shape=out.aval.shape), v, e.source)
                        cur = v
                    emit(P_["mul"], [cur, Literal(float(n), weak=True)], {}, out, e.source)
                    continue
        if rep is not None and not (out in outset and rep in inset):
            subst[out] = rep
            continue
        eqns.append(e)
        producer[out] = e
    g = Graph(graph.invars, graph.constvars, graph.consts, eqns, [s(a) for a in graph.outvars])
    return dead_code_elimination(g)


# ----------------------------------------------------------------------------- small reductions

_REDUCE_TO_BINARY = {"reduce_max": "maximum", "reduce_min": "minimum", "reduce_sum": "add"}


@dataclass(frozen=True)
class UnrollSmallReductions:
    """Rewrite a float max/min/sum over one axis of at most ``max_axis`` elements, whose result
    has at least ``min_elements`` elements, as a chain of elementwise maximum/minimum/add over
    slices of that axis (strength reduction: numpy's reduction loop over a short inner axis costs
    tens of times more per element than a binary ufunc over the slices, e.g. the softmax max/sum
    over 4 actions of a vmapped batch).  Sums then add in sequential order."""

    max_axis: int = 8
    min_elements: int = 1024

    @property
    def __name__(self) -> str:  # pipeline history / inspect
        return "unroll_small_reductions"

    def __call__(self, graph: Graph) -> Graph:
        eqns: list = []
        for e in graph.eqns:
            name = e.prim.name
            if name in _REDUCE_TO_BINARY and isinstance(e.inputs[0], Var):
                x = e.inputs[0]
                out = e.outputs[0]
                axes = tuple(int(a) % max(x.aval.ndim, 1) for a in e.attrs["axes"])
                if (
                    len(axes) == 1
                    and is_float(x.aval.dtype)
                    and x.aval.dtype == out.aval.dtype
                    and 1 <= x.aval.shape[axes[0]] <= self.max_axis
                    and out.aval.size >= self.min_elements
                    and not _last_axis_kernel(name, x, axes[0])
                ):
                    eqns.extend(_unrolled(e, x, out, axes[0]))
                    continue
            eqns.append(e)
        return Graph(graph.invars, graph.constvars, graph.consts, eqns, graph.outvars)


def _last_axis_kernel(name: str, x: Var, axis: int) -> bool:
    """Whether a reduction over the last axis has a better kernel than unrolling: the native
    row max/min, or (a sum of rank >= 3) ``sums_as_matmul``."""
    if axis != x.aval.ndim - 1 or x.aval.ndim < 2:
        return False
    if name == "reduce_sum":
        return x.aval.ndim >= 3 and x.aval.size >= sums_as_matmul.min_elements
    return row_reduce_native(x.aval, axis)


def _unrolled(e: Eqn, x: Var, out: Var, axis: int) -> list:
    nd = x.aval.ndim
    n = x.aval.shape[axis]
    kshape = tuple(1 if i == axis else d for i, d in enumerate(x.aval.shape))
    res: list = []
    slices = []
    for k in range(n):
        v = Var(ShapedArray(kshape, x.aval.dtype))
        starts = tuple(k if i == axis else 0 for i in range(nd))
        limits = tuple(k + 1 if i == axis else d for i, d in enumerate(x.aval.shape))
        res.append(Eqn(PRIMITIVES["slice"], [x], [v], dict(starts=starts, limits=limits, strides=(1,) * nd), e.source))
        slices.append(v)
    keep = out.aval.shape == kshape
    acc = slices[0]
    binop = PRIMITIVES[_REDUCE_TO_BINARY[e.prim.name]]
    for k in range(1, n):
        v = out if (k == n - 1 and keep) else Var(ShapedArray(kshape, x.aval.dtype))
        res.append(Eqn(binop, [acc, slices[k]], [v], {}, e.source))
        acc = v
    if acc is not out:
        res.append(Eqn(PRIMITIVES["reshape"], [acc], [out], dict(shape=out.aval.shape), e.source))
    return res


unroll_small_reductions = UnrollSmallReductions()


@dataclass(frozen=True)
class SumsAsMatmul:
    """Rewrite a float sum over the last or second-to-last axis of an array of rank >= 3 (and at
    least ``min_elements`` elements) as a matmul with a ones vector: BLAS runs these 4-6x faster
    than numpy's reduction loop (e.g. bias gradients of a vmapped batch).  Rank 2 is left to the
    executor, which already lowers it to ``np.dot``.  The summation order changes (BLAS order)."""

    min_elements: int = 4096

    @property
    def __name__(self) -> str:
        return "sums_as_matmul"

    def __call__(self, graph: Graph) -> Graph:
        eqns: list = []
        constvars, consts = list(graph.constvars), list(graph.consts)
        for e in graph.eqns:
            x = e.inputs[0] if e.inputs else None
            if e.prim.name == "reduce_sum" and isinstance(x, Var) and x.aval.ndim >= 3 and is_float(x.aval.dtype):
                out = e.outputs[0]
                nd = x.aval.ndim
                axes = tuple(int(a) % nd for a in e.attrs["axes"])
                if len(axes) == 1 and axes[0] >= nd - 2 and x.aval.size >= self.min_elements and out.aval.dtype == x.aval.dtype:
                    n = x.aval.shape[axes[0]]
                    ones = Var(ShapedArray((n, 1) if axes[0] == nd - 1 else (1, n), x.aval.dtype))
                    constvars.append(ones)
                    consts.append(np.ones(ones.aval.shape, x.aval.dtype))
                    if axes[0] == nd - 1:  # rows of the flattened leading axes: one matrix-vector product
                        rows = x.aval.size // n
                        x2 = Var(ShapedArray((rows, n), x.aval.dtype))
                        eqns.append(Eqn(PRIMITIVES["reshape"], [x], [x2], dict(shape=(rows, n)), e.source))
                        m = Var(ShapedArray((rows, 1), x.aval.dtype))
                        ins = [x2, ones]
                    else:
                        m = Var(ShapedArray(x.aval.shape[:-2] + (1, x.aval.shape[-1]), x.aval.dtype))
                        ins = [ones, x]
                    eqns.append(Eqn(PRIMITIVES["matmul"], ins, [m], {}, e.source))
                    eqns.append(Eqn(PRIMITIVES["reshape"], [m], [out], dict(shape=out.aval.shape), e.source))
                    continue
            eqns.append(e)
        return Graph(graph.invars, constvars, consts, eqns, graph.outvars)


sums_as_matmul = SumsAsMatmul()


# ----------------------------------------------------------------------------- pipeline


@dataclass(frozen=True)
class Pipeline:
    """Passes run in order, the whole list repeated until the equation count stops falling
    (at most ``max_rounds`` times).  ``record=True`` keeps each stage's graph in ``history``."""

    passes: tuple = ()
    max_rounds: int = 3

    def __call__(self, graph: Graph, history: list | None = None) -> Graph:
        for _ in range(self.max_rounds):
            before = len(graph.eqns)
            for p in self.passes:
                graph = p(graph)
                if history is not None:
                    history.append((pass_name(p), graph))
            if len(graph.eqns) >= before:
                break
        return graph


def pass_name(p: Any) -> str:
    return getattr(p, "__name__", type(p).__name__)


def fuse_elementwise(graph: Graph) -> Graph:
    """Elementwise fusion as the default pipeline runs it: trees the native VM executes in one
    call (``fusion.default_elementwise_fusion``)."""
    return default_elementwise_fusion(graph)


DEFAULT_PASSES: tuple = (
    constant_folding,
    algebraic_simplification,
    common_subexpression_elimination,
    unroll_small_reductions,
    sums_as_matmul,
    select_native_kernels,
    fuse_elementwise,
    dead_code_elimination,
)
DEFAULT_PIPELINE = Pipeline(DEFAULT_PASSES)

FUSION_PIPELINE = Pipeline(tuple(p for p in DEFAULT_PASSES if p is not fuse_elementwise) + (elementwise_fusion,))
"""The default passes with elementwise fusion of every fusible tree (not only what the native VM
runs): ``jit(fn, passes=passes.FUSION_PIPELINE)``."""


def resolve(passes: Any) -> Pipeline | None:
    """``None``/``"default"`` -> the default pipeline; ``()``/``False`` -> none; a sequence of
    passes or a Pipeline -> that pipeline."""
    if passes is None or (isinstance(passes, str) and passes == "default"):
        return DEFAULT_PIPELINE
    if passes is False or (isinstance(passes, (tuple, list)) and not passes):
        return None
    if isinstance(passes, Pipeline):
        return passes
    if callable(passes):
        return Pipeline((passes,))
    return Pipeline(tuple(passes))


__all__ = [
    "DEFAULT_PASSES",
    "DEFAULT_PIPELINE",
    "Pipeline",
    "Simplify",
    "SumsAsMatmul",
    "UnrollSmallReductions",
    "algebraic_simplification",
    "common_subexpression_elimination",
    "constant_folding",
    "dead_code_elimination",
    "fuse_elementwise",
    "resolve",
    "sums_as_matmul",
    "unroll_small_reductions",
]
