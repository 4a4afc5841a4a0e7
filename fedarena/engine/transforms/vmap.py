"""``vmap``: the batching transformation, an interpreter of the IR with one batching rule per primitive.

``vmap(fn)`` traces ``fn`` on one example (the inputs with the mapped axis removed), then replays
the graph's equations on batched values: every batched value carries its batch dimension in front
(axis 0) and each primitive's rule rewrites the equation so that it computes all examples at once
(JAX's batching interpreter; Bradbury et al., "JAX: composable transformations of Python+NumPy
programs", 2018, and the ``vmap`` design note).  The rewritten equations go through ``bind``, so a
vmapped function runs eagerly, inlines into ``jit``, and is differentiated by ``grad`` like any
other; ``vmap(grad(f))`` batches the forward and backward equations ``grad`` traced.

A primitive without a specialised rule is batched by the generic rule: unstack the batch, apply
the primitive per example, stack the results (correct for every primitive, fast for none).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..core.interpreter import interpret
from ..core.ir import EngineError, Literal, ShapedArray, Var
from ..core.pytree import tree_flatten, tree_unflatten
from ..core import buckets as _buckets
from ..core.tracing import Primitive, Tracer, aval_of, bind, bind_rule, names_with, source_scope, trace_flat

BatchRule = Callable[..., Any]
BATCH_RULES: dict[str, BatchRule] = {}
"""``rule(prim, vals, batched, size, **attrs) -> value batched on axis 0`` (a list of them for a
primitive with ``multiple_results``); ``vals[i]`` has its batch dimension in front when ``batched[i]``."""


def batch_rule(*names: str) -> Callable[[BatchRule], BatchRule]:
    def deco(fn: BatchRule) -> BatchRule:
        for n in names:
            BATCH_RULES[n] = fn
        return fn

    return deco


def _shape(x: Any) -> tuple:
    return aval_of(x).shape


def _ndim(x: Any) -> int:
    return len(aval_of(x).shape)


def _materialize(x: Any, size: int) -> Any:
    """An unbatched value broadcast to carry a batch axis in front."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        x = np.asarray(x)
    return P.broadcast_to(x, (size,) + _shape(x))


def _move_to_front(x: Any, axis: int) -> Any:
    nd = _ndim(x)
    axis = axis % nd
    if axis == 0:
        return x
    perm = (axis,) + tuple(i for i in range(nd) if i != axis)
    return P.transpose(x, perm)


def _move_from_front(x: Any, axis: int) -> Any:
    nd = _ndim(x)
    axis = axis % nd
    if axis == 0:
        return x
    perm = list(range(1, nd))
    perm.insert(axis, 0)
    return P.transpose(x, tuple(perm))


def _all_batched(vals: Sequence[Any], batched: Sequence[bool], size: int) -> list:
    return [v if b else _materialize(v, size) for v, b in zip(vals, batched)]


# ----------------------------------------------------------------------------- generic rule


def _generic_rule(prim: Primitive, vals, batched, size, **attrs):
    outs = []
    for i in range(size):
        args = []
        for v, b in zip(vals, batched):
            if b:
                nd = _ndim(v)
                s = bind(P.slice_p, v, starts=(i,) + (0,) * (nd - 1), limits=(i + 1,) + _shape(v)[1:], strides=(1,) * nd)
                args.append(P.reshape(s, _shape(v)[1:]))
            else:
                args.append(v)
        outs.append(bind(prim, *args, **attrs))
    if prim.multiple_results:  # one stack per output
        return [bind(P.stack_p, *col, axis=0) for col in zip(*outs)]
    return bind(P.stack_p, *outs, axis=0)


# ----------------------------------------------------------------------------- elementwise / matmul


def _aligned(vals, batched, out_rank: int):
    """Batched operands reshaped to ``(B, 1.., *shape)`` so numpy broadcasting lines the batch up."""
    res = []
    for v, b in zip(vals, batched):
        if b and _ndim(v) - 1 < out_rank:
            s = _shape(v)
            v = P.reshape(v, (s[0],) + (1,) * (out_rank - (len(s) - 1)) + s[1:])
        res.append(v)
    return res


