"""``jit(fn, donate_argnums=...)``: outputs written over donated arguments, the same values as
without donation, and no write when the argument cannot safely take one."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.compiler.fusion import FusedKernel
from fedarena.engine.core import cext
from fedarena.engine.core.ir import EngineError

native = pytest.mark.skipif(not cext.available(), reason="multi-output fusion needs the C extension")


def _step_fn():
    mlp = nn.MLP([64, 96, 10], activation="relu")
    opt = optim.adam(1e-2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    p = mlp.init(0)
    return step, p, opt.init(p), x, y


def _fresh(tree):
    return engine.tree_map(lambda a: np.array(a, copy=True), tree)


@native
def test_donated_training_matches_undonated_bit_for_bit_and_reuses_the_weights():
    step, p0, s0, x, y = _step_fn()
    plain = engine.jit(step)
    donating = engine.jit(step, donate_argnums=(0, 1))
    pa, sa = _fresh(p0), _fresh(s0)
    pb, sb = _fresh(p0), _fresh(s0)
    reused = 0
    for _ in range(4):
        pa, sa, la = plain(pa, sa, x, y)
        before = {id(a) for a in engine.tree_leaves((pb, sb))}
        pb, sb, lb = donating(pb, sb, x, y)
        reused += sum(id(a) in before for a in engine.tree_leaves((pb, sb)))
        assert float(la) == float(lb)
    for a, b in zip(engine.tree_leaves((pa, sa)), engine.tree_leaves((pb, sb))):
        np.testing.assert_array_equal(a, b)
    assert reused > 0  # the 64x96 weight and its moments were updated in their own arrays


@native
def test_an_array_passed_twice_or_viewed_is_not_written():
    opt = optim.adam(1e-2)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((128, 96)).astype(np.float32)
    g = rng.standard_normal((128, 96)).astype(np.float32)
    update = engine.jit(lambda g, s, p: opt.update(g, s, p), donate_argnums=(1, 2))
    ref_p, ref_s = engine.jit(lambda g, s, p: opt.update(g, s, p))({"w": g}, opt.init({"w": w}), {"w": w.copy()})
    # the same array as parameter and as gradient: writing the update into it would corrupt the gradient
    shared = w.copy()
    s = opt.init({"w": shared})
    p2, s2 = update({"w": shared}, s, {"w": shared})
    np.testing.assert_array_equal(shared, w)  # left alone
    expect_p, _ = engine.jit(lambda g, s, p: opt.update(g, s, p))({"w": w.copy()}, opt.init({"w": w}), {"w": w.copy()})
    np.testing.assert_array_equal(p2["w"], expect_p["w"])
    # a view of a larger array
    big = np.concatenate([w, w])
    view = big[:128]
    p3, _ = update({"w": g}, opt.init({"w": w}), {"w": view})
    np.testing.assert_array_equal(big[:128], w)
    np.testing.assert_array_equal(p3["w"], ref_p["w"])
    # a read-only array
    ro = w.copy()
    ro.flags.writeable = False
    p4, _ = update({"w": g}, opt.init({"w": w}), {"w": ro})
    np.testing.assert_array_equal(ro, w)
    np.testing.assert_array_equal(p4["w"], ref_p["w"])


@native
def test_a_donated_argument_read_after_the_update_is_not_overwritten():
    opt = optim.sgd(0.1) if hasattr(optim, "sgd") else optim.adam(1e-2)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((96, 96)).astype(np.float32)
    g = rng.standard_normal((96, 96)).astype(np.float32)

    def f(g, s, p):
        new_p, new_s = opt.update(g, s, p)
        return new_p, new_s, ops.sum(p["w"] * 2.0)  # the old parameters are read after the update

    out = engine.jit(f, donate_argnums=(1, 2))({"w": g}, opt.init({"w": w}), {"w": w.copy()})
    ref = engine.jit(f)({"w": g}, opt.init({"w": w}), {"w": w.copy()})
    np.testing.assert_array_equal(out[0]["w"], ref[0]["w"])
    assert float(out[2]) == float(ref[2])


def test_donation_cannot_be_static_and_is_off_under_the_nan_debugger():
    with pytest.raises(EngineError, match="both static and donated"):
        engine.jit(lambda a, b: a, static_argnums=(1,), donate_argnums=(1,))
    step, p0, s0, x, y = _step_fn()
    j = engine.jit(step, donate_argnums=(0, 1), debug_nans=True)
    p, s = _fresh(p0), _fresh(s0)
    ids = {id(a) for a in engine.tree_leaves((p, s))}
    p2, s2, _ = j(p, s, x, y)
    assert not ids & {id(a) for a in engine.tree_leaves((p2, s2))}


def test_the_numpy_fallback_of_a_multi_output_kernel_is_safe_over_its_inputs():
    # the kernel of body (a, b) -> (a * b + 1, a - b): writing the first output over `a` before the
    # second is computed would change the second one
    from fedarena.engine.core.ir import Graph, Var

    def f(a, b):
        return [a * b + 1.0, a - b]

    graph = engine.make_graph(lambda a, b: tuple(f(a, b)))(np.ones(8, np.float32), np.ones(8, np.float32))
    body = Graph(graph.invars, [], [], graph.eqns, graph.outvars)
    kernel = FusedKernel(body)
    a = np.arange(8, dtype=np.float32)
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    expect = [a * b + 1, a - b]
    a2, other = a.copy(), np.empty_like(a)
    kernel(a2, b, a2, other)  # first output over the first input
    np.testing.assert_array_equal(a2, expect[0])
    np.testing.assert_array_equal(other, expect[1])
    assert all(isinstance(v, Var) for v in body.outvars)


@native
def test_the_vm_writes_several_outputs_over_their_inputs_after_reading_each_block():
    from fedarena.engine.compiler import native as N
    from fedarena.engine.core.ir import Graph

    n = 100_000
    graph = engine.make_graph(lambda a, b: (a * b + 1.0, a - b, b * 0.5))(np.ones(n, np.float32), np.ones(n, np.float32))
    body = Graph(graph.invars, [], [], graph.eqns, graph.outvars)
    prog = N.elementwise_program(body)
    assert prog is not None
    rng = np.random.default_rng(3)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    expect = [a * b + 1, a - b, b * np.float32(0.5)]
    a2, b2, c = a.copy(), b.copy(), np.empty_like(a)
    assert cext._native.elementwise(prog.program, prog.consts, prog.modes, prog.bparams, n, False, (b2, c, a2), a2, b2)
    np.testing.assert_array_equal(b2, expect[0])
    np.testing.assert_array_equal(c, expect[1])
    np.testing.assert_array_equal(a2, expect[2])
    # an output over a shifted part of an input: declined, nothing written
    buf = np.concatenate([a, a[:8]])
    out = np.zeros(n, np.float32)
    assert not cext._native.elementwise(prog.program, prog.consts, prog.modes, prog.bparams, n, False, (buf[8:], out, out.copy()), buf[:n], b)
    assert not out.any()
