"""Optimizers as pure functions over parameter pytrees, and learning-rate schedules.

``opt = adam(3e-4)``; ``state = opt.init(params)``; ``params, state = opt.update(grads, state, params)``.
Nothing is mutated, so a whole training step (loss, gradient, update) traces into one graph.
Update rules follow the papers and PyTorch's documented algorithms so results match
``torch.optim``: SGD with momentum / Nesterov (Sutskever et al., ICML 2013), Adam (Kingma & Ba,
ICLR 2015, Algorithm 1), AdamW (Loshchilov & Hutter, ICLR 2019), RMSProp (Tieleman & Hinton,
2012, lecture 6.5; centered variant of Graves 2013).  Gradient clipping by global norm follows
Pascanu et al. (ICML 2013) with PyTorch's ``clip_grad_norm_`` constant (1e-6).
"""

from __future__ import annotations

import math
from builtins import sum as builtins_sum
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import ops
from .primitives import cast, dtype_of
from .core.pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

Schedule = Callable[[Any], Any]


# ============================================================================ schedules


def constant(value: float) -> Schedule:
    return lambda step: value


def linear(init_value: float, end_value: float, transition_steps: int) -> Schedule:
    """Linear from ``init_value`` at step 0 to ``end_value`` at ``transition_steps``, then flat."""
    if transition_steps <= 0:
        raise ValueError(f"transition_steps must be positive, got {transition_steps}")

    def sched(step: Any) -> Any:
        frac = ops.minimum(ops.multiply(ops.astype(step, np.float64), 1.0 / transition_steps), 1.0)
        return ops.add(init_value, ops.multiply(frac, end_value - init_value))

    return sched


def cosine(init_value: float, decay_steps: int, alpha: float = 0.0) -> Schedule:
    """Cosine decay (Loshchilov & Hutter, SGDR, ICLR 2017) to ``alpha * init_value``."""
    if decay_steps <= 0:
        raise ValueError(f"decay_steps must be positive, got {decay_steps}")

    def sched(step: Any) -> Any:
        t = ops.minimum(ops.astype(step, np.float64), float(decay_steps))
        c = ops.multiply(ops.add(ops.cos(ops.multiply(t, math.pi / decay_steps)), 1.0), 0.5)
        return ops.multiply(ops.add(ops.multiply(c, 1.0 - alpha), alpha), init_value)

    return sched


