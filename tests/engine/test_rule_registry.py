"""Every primitive carries all of its rules beside its definition: the registry is enumerated and each
primitive must have a vmap batching rule (or the explicit ``loop_batching`` declaration), a cupy rule
(a step rule, an elementwise C expression, or the explicit ``host_only`` declaration) and its AD rules
(VJP and JVP, or ``differentiable=False``), each defined in the primitive's own family module.  A
primitive without a batching or cupy rule is refused in one line instead of silently looping or
running on the host."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine.backends.cupy import jit as _cupy_jit  # noqa: F401  (defines the control-flow cupy rules)
from fedarena.engine.backends.cupy.executor import Executable
from fedarena.engine.core.ir import EngineError, Eqn, Graph, ShapedArray, Var
from fedarena.engine.core.tracing import PRIMITIVES, bind, register
from fedarena.engine.primitives.base import host_only, loop_batching

FAMILIES = "fedarena.engine.primitives."
"""The family modules (``primitives/<family>.py``) and their shared vocabulary (``base``, ``cuda``)."""

CUPY_RULE_IN_BACKEND: dict[str, str] = {}
"""Primitives whose cupy rule may sit outside their module (none: every rule is beside its primitive)."""
NO_BATCH_RULE: set[str] = set()
"""Primitives without a batching rule or ``loop_batching`` declaration (none)."""


def _home(p) -> str:
    return p.impl.__module__


def _defined_beside(fn, p) -> bool:
    """``fn`` is defined in the primitive's module, or (for a primitive of primitives/) in a family module."""
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    home = _home(p)
    return mod == home or (home.startswith(FAMILIES) and mod.startswith(FAMILIES))


def _all():
    return sorted(PRIMITIVES.items())


def test_every_primitive_has_a_batching_rule_beside_it():
    missing = [n for n, p in _all() if p.batch is None]
    assert set(missing) == NO_BATCH_RULE, f"primitives without a batching rule or loop_batching declaration: {missing}"
    for n, p in _all():
        if p.batch is None:
            continue
        assert p.batch is loop_batching or _defined_beside(p.batch, p), f"{n}: batching rule defined in {p.batch.__module__}, not beside the primitive ({_home(p)})"


def test_every_primitive_has_a_cupy_rule_beside_it():
    for n, p in _all():
        rule = p.cuda if p.cuda is not None else p.cuda_expr
        assert rule is not None, f"{n}: no cupy rule, no elementwise C expression and no host_only declaration"
        if n in CUPY_RULE_IN_BACKEND:
            mod = rule.__module__ if hasattr(rule, "__module__") else type(rule).__module__
            assert mod == CUPY_RULE_IN_BACKEND[n], f"{n}: cupy rule in {mod}"
            continue
        assert rule is host_only or _defined_beside(rule, p), f"{n}: cupy rule defined in {rule.__module__}, not beside the primitive ({_home(p)})"
    # every primitive the fused-kernel generator may meet gives its C expression (or is a broadcast view)
    from fedarena.engine.backends.cupy.kernels import ELEMENTWISE_OPS

    for n in ELEMENTWISE_OPS:
        p = PRIMITIVES[n]
        assert p.cuda_expr is not None or "view" in p.traits, n


def test_every_differentiable_primitive_has_its_ad_rules_beside_it():
    for n, p in _all():
        if not p.differentiable:
            continue
        vjp = p.vjp if p.vjp is not None else p.vjp_saved
        assert vjp is not None and p.jvp is not None, f"{n}: differentiable without a VJP and a JVP"
        for rule in (vjp, p.jvp):
            assert _defined_beside(rule, p), f"{n}: AD rule {rule.__qualname__} in {rule.__module__}, not beside the primitive ({_home(p)})"


@pytest.fixture
def bare_primitive():
    """A primitive registered with a shape rule and a numpy kernel only (removed afterwards)."""
    p = register("test_bare_twice")
    p.abstract_eval = lambda avals, attrs, weak: avals[0]
    p.impl = lambda x: 2 * x
    yield p
    del PRIMITIVES["test_bare_twice"]


def test_a_primitive_without_a_batching_rule_is_refused(bare_primitive):
    fn = lambda x: bind(bare_primitive, x)  # noqa: E731
    with pytest.raises(EngineError, match="test_bare_twice.*no batching rule"):
        engine.vmap(fn)(np.ones((3, 2)))
    bare_primitive.batch = loop_batching  # declared: one application per example
    np.testing.assert_array_equal(engine.vmap(fn)(np.arange(6.0).reshape(3, 2)), 2 * np.arange(6.0).reshape(3, 2))


def test_a_primitive_without_a_cupy_rule_is_refused(bare_primitive):
    x, y = Var(ShapedArray((2,), np.dtype(np.float32))), Var(ShapedArray((2,), np.dtype(np.float32)))
    g = Graph([x], [], [], [Eqn(bare_primitive, [x], [y], {}, None)], [y])
    device = types.SimpleNamespace(xp=np)  # planning the steps needs no device work
    with pytest.raises(EngineError, match="test_bare_twice.*no cupy rule"):
        Executable(g, device, validate=False)
    bare_primitive.cuda = host_only
    assert Executable(g, device, validate=False).host_steps == ["test_bare_twice"]


