"""vmap: every batching rule against a Python loop over examples (the oracle), composition with
grad and jit, per-example gradients and 256 independent federated clients as one program."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim

from .cases import CASE_IDS, CASES, NONDIFF_CASES, NONDIFF_IDS

B = 3


def _loop(fn, per_example_args, in_axes):
    outs = []
    for i in range(B):
        args = [a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(per_example_args, in_axes)]
        outs.append(np.asarray(fn(*args)))
    return np.stack(outs)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_vmap_rule_matches_loop(case):
    """Every argument mapped (batched rule), and each argument mapped alone (mixed batched/unbatched)."""
    name, fn, _, make = case
    rng = np.random.default_rng(7)
    examples = [make(rng) for _ in range(B)]
    stacked = [np.stack([ex[k] for ex in examples]) for k in range(len(examples[0]))]
    expect = np.stack([np.asarray(fn(*ex)) for ex in examples])
    got = engine.vmap(fn)(*stacked)
    np.testing.assert_allclose(got, expect, rtol=1e-10, atol=1e-12)
    n = len(stacked)
    if n > 1:
        for k in range(n):
            axes = tuple(0 if j == k else None for j in range(n))
            args = [stacked[j] if j == k else examples[0][j] for j in range(n)]
            expect_k = _loop(fn, args, axes)
            np.testing.assert_allclose(engine.vmap(fn, in_axes=axes)(*args), expect_k, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", NONDIFF_CASES, ids=NONDIFF_IDS)
def test_vmap_rule_of_primitives_without_gradient_matches_loop(case):
    """Batched eagerly and under jit, against one call per example (exact: integer/bool results)."""
    name, fn, make = case
    rng = np.random.default_rng(11)
    examples = [make(rng) for _ in range(B)]
    stacked = [np.stack([ex[k] for ex in examples]) for k in range(len(examples[0]))]
    expect = np.stack([np.asarray(fn(*ex)) for ex in examples])
    check = np.testing.assert_array_equal if expect.dtype.kind in "biu" else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12)
    check(engine.vmap(fn)(*stacked), expect)
    check(engine.jit(engine.vmap(fn))(*stacked), expect)
    check(np.stack([engine.jit(fn)(*ex) for ex in examples]), expect)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("matmul_batched", "sum_axis", "take_axis1", "conv2d", "gather")], ids=lambda c: c[0])
def test_vmap_grad_of_sum_matches_loop(case):
    """vmap(grad(f)) and jit(vmap(grad(f))) equal per-example gradients from a loop."""
    name, fn, _, make = case
    rng = np.random.default_rng(3)
    examples = [make(rng) for _ in range(B)]
    stacked = [np.stack([ex[k] for ex in examples]) for k in range(len(examples[0]))]

    def loss(*xs):
        return ops.sum(ops.tanh(fn(*xs)))

    g = engine.grad(loss)
    expect = np.stack([g(*ex) for ex in examples])
    np.testing.assert_allclose(engine.vmap(g)(*stacked), expect, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(engine.jit(engine.vmap(g))(*stacked), expect, rtol=1e-10, atol=1e-12)


def test_in_and_out_axes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 3))  # mapped over axis 1
    w = rng.standard_normal((4, 2))

    def f(x, w):
        return x.T @ w  # (3, 4) @ (4, 2)

    got = engine.vmap(f, in_axes=(1, None), out_axes=2)(x, w)
    expect = np.stack([x[:, i].T @ w for i in range(5)], axis=2)
    assert got.shape == (3, 2, 5)
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    # pytree in_axes and an unbatched output broadcast along the batch
    p = {"a": rng.standard_normal(3), "b": rng.standard_normal((5, 3))}
    out = engine.vmap(lambda p: (p["a"] * p["b"], ops.sum(p["a"])), in_axes=({"a": None, "b": 0},))(p)
    np.testing.assert_allclose(out[0], p["a"] * p["b"])
    np.testing.assert_allclose(out[1], np.full(5, p["a"].sum()))


def test_nested_vmap_and_errors():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5))
    y = rng.standard_normal((5,))
    got = engine.vmap(engine.vmap(lambda a, b: ops.sum(a * b), in_axes=(0, None)), in_axes=(0, None))(x, y)
    np.testing.assert_allclose(got, np.einsum("ijk,k->ij", x, y), rtol=1e-12)
    with pytest.raises(engine.EngineError, match="different sizes"):
        engine.vmap(lambda a, b: a + b)(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(engine.EngineError, match="no input is mapped"):
        engine.vmap(lambda a: a, in_axes=None)(np.ones(3))
    with pytest.raises(engine.EngineError, match="out of range"):
        engine.vmap(lambda a: a, in_axes=2)(np.ones((3, 2)))


def _mlp_loss(mlp):
    def loss(params, x, y):
        return ops.cross_entropy(mlp.apply(params, x), y)

    return loss


def test_per_example_gradients_of_mlp_equal_loop():
    mlp = nn.MLP([6, 16, 16, 4], activation="tanh")
    params = mlp.init(0, dtype=np.float64)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 6))
    y = rng.integers(0, 4, size=32)
    loss = _mlp_loss(mlp)

    def one(params, xi, yi):
        return engine.grad(loss)(params, xi[None], yi[None])

    per_ex = engine.jit(engine.vmap(one, in_axes=(None, 0, 0)))(params, x, y)
    g1 = engine.jit(engine.grad(loss))
    for i in range(32):
        ref = g1(params, x[i : i + 1], y[i : i + 1])
        for a, b in zip(engine.tree_leaves(per_ex), engine.tree_leaves(ref)):
            np.testing.assert_allclose(a[i], b, rtol=1e-10, atol=1e-13)
    # grad of a vmapped function: d/dparams of the sum of per-example losses == full-batch grad * B
    vloss = engine.vmap(lambda p, xi, yi: loss(p, xi[None], yi[None]), in_axes=(None, 0, 0))
    g_sum = engine.grad(lambda p: ops.sum(vloss(p, x, y)))(params)
    g_full = engine.grad(loss)(params, x, y)
    for a, b in zip(engine.tree_leaves(g_sum), engine.tree_leaves(g_full)):
        np.testing.assert_allclose(a, 32 * b, rtol=1e-10, atol=1e-12)


def test_vmapped_training_step_over_256_clients_equals_one_by_one():
    """Local SGD (3 steps) for 256 clients, each with its own MLP parameters and data, as one program."""
    n_clients, batch = 256, 8
    mlp = nn.MLP([5, 8, 3], activation="relu")
    loss = _mlp_loss(mlp)
    opt = optim.sgd(0.1, momentum=0.9)

    def local_steps(params, state, x, y):
        for k in range(3):
            l, g = engine.value_and_grad(loss)(params, x[k], y[k])
            params, state = opt.update(g, state, params)
        return params, state, l

    rng = np.random.default_rng(5)
    per_client = [mlp.init(seed, dtype=np.float64) for seed in range(n_clients)]
    params = engine.tree_map(lambda *a: np.stack(a), *per_client)
    states = engine.tree_map(lambda *a: np.stack(a), *[opt.init(p) for p in per_client])
    x = rng.standard_normal((n_clients, 3, batch, 5))
    y = rng.integers(0, 3, size=(n_clients, 3, batch))
    step = engine.jit(engine.vmap(local_steps))
    new_p, new_s, losses = step(params, states, x, y)
    single = engine.jit(local_steps)
    for c in range(n_clients):
        p_c, s_c, l_c = single(per_client[c], opt.init(per_client[c]), x[c], y[c])
        np.testing.assert_allclose(losses[c], l_c, rtol=1e-10)
        for a, b in zip(engine.tree_leaves(new_p), engine.tree_leaves(p_c)):
            np.testing.assert_allclose(a[c], b, rtol=1e-9, atol=1e-12)
        for a, b in zip(engine.tree_leaves(new_s), engine.tree_leaves(s_c)):
            np.testing.assert_allclose(a[c], b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_and_its_gradient_with_batched_indices(axis):
    """take with both operands batched (flattened-offset rule) and its transpose index_add."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((4, 5, 6, 3))
    n = X.shape[axis + 1]
    I = rng.integers(0, n, size=(4, 2, 3))
    w = rng.standard_normal(np.take(X[0], I[0], axis=axis).shape)

    def f(x, i):
        return ops.take(x, i, axis=axis)

    got = engine.vmap(f)(X, I)
    np.testing.assert_allclose(got, np.stack([np.take(X[b], I[b], axis=axis) for b in range(4)]))
    g = engine.grad(lambda x, i: ops.sum(f(x, i) * w))
    ref = np.stack([g(X[b], I[b]) for b in range(4)])
    np.testing.assert_allclose(engine.vmap(g)(X, I), ref, rtol=1e-12)
    np.testing.assert_allclose(engine.jit(engine.vmap(g))(X, I), ref, rtol=1e-12)
    # indices batched, table shared (an embedding looked up per example)
    np.testing.assert_allclose(
        engine.vmap(f, in_axes=(None, 0))(X[0], I), np.stack([np.take(X[0], I[b], axis=axis) for b in range(4)])
    )


