"""Equations with several outputs: scan/cond/while return each carry (and stacked y) as an output of
its own, with its own dtype -- an int64 beyond 2**53 beside a float32 stays exact (the packed
float64 vector of the first engine rounded it) -- and grad/jvp/vmap/jit of them still agree with
finite differences and plain numpy loops."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops

BIG = np.int64(2**60 + 1)  # float64 rounds it to 2**60


def _scan_fn(i, x, xs):
    def step(c, xt):
        ci, cx = c
        return (ci + np.int64(1), cx * xt), ci  # the y is the int64 counter
    return engine.scan(step, (i, x), xs)


def _cond_fn(i, x):
    return engine.cond(x > 0, lambda i, x: (i + np.int64(1), x * 2.0), lambda i, x: (i - np.int64(1), x), i, x)


def _while_fn(i, x):
    return engine.while_loop(lambda s: s[1] < 10.0, lambda s: (s[0] + np.int64(1), s[1] * np.float32(2.0)), (i, x))


XS = np.array([1.5, 2.0, -1.0], np.float32)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_scan_keeps_an_int64_beyond_2_53_exact_beside_a_float32(mode):
    f = _scan_fn if mode == "eager" else engine.jit(_scan_fn)
    (ci, cx), ys = f(BIG, np.float32(2.0), XS)
    assert ci.dtype == np.int64 and int(ci) == 2**60 + 4
    assert cx.dtype == np.float32 and float(cx) == pytest.approx(2.0 * 1.5 * 2.0 * -1.0)
    assert ys.dtype == np.int64 and [int(v) for v in ys] == [2**60 + 1, 2**60 + 2, 2**60 + 3]


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_cond_and_while_keep_an_int64_beyond_2_53_exact(mode):
    c = _cond_fn if mode == "eager" else engine.jit(_cond_fn)
    w = _while_fn if mode == "eager" else engine.jit(_while_fn)
    i, x = c(BIG, np.float32(3.0))
    assert (i.dtype, int(i), x.dtype, float(x)) == (np.int64, 2**60 + 2, np.float32, 6.0)
    i, x = c(BIG, np.float32(-3.0))
    assert int(i) == 2**60 and float(x) == -3.0
    i, x = w(BIG, np.float32(1.0))
    assert (i.dtype, int(i), x.dtype, float(x)) == (np.int64, 2**60 + 5, np.float32, 16.0)


def test_the_equation_has_one_output_per_carry_with_its_own_dtype():
    g = engine.make_graph(_scan_fn)(BIG, np.float32(2.0), XS)
    (e,) = [e for e in g.eqns if e.prim.name == "scan"]
    assert [v.aval.str_short() for v in e.outputs] == ["i64[]", "f32[]", "i64[3]"]
    g.validate()
    g = engine.make_graph(_while_fn)(BIG, np.float32(1.0))
    (e,) = [e for e in g.eqns if e.prim.name == "while"]
    assert [v.aval.str_short() for v in e.outputs] == ["i64[]", "f32[]"]
    assert not any(e.prim.name in ("concatenate", "slice") for e in g.eqns)  # nothing packed or unpacked


def test_vmap_of_multi_output_control_flow_matches_a_python_loop():
    i = np.array([BIG, BIG + 7], np.int64)
    x = np.array([3.0, -2.0], np.float32)
    ci, cx = engine.jit(engine.vmap(_cond_fn))(i, x)  # a batched predicate: both branches and a select per output
    assert [int(v) for v in ci] == [2**60 + 2, 2**60 + 7]
    np.testing.assert_array_equal(cx, [6.0, -2.0])
    wi, wx = engine.jit(engine.vmap(_while_fn))(i, np.array([1.0, 4.0], np.float32))
    assert [int(v) for v in wi] == [2**60 + 5, 2**60 + 10]  # 1 -> 16 in 4 steps, 4 -> 16 in 2
    np.testing.assert_array_equal(wx, [16.0, 16.0])
    (si, sx), ys = engine.vmap(_scan_fn, in_axes=(0, 0, None))(i, x, XS)
    assert [int(v) for v in si] == [2**60 + 4, 2**60 + 11]
    assert ys.dtype == np.int64 and int(ys[1, 2]) == 2**60 + 10
    np.testing.assert_allclose(sx, x * np.prod(XS), rtol=1e-6)


def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        d = np.zeros_like(x)
        d.flat[k] = eps
        g.flat[k] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def test_grad_and_jvp_through_scan_with_an_int_carry_match_finite_differences():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 3))
    xs = rng.normal(size=(4, 3))

    def loss(w, i0):
        def step(c, xt):
            i, h = c
            h = ops.tanh(h @ w + xt * ops.astype(i, np.float64))
            return (i + np.int64(1), h), ops.sum(h * h)
        (_, h), ys = engine.scan(step, (i0, np.zeros(3)), xs)
        return ops.sum(h) + ops.sum(ys)

    i0 = np.int64(1)
    g = engine.jit(engine.grad(loss))(w, i0)
    ref = _fd(lambda w_: float(loss(w_, i0)), w)
    np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-8)
    v = rng.normal(size=w.shape)
    _, t = engine.jvp(lambda w_: loss(w_, i0), (w,), (v,))
    np.testing.assert_allclose(float(t), float(np.sum(ref * v)), rtol=1e-6)


def test_grad_through_cond_selects_the_taken_branch_and_ignores_the_int_output():
    def f(x):
        i, y = engine.cond(ops.sum(x) > 0, lambda x: (np.int64(2**60 + 1), ops.sin(x)), lambda x: (np.int64(0), x * x), x)
        return ops.sum(y) + ops.astype(i, np.float64) * 0.0

    for x in (np.array([0.3, 0.9]), np.array([-0.5, 0.1])):
        np.testing.assert_allclose(engine.jit(engine.grad(f))(x), _fd(lambda z: float(f(z)), x), rtol=1e-6)


def test_a_carry_passed_through_unchanged_is_not_overwritten_by_a_later_in_place_op():
    # the body returns its carry as it is, so the compiled body hands back the operand array itself;
    # the executor then runs tanh in place over y's dying buffer -- the scan's output must not change
    def f(x):
        y = x * 2.0
        c, _ = engine.scan(lambda c, _: (c, None), y, length=3)
        return c, ops.tanh(y) + 1.0

    x = np.linspace(-1, 1, 8)
    c, t = engine.jit(f, passes=())(x)
    np.testing.assert_array_equal(c, x * 2.0)
    np.testing.assert_allclose(t, np.tanh(x * 2.0) + 1.0)


def test_control_flow_on_constants_is_folded_once_and_still_exact():
    def f(x):
        (i, _), _ = engine.scan(lambda c, _: ((c[0] + np.int64(1), c[1]), None), (np.int64(BIG), np.float32(0)), length=2)
        return x + ops.astype(i - np.int64(2**60), np.float32)

    exe = engine.jit(f)
    np.testing.assert_array_equal(exe(np.zeros(2, np.float32)), [3.0, 3.0])
    np.testing.assert_array_equal(exe(np.ones(2, np.float32)), [4.0, 4.0])