def _unbatched_rank(vals, batched) -> int:
    return max((_ndim(v) - (1 if b else 0) for v, b in zip(vals, batched)), default=0)


_ELEMENTWISE = tuple(sorted(names_with("elementwise")))  # derived from the primitives' traits


@batch_rule(*_ELEMENTWISE)
def _elementwise_rule(prim, vals, batched, size, **attrs):
    r = _unbatched_rank(vals, batched)
    return bind(prim, *_aligned(vals, batched, r), **attrs)


@batch_rule("matmul")
def _matmul_rule(prim, vals, batched, size, **attrs):
    x, y = vals
    bx, by = batched
    if bx and not by and _ndim(y) == 2:
        # (B, ..., m, k) @ (k, n): one GEMM over all rows instead of B small ones
        s = _shape(x)
        out = bind(prim, P.reshape(x, (int(np.prod(s[:-1], dtype=np.int64)), s[-1])), y, **attrs)
        return P.reshape(out, s[:-1] + (_shape(y)[1],))
    if by and not bx and _ndim(x) == 2 and _ndim(y) == 3:
        # (m, k) @ (B, k, n): fold the batch into the columns
        b, k, n = _shape(y)
        yc = P.reshape(P.transpose(y, (1, 0, 2)), (k, b * n))
        out = P.reshape(bind(prim, x, yc, **attrs), (_shape(x)[0], b, n))
        return P.transpose(out, (1, 0, 2))
    r = _unbatched_rank(vals, batched)
    x, y = _aligned(vals, batched, r)
    if _shape(x)[-1] == 1 and _ndim(x) >= 2 and _ndim(y) >= 2:
        # contraction over one element (per-example outer products in backward passes): a
        # broadcast multiply is an order of magnitude cheaper than B tiny GEMMs
        return P.mul(x, y)
    return bind(prim, x, y, **attrs)


@batch_rule("one_hot")
def _front_preserving_rule(prim, vals, batched, size, **attrs):
    return bind(prim, *vals, **attrs)


# ----------------------------------------------------------------------------- reductions


def _shift_axes(axes, nd_unbatched: int) -> tuple:
    return tuple((int(a) % nd_unbatched) + 1 for a in axes)


@batch_rule("reduce_sum", "reduce_max", "reduce_min")
def _reduce_rule(prim, vals, batched, size, axes, keepdims):
    (x,) = vals
    return bind(prim, x, axes=_shift_axes(axes, _ndim(x) - 1), keepdims=keepdims)


@batch_rule("argmax")
def _argmax_rule(prim, vals, batched, size, axis, keepdims):
    (x,) = vals
    return bind(prim, x, axis=(int(axis) % (_ndim(x) - 1)) + 1, keepdims=keepdims)


# ----------------------------------------------------------------------------- shapes


@batch_rule("transpose")
def _transpose_rule(prim, vals, batched, size, perm):
    return bind(prim, vals[0], perm=(0,) + tuple(int(p) + 1 for p in perm))


@batch_rule("reshape")
def _reshape_rule(prim, vals, batched, size, shape):
    return bind(prim, vals[0], shape=(size,) + tuple(shape))


@batch_rule("broadcast_to")
def _broadcast_rule(prim, vals, batched, size, shape):
    (x,) = _aligned(vals, batched, len(shape))
    return bind(prim, x, shape=(size,) + tuple(shape))


@batch_rule("squeeze")
def _squeeze_rule(prim, vals, batched, size, axes):
    return bind(prim, vals[0], axes=_shift_axes(axes, _ndim(vals[0]) - 1))


@batch_rule("expand_dims")
def _expand_dims_rule(prim, vals, batched, size, axes):
    n_out = _ndim(vals[0]) - 1 + len(axes)
    return bind(prim, vals[0], axes=_shift_axes(axes, n_out))


@batch_rule("slice")
def _slice_rule(prim, vals, batched, size, starts, limits, strides):
    return bind(prim, vals[0], starts=(0,) + tuple(starts), limits=(size,) + tuple(limits), strides=(1,) + tuple(strides))


@batch_rule("pad")
def _pad_rule(prim, vals, batched, size, low, high, interior):
    return bind(prim, vals[0], low=(0,) + tuple(low), high=(0,) + tuple(high), interior=(0,) + tuple(interior))