# ----------------------------------------------------------------------------- linear primitives: JVP + transpose

_RNG = np.random.default_rng(7)


def _f(*shape):
    return _RNG.standard_normal(shape)


IDX = np.array([[2], [0], [3]])
TAKE_IDX = np.array([1, 0, 1, 2])
LINEAR_CASES = {
    # name: (operands, attrs); integer operands are indices (no tangent, no cotangent)
    "neg": ([_f(3, 4)], {}),
    "add": ([_f(3, 4), _f(4)], {}),
    "sub": ([_f(3, 4), _f(3, 1)], {}),
    "mul": ([_f(3, 4), _f(4)], {}),
    "reduce_sum": ([_f(3, 4)], dict(axes=(1,), keepdims=False)),
    "cumsum": ([_f(3, 4)], dict(axis=1, reverse=True)),
    "matmul": ([_f(3, 4), _f(4, 2)], {}),
    "transpose": ([_f(2, 3, 4)], dict(perm=(2, 0, 1))),
    "reshape": ([_f(3, 4)], dict(shape=(2, 6))),
    "broadcast_to": ([_f(1, 4)], dict(shape=(3, 4))),
    "squeeze": ([_f(3, 1)], dict(axes=(1,))),
    "expand_dims": ([_f(3, 4)], dict(axes=(0,))),
    "slice": ([_f(5, 4)], dict(starts=(0, 1), limits=(5, 4), strides=(2, 1))),
    "pad": ([_f(3, 4)], dict(low=(1, 0), high=(0, 2), interior=(1, 0))),
    "concatenate": ([_f(2, 3), _f(1, 3)], dict(axis=0)),
    "stack": ([_f(2, 3), _f(2, 3)], dict(axis=1)),
    "gather": ([_f(3, 4), IDX], dict(axis=1)),
    "take": ([_f(3, 4), TAKE_IDX], dict(axis=0)),
    "scatter_add": ([_f(3, 1), IDX], dict(axis=1, shape=(3, 4))),
    "index_add": ([_f(4, 2), TAKE_IDX], dict(axis=0, size=3)),
    "conv2d": ([_f(2, 3, 5, 5), _f(4, 3, 3, 3)], dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))),
}


def _traced_cases() -> dict:
    """col2im and conv_input_grad as the engine emits them (attributes from a traced gradient)."""
    out = {}
    # a stride-1 convolution's input gradient is col2im; a strided one on phase planes is conv_input_grad
    for x, w, stride in ((_f(2, 3, 6, 6), _f(4, 3, 3, 3), 1), (_f(2, 3, 8, 8), _f(4, 3, 2, 2), 2)):
        g = engine.make_graph(engine.grad(lambda x, w: engine.ops.sum(engine.ops.conv2d(x, w, stride, 0) ** 2)))(x, w)
        for e in g.eqns:
            if e.prim.name in ("col2im", "conv_input_grad") and all(a.aval.dtype.kind == "f" for a in e.inputs):
                out.setdefault(e.prim.name, ([_f(*a.aval.shape) for a in e.inputs], dict(e.attrs)))
    return out


def _dot(a, b) -> float:
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def test_every_linear_primitive_is_checked():
    linear = {n for n, p in PRIMITIVES.items() if p.transpose is not None}
    assert linear >= {"neg", "add", "sub", "mul", "reduce_sum", "matmul", "transpose", "reshape", "broadcast_to", "slice", "pad", "concatenate", "gather"}
    assert linear == set(LINEAR_CASES) | set(_traced_cases()), "a linear primitive without a case below (or a case of a non-linear one)"
    for n in linear:
        p = PRIMITIVES[n]
        assert p.vjp is p.transpose and p.linearity is not None, n


@pytest.mark.parametrize("name", sorted(LINEAR_CASES) + ["col2im", "conv_input_grad"])
def test_linear_jvp_and_transpose_are_adjoint(name):
    """The dot-product test of the transposition: <J t, c> = <t, J^T c> for random t and c, with J the
    primitive's (derived or declared) JVP and J^T its transpose, i.e. the VJP reverse mode uses."""
    cases = dict(LINEAR_CASES, **_traced_cases())
    ins, attrs = cases[name]
    p = PRIMITIVES[name]
    out = bind(p, *ins, **attrs)
    lin = [i for i, a in enumerate(ins) if np.asarray(a).dtype.kind == "f"]
    # bilinear: linear in each operand with the other fixed; otherwise jointly in all float operands
    groups = [[i] for i in lin] if p.linearity == "bilinear" else [lin]
    for group in groups:
        ts = [_f(*np.shape(ins[i])) if i in group else None for i in range(len(ins))]
        jt = p.jvp(ts, out, *ins, **attrs)
        c = _f(*np.shape(out))
        need = tuple(i in group for i in range(len(ins)))
        cts = p.transpose(need, c, out, *ins, **attrs)
        lhs = _dot(jt, c)
        rhs = sum(_dot(ts[i], np.broadcast_to(cts[i], np.shape(ins[i]))) for i in group)
        assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs)), (name, group, lhs, rhs)