def warmup(warmup_steps: int, peak_value: float, after: Schedule | None = None, init_value: float = 0.0) -> Schedule:
    """Linear warm-up from ``init_value`` to ``peak_value`` over ``warmup_steps``, then ``after``
    (evaluated at ``step - warmup_steps``; constant ``peak_value`` if omitted)."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps must be positive, got {warmup_steps}")
    after = after or constant(peak_value)

    def sched(step: Any) -> Any:
        s = ops.astype(step, np.float64)
        ramp = ops.add(init_value, ops.multiply(s, (peak_value - init_value) / warmup_steps))
        rest = ops.multiply(ops.astype(after(ops.maximum(ops.subtract(s, float(warmup_steps)), 0.0)), np.float64), 1.0)
        return ops.where(ops.less(s, float(warmup_steps)), ramp, rest)

    return sched


def _lr_at(lr: float | Schedule, count: Any) -> Any:
    return lr(count) if callable(lr) else lr


# ============================================================================ clipping


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, Any]:
    """Scale all gradients by min(1, max_norm / (norm + 1e-6)); returns (clipped, norm)."""
    leaves, td = tree_flatten(grads)
    if not leaves:
        return grads, 0.0
    norm = ops.global_norm([ops.astype(g, np.float64) if dtype_of(g) != dtype_of(leaves[0]) else g for g in leaves])
    scale = ops.minimum(ops.divide(max_norm, ops.add(norm, 1e-6)), 1.0)
    return tree_unflatten(td, [ops.multiply(g, cast(scale, dtype_of(g))) for g in leaves]), norm


# ============================================================================ optimizers


@dataclass(frozen=True)
class Optimizer:
    """``init(params) -> state`` and ``update(grads, state, params) -> (new_params, new_state)``."""

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], tuple[Any, Any]]
    name: str = "optimizer"


def _count0() -> np.ndarray:
    return np.zeros((), np.int64)


def _zeros_like_tree(params: Any) -> Any:
    return tree_map(lambda p: np.zeros(np.shape(p), np.asarray(p).dtype if not hasattr(p, "aval") else p.dtype), params)


def _prepare(grads: Any, params: Any, weight_decay: float, max_grad_norm: float | None) -> Any:
    if max_grad_norm is not None:
        grads, _ = clip_by_global_norm(grads, max_grad_norm)
    if weight_decay:
        grads = tree_map(lambda g, p: ops.add(g, ops.multiply(p, weight_decay)), grads, params)
    return grads


def _scalar(x: Any, like: Any) -> Any:
    """A scalar hyper-parameter in the dtype of ``like`` (Python floats stay weak)."""
    if isinstance(x, (int, float)):
        return x
    return cast(x, dtype_of(like))


def sgd(
    lr: float | Schedule = 1e-2,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
) -> Optimizer:
    """SGD; with momentum ``buf = momentum * buf + g`` and step ``g + momentum * buf`` (Nesterov)
    or ``buf`` — PyTorch's formulation with dampening 0."""
    if nesterov and momentum <= 0:
        raise ValueError("Nesterov momentum needs momentum > 0")

    def init(params: Any) -> Any:
        st: dict = {"count": _count0()}
        if momentum:
            st["momentum"] = _zeros_like_tree(params)
        return st

    def update(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        grads = _prepare(grads, params, weight_decay, max_grad_norm)
        lr_t = _lr_at(lr, state["count"])
        new_state: dict = {"count": ops.add(state["count"], 1)}
        if momentum:
            bufs = tree_map(lambda b, g: ops.add(ops.multiply(b, momentum), g), state["momentum"], grads)
            new_state["momentum"] = bufs
            if nesterov:
                steps = tree_map(lambda g, b: ops.add(g, ops.multiply(b, momentum)), grads, bufs)
            else:
                steps = bufs
        else:
            steps = grads
        new_params = tree_map(lambda p, s: ops.subtract(p, ops.multiply(s, _scalar(lr_t, p))), params, steps)
        return new_params, new_state

    return Optimizer(init, update, "sgd")


def _flat(leaves: list) -> Any:
    """Concatenate the raveled leaves into one vector (one kernel call)."""
    return ops.concatenate([ops.reshape(x, (-1,)) for x in leaves], axis=0) if len(leaves) > 1 else ops.reshape(leaves[0], (-1,))


def _unflat(flat: Any, like: list) -> list:
    out, off = [], 0
    for x in like:
        shp = ops.shape(x)
        n = int(np.prod(shp, dtype=np.int64))
        out.append(ops.reshape(ops.slice_axis(flat, off, off + n), shp))
        off += n
    return out


def _fusable(p_leaves: list) -> bool:
    dts = {np.dtype(dtype_of(p)) for p in p_leaves}
    return len(p_leaves) > 0 and len(dts) == 1


FUSE_MAX_ELEMENTS = 1 << 16
SMALL_LEAF_ELEMENTS = 1 << 13


def _layout(fused: bool | str, leaves: list) -> str:
    """How Adam keeps its moments: ``"flat"`` (one vector; small models, where kernel-call overhead
    dominates), ``"buckets"`` (``fused="auto"`` and a large model: the leaves of at most
    SMALL_LEAF_ELEMENTS share one vector, the large ones stay separate, since concatenating them
    would add two passes over most of the parameters) or ``"leaves"`` (one array per leaf)."""
    if not fused or not _fusable(leaves):
        return "leaves"
    if fused == "auto" and builtins_sum(int(np.prod(ops.shape(p), dtype=np.int64)) for p in leaves) > FUSE_MAX_ELEMENTS:
        return "buckets"
    return "flat"


def _state_shapes(layout: str, leaves: list) -> list:
    """Shapes of the moment arrays ``init`` makes for ``leaves`` under ``layout``."""
    if layout == "flat":
        return [(int(builtins_sum(int(np.prod(ops.shape(p), dtype=np.int64)) for p in leaves)),)]
    if layout == "buckets":
        small = _small(leaves)
        head = [(int(builtins_sum(int(np.prod(ops.shape(leaves[i]), dtype=np.int64)) for i in small)),)] if small else []
        return head + [tuple(ops.shape(p)) for i, p in enumerate(leaves) if i not in small]
    return [tuple(ops.shape(p)) for p in leaves]


def _check_state(state: Any, layout: str, leaves: list, name: str) -> None:
    """A clear error for an optimizer state that does not belong to these parameters (another
    model's, or one saved by an older layout) instead of a shape error deep in the update."""
    if not isinstance(state, dict) or not {"count", "mu", "nu"} <= set(state):
        raise ValueError(f"{name}: the optimizer state must be the dict made by init(params) with 'count', 'mu', 'nu'")
    want = _state_shapes(layout, leaves)
    container = {"flat": "one array", "buckets": "a list", "leaves": "a tree like the parameters"}[layout]
    for key in ("mu", "nu"):
        m = state[key]
        got = [tuple(ops.shape(x)) for x in tree_leaves(m)]
        is_array = not isinstance(m, (dict, list, tuple))
        kind_ok = is_array if layout == "flat" else isinstance(m, list) if layout == "buckets" else not is_array
        if got != want or not kind_ok:
            raise ValueError(
                f"{name}: optimizer state {key!r} has moment arrays of shapes {got[:4]}{'...' if len(got) > 4 else ''}"
                f" but these parameters need {container} of {want[:4]}{'...' if len(want) > 4 else ''} (layout {layout!r}): a state of"
                " another model or of an older optimizer layout; make a new one with init(params)"
            )


def _small(leaves: list) -> list:
    """Indices of the leaves that share the flat vector of the "buckets" layout."""
    return [i for i, p in enumerate(leaves) if int(np.prod(ops.shape(p), dtype=np.int64)) <= SMALL_LEAF_ELEMENTS]


def _adam(
    lr: float | Schedule,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
    max_grad_norm: float | None,
    name: str,
    fused: bool,
) -> Optimizer:
    """Adam / AdamW.  With ``fused`` (default) and parameters of one dtype, the moments are kept
    as single flat vectors and the update runs on the concatenated gradient — the same
    arithmetic per element, far fewer kernel calls (like PyTorch's multi-tensor/fused Adam).
    ``fused="auto"`` on a large model fuses only the small leaves (see :func:`_layout`); the
    layout is a function of the parameters' shapes, so ``update`` re-derives it from ``params``."""

    def init(params: Any) -> Any:
        leaves = tree_leaves(params)
        layout = _layout(fused, leaves)
        if layout == "leaves":
            return {"count": _count0(), "mu": _zeros_like_tree(params), "nu": _zeros_like_tree(params)}
        dt = np.dtype(dtype_of(leaves[0]))
        if layout == "flat":
            n = int(builtins_sum(np.size(p) for p in leaves))
            return {"count": _count0(), "mu": np.zeros(n, dt), "nu": np.zeros(n, dt)}
        small = _small(leaves)
        vecs = ([np.zeros(int(builtins_sum(np.size(leaves[i]) for i in small)), dt)] if small else []) + [
            np.zeros(np.shape(p), dt) for i, p in enumerate(leaves) if i not in small
        ]
        return {"count": _count0(), "mu": vecs, "nu": [v.copy() for v in vecs]}

    def _step(p, g, m, v, lr_t, step_size, eps_hat, in_dtype):
        dt = dtype_of(p)
        if decoupled and weight_decay:
            p = ops.multiply(p, in_dtype(ops.subtract(1.0, ops.multiply(lr_t, weight_decay)), dt))
        m = ops.add(ops.multiply(m, b1), ops.multiply(g, 1.0 - b1))
        v = ops.add(ops.multiply(v, b2), ops.multiply(ops.multiply(g, g), 1.0 - b2))
        # lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) == (lr sqrt(bc2)/bc1) * m / (sqrt(v) + eps sqrt(bc2)):
        # the same Algorithm 1 step with one pass fewer over the parameters.
        denom = ops.add(ops.sqrt(v), in_dtype(eps_hat, dt))
        p = ops.subtract(p, ops.multiply(ops.divide(m, denom), in_dtype(step_size, dt)))
        return p, m, v

    def update(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        p_leaves, td = tree_flatten(params)
        layout = _layout(fused, p_leaves)
        _check_state(state, layout, p_leaves, name)
        grads = _prepare(grads, params, 0.0 if decoupled else weight_decay, max_grad_norm)
        count = ops.add(state["count"], 1)
        lr_t = _lr_at(lr, state["count"])
        t = ops.astype(count, np.float64)
        bc1 = ops.subtract(1.0, ops.power(b1, t))
        bc2_sqrt = ops.sqrt(ops.subtract(1.0, ops.power(b2, t)))
        step_size = ops.divide(ops.multiply(lr_t, bc2_sqrt), bc1)
        eps_hat = ops.multiply(bc2_sqrt, eps)
        g_leaves = tree_leaves(grads)
        cache: dict = {}

        def in_dtype(x: Any, dt: np.dtype) -> Any:
            key = (id(x), np.dtype(dt))
            if key not in cache:
                cache[key] = cast(x, dt)
            return cache[key]

        if layout == "flat":
            p, m, v = _step(_flat(p_leaves), _flat(g_leaves), state["mu"], state["nu"], lr_t, step_size, eps_hat, in_dtype)
            return tree_unflatten(td, _unflat(p, p_leaves)), {"count": count, "mu": m, "nu": v}
        if layout == "buckets":
            small = _small(p_leaves)
            large = [i for i in range(len(p_leaves)) if i not in small]
            new_p = list(p_leaves)
            new_m, new_v = [], []
            if small:
                sp = [p_leaves[i] for i in small]
                p, m, v = _step(_flat(sp), _flat([g_leaves[i] for i in small]), state["mu"][0], state["nu"][0], lr_t, step_size, eps_hat, in_dtype)
                for i, q in zip(small, _unflat(p, sp)):
                    new_p[i] = q
                new_m.append(m)
                new_v.append(v)
            for k, i in enumerate(large, start=1 if small else 0):
                new_p[i], m, v = _step(p_leaves[i], g_leaves[i], state["mu"][k], state["nu"][k], lr_t, step_size, eps_hat, in_dtype)
                new_m.append(m)
                new_v.append(v)
            return tree_unflatten(td, new_p), {"count": count, "mu": new_m, "nu": new_v}
        m_leaves, mt = tree_flatten(state["mu"])
        v_leaves, vt = tree_flatten(state["nu"])
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(p_leaves, g_leaves, m_leaves, v_leaves):
            p, m, v = _step(p, g, m, v, lr_t, step_size, eps_hat, in_dtype)
            new_p.append(p)
            new_m.append(m)
            new_v.append(v)
        return tree_unflatten(td, new_p), {"count": count, "mu": tree_unflatten(mt, new_m), "nu": tree_unflatten(vt, new_v)}

    return Optimizer(init, update, name)


def adam(
    lr: float | Schedule = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    fused: bool | str = "auto",
) -> Optimizer:
    """Adam; ``weight_decay`` is L2 added to the gradient (PyTorch's ``Adam(weight_decay=...)``).
    ``fused``: keep the moments as flat vectors (``"auto"``: when the model has at most
    65536 parameters, else only its small leaves'; see :func:`_layout`)."""
    return _adam(lr, b1, b2, eps, weight_decay, False, max_grad_norm, "adam", fused)


def adamw(
    lr: float | Schedule = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    max_grad_norm: float | None = None,
    fused: bool | str = "auto",
) -> Optimizer:
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the Adam step."""
    return _adam(lr, b1, b2, eps, weight_decay, True, max_grad_norm, "adamw", fused)


def rmsprop(
    lr: float | Schedule = 1e-2,
    alpha: float = 0.99,
    eps: float = 1e-8,
    momentum: float = 0.0,
    centered: bool = False,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
) -> Optimizer:
    """RMSProp in PyTorch's form: ``v = alpha v + (1-alpha) g^2``, ``avg = sqrt(v - ga^2 if
    centered else v) + eps``, step ``g / avg`` (through a momentum buffer if momentum > 0)."""

    def init(params: Any) -> Any:
        st: dict = {"count": _count0(), "nu": _zeros_like_tree(params)}
        if centered:
            st["g_avg"] = _zeros_like_tree(params)
        if momentum:
            st["momentum"] = _zeros_like_tree(params)
        return st

    def update(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        grads = _prepare(grads, params, weight_decay, max_grad_norm)
        lr_t = _lr_at(lr, state["count"])
        new_state: dict = {"count": ops.add(state["count"], 1)}
        nu = tree_map(lambda v, g: ops.add(ops.multiply(v, alpha), ops.multiply(ops.multiply(g, g), 1.0 - alpha)), state["nu"], grads)
        new_state["nu"] = nu
        if centered:
            ga = tree_map(lambda a, g: ops.add(ops.multiply(a, alpha), ops.multiply(g, 1.0 - alpha)), state["g_avg"], grads)
            new_state["g_avg"] = ga
            avg = tree_map(lambda v, a: ops.add(ops.sqrt(ops.subtract(v, ops.multiply(a, a))), eps), nu, ga)
        else:
            avg = tree_map(lambda v: ops.add(ops.sqrt(v), eps), nu)
        steps = tree_map(ops.divide, grads, avg)
        if momentum:
            steps = tree_map(lambda b, s: ops.add(ops.multiply(b, momentum), s), state["momentum"], steps)
            new_state["momentum"] = steps
        new_params = tree_map(lambda p, s: ops.subtract(p, ops.multiply(s, _scalar(lr_t, p))), params, steps)
        return new_params, new_state

    return Optimizer(init, update, "rmsprop")