@batch_rule("concatenate", "stack")
def _concat_rule(prim, vals, batched, size, axis):
    vals = _all_batched(vals, batched, size)
    nd = _ndim(vals[0]) - 1 + (1 if prim.name == "stack" else 0)
    return bind(prim, *vals, axis=(int(axis) % nd) + 1)


# ----------------------------------------------------------------------------- indexing


@batch_rule("gather")
def _gather_rule(prim, vals, batched, size, axis):
    x, idx = _all_batched(vals, batched, size)
    return bind(prim, x, idx, axis=(int(axis) % (_ndim(x) - 1)) + 1)


@batch_rule("scatter_add")
def _scatter_rule(prim, vals, batched, size, axis, shape):
    upd, idx = _all_batched(vals, batched, size)
    return bind(prim, upd, idx, axis=(int(axis) % len(shape)) + 1, shape=(size,) + tuple(shape))


def _batch_offsets(idx: Any, size: int, n: int) -> Any:
    """``idx[b] + b * n``: indices into the batch-flattened axis."""
    off = np.arange(size, dtype=aval_of(idx).dtype) * n
    return P.add(idx, np.reshape(off, (size,) + (1,) * (_ndim(idx) - 1)))


@batch_rule("take")
def _take_rule(prim, vals, batched, size, axis):
    x, idx = vals
    bx, bi = batched
    if bx and not bi:
        return bind(prim, x, idx, axis=(int(axis) % (_ndim(x) - 1)) + 1)
    if bi and not bx:
        ax = int(axis) % _ndim(x)
        return _move_to_front(bind(prim, x, idx, axis=ax), ax)
    # both batched: move the taken axis next to the batch axis, flatten the two, offset the indices
    ax = (int(axis) % (_ndim(x) - 1)) + 1
    if ax != 1:
        perm = (0, ax) + tuple(i for i in range(1, _ndim(x)) if i != ax)
        x = P.transpose(x, perm)
    s = _shape(x)
    flat = P.reshape(x, (s[0] * s[1],) + s[2:])
    out = bind(prim, flat, _batch_offsets(idx, size, s[1]), axis=0)  # (B, *idx, *rest)
    if ax != 1:
        k = _ndim(idx) - 1  # index dims after the batch
        nd = _ndim(out)
        rest = list(range(1 + k, nd))
        # rest dims of x in original order were [1..ax-1] then [ax+1..]; those before ax go first
        before = rest[: ax - 1]
        after = rest[ax - 1 :]
        out = P.transpose(out, tuple([0] + before + list(range(1, 1 + k)) + after))
    return out


def _index_add(prim, vals, batched, bsize, **attrs):
    axis, n = int(attrs["axis"]), int(attrs["size"])
    upd, idx = vals
    bu, bi = batched
    if bu and not bi:
        return bind(prim, upd, idx, axis=axis + 1, size=n)
    upd, idx = _all_batched(vals, batched, bsize)
    k = _ndim(idx) - 1
    if axis != 0:
        # bring the index dims right after the batch axis
        nd = _ndim(upd)
        idx_dims = list(range(1 + axis, 1 + axis + k))
        others = [i for i in range(1, nd) if i not in idx_dims]
        upd = P.transpose(upd, tuple([0] + idx_dims + others))
    s = _shape(upd)
    upd2 = P.reshape(upd, (s[0] * int(np.prod(s[1 : 1 + k], dtype=np.int64)),) + s[1 + k :])
    idx2 = P.reshape(_batch_offsets(idx, bsize, n), (s[0] * int(np.prod(s[1 : 1 + k], dtype=np.int64)),))
    out = bind(prim, upd2, idx2, axis=0, size=bsize * n)  # (B*n, *rest)
    out = P.reshape(out, (bsize, n) + s[1 + k :])
    if axis != 0:
        nd = _ndim(out)
        perm = [0] + list(range(2, 2 + axis)) + [1] + list(range(2 + axis, nd))
        out = P.transpose(out, tuple(perm))
    return out