def test_vmapped_adam_with_global_norm_clipping_equals_per_client_steps():
    """Adam's flat moment vectors, step counter and per-client global-norm clipping under vmap."""
    mlp = nn.MLP([5, 8, 3], activation="relu")
    opt = optim.adam(1e-2, max_grad_norm=0.5)

    def step(p, s, x, y):
        l, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, l

    ps = [mlp.init(i, dtype=np.float64) for i in range(4)]
    stacked = (engine.tree_map(lambda *a: np.stack(a), *ps), engine.tree_map(lambda *a: np.stack(a), *[opt.init(p) for p in ps]))
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((4, 8, 5)), rng.integers(0, 3, (4, 8))
    vstep, one = engine.jit(engine.vmap(step)), engine.jit(step)
    singles = [(ps[i], opt.init(ps[i])) for i in range(4)]
    for _ in range(3):
        *stacked, _ = vstep(*stacked, X, Y)
        singles = [one(*singles[i], X[i], Y[i])[:2] for i in range(4)]
    for i in range(4):
        for u, v in zip(engine.tree_leaves(stacked), engine.tree_leaves(singles[i])):
            np.testing.assert_allclose(u[i], v, rtol=1e-10, atol=1e-14)


def test_keyword_arguments_are_mapped_over_their_leading_axis():
    rng = np.random.default_rng(11)
    w, xs, bs = rng.standard_normal((3, 2)), rng.standard_normal((5, 4, 3)), rng.standard_normal((5, 2))

    def f(w, x, bias=None):
        return ops.tanh(x @ w + bias)

    got = engine.vmap(f, in_axes=(None, 0))(w, xs, bias=bs)
    np.testing.assert_allclose(got, np.stack([np.tanh(xs[i] @ w + bs[i]) for i in range(5)]), rtol=1e-12)
    with pytest.raises(engine.EngineError, match="different sizes"):
        engine.vmap(f, in_axes=(None, 0))(w, xs, bias=bs[:3])
