"""Helpers every primitive family shares: dtype promotion (numpy 2, weak Python scalars),
broadcasting, ``_define`` (registers a primitive with its rules), and the internal binders
(``add``, ``mul``, ``reshape``, ...) that VJP/JVP rules are written with.  The binders find their
primitive in the registry by name, so this module needs no family.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..core.ir import ShapeError, ShapedArray, is_float
from ..core.tracing import PRIMITIVES, Primitive, aval_of, bind, register

# ============================================================================ helpers


def shape_of(x: Any) -> tuple:
    return aval_of(x).shape


def dtype_of(x: Any) -> np.dtype:
    return aval_of(x).dtype


def _stand_in(av: ShapedArray) -> Any:
    return 0.0 if is_float(av.dtype) else {"b": False, "i": 0, "u": 0}[av.dtype.kind]


def promote(avals: Sequence[ShapedArray], weak: Sequence[bool]) -> np.dtype:
    """numpy's result type, with Python scalars weak (NEP 50)."""
    parts = [_stand_in(av) if w else av.dtype for av, w in zip(avals, weak)]
    return np.result_type(*parts)


def broadcast_shapes(*shapes: tuple) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(s) for s in shapes)} do not broadcast") from None


def _floatify(dt: np.dtype) -> np.dtype:
    return dt if is_float(dt) else np.dtype(np.float64)


def _define(
    name: str,
    rule: Callable,
    impl: Callable,
    emit: Callable | None,
    vjp: Callable | None = None,
    jvp: Callable | None = None,
    differentiable: bool = True,
    traits: Sequence[str] = (),
    batch: Callable | None = None,
    cuda: Callable | None = None,
    cuda_expr: Callable | None = None,
    transpose: Callable | None = None,
    linearity: str | None = None,
    scalar_emit: str | Callable | None = None,
) -> Primitive:
    """Register primitive ``name`` with its rules (see :class:`~fedarena.engine.core.tracing.Primitive`):
    shape/dtype ``rule``, numpy ``impl``, ``emit`` rule, ``vjp``/``jvp``, ``batch`` rule of vmap,
    ``cuda`` step rule and ``cuda_expr`` element expression of the cupy backend, ``scalar_emit`` form
    on 0-d numpy scalars for the numpy executor.

    A linear primitive gives its ``transpose`` rule and its ``linearity`` (see :data:`LINEARITY`)
    instead of a VJP: its VJP is the transpose and, unless ``jvp`` is given (to avoid materialising
    zero tangents), its JVP is derived from the linearity."""
    if transpose is not None:
        if vjp is not None or linearity not in LINEARITY:
            raise ValueError(f"{name}: a linear primitive gives a transpose rule and its linearity {sorted(LINEARITY)}, not a VJP")
    p = register(name)
    p.traits = frozenset(traits)
    p.abstract_eval = rule
    p.impl = impl
    p.emit = emit
    p.vjp = vjp
    p.jvp = jvp
    p.differentiable = differentiable
    p.batch = batch
    p.cuda = cuda
    p.cuda_expr = cuda_expr
    p.transpose = transpose
    p.linearity = linearity
    p.scalar_emit = scalar_emit
    if transpose is not None:
        p.vjp = transpose  # reverse mode of a linear map: its transpose
        if jvp is None:
            p.jvp = LINEARITY[linearity](p)
    return p


# ============================================================================ linear primitives
# The JVP of a linear map is the map applied to the tangents; only its transpose is written by hand.


def sum_tangents(out, *terms):
    """The sum of the tangent terms that are not ``None``, each broadcast to ``out``'s shape."""
    acc = None
    for t in terms:
        if t is None:
            continue
        t = _bcast_tangent(t, shape_of(out))
        acc = t if acc is None else add(acc, t)
    return acc


def _first_linear_jvp(prim: Primitive) -> Callable:
    """Linear in the first operand; the others (indices) carry no tangent."""

    def jvp(ts, out, x, *rest, **attrs):
        return None if ts[0] is None else bind(prim, ts[0], *rest, **attrs)

    return jvp


def _joint_linear_jvp(prim: Primitive) -> Callable:
    """Linear in all operands together: the primitive of the tangents (zeros where none flows)."""

    def jvp(ts, out, *xs, **attrs):
        return bind(prim, *[zeros_like_aval(aval_of(x)) if t is None else t for t, x in zip(ts, xs)], **attrs)

    return jvp


def _bilinear_jvp(prim: Primitive) -> Callable:
    """Linear in each of its two operands: ``f(tx, y) + f(x, ty)``."""

    def jvp(ts, out, x, y, **attrs):
        a = None if ts[0] is None else bind(prim, ts[0], y, **attrs)
        b = None if ts[1] is None else bind(prim, x, ts[1], **attrs)
        return sum_tangents(out, a, b)

    return jvp


LINEARITY = {"first": _first_linear_jvp, "joint": _joint_linear_jvp, "bilinear": _bilinear_jvp}
"""How a linear primitive is linear, and the JVP that follows from it."""


# ============================================================================ batching (vmap) helpers
# A batching rule ``rule(prim, vals, batched, size, **attrs)`` gets ``vals[i]`` with its batch axis in
# front when ``batched[i]`` and returns the result batched on axis 0 (JAX's batching interpreter;
# Bradbury et al., "JAX: composable transformations of Python+NumPy programs", 2018).


