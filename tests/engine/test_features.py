"""Issue 18's JAX-style features against independent oracles: BatchNorm/GELU against PyTorch in
train and eval mode, jacfwd/jacrev/hessian against torch.autograd.functional and closed forms,
custom_vjp (the custom rule is the one used), remat (the backward pass recomputes the body) and
the numpy-named additions against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("shape", [(16, 5), (8, 3, 4, 4)])
def test_batchnorm_matches_pytorch_train_and_eval(shape):
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    bn = nn.BatchNorm(c, momentum=0.2)
    params = {"gamma": rng.uniform(0.5, 1.5, c), "beta": rng.standard_normal(c)}
    state = bn.init_state(np.float64)
    tbn = (torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d)(c, momentum=0.2).double()
    with torch.no_grad():
        tbn.weight.copy_(torch.tensor(params["gamma"]))
        tbn.bias.copy_(torch.tensor(params["beta"]))
    step = engine.jit(lambda p, x, s: bn.apply(p, x, s, train=True))
    for t in range(3):
        x = rng.standard_normal(shape) * 2 + t
        y, state = step(params, x, state)
        tbn.train()
        ty = tbn(torch.tensor(x))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state["mean"], tbn.running_mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(state["var"], tbn.running_var.numpy(), rtol=1e-12)
    x = rng.standard_normal(shape)
    tbn.eval()
    y_eval, same = bn.apply(params, x, state, train=False)
    assert same is state
    np.testing.assert_allclose(y_eval, tbn(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-12)
    # gradients through the batch statistics (train mode) against autograd
    xt = torch.tensor(x, requires_grad=True)
    tbn.train()
    w = rng.standard_normal(shape)
    (tbn(xt) * torch.tensor(w)).sum().backward()
    g = engine.grad(lambda x: ops.sum(bn.apply(params, x, state, train=True)[0] * w))(x)
    np.testing.assert_allclose(g, xt.grad.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_layer_matches_pytorch(approximate):
    x = np.linspace(-5, 5, 41)
    layer = nn.GELU(approximate)
    ref = torch.nn.GELU(approximate=approximate)
    xt = torch.tensor(x, requires_grad=True)
    ref(xt).sum().backward()
    np.testing.assert_allclose(layer(None, x), ref(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(engine.grad(lambda x: ops.sum(layer(None, x)))(x), xt.grad.numpy(), rtol=1e-10, atol=1e-14)


def _f(x, w):
    return ops.tanh(w @ x) * ops.sum(x * x)


def test_jacobians_match_torch():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(4), rng.standard_normal((3, 4))
    tj = torch.autograd.functional.jacobian(lambda x, w: (w @ x).tanh() * (x * x).sum(), (torch.tensor(x), torch.tensor(w)))
    for jac in (engine.jacrev, engine.jacfwd):
        np.testing.assert_allclose(jac(_f)(x, w), tj[0].numpy(), rtol=1e-12)
        jx, jw = engine.jit(jac(_f, argnums=(0, 1)))(x, w)
        assert jw.shape == (3, 3, 4)
        np.testing.assert_allclose(jx, tj[0].numpy(), rtol=1e-12)
        np.testing.assert_allclose(jw, tj[1].numpy(), rtol=1e-12)


def test_hessian_matches_closed_form_and_torch():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4))
    a = a + a.T
    x = rng.standard_normal(4)
    np.testing.assert_allclose(engine.hessian(lambda x: 0.5 * x @ a @ x)(x), a, rtol=1e-12)
    g = lambda x: ops.sum(ops.sin(x) * x[0]) + ops.prod(x)  # noqa: E731
    th = torch.autograd.functional.hessian(lambda x: (x.sin() * x[0]).sum() + x.prod(), torch.tensor(x))
    np.testing.assert_allclose(engine.jit(engine.hessian(g))(x), th.numpy(), rtol=1e-10, atol=1e-12)
    m = rng.standard_normal((2, 3))
    hm = engine.hessian(lambda m: ops.sum(m**3))(m)
    assert hm.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(hm.reshape(6, 6), np.diag(6 * m.ravel()), rtol=1e-12)


def test_custom_vjp_uses_its_rule():
    clip = engine.custom_vjp(lambda x: x * 1.0)  # identity forward, gradient clipped to [-1, 1]
    clip.defvjp(lambda x: (x * 1.0, None), lambda res, g: (ops.clip(g, -1.0, 1.0),))
    x = np.array([1.0, 2.0, 3.0])
    f = lambda x: ops.sum(clip(x) * np.array([0.5, -4.0, 2.0]))  # noqa: E731
    np.testing.assert_array_equal(engine.grad(f)(x), [0.5, -1.0, 1.0])
    np.testing.assert_array_equal(engine.jit(engine.grad(f))(x), [0.5, -1.0, 1.0])
    per_ex = engine.vmap(engine.grad(lambda x: ops.sum(clip(x) * 3.0)))(np.ones((2, 3)))
    np.testing.assert_array_equal(per_ex, np.ones((2, 3)))
    with pytest.raises(engine.EngineError, match="reverse mode only"):
        engine.jvp(clip, (x,), (x,))
    with pytest.raises(engine.EngineError, match="defvjp"):
        engine.custom_vjp(lambda x: x)(x)


def test_remat_recomputes_its_body_in_the_backward_pass():
    rng = np.random.default_rng(2)
    w1, w2 = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))

    def block(x):
        return ops.tanh(ops.tanh(x @ w1) @ w2)

    plain = lambda x: ops.sum(block(x) ** 2)  # noqa: E731
    ckpt = lambda x: ops.sum(engine.remat(block)(x) ** 2)  # noqa: E731
    x = rng.standard_normal((4, 8))
    np.testing.assert_allclose(engine.jit(engine.grad(ckpt))(x), engine.grad(plain)(x), rtol=1e-12)
    g = engine.make_graph(engine.grad(ckpt))(x)
    names = [e.prim.name for e in g.eqns]
    # forward: one remat_call (its tanh equations inside); backward: the body's two tanh again
    assert names.count("remat_call") == 1 and names.count("tanh") == 2
    assert [e.prim.name for e in engine.make_graph(engine.grad(plain))(x).eqns].count("tanh") == 2


def test_numpy_named_additions_match_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5))
    i = rng.integers(-7, 7, (4, 5))
    f = engine.jit(
        lambda x, i: (
            i // 3, i % 3, x // 0.4, x % 0.4, ops.cumsum(i, axis=0), ops.prod(i, axis=1), ops.sort(x, axis=0),
            ops.argsort(i, axis=1), ops.any(x > 1.5, axis=0), ops.all(i != 0), ops.isnan(x / (x - x)), ops.isfinite(1.0 / i),
        )
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        got = f(x, i)
        want = (
            i // 3, i % 3, x // 0.4, x % 0.4, np.cumsum(i, 0), np.prod(i, 1), np.sort(x, 0),
            np.argsort(i, 1, kind="stable"), np.any(x > 1.5, 0), np.all(i != 0), np.isnan(x / (x - x)), np.isfinite(1.0 / i),
        )
    for g_, w_ in zip(got, want):
        assert g_.dtype == w_.dtype
        np.testing.assert_allclose(g_, w_, rtol=1e-14)


def test_einsum_refuses_what_it_does_not_support():
    x = np.ones((3, 3))
    with pytest.raises(engine.ShapeError, match="repeated index"):
        ops.einsum("ii->i", x)
    with pytest.raises(engine.ShapeError, match="ellipsis"):
        ops.einsum("...i->i", x)
    with pytest.raises(engine.ShapeError, match="sizes"):
        ops.einsum("ij,jk->ik", x, np.ones((4, 2)))


def test_custom_vjp_keeps_fwd_residuals_instead_of_running_fwd_again():
    calls = {"fwd": 0}

    def fwd(x):
        calls["fwd"] += 1
        y = ops.exp(x)
        return y, y  # the residual is the output itself

    f = engine.custom_vjp(lambda x: ops.exp(x))
    f.defvjp(fwd, lambda y, g: (g * y,))
    loss = lambda x: ops.sum(f(x) * np.array([1.0, -2.0, 0.5]))  # noqa: E731
    x = np.array([0.1, 0.7, -1.2])
    g = engine.make_graph(engine.grad(loss))(x)
    names = [e.prim.name for e in g.eqns]
    # the differentiated forward is fwd's own equations: no custom_vjp_call, and exp once (bwd reuses it)
    assert "custom_vjp_call" not in names and names.count("exp") == 1
    calls["fwd"] = 0
    np.testing.assert_allclose(engine.grad(loss)(x), np.exp(x) * [1.0, -2.0, 0.5], rtol=1e-15)
    assert calls["fwd"] == 1
    np.testing.assert_allclose(engine.jit(engine.grad(loss))(x), np.exp(x) * [1.0, -2.0, 0.5], rtol=1e-15)
    hess = engine.grad(lambda x: ops.sum(engine.grad(loss)(x)))(x)  # grad of grad through fwd's residual
    np.testing.assert_allclose(hess, np.exp(x) * [1.0, -2.0, 0.5], rtol=1e-14)
    np.testing.assert_allclose(f(x), np.exp(x), rtol=1e-15)  # undifferentiated: fn
