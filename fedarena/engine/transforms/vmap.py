"""``vmap``: the batching transformation, an interpreter of the IR with one batching rule per primitive.

``vmap(fn)`` traces ``fn`` on one example (the inputs with the mapped axis removed), then replays
the graph's equations on batched values: every batched value carries its batch dimension in front
(axis 0) and each primitive's rule rewrites the equation so that it computes all examples at once
(JAX's batching interpreter; Bradbury et al., "JAX: composable transformations of Python+NumPy
programs", 2018, and the ``vmap`` design note).  The rewritten equations go through ``bind``, so a
vmapped function runs eagerly, inlines into ``jit``, and is differentiated by ``grad`` like any
other; ``vmap(grad(f))`` batches the forward and backward equations ``grad`` traced.

Each primitive carries its batching rule beside its definition (``prim.batch``, in its family file);
one without a specialised rule declares ``primitives.base.loop_batching`` (unstack the batch, apply
the primitive per example, stack the results), and one with neither is refused in one line.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import primitives as P
from ..core.interpreter import interpret
from ..core.ir import EngineError, ShapedArray
from ..core.pytree import tree_flatten, tree_unflatten
from ..core import buckets as _buckets
from ..core.tracing import Tracer, aval_of, bind_rule, source_scope, trace_flat
from ..primitives.base import materialize, move_to_front

def _shape(x: Any) -> tuple:
    return aval_of(x).shape


def _ndim(x: Any) -> int:
    return len(aval_of(x).shape)


def _move_from_front(x: Any, axis: int) -> Any:
    nd = _ndim(x)
    axis = axis % nd
    if axis == 0:
        return x
    perm = list(range(1, nd))
    perm.insert(axis, 0)
    return P.transpose(x, tuple(perm))


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
        rule_fn = e.prim.batch
        if rule_fn is None:
            raise EngineError(
                f"vmap: primitive {e.prim.name!r} has no batching rule (define its batch rule beside the primitive, "
                "or declare primitives.base.loop_batching for a per-example loop)"
            )
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
                x = move_to_front(x, ax)
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
                o = materialize(o, size)
            res.append(_move_from_front(o, ax))
        return tree_unflatten(out_tree[0], res)

    wrapped.__name__ = f"vmap({getattr(fn, '__name__', 'fn')})"
    return wrapped


def _out_axes(out_axes: Any, td: tuple, n: int) -> list:
    if isinstance(out_axes, (int, type(None))):
        return [out_axes] * n
    skeleton = tree_unflatten(td, list(range(n)))
    return _prefix_leaves(out_axes, skeleton)


__all__ = ["batch_graph", "vmap"]
