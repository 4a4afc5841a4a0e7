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

# Rules that cannot sit in the primitive's module, each with its reason:
CUPY_RULE_IN_BACKEND = {
    # their device steps run sub-executables of the cupy backend, and control_flow/ sits above backends/
    "scan": "fedarena.engine.backends.cupy.control",
    "cond": "fedarena.engine.backends.cupy.control",
    "while": "fedarena.engine.backends.cupy.control",
    # the compiler's own primitives (compiler/ sits below backends/): the fused group is the backend's kernel
    "fused_elementwise": "fedarena.engine.backends.cupy.executor",
    "fused_elementwise_multi": "fedarena.engine.primitives.base",
    "dense": "fedarena.engine.primitives.base",
    "softmax": "fedarena.engine.primitives.base",
}
NO_BATCH_RULE = {"dense", "softmax"}
"""The numpy backend's native-kernel selections (compiler/native.py): made by a compiler pass after
every transformation, never seen by vmap; listed here until their module declares them."""


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
