"""``custom_vjp`` (a function with a hand-written reverse rule) and ``remat`` (gradient
checkpointing), both as call primitives whose equation carries the function's traced body.

``remat(fn)``: the forward pass runs the body without keeping its intermediate values; the
backward pass recomputes them from the inputs and then differentiates (Griewank & Walther,
"Evaluating Derivatives", 2nd ed., ch. 12; Chen et al., "Training deep nets with sublinear
memory cost", 2016).  Only the body's inputs and output stay alive between the passes.

``custom_vjp(fn)`` with ``fn.defvjp(fwd, bwd)`` (JAX's interface): ``fwd(*args) -> (out,
residuals)``, ``bwd(residuals, cotangent) -> tuple with one cotangent per argument``.  Under
differentiation the forward pass runs ``fwd`` (not ``fn``) and keeps its residuals for ``bwd``
(autodiff's ``vjp_forward``/``vjp_saved`` rules), so nothing is computed twice; undifferentiated
calls run ``fn``.  Forward mode (``jvp``) is refused, as in JAX.

Both take array arguments and return one array.  Under ``vmap`` the body (and ``fwd``/``bwd``)
are batched and bound again as the same kind of call, so checkpointing and the custom rule
survive batching.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .transforms import autodiff as AD
from . import ops
from .transforms.vmap import vmap
from .backends.numpy.executor import Executable
from .core.ir import EngineError, Graph, ShapeError
from .primitives import expr
from .primitives.base import host_only
from .core.tracing import Tracer, aval_of, bind, eval_graph, register, trace_flat


def _as_array(x: Any) -> Any:
    return x if isinstance(x, (Tracer, np.ndarray)) else np.asarray(x)


def _trace_body(fn: Callable, args: tuple, what: str) -> Graph:
    avals = [aval_of(a) for a in args]

    def flat(ins: list) -> list:
        out = fn(*ins)
        if not isinstance(out, (Tracer, np.ndarray, np.generic)):
            raise EngineError(f"{what}: the function must return one array, got {type(out).__name__}")
        return [out]

    graph, captured = trace_flat(flat, avals)
    if captured:
        raise EngineError(
            f"{what}: the function closes over a value traced by an enclosing transformation; pass it as an argument"
        )
    return graph


class _Body:
    """A call body compiled once by the numpy executor (lazily)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._exe: Executable | None = None

    def __call__(self, *args: Any) -> np.ndarray:
        if self._exe is None:
            self._exe = Executable(self.graph, validate=False)
        return self._exe(*args)[0]


def _call_rule(avals, attrs, weak):
    body: Graph = attrs["body"].graph
    want = [v.aval for v in body.invars]
    if list(avals) != want:
        raise ShapeError(f"{attrs['body_name']}: operands {list(avals)} do not match the body's inputs {want}")
    return body.outvars[0].aval


def _call_impl(*args, body, body_name, **attrs):
    return body(*args)


def _call_emit(ctx, ins, attrs, in_avals, out_aval):
    return expr(f"{ctx.const(attrs['body'])}({', '.join(ins)})")


def _batched_fn(fn: Callable, batched: list, size: int) -> tuple[Callable, list]:
    axes = tuple(0 if b else None for b in batched)
    return vmap(fn, in_axes=axes), axes


# ----------------------------------------------------------------------------- remat

remat_p = register("remat_call")
remat_p.abstract_eval = _call_rule
remat_p.impl = _call_impl
remat_p.emit = _call_emit


def _body_fn(attrs: dict) -> Callable:
    g = attrs["body"].graph
    return lambda *xs: eval_graph(g, xs)[0]


def _remat_vjp(need, ct, out, *ins, **attrs):
    _, pull = AD.vjp(_body_fn(attrs), *ins)  # recompute the body's intermediates, then pull back
    return tuple(pull(ct))


def _remat_jvp(ts, out, *ins, **attrs):
    tangents = [np.zeros(aval_of(x).shape, aval_of(x).dtype) if t is None else t for x, t in zip(ins, ts)]
    return AD.jvp(_body_fn(attrs), ins, tangents)[1]


def _remat_batch(prim, vals, batched, size, **attrs):
    fn, _ = _batched_fn(_body_fn(attrs), batched, size)
    return remat(fn)(*vals)


remat_p.vjp = _remat_vjp
remat_p.jvp = _remat_jvp
remat_p.batch = _remat_batch
remat_p.cuda = host_only  # the cupy backend runs its numpy kernel (the body's executor) on host copies