BATCH_RULES["index_add"] = _index_add  # registered by hand: the primitive's ``size`` attribute clashes with the rule's


# ----------------------------------------------------------------------------- convolution and pooling


def _fold(x: Any) -> tuple[Any, tuple]:
    s = _shape(x)
    return P.reshape(x, (s[0] * s[1],) + s[2:]), s


@batch_rule("conv2d")
def _conv_rule(prim, vals, batched, size, **attrs):
    x, w = vals
    bx, bw = batched
    if bw:
        return _generic_rule(prim, vals, batched, size, **attrs)
    xf, s = _fold(x)
    out = bind(prim, xf, w, **attrs)
    return P.reshape(out, (s[0], s[1]) + _shape(out)[1:])


@batch_rule("max_pool2d", "avg_pool2d", "im2col")
def _fold_rule(prim, vals, batched, size, **attrs):
    xf, s = _fold(vals[0])
    out = bind(prim, xf, **attrs)
    return P.reshape(out, (s[0], s[1]) + _shape(out)[1:])


@batch_rule("col2im")
def _col2im_rule(prim, vals, batched, size, **attrs):
    xf, s = _fold(vals[0])
    xs = tuple(attrs["x_shape"])
    out = bind(prim, xf, **dict(attrs, x_shape=(size * xs[0],) + xs[1:]))
    return P.reshape(out, (size,) + xs)


# ----------------------------------------------------------------------------- the interpreter


def batch_graph(graph, args: Sequence[Any], batched: Sequence[bool], size: int) -> tuple[list, list]:
    """Replay ``graph`` on ``args`` (batched ones with the batch axis in front); return the output
    values and whether each is batched."""
    def rule(e, ins: list) -> tuple:
        vals = [v for v, _ in ins]
        flags = [b for _, b in ins]
        if not any(flags):
            out = bind_rule(e, vals)
            return [(o, False) for o in out] if e.prim.multiple_results else (out, False)
        rule_fn = BATCH_RULES.get(e.prim.name)
        if rule_fn is None:
            custom = getattr(e.prim, "batch", None)
            rule_fn = custom if custom is not None else _generic_rule
        with source_scope(e.source):  # batched equations keep the user's source line
            out = rule_fn(e.prim, vals, flags, size, **e.attrs)
        outs = list(out) if e.prim.multiple_results else [out]
        for o, v in zip(outs, e.outputs):
            want = (size,) + v.aval.shape
            if _shape(o) != want:  # pragma: no cover - a rule bug
                raise EngineError(f"vmap: batching rule of {e.prim.name} gave shape {_shape(o)}, expected {want}")
        return [(o, True) for o in outs] if e.prim.multiple_results else (out, True)

    res, _ = interpret(graph, [(a, b) for a, b in zip(args, batched)], rule, lift=lambda c: (c, False))
    return [v for v, _ in res], [b for _, b in res]


def _axes_for(in_axes: Any, args: tuple) -> list:
    """One axis (int or None) per flattened leaf of ``args``."""
    if isinstance(in_axes, (int, type(None))):
        per_arg = [in_axes] * len(args)
    elif isinstance(in_axes, (tuple, list)):
        if len(in_axes) != len(args):
            raise EngineError(f"vmap: in_axes has {len(in_axes)} entries but the function got {len(args)} arguments")
        per_arg = list(in_axes)
    else:
        raise EngineError(f"vmap: in_axes must be an int, None, or a tuple with one entry per argument, got {in_axes!r}")
    out = []
    for a, ax in zip(args, per_arg):
        n = len(tree_flatten(a)[0])
        if isinstance(ax, (int, type(None))):
            out.extend([ax] * n)
        else:
            leaves_ax = _prefix_leaves(ax, a)
            out.extend(leaves_ax)
    return out


def _prefix_leaves(ax_tree: Any, arg: Any) -> list:
    if isinstance(ax_tree, (int, type(None))):
        return [ax_tree] * len(tree_flatten(arg)[0])
    if isinstance(ax_tree, dict) and isinstance(arg, dict):
        if set(ax_tree) != set(arg):
            raise EngineError(f"vmap: in_axes keys {sorted(ax_tree)} do not match argument keys {sorted(arg)}")
        return [x for k in sorted(arg) for x in _prefix_leaves(ax_tree[k], arg[k])]
    if isinstance(ax_tree, (list, tuple)) and isinstance(arg, (list, tuple)) and len(ax_tree) == len(arg):
        return [x for t, a in zip(ax_tree, arg) for x in _prefix_leaves(t, a)]
    raise EngineError(f"vmap: in_axes entry {ax_tree!r} does not match the argument's structure")


