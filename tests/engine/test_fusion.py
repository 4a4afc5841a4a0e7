"""Elementwise fusion: which equations fuse, the generated in-place kernels, and equality of fused
and unfused programs (random programs from the registry, with gradients; a train step)."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.compiler.fusion import elementwise_fusion, fused_p, fused_sources
from fedarena.engine.compiler.passes import FUSION_PIPELINE
from fedarena.engine.core.tracing import eval_graph

from .test_passes import _random_program


def test_chain_fuses_into_one_node_running_in_the_output_buffer():
    def f(x, b):
        return ops.exp(ops.tanh(x * 2.0 + b) - 1.0)

    x, b = np.random.default_rng(0).standard_normal((4, 5)), np.linspace(0, 1, 5)
    g = elementwise_fusion(engine.make_graph(f)(x, b))
    assert [e.prim.name for e in g.eqns] == ["fused_elementwise"]
    assert len(g.eqns[0].attrs["body"].eqns) == 5
    (src,) = fused_sources(g)
    assert "_t" not in src  # the whole chain runs in `out`
    np.testing.assert_allclose(Executable(g)(x, b)[0], np.exp(np.tanh(x * 2.0 + b) - 1.0), rtol=1e-14)


def test_shared_values_and_shape_changes_are_fusion_boundaries():
    def f(x):
        h = ops.tanh(x * 3.0)  # used twice: stays a boundary
        s = ops.sum(h, axis=1, keepdims=True)  # not elementwise
        return h * s + ops.exp(h)

    x = np.random.default_rng(1).standard_normal((3, 4))
    g0 = engine.make_graph(f)(x)
    g = elementwise_fusion(g0)
    names = [e.prim.name for e in g.eqns]
    assert names.count("fused_elementwise") == 2 and "reduce_sum" in names
    np.testing.assert_allclose(Executable(g)(x)[0], Executable(g0)(x)[0], rtol=1e-14)


@pytest.mark.parametrize("seed", range(8))
def test_property_fused_programs_compute_the_same(seed):
    rng = np.random.default_rng(100 + seed)
    fn = _random_program(rng, n_ops=8)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def loss(x, y):
        outs = fn(x, y)
        return outs[0] + ops.sum(outs[1] * outs[1]) + ops.sum(outs[2])

    for f in (fn, engine.value_and_grad(loss, argnums=(0, 1))):
        g = engine.make_graph(f)(x, y)
        g2 = FUSION_PIPELINE(g)
        g2.validate()
        for u, v in zip(Executable(g)(x, y), Executable(g2)(x, y)):
            np.testing.assert_allclose(v, u, rtol=1e-6, atol=1e-12)


def test_fused_train_step_equals_unfused():
    mlp = nn.MLP([6, 16, 3], activation="tanh")
    opt = optim.adam(1e-2)

    def step(p, s, x, y):
        l, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, l

    p = mlp.init(0, dtype=np.float64)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 6)), rng.integers(0, 3, 8)
    fused, plain = engine.jit(step, passes=FUSION_PIPELINE), engine.jit(step, passes=())
    assert any(e.prim is fused_p for e in fused.graph(p, opt.init(p), x, y).eqns)
    a = (p, opt.init(p))
    b = (p, opt.init(p))
    for _ in range(3):
        *a, la = fused(*a, x, y)
        *b, lb = plain(*b, x, y)
        np.testing.assert_allclose(la, lb, rtol=1e-12)
    for u, v in zip(engine.tree_leaves(a), engine.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-14)


def test_fused_node_rules_grad_jvp_vmap():
    def f(x):
        return ops.tanh(x * x + 1.0) * ops.sin(x)

    x = np.linspace(-1, 1, 5)
    g = elementwise_fusion(engine.make_graph(f)(x))
    assert g.eqns[-1].prim is fused_p

    def run(x):
        return ops.sum(eval_graph(g, [x])[0])

    np.testing.assert_allclose(engine.grad(run)(x), engine.grad(lambda x: ops.sum(f(x)))(x), rtol=1e-12)
    _, t = engine.jvp(run, (x,), (np.ones(5),))
    _, t_ref = engine.jvp(lambda x: ops.sum(f(x)), (x,), (np.ones(5),))
    np.testing.assert_allclose(t, t_ref, rtol=1e-12)
    X = np.stack([x, x * 0.5])
    np.testing.assert_allclose(engine.vmap(lambda x: eval_graph(g, [x])[0])(X), f(X), rtol=1e-12)