def remat(fn: Callable) -> Callable:
    """``fn`` with gradient checkpointing: its intermediates are recomputed in the backward pass."""

    def wrapped(*args: Any) -> Any:
        args = tuple(_as_array(a) for a in args)
        body = _trace_body(fn, args, "remat")
        return bind(remat_p, *args, body=_Body(body), body_name="remat")

    wrapped.__name__ = f"remat({getattr(fn, '__name__', 'fn')})"
    return wrapped


checkpoint = remat

# ----------------------------------------------------------------------------- custom_vjp

custom_vjp_p = register("custom_vjp_call")
custom_vjp_p.abstract_eval = _call_rule
custom_vjp_p.impl = lambda *args, body, body_name, fwd, bwd: body(*args)
custom_vjp_p.emit = _call_emit


def _custom_vjp_forward(ins, body, body_name, fwd, bwd):
    """The differentiated forward pass runs ``fwd``: its output, and its residuals for ``bwd``."""
    got = fwd(*ins)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise EngineError(f"custom_vjp: fwd must return (output, residuals), got {type(got).__name__}")
    out, res = got
    want = body.graph.outvars[0].aval
    oav = aval_of(out)
    if oav.shape != want.shape:
        raise EngineError(f"custom_vjp: fwd's output has shape {oav.shape} but the function's has {want.shape}")
    if oav.dtype != want.dtype:
        out = ops.astype(out, want.dtype)
    return out, res


def _custom_vjp_saved(res, need, ct, out, *ins, body, body_name, fwd, bwd):
    cts = bwd(res, ct)
    if not isinstance(cts, tuple) or len(cts) != len(ins):
        raise EngineError(f"custom_vjp: bwd must return a tuple with one cotangent per argument ({len(ins)}), got {type(cts).__name__}")
    fixed = []
    for c, x in zip(cts, ins):
        if c is not None and aval_of(c).shape != aval_of(x).shape:
            raise EngineError(f"custom_vjp: bwd gave a cotangent of shape {aval_of(c).shape} for an argument of shape {aval_of(x).shape}")
        fixed.append(c)
    return tuple(fixed)


def _custom_jvp(ts, out, *ins, **attrs):
    raise EngineError("custom_vjp functions support reverse mode only (grad/vjp), not jvp/jacfwd, as in JAX")


def _custom_batch(prim, vals, batched, size, body, body_name, fwd, bwd):
    g = body.graph
    fn_b, axes = _batched_fn(lambda *xs: eval_graph(g, xs)[0], batched, size)
    fwd_b = vmap(fwd, in_axes=axes)
    bwd_b = vmap(lambda res, c: bwd(res, c), in_axes=(0, 0))

    def bwd_all(res, c):
        cts = bwd_b(res, c)
        # unbatched arguments get the cotangent summed over the batch
        return tuple(
            c_i if (b or c_i is None) else _sum0(c_i) for c_i, b in zip(cts, batched)
        )

    f = custom_vjp(fn_b)
    f.defvjp(fwd_b, bwd_all)
    return f(*vals)


def _sum0(x: Any) -> Any:
    return ops.sum(x, axis=0)


def _custom_vjp_rule(need, ct, out, *ins, body, body_name, fwd, bwd):
    """The VJP where no forward pass saved residuals (the equation was not replayed by autodiff's
    forward, e.g. a graph differentiated after the fact): ``fwd`` runs again for them."""
    _, res = _custom_vjp_forward(list(ins), body, body_name, fwd, bwd)
    return _custom_vjp_saved(res, need, ct, out, *ins, body=body, body_name=body_name, fwd=fwd, bwd=bwd)


custom_vjp_p.vjp = _custom_vjp_rule
custom_vjp_p.vjp_forward = _custom_vjp_forward
custom_vjp_p.vjp_saved = _custom_vjp_saved
custom_vjp_p.jvp = _custom_jvp
custom_vjp_p.batch = _custom_batch
custom_vjp_p.cuda = host_only  # the cupy backend runs its numpy kernel on host copies


class custom_vjp:  # noqa: N801 - JAX's name
    """A function with its own reverse-mode rule: ``f = custom_vjp(fn); f.defvjp(fwd, bwd)``."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None
        self.__name__ = getattr(fn, "__name__", "custom_vjp")

    def defvjp(self, fwd: Callable, bwd: Callable) -> "custom_vjp":
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args: Any) -> Any:
        if self.fwd is None or self.bwd is None:
            raise EngineError(f"custom_vjp({self.__name__}): call defvjp(fwd, bwd) before using it")
        args = tuple(_as_array(a) for a in args)
        body = _trace_body(self.fn, args, "custom_vjp")
        return bind(custom_vjp_p, *args, body=_Body(body), body_name="custom_vjp", fwd=self.fwd, bwd=self.bwd)
