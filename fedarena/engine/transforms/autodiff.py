"""Automatic differentiation as a graph transformation.

``grad``/``value_and_grad``/``vjp`` trace the function into a :class:`~fedarena.engine.core.ir.Graph`,
replay its equations, then walk them in reverse applying each primitive's VJP rule and summing
cotangents of variables used more than once (reverse-mode accumulation; Griewank & Walther,
"Evaluating Derivatives", 2nd ed., sec. 3.2).  ``jvp`` walks forward with JVP rules (sec. 3.1).
The emitted backward equations go through ``bind``, so they land in whatever trace is active:
inside ``jit`` the gradient becomes part of the compiled graph, outside it runs eagerly, and
nesting (grad of grad, Hessian-vector products) works because the rules are themselves traced.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import ops
from .. import primitives as P
from ..core.ir import EngineError, Graph, Literal, ShapedArray, Var, is_float
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.interpreter import interpret
from ..core.tracing import Tracer, aval_of, bind, bind_rule, current_trace, source_scope, trace_flat


def _read(env: dict, a: Any) -> Any:
    if isinstance(a, Literal):
        return a.value if a.weak else np.asarray(a.value, a.aval.dtype)[()]
    return env[a]


def forward(graph: Graph, args: Sequence[Any], active: Sequence[bool]) -> tuple[dict, set]:
    """Replay ``graph`` on ``args``; return the value environment and the set of variables that
    depend differentiably on the inputs flagged ``active``.  A primitive with a ``vjp_forward`` rule
    computes its output and residuals there (instead of binding itself); the environment keeps the
    residuals under the equation, for its ``vjp_saved`` rule in :func:`backward`."""
    live = {v for v, a in zip(graph.invars, active) if a}
    saved: dict = {}

    def rule(e, ins):
        if e.prim.differentiable and any(isinstance(a, Var) and a in live for a in e.inputs):
            live.update(e.outputs)
            if e.prim.vjp_forward is not None:  # the primitive computes what its VJP needs now (custom_vjp's fwd)
                with source_scope(e.source):
                    out, saved[e] = e.prim.vjp_forward(ins, **e.attrs)
                return out
        return bind_rule(e, ins)

    env = interpret(graph, args, rule)[1]
    env.update(saved)  # keyed by equation: the residuals backward hands to vjp_saved
    return env, live


def _accumulate(cts: dict, v: Var, g: Any) -> None:
    av = aval_of(g)
    if av.dtype != v.aval.dtype:
        g = P.cast(g, v.aval.dtype)
    if av.shape != v.aval.shape:
        g = P.broadcast_to(g, v.aval.shape)
    prev = cts.get(v)
    cts[v] = g if prev is None else P.add(prev, g)


def backward(graph: Graph, env: dict, live: set, out_cts: Sequence[Any]) -> list[Any]:
    """Reverse sweep: cotangents of the graph inputs (``None`` where none flows)."""
    cts: dict[Var, Any] = {}
    for v, c in zip(graph.outvars, out_cts):
        if c is not None and isinstance(v, Var) and v in live:
            _accumulate(cts, v, c)
    for e in reversed(graph.eqns):
        if e.prim.multiple_results:  # a list of cotangents (None for an output without one) and outputs
            c = [cts.pop(o, None) for o in e.outputs]
            if all(x is None for x in c):
                continue
            out = [env[o] for o in e.outputs]
        else:
            o = e.outputs[0]
            c = cts.pop(o, None)
            if c is None:
                continue
            out = env[o]
        if e.prim.vjp is None:
            raise EngineError(f"primitive {e.prim.name!r} has no VJP rule (at {e.source})")
        need = tuple(isinstance(a, Var) and a in live for a in e.inputs)
        ins = [_read(env, a) for a in e.inputs]
        with source_scope(e.source):
            if e in env:  # residuals saved by vjp_forward in the forward pass
                gs = e.prim.vjp_saved(env[e], need, c, out, *ins, **e.attrs)
            else:
                gs = e.prim.vjp(need, c, out, *ins, **e.attrs)
            for a, n, g in zip(e.inputs, need, gs):
                if n and g is not None:
                    _accumulate(cts, a, g)
    return [cts.get(v) for v in graph.invars]


def _zeros(av: ShapedArray) -> Any:
    if current_trace() is None:
        return np.zeros(av.shape, av.dtype)
    return P.full(av.shape, av.dtype, 0)


# ----------------------------------------------------------------------------- function-level API


def _as_input(x: Any, differentiable: bool, what: str) -> Any:
    if isinstance(x, Tracer):
        if differentiable and not is_float(x.dtype):
            raise EngineError(f"{what}: can only differentiate with respect to float arrays, got {x.dtype}")
        return x
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic) and not differentiable:
        return x  # static Python scalar
    arr = np.asarray(x)
    if differentiable and not is_float(arr.dtype):
        raise EngineError(f"{what}: can only differentiate with respect to float arrays, got {arr.dtype}")
    return arr


def _trace_call(fn: Callable, args: tuple, kwargs: dict, diff_mask: Sequence[bool], what: str):
    """Flatten args, trace fn over them; return (graph, flat input values, per-input active flags,
    arg treedef, output treedef holder)."""
    flat, flags, positions = [], [], []
    arg_trees = []
    for i, a in enumerate(args):
        leaves, td = tree_flatten(a)
        arg_trees.append(td)
        for leaf in leaves:
            v = _as_input(leaf, diff_mask[i], what)
            flat.append(v)
            flags.append(diff_mask[i])
            positions.append(i)
    traced_idx = [k for k, v in enumerate(flat) if not (isinstance(v, (bool, int, float)) and not isinstance(v, np.generic))]
    out_tree: list = []

    def flat_fn(tracers: list) -> list:
        vals = list(flat)
        for k, t in zip(traced_idx, tracers):
            vals[k] = t
        it = iter(vals)
        rebuilt = []
        for td, a in zip(arg_trees, args):
            n = len(tree_flatten(a)[0])
            rebuilt.append(tree_unflatten(td, [next(it) for _ in range(n)]))
        out = fn(*rebuilt, **kwargs)
        leaves, td = tree_flatten(out)
        out_tree.append(td)
        return leaves

    graph, captured = trace_flat(flat_fn, [aval_of(flat[k]) for k in traced_idx])
    in_vals = [flat[k] for k in traced_idx] + captured
    active = [flags[k] for k in traced_idx] + [False] * len(captured)
    groups = [positions[k] for k in traced_idx]
    return graph, in_vals, active, groups, arg_trees, out_tree[0], traced_idx, flat


def _norm_argnums(argnums: int | Sequence[int], n: int) -> tuple[tuple[int, ...], bool]:
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not -n <= a < n:
            raise EngineError(f"argnums {argnums} out of range for a call with {n} positional arguments")
    return tuple(a % n for a in nums), single


def value_and_grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Return ``f(*args) -> (value, grads)`` (``((value, aux), grads)`` with ``has_aux``).

    ``fn`` must return a scalar float (or ``(scalar, aux)``). ``grads`` has the structure of
    ``args[argnums]`` (a tuple of them when ``argnums`` is a sequence).
    """

    def wrapped(*args: Any, **kwargs: Any):
        nums, single = _norm_argnums(argnums, len(args))
        mask = [i in nums for i in range(len(args))]
        graph, in_vals, active, groups, arg_trees, out_td, traced_idx, flat = _trace_call(
            fn, args, kwargs, mask, "grad"
        )
        env, live = forward(graph, in_vals, active)
        outs = [_read(env, a) for a in graph.outvars]
        out = tree_unflatten(out_td, outs)
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise EngineError("grad(has_aux=True): the function must return (scalar, aux)")
            value, aux = out
        else:
            value, aux = out, None
        vav = aval_of(value) if isinstance(value, (Tracer, np.ndarray, np.generic)) else None
        if vav is None or vav.shape != () or not is_float(vav.dtype):
            raise EngineError(
                f"grad: the function must return a float scalar (got {vav.str_short() if vav else type(value).__name__}); "
                "use vjp for non-scalar outputs"
            )
        loss_var = graph.outvars[0]
        cts_out = [None] * len(graph.outvars)
        cts_out[0] = np.ones((), vav.dtype)
        if not isinstance(loss_var, Var):
            cts_out[0] = None
        in_cts = backward(graph, env, live, cts_out)
        # regroup per argument
        per_leaf: list[Any] = [None] * len(flat)
        for k, c in zip(traced_idx, in_cts[: len(traced_idx)]):
            per_leaf[k] = c
        grads_all = []
        k = 0
        for i, (td, a) in enumerate(zip(arg_trees, args)):
            n = len(tree_flatten(a)[0])
            if mask[i]:
                leaves = []
                for j in range(k, k + n):
                    c = per_leaf[j]
                    leaves.append(_zeros(aval_of(flat[j])) if c is None else c)
                grads_all.append(tree_unflatten(td, leaves))
            k += n
        grads = grads_all[0] if single else tuple(grads_all)
        return ((value, aux), grads) if has_aux else (value, grads)

    wrapped.__name__ = f"value_and_grad({getattr(fn, '__name__', 'fn')})"
    return wrapped


def grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Return ``f(*args) -> grads`` (``(grads, aux)`` with ``has_aux``) of a scalar function."""
    vg = value_and_grad(fn, argnums, has_aux)

    def wrapped(*args: Any, **kwargs: Any):
        v, g = vg(*args, **kwargs)
        return (g, v[1]) if has_aux else g

    wrapped.__name__ = f"grad({getattr(fn, '__name__', 'fn')})"
    return wrapped


def vjp(fn: Callable, *primals: Any, has_aux: bool = False):
    """Return ``(out, vjp_fn)`` (``(out, vjp_fn, aux)`` with ``has_aux``); ``vjp_fn(cotangent)``
    returns a tuple with one cotangent pytree per primal."""
    graph, in_vals, active, groups, arg_trees, out_td, traced_idx, flat = _trace_call(
        fn, primals, {}, [True] * len(primals), "vjp"
    )
    env, live = forward(graph, in_vals, active)
    outs = [_read(env, a) for a in graph.outvars]
    out = tree_unflatten(out_td, outs)
    aux = None
    n_main = len(graph.outvars)
    if has_aux:
        out, aux = out
        n_main = len(tree_flatten(out)[0])

    def vjp_fn(cotangent: Any) -> tuple:
        ct_leaves, ct_td = tree_flatten(cotangent)
        main_td = tree_flatten(out)[1]
        if ct_td != main_td:
            raise EngineError("vjp_fn: cotangent structure does not match the function output")
        for c, o in zip(ct_leaves, outs[:n_main]):
            if aval_of(c).shape != aval_of(o).shape:
                raise EngineError(f"vjp_fn: cotangent shape {aval_of(c).shape} does not match output shape {aval_of(o).shape}")
        cts = list(ct_leaves) + [None] * (len(graph.outvars) - n_main)
        in_cts = backward(graph, env, live, cts)
        per_leaf: list[Any] = [None] * len(flat)
        for k, c in zip(traced_idx, in_cts[: len(traced_idx)]):
            per_leaf[k] = c
        res = []
        k = 0
        for td, a in zip(arg_trees, primals):
            n = len(tree_flatten(a)[0])
            res.append(tree_unflatten(td, [_zeros(aval_of(flat[j])) if per_leaf[j] is None else per_leaf[j] for j in range(k, k + n)]))
            k += n
        return tuple(res)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _fit_tangent(t: Any, o: ShapedArray) -> Any:
    """A JVP rule's tangent cast and broadcast to its output's type (``None`` stays ``None``)."""
    if t is not None:
        if aval_of(t).dtype != o.dtype:
            t = P.cast(t, o.dtype)
        if aval_of(t).shape != o.shape:
            t = P.broadcast_to(t, o.shape)
    return t


def jvp_graph(graph: Graph, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """Forward mode through ``graph`` with each primitive's JVP rule: the output values and their
    tangents (``None`` where no tangent flows).  ``tangents[i]`` is ``None`` for an input without one."""

    def rule(e, ins: list) -> tuple:
        vals = [v for v, _ in ins]
        ts = [t for _, t in ins]
        out = bind_rule(e, vals)
        multi = e.prim.multiple_results
        if not e.prim.differentiable or all(t is None for t in ts):
            return [(o, None) for o in out] if multi else (out, None)
        if e.prim.jvp is None:
            raise EngineError(f"primitive {e.prim.name!r} has no JVP rule (at {e.source})")
        with source_scope(e.source):
            t = e.prim.jvp(ts, out, *vals, **e.attrs)
        if multi:
            return [(o, _fit_tangent(x, v.aval)) for o, x, v in zip(out, t, e.outputs)]
        return out, _fit_tangent(t, e.outputs[0].aval)

    res, _ = interpret(graph, list(zip(primals, tangents)), rule, lift=lambda c: (c, None))
    return [v for v, _ in res], [t for _, t in res]


def jvp(fn: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """Forward mode: ``(fn(*primals), J @ tangents)`` using each primitive's JVP rule."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise EngineError("jvp: primals and tangents must have the same length")
    graph, in_vals, active, groups, arg_trees, out_td, traced_idx, flat = _trace_call(
        fn, primals, {}, [True] * len(primals), "jvp"
    )
    t_flat = []
    for p, t in zip(primals, tangents):
        pl, ptd = tree_flatten(p)
        tl, ttd = tree_flatten(t)
        if ptd != ttd:
            raise EngineError("jvp: tangent structure does not match the primal")
        for a, b in zip(pl, tl):
            if aval_of(b).shape != aval_of(a).shape:
                raise EngineError(f"jvp: tangent shape {aval_of(b).shape} does not match primal shape {aval_of(a).shape}")
        t_flat.extend(tl)
    in_tans: list[Any] = [None] * len(graph.invars)
    for k, (i, v) in enumerate(zip(traced_idx, graph.invars)):
        in_tans[k] = P.cast(np.asarray(t_flat[i]) if not isinstance(t_flat[i], Tracer) else t_flat[i], v.aval.dtype)
    outs, t_outs = jvp_graph(graph, in_vals, in_tans)
    t_outs = [_zeros(aval_of(o)) if t is None else t for t, o in zip(t_outs, outs)]
    return tree_unflatten(out_td, outs), tree_unflatten(out_td, t_outs)


def hvp(fn: Callable, primals: Sequence[Any], vectors: Sequence[Any]) -> Any:
    """Hessian-vector product of a scalar ``fn``: d/de grad(fn)(x + e v) at e=0, computed as the
    gradient of <grad(fn)(x), v> (reverse-over-reverse)."""
    primals, vectors = tuple(primals), tuple(vectors)
    g = grad(fn, argnums=tuple(range(len(primals))))
    def inner(*xs: Any) -> Any:
        gs = g(*xs)
        total = None
        for gl, vl in zip(tree_flatten(gs)[0], tree_flatten(vectors)[0]):
            s = ops.vdot(gl, vl)
            total = s if total is None else ops.add(total, s)
        return total

    out = grad(inner, argnums=tuple(range(len(primals))))(*primals)
    return out[0] if len(primals) == 1 else out
