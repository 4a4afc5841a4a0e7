"""Recompile warnings (which argument, what changed), the compile budget, explain_cache_misses, and
jit(shape_buckets=...): padded batches with a validity mask give the unpadded results (against numpy and
PyTorch), compile once per bucket, and refuse what would mix padded rows into valid ones."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops


def _recompile_messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, engine.RecompileWarning)]


def test_eleven_new_shapes_warn_once_naming_the_argument_and_the_change():
    f = engine.jit(lambda scale, batch: ops.sum(batch["obs"]) * scale)
    scale = np.float64(2.0)
    msgs = _recompile_messages(lambda: [f(scale, {"obs": np.ones((n, 2))}) for n in range(1, 12)])
    assert f.cache_size == 11 and f.compiles == 11
    assert len(msgs) == 1
    assert "batch['obs']: shape (1, 2) -> (2, 2)" in msgs[0] and "scale" not in msgs[0].split("because")[1][:20]
    # a dtype change and a static value change are named too (a fresh function warns once again)
    h = engine.jit(lambda x, mode: x * 2 if mode == "double" else x, static_argnums=1)
    h(np.ones(2, np.float32), "double")
    (msg,) = _recompile_messages(lambda: h(np.ones(2, np.float32), "half"))
    assert "mode: static value 'double' -> 'half'" in msg
    k = engine.jit(lambda x: x + 1)
    k(np.ones(3, np.float32))
    (msg,) = _recompile_messages(lambda: k(np.ones(3, np.float64)))
    assert "x: dtype float32 -> float64" in msg


def test_explain_cache_misses_explains_every_miss_and_can_be_switched_off():
    f = engine.jit(lambda x, y: x + y)
    try:
        engine.explain_cache_misses(True)
        msgs = _recompile_messages(lambda: [f(np.ones(n), np.ones(n)) for n in (1, 2, 3)] + [f(np.ones(3), 1.5)])
    finally:
        engine.explain_cache_misses(False)
    assert len(msgs) == 3
    assert "x: shape (1,) -> (2,); y: shape (1,) -> (2,)" in msgs[0] and "(2,) -> (3,)" in msgs[1]
    assert "y: array float64[3] -> Python scalar 1.5" in msgs[2]
    assert _recompile_messages(lambda: [f(np.ones(n), np.ones(n)) for n in (4, 5)]) != []  # once per function
    assert _recompile_messages(lambda: [f(np.ones(n), np.ones(n)) for n in (6, 7)]) == []


def test_compile_budget_warns_once_past_max_compiles():
    f = engine.jit(lambda x: x * 2, max_compiles=3)
    msgs = _recompile_messages(lambda: [f(np.ones(n)) for n in range(1, 7)])
    budget = [m for m in msgs if "budget" in m]
    assert len(budget) == 1 and "compiled 4 programs, over its budget of 3" in budget[0]
    with pytest.raises(engine.EngineError, match="max_compiles must be a positive int"):
        engine.jit(lambda x: x, max_compiles=0)


def _mlp_loss(params, x, y):
    h = ops.tanh(ops.matmul(x, params["w1"]) + params["b1"])
    return ops.cross_entropy(ops.matmul(h, params["w2"]) + params["b2"], y)


def _params(rng):
    return {"w1": rng.normal(size=(6, 5)), "b1": rng.normal(size=5), "w2": rng.normal(size=(5, 3)),
            "b2": rng.normal(size=3)}


def test_shape_buckets_compile_at_most_three_times_and_equal_the_unpadded_call():
    rng = np.random.default_rng(0)
    params = _params(rng)
    bucketed = engine.jit(engine.value_and_grad(_mlp_loss), shape_buckets=(4, 16, 64), bucket_argnums=(1, 2))
    plain = engine.jit(engine.value_and_grad(_mlp_loss))
    sizes = list(range(1, 12)) + [40, 64]
    with warnings.catch_warnings():
        warnings.simplefilter("error", engine.RecompileWarning)  # a new bucket is expected: no warning
        for n in sizes:
            x, y = rng.normal(size=(n, 6)), rng.integers(0, 3, size=n)
            v, g = bucketed(params, x, y)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", engine.RecompileWarning)
                v0, g0 = plain(params, x, y)
            np.testing.assert_allclose(v, v0, rtol=1e-12)
            for k in params:
                np.testing.assert_allclose(g[k], g0[k], rtol=1e-10, atol=1e-14, err_msg=k)
    assert bucketed.compiles == 3 and plain.compiles == len(sizes)


def test_shape_buckets_loss_and_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    params = _params(rng)
    bucketed = engine.jit(engine.value_and_grad(_mlp_loss), shape_buckets=(8, 32), bucket_argnums=(1, 2))
    for n in (3, 8, 19):
        x, y = rng.normal(size=(n, 6)), rng.integers(0, 3, size=n)
        v, g = bucketed(params, x, y)
        tp = {k: torch.tensor(p, requires_grad=True) for k, p in params.items()}
        h = torch.tanh(torch.tensor(x) @ tp["w1"] + tp["b1"])
        loss = torch.nn.functional.cross_entropy(h @ tp["w2"] + tp["b2"], torch.tensor(y))
        loss.backward()
        np.testing.assert_allclose(v, loss.item(), rtol=1e-12)
        for k in params:
            np.testing.assert_allclose(g[k], tp[k].grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=k)


def test_masked_reductions_losses_and_per_row_outputs_equal_numpy():
    rng = np.random.default_rng(2)

    def many(x, t, labels):
        return {
            "sum0": ops.sum(x, axis=0), "sum": ops.sum(x), "mean0": ops.mean(x, axis=0), "mean": ops.mean(x),
            "var0": ops.var(x, axis=0), "std1": ops.std(x, axis=0, ddof=1), "max": ops.max(x), "min0": ops.min(x, 0),
            "prod0": ops.prod(x, axis=0), "argmax0": ops.argmax(x, axis=0), "argmin0": ops.argmin(x, axis=0),
            "any0": ops.any(x > 1.0, axis=0), "all0": ops.all(x > -3.0, axis=0), "softmax0": ops.softmax(x, axis=0),
            "lse0": ops.logsumexp(x, axis=0), "mse": ops.mse(x, t), "huber_sum": ops.huber(x, t, reduction="sum"),
            "ce_rows": ops.cross_entropy(x, labels, reduction="none"), "rows": ops.tanh(x) * 2.0,
            "mean_rows": ops.mean(x, axis=1), "picked": x[np.arange(x.shape[0]), labels], "col": x[:, 1],
        }

    f = engine.jit(many, shape_buckets=(16,))
    for n in (1, 5, 16):
        x, t = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
        labels = rng.integers(0, 4, size=n)
        got = f(x, t, labels)
        e = np.exp(x - x.max(0))
        d = x - t
        logp = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
        want = {
            "sum0": x.sum(0), "sum": x.sum(), "mean0": x.mean(0), "mean": x.mean(), "var0": x.var(0),
            "std1": x.std(0, ddof=1) if n > 1 else np.full(4, np.nan), "max": x.max(), "min0": x.min(0),
            "prod0": x.prod(0), "argmax0": x.argmax(0), "argmin0": x.argmin(0), "any0": (x > 1.0).any(0),
            "all0": (x > -3.0).all(0), "softmax0": e / e.sum(0), "lse0": np.log(np.exp(x).sum(0)),
            "mse": (d * d).mean(), "huber_sum": np.where(np.abs(d) <= 1, 0.5 * d * d, np.abs(d) - 0.5).sum(),
            "ce_rows": -logp[np.arange(n), labels], "rows": np.tanh(x) * 2.0, "mean_rows": x.mean(1),
            "picked": x[np.arange(n), labels], "col": x[:, 1],
        }
        for k, w in want.items():
            assert got[k].shape == np.shape(w), (k, n)
            np.testing.assert_allclose(got[k], w, rtol=1e-12, atol=1e-15, err_msg=f"{k} n={n}")
    assert f.compiles == 1


def test_per_example_gradients_under_vmap_equal_the_unpadded_ones():
    rng = np.random.default_rng(3)
    params = _params(rng)

    def per_example(p, x, y):
        grads = engine.vmap(engine.grad(lambda q, xi, yi: _mlp_loss(q, xi[None], yi[None])), in_axes=(None, 0, 0))(p, x, y)
        norms = ops.sqrt(sum(ops.sum(ops.reshape(g * g, (g.shape[0], -1)), axis=1) for g in grads.values()))
        return norms, ops.mean(norms)

    bucketed = engine.jit(per_example, shape_buckets=(8, 32), bucket_argnums=(1, 2))
    for n in (2, 7, 9):
        x, y = rng.normal(size=(n, 6)), rng.integers(0, 3, size=n)
        norms, mean = bucketed(params, x, y)
        want = engine.jit(per_example)(params, x, y)
        assert norms.shape == (n,)
        np.testing.assert_allclose(norms, want[0], rtol=1e-12)
        np.testing.assert_allclose(mean, want[1], rtol=1e-12)


@pytest.mark.parametrize("body, what", [
    (lambda x: ops.sum(ops.matmul(ops.transpose(x), x)), "transposing"),
    (lambda x: ops.sum(ops.reshape(x, (-1,)) ** 2), "reshape"),
    (lambda x: ops.concatenate([x, x], axis=0), "concatenating"),
    (lambda x: ops.stack([x, x]), "stacking"),
    (lambda x: ops.matmul(ops.ones((2, 8)), x), "matmul"),
    (lambda x: ops.einsum("bi,bj->ij", x, x), "einsum"),
    (lambda x: ops.sort(x, axis=0), "sorting"),
    (lambda x: ops.sum(x[:3]), "indexing"),
    (lambda x: x[0], "indexing"),
    (lambda x: ops.take(x, np.array([0, 1]), axis=0), "taking rows"),
])
def test_operations_that_mix_padded_rows_are_refused_in_one_line(body, what):
    f = engine.jit(body, shape_buckets=(8,))
    with pytest.raises(engine.EngineError, match=f"^shape_buckets: {what}") as info:
        f(np.ones((5, 3)))
    assert "\n" not in str(info.value)


def test_bad_bucketed_calls_are_named():
    f = engine.jit(lambda p, x: ops.sum(ops.matmul(x, p)), shape_buckets=(4, 8), bucket_argnums=1)
    with pytest.raises(engine.EngineError, match="a batch of 9 rows is larger than the largest bucket 8"):
        f(np.ones((3, 2)), np.ones((9, 3)))
    with pytest.raises(engine.EngineError, match=r"argument p is not bucketed but its leading length is the bucket size 4"):
        f(np.ones((4, 2)), np.ones((3, 4)))
    g = engine.jit(lambda x, y: ops.sum(x) + ops.sum(y), shape_buckets=(8,))
    with pytest.raises(engine.EngineError, match="y has 4 rows but x has 3"):
        g(np.ones(3), np.ones(4))
    with pytest.raises(engine.EngineError, match="shape_buckets must be a non-empty sequence of positive ints"):
        engine.jit(lambda x: x, shape_buckets=(0, 4))


def test_shape_varies_silences_the_new_shape_warning_but_not_the_budget():
    import warnings

    from fedarena import engine
    from fedarena.engine import RecompileWarning

    f = engine.jit(lambda x: (x * 2).sum(), shape_varies=True, max_compiles=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 4):
            f(np.ones((n, 2), np.float32))
    assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
    with pytest.warns(RecompileWarning, match="over its budget of 3"):
        f(np.ones((4, 2), np.float32))