def vmap(fn: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """Vectorise ``fn`` over an axis of its inputs.

    ``in_axes``: an int (the mapped axis of every input), ``None`` (not mapped), or a tuple with one
    entry per positional argument (each an int, ``None`` or a pytree of those matching the argument).
    ``out_axes``: an int, or a pytree prefix of the output of ints.  All mapped inputs must have the
    same size along their mapped axis.  Keyword arguments are mapped over their leading axis (JAX's
    convention: ``in_axes`` describes the positional arguments only).
    """

    def wrapped(*args: Any, **kwargs: Any):
        axes = _axes_for(in_axes, args) + [0] * len(tree_flatten(kwargs)[0])
        flat, arg_trees = [], []
        for a in (*args, kwargs):
            leaves, td = tree_flatten(a)
            arg_trees.append((td, len(leaves)))
            flat.extend(leaves)
        size = None
        vals, batched, avals, traced = [], [], [], []
        for k, (x, ax) in enumerate(zip(flat, axes)):
            static = isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)
            if static:
                if ax is not None:
                    raise EngineError(f"vmap: argument leaf {k} is a Python scalar but in_axes maps axis {ax}")
                continue
            if not isinstance(x, Tracer):
                x = np.asarray(x)
            av = aval_of(x)
            if ax is not None:
                if not -av.ndim <= ax < av.ndim:
                    raise EngineError(f"vmap: in_axes {ax} is out of range for an input of shape {av.shape}")
                n = av.shape[ax]
                if size is None:
                    size = n
                elif n != size:
                    raise EngineError(f"vmap: mapped inputs have different sizes along their axes ({size} and {n})")
                x = _move_to_front(x, ax)
                av = ShapedArray(av.shape[:ax % av.ndim] + av.shape[ax % av.ndim + 1 :], av.dtype)
            vals.append(x)
            batched.append(ax is not None)
            avals.append(av)
            traced.append(k)
        if size is None:
            raise EngineError("vmap: no input is mapped (every in_axes entry is None)")
        out_tree: list = []

        def flat_fn(tracers: list) -> list:
            full = list(flat)
            for k, t in zip(traced, tracers):
                full[k] = t
            it = iter(full)
            rebuilt = [tree_unflatten(td, [next(it) for _ in range(n)]) for td, n in arg_trees]
            out = fn(*rebuilt[:-1], **rebuilt[-1])
            leaves, td = tree_flatten(out)
            out_tree.append(td)
            return leaves

        with _buckets.scope(None):  # the mapped function sees one example: no padded batch axis inside
            graph, captured = trace_flat(flat_fn, avals)
        outs, out_b = batch_graph(graph, vals + captured, batched + [False] * len(captured), size)
        out_ax = _out_axes(out_axes, out_tree[0], len(outs))
        res = []
        for o, b, ax in zip(outs, out_b, out_ax):
            if isinstance(o, (bool, int, float)) and not isinstance(o, np.generic):
                o = np.asarray(o)
            if ax is None:
                if b:
                    raise EngineError("vmap: out_axes is None for an output that depends on the mapped inputs")
                res.append(o)
                continue
            if not b:
                o = _materialize(o, size)
            res.append(_move_from_front(o, ax))
        return tree_unflatten(out_tree[0], res)

    wrapped.__name__ = f"vmap({getattr(fn, '__name__', 'fn')})"
    return wrapped


def _out_axes(out_axes: Any, td: tuple, n: int) -> list:
    if isinstance(out_axes, (int, type(None))):
        return [out_axes] * n
    skeleton = tree_unflatten(td, list(range(n)))
    return _prefix_leaves(out_axes, skeleton)


__all__ = ["BATCH_RULES", "batch_graph", "batch_rule", "vmap"]
