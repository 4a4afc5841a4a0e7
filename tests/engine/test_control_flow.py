"""Control flow: scan/cond/while_loop/fori_loop against Python loops (the oracle) — values,
reverse-mode gradients equal to the unrolled loop, forward mode against finite differences,
batching, and GAE(lambda) / V-trace targets against straightforward numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops


def _allclose_tree(a, b, rtol=1e-10, atol=1e-12):
    la, lb = engine.tree_leaves(a), engine.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _rnn_scan(params, h0, xs, reverse=False):
    def step(h, x):
        h = ops.tanh(x @ params["w"] + h @ params["u"] + params["b"])
        return h, ops.sum(h * h, axis=-1)

    return engine.scan(step, h0, xs, reverse=reverse)


def _rnn_unrolled(params, h0, xs, reverse=False):
    h = h0
    ys = [None] * xs.shape[0]
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in order:
        h = ops.tanh(xs[t] @ params["w"] + h @ params["u"] + params["b"])
        ys[t] = ops.sum(h * h, axis=-1)
    return h, ops.stack(ys)


def _rnn_setup(seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 4)) * 0.5, "u": rng.standard_normal((4, 4)) * 0.5, "b": rng.standard_normal(4) * 0.1}
    return params, rng.standard_normal((2, 4)) * 0.3, rng.standard_normal((6, 2, 3))


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_values_and_gradients_equal_unrolled_loop(reverse):
    params, h0, xs = _rnn_setup()
    _allclose_tree(_rnn_scan(params, h0, xs, reverse), _rnn_unrolled(params, h0, xs, reverse))
    _allclose_tree(engine.jit(_rnn_scan, static_argnums=3)(params, h0, xs, reverse), _rnn_unrolled(params, h0, xs, reverse))

    def loss(fn):
        def f(params, h0, xs):
            h, ys = fn(params, h0, xs, reverse)
            return ops.sum(ops.sin(ys)) + ops.sum(h * np.linspace(0.1, 1, 8).reshape(2, 4))

        return f

    g_scan = engine.grad(loss(_rnn_scan), argnums=(0, 1, 2))(params, h0, xs)
    g_unrolled = engine.grad(loss(_rnn_unrolled), argnums=(0, 1, 2))(params, h0, xs)
    _allclose_tree(g_scan, g_unrolled)
    _allclose_tree(engine.jit(engine.grad(loss(_rnn_scan), argnums=(0, 1, 2)))(params, h0, xs), g_unrolled)
    # forward mode through scan against the unrolled loop
    v = engine.tree_map(lambda a: np.ones_like(a) * 0.3, params)
    _, t_scan = engine.jvp(lambda p: loss(_rnn_scan)(p, h0, xs), (params,), (v,))
    _, t_unr = engine.jvp(lambda p: loss(_rnn_unrolled)(p, h0, xs), (params,), (v,))
    np.testing.assert_allclose(t_scan, t_unr, rtol=1e-10)


def test_scan_grad_of_grad_and_int_carry():
    # Hessian-vector product through scan == through the unrolled loop
    xs = np.array([0.3, -0.2, 0.5, 0.1])

    def f_scan(a):
        c, _ = engine.scan(lambda c, x: (ops.tanh(c * a + x), None), np.float64(0.2), xs)
        return c * c

    def f_unr(a):
        c = 0.2
        for x in xs:
            c = ops.tanh(c * a + x)
        return c * c

    a = np.float64(0.7)
    h1 = engine.grad(engine.grad(f_scan))(a)
    h2 = engine.grad(engine.grad(f_unr))(a)
    np.testing.assert_allclose(h1, h2, rtol=1e-9)
    # an integer counter in the carry: no gradient flows to it, values stay exact
    (cnt, s), _ = engine.scan(lambda c, x: ((c[0] + 1, c[1] + x * x), None), (np.int64(0), np.float64(0.0)), xs)
    assert cnt.dtype == np.int64 and int(cnt) == 4
    g = engine.grad(lambda xs: engine.scan(lambda c, x: ((c[0] + 1, c[1] + x * x), None), (np.int64(0), np.float64(0.0)), xs)[0][1])(xs)
    np.testing.assert_allclose(g, 2 * xs)


def test_scan_errors():
    with pytest.raises(engine.ShapeError, match="carry changed shape"):
        engine.scan(lambda c, x: (ops.stack([c, c]), None), np.float64(0.0), np.ones(3))
    with pytest.raises(engine.ShapeError, match="disagree"):
        engine.scan(lambda c, x: (c, None), np.float64(0.0), (np.ones(3), np.ones(4)))


# ----------------------------------------------------------------------------- RL targets


def gae_numpy(rewards, values, dones, last_value, gamma, lam):
    T = len(rewards)
    adv = np.zeros(T)
    last = 0.0
    for t in reversed(range(T)):
        next_v = last_value if t == T - 1 else values[t + 1]
        nonterm = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterm - values[t]
        last = delta + gamma * lam * nonterm * last
        adv[t] = last
    return adv


def gae_scan(rewards, values, dones, last_value, gamma, lam):
    next_values = ops.concatenate([values[1:], ops.reshape(last_value, (1,))])
    nonterm = 1.0 - dones
    deltas = rewards + gamma * next_values * nonterm - values

    def step(acc, inp):
        delta, nt = inp
        acc = delta + gamma * lam * nt * acc
        return acc, acc

    _, adv = engine.scan(step, np.float64(0.0), (deltas, nonterm), reverse=True)
    return adv


def vtrace_numpy(behaviour_logp, target_logp, rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=1.0):
    """Espeholt et al. (2018), IMPALA, eq. (1), by the backward recursion of their Remark 1."""
    T = len(rewards)
    rho = np.exp(target_logp - behaviour_logp)
    rhos = np.minimum(rho_bar, rho)
    cs = np.minimum(c_bar, rho)
    values_tp1 = np.append(values[1:], bootstrap)
    deltas = rhos * (rewards + discounts * values_tp1 - values)
    vs_minus_v = np.zeros(T)
    acc = 0.0
    for t in reversed(range(T)):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    vs_tp1 = np.append(vs[1:], bootstrap)
    pg_adv = rhos * (rewards + discounts * vs_tp1 - values)
    return vs, pg_adv


def vtrace_scan(behaviour_logp, target_logp, rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=1.0):
    rho = ops.exp(target_logp - behaviour_logp)
    rhos = ops.minimum(rho, rho_bar)
    cs = ops.minimum(rho, c_bar)
    values_tp1 = ops.concatenate([values[1:], ops.reshape(bootstrap, (1,))])
    deltas = rhos * (rewards + discounts * values_tp1 - values)
    _, vs_minus_v = engine.scan(lambda acc, inp: ((inp[0] + inp[1] * inp[2] * acc),) * 2, np.float64(0.0), (deltas, discounts, cs), reverse=True)
    vs = values + vs_minus_v
    vs_tp1 = ops.concatenate([vs[1:], ops.reshape(bootstrap, (1,))])
    return vs, rhos * (rewards + discounts * vs_tp1 - values)


def test_gae_with_scan_matches_numpy():
    rng = np.random.default_rng(4)
    T = 17
    r, v = rng.standard_normal(T), rng.standard_normal(T)
    d = (rng.uniform(size=T) < 0.2).astype(np.float64)
    lv = np.float64(0.37)
    ref = gae_numpy(r, v, d, 0.37, 0.99, 0.95)
    np.testing.assert_allclose(gae_scan(r, v, d, lv, 0.99, 0.95), ref, rtol=1e-12)
    np.testing.assert_allclose(engine.jit(gae_scan, static_argnums=(4, 5))(r, v, d, lv, 0.99, 0.95), ref, rtol=1e-12)
    # batched over 5 environments with vmap
    R, V, D = rng.standard_normal((5, T)), rng.standard_normal((5, T)), (rng.uniform(size=(5, T)) < 0.2) * 1.0
    LV = rng.standard_normal(5)
    got = engine.vmap(lambda r, v, d, lv: gae_scan(r, v, d, lv, 0.99, 0.95))(R, V, D, LV)
    for e in range(5):
        np.testing.assert_allclose(got[e], gae_numpy(R[e], V[e], D[e], LV[e], 0.99, 0.95), rtol=1e-12)


def test_vtrace_with_scan_matches_numpy():
    rng = np.random.default_rng(5)
    T = 20
    blp, tlp = rng.standard_normal(T) * 0.5 - 1, rng.standard_normal(T) * 0.5 - 1
    r, v = rng.standard_normal(T), rng.standard_normal(T)
    disc = 0.99 * (rng.uniform(size=T) > 0.1)
    boot = np.float64(0.5)
    vs_ref, pg_ref = vtrace_numpy(blp, tlp, r, v, 0.5, disc)
    vs, pg = engine.jit(vtrace_scan)(blp, tlp, r, v, boot, disc)
    np.testing.assert_allclose(vs, vs_ref, rtol=1e-12)
    np.testing.assert_allclose(pg, pg_ref, rtol=1e-12)


# ----------------------------------------------------------------------------- cond / while / fori


def test_cond_values_gradients_and_vmap():
    def f(p, x, y):
        return engine.cond(p, lambda a, b: ops.sin(a) * b, lambda a, b: a + ops.exp(b), x, y)

    x, y = np.array([0.3, -1.2]), np.array([0.7, 0.1])
    np.testing.assert_allclose(f(True, x, y), np.sin(x) * y)
    np.testing.assert_allclose(engine.jit(f)(np.bool_(False), x, y), x + np.exp(y))
    loss = lambda x, y, p: ops.sum(f(p, x, y) ** 2)  # noqa: E731
    for p in (True, False):
        unrolled = (lambda x, y: ops.sum((ops.sin(x) * y) ** 2)) if p else (lambda x, y: ops.sum((x + ops.exp(y)) ** 2))
        _allclose_tree(engine.grad(loss, argnums=(0, 1))(x, y, np.bool_(p)), engine.grad(unrolled, argnums=(0, 1))(x, y))
        _, t = engine.jvp(lambda x: loss(x, y, np.bool_(p)), (x,), (np.ones(2),))
        _, t_ref = engine.jvp(lambda x: unrolled(x, y), (x,), (np.ones(2),))
        np.testing.assert_allclose(t, t_ref, rtol=1e-12)
    # batched predicate -> both branches computed and selected per example
    P_ = np.array([True, False, True])
    X = np.stack([x, x * 2, x * 3])
    got = engine.vmap(f, in_axes=(0, 0, None))(P_, X, y)
    for i in range(3):
        np.testing.assert_allclose(got[i], f(bool(P_[i]), X[i], y))
    got = engine.vmap(f, in_axes=(None, 0, None))(np.bool_(False), X, y)
    np.testing.assert_allclose(got, X + np.exp(y))
    with pytest.raises(engine.ShapeError, match="different types"):
        engine.cond(True, lambda a: a, lambda a: ops.sum(a), x)


def test_while_loop_forward_jvp_vmap_and_reverse_mode_error():
    def newton_sqrt(a):
        # iterate x <- (x + a/x)/2 until converged (data-dependent trip count)
        def body(s):
            x, i = s
            return (0.5 * (x + a / x), i + 1)

        return engine.while_loop(lambda s: ops.logical_and(ops.abs(s[0] * s[0] - a) > 1e-12, s[1] < 100), body, (a, np.int64(0)))

    a = np.float64(7.0)
    x, n = newton_sqrt(a)
    np.testing.assert_allclose(x, np.sqrt(7.0), rtol=1e-12)
    xj, nj = engine.jit(newton_sqrt)(a)
    assert int(nj) == int(n) and np.isclose(xj, x)
    _, t = engine.jvp(lambda a: newton_sqrt(a)[0], (a,), (np.float64(1.0),))
    # the derivative of the unrolled iteration with the same trip count
    def unrolled(a):
        x = a
        for _ in range(int(n)):
            x = 0.5 * (x + a / x)
        return x

    _, t_ref = engine.jvp(unrolled, (a,), (np.float64(1.0),))
    np.testing.assert_allclose(t, t_ref, rtol=1e-10)
    np.testing.assert_allclose(t, 0.5 / np.sqrt(7.0), rtol=1e-6)
    As = np.array([2.0, 9.0, 0.25, 16.0])
    xs, ns = engine.vmap(newton_sqrt)(As)
    np.testing.assert_allclose(xs, np.sqrt(As), rtol=1e-12)
    assert [int(k) for k in ns] == [int(newton_sqrt(np.float64(v))[1]) for v in As]
    with pytest.raises(engine.EngineError, match="scan"):
        engine.grad(lambda a: newton_sqrt(a)[0])(a)


def test_fori_loop_static_and_traced_bounds():
    def f(x):
        return engine.fori_loop(0, 5, lambda i, v: v * x + ops.astype(i, np.float64), np.float64(1.0))

    def ref(x):
        v = 1.0
        for i in range(5):
            v = v * x + i
        return v

    x = np.float64(0.8)
    np.testing.assert_allclose(f(x), ref(0.8), rtol=1e-12)
    np.testing.assert_allclose(engine.grad(f)(x), engine.grad(ref)(x), rtol=1e-12)
    g = engine.jit(lambda n, x: engine.fori_loop(np.int64(0), n, lambda i, v: v * x, np.float64(1.0)))
    np.testing.assert_allclose(g(np.int64(4), x), 0.8**4, rtol=1e-12)
    np.testing.assert_allclose(g(np.int64(2), x), 0.8**2, rtol=1e-12)


def test_vmap_of_scan_and_grad_of_vmapped_scan():
    params, h0, xs = _rnn_setup(1)
    H0 = np.stack([h0, h0 * 0.5, -h0])
    XS = np.stack([xs, xs[::-1], xs * 0.3])
    got = engine.vmap(lambda h, x: _rnn_scan(params, h, x))(H0, XS)
    for i in range(3):
        _allclose_tree((got[0][i], got[1][i]), _rnn_unrolled(params, H0[i], XS[i]))

    def loss(fn):
        def f(p):
            h, ys = engine.vmap(lambda h, x: fn(p, h, x))(H0, XS)
            return ops.sum(ys) + ops.sum(h)

        return f

    _allclose_tree(engine.grad(loss(_rnn_scan))(params), engine.grad(loss(_rnn_unrolled))(params))
    _allclose_tree(engine.jit(engine.grad(loss(_rnn_scan)))(params), engine.grad(loss(_rnn_unrolled))(params))