def _ndim(x: Any) -> int:
    return len(aval_of(x).shape)


def materialize(x: Any, size: int) -> Any:
    """An unbatched value broadcast to carry a batch axis of ``size`` in front."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        x = np.asarray(x)
    return broadcast_to(x, (size,) + shape_of(x))


def all_batched(vals: Sequence[Any], batched: Sequence[bool], size: int) -> list:
    """Every operand with a batch axis in front (unbatched ones broadcast)."""
    return [v if b else materialize(v, size) for v, b in zip(vals, batched)]


def move_to_front(x: Any, axis: int) -> Any:
    """``x`` with its axis ``axis`` moved to the front."""
    nd = _ndim(x)
    axis = axis % nd
    if axis == 0:
        return x
    return transpose(x, (axis,) + tuple(i for i in range(nd) if i != axis))


def shift_axes(axes: Sequence[int], nd_unbatched: int) -> tuple:
    """Axes of an unbatched operand of rank ``nd_unbatched`` as axes of its batched version."""
    return tuple((int(a) % nd_unbatched) + 1 for a in axes)


def fold_batch(x: Any) -> tuple[Any, tuple]:
    """The batch axis folded into the next one: ``(B, N, ...) -> (B*N, ...)``, and the old shape."""
    s = shape_of(x)
    return reshape(x, (s[0] * s[1],) + s[2:]), s


def loop_batching(prim: Primitive, vals, batched, size, **attrs):
    """The batching rule of a primitive declared without a specialised one: unstack the batch,
    apply the primitive per example, stack the results (correct for every primitive, fast for none)."""
    outs = []
    for i in range(size):
        args = []
        for v, b in zip(vals, batched):
            if b:
                nd = _ndim(v)
                s = bind(PRIMITIVES["slice"], v, starts=(i,) + (0,) * (nd - 1), limits=(i + 1,) + shape_of(v)[1:], strides=(1,) * nd)
                args.append(reshape(s, shape_of(v)[1:]))
            else:
                args.append(v)
        outs.append(bind(prim, *args, **attrs))
    if prim.multiple_results:  # one stack per output
        return [bind(PRIMITIVES["stack"], *col, axis=0) for col in zip(*outs)]
    return bind(PRIMITIVES["stack"], *outs, axis=0)


def host_only(eqn: Any, lib: Any) -> None:
    """The cupy rule of a primitive declared to run its numpy kernel on host copies on that backend."""
    return None


# Internal binders used by the rules (public, numpy-named versions live in ops.py).


def add(x, y):
    return bind(PRIMITIVES["add"], x, y)


def sub(x, y):
    return bind(PRIMITIVES["sub"], x, y)


def mul(x, y):
    return bind(PRIMITIVES["mul"], x, y)


def div(x, y):
    return bind(PRIMITIVES["div"], x, y)


def neg(x):
    return bind(PRIMITIVES["neg"], x)


def exp(x):
    return bind(PRIMITIVES["exp"], x)


def log(x):
    return bind(PRIMITIVES["log"], x)


def sign(x):
    return bind(PRIMITIVES["sign"], x)


def select(p, a, b):
    return bind(PRIMITIVES["select"], p, a, b)


def eq(x, y):
    return bind(PRIMITIVES["eq"], x, y)


def gt(x, y):
    return bind(PRIMITIVES["gt"], x, y)


def ge(x, y):
    return bind(PRIMITIVES["ge"], x, y)


def le(x, y):
    return bind(PRIMITIVES["le"], x, y)


def logical_and(x, y):
    return bind(PRIMITIVES["and"], x, y)


def cast(x, dtype):
    dtype = np.dtype(dtype)
    if dtype_of(x) == dtype and not isinstance(x, (bool, int, float)):
        return x
    return bind(PRIMITIVES["cast"], x, dtype=dtype)


def reduce_sum(x, axes, keepdims=False):
    return bind(PRIMITIVES["reduce_sum"], x, axes=tuple(axes), keepdims=bool(keepdims))


def reshape(x, shape):
    shape = tuple(int(s) for s in shape)
    if shape_of(x) == shape:
        return x
    return bind(PRIMITIVES["reshape"], x, shape=shape)


def broadcast_to(x, shape):
    shape = tuple(int(s) for s in shape)
    if shape_of(x) == shape and not isinstance(x, (bool, int, float)):
        return x
    return bind(PRIMITIVES["broadcast_to"], x, shape=shape)


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind(PRIMITIVES["transpose"], x, perm=perm)


def matmul(x, y):
    return bind(PRIMITIVES["matmul"], x, y)


def full(shape, dtype, value=0):
    return bind(PRIMITIVES["full"], shape=tuple(int(s) for s in shape), dtype=np.dtype(dtype), value=value)


def zeros_like_aval(av: ShapedArray):
    return full(av.shape, av.dtype, 0)


def unbroadcast(ct, shape: tuple):
    """Sum ``ct`` over the axes along which a value of ``shape`` was broadcast."""
    cs = shape_of(ct)
    shape = tuple(shape)
    if cs == shape:
        return ct
    lead = len(cs) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and cs[i + lead] != 1)
    r = reduce_sum(ct, axes) if axes else ct
    return reshape(r, shape)


def _bcast_tangent(t, shape):
    return broadcast_to(t, shape) if shape_of(t) != tuple(shape) else t


def _swap_last(x):
    n = len(shape_of(x))
    return transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))
