"""Regression tests for defects found by using the documented API (issue 18, item 2); each one
failed on c6ac2a8.  Oracles: numpy's own indexing, PyTorch's cross-entropy, closed forms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops

X = np.arange(60.0).reshape(3, 4, 5) * 0.1 - 2.0

KEYS = [
    np.array([2, 0, -1]),
    (np.arange(3), np.array([1, 2, 3])),
    (np.arange(3), np.array([1, 2, 3]), np.array([0, 4, -2])),
    (slice(None), np.array([[0, 1], [3, 2]])),
    (Ellipsis, np.array([4, 0])),
    (np.array([0, 2]), slice(1, 3), np.array([1, 4])),  # non-adjacent: the index axis goes first
    (1, slice(None), np.array([0, 3])),  # an int takes part in the advanced index
    (slice(None), np.array([2, 1]), 3),
    (None, np.array([1, 2]), slice(None)),
    (np.array([[0], [2]]), np.array([[1, 3]])),  # index arrays broadcast
    (slice(None, None, -1),),
    (slice(None), slice(3, 0, -2), slice(None, None, -3)),
    (Ellipsis, slice(-1, None, -1)),
]


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_integer_array_indexing_matches_numpy_eager_jit_and_grad(key):
    expect = X[key]
    np.testing.assert_array_equal(ops.getitem(X, key), expect)
    np.testing.assert_array_equal(engine.jit(lambda x: x[key])(X), expect)
    w = np.cos(np.arange(expect.size)).reshape(expect.shape)
    g = engine.jit(engine.grad(lambda x: ops.sum(x[key] * w)))(X)
    ref = np.zeros_like(X)
    np.add.at(ref, key, w)
    np.testing.assert_allclose(g, ref, rtol=0, atol=1e-15)


def test_q_values_of_taken_actions_with_traced_actions():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 4))
    a = rng.integers(0, 4, 6)
    f = engine.jit(lambda q, a: q[np.arange(6), a])
    np.testing.assert_array_equal(f(q, a), q[np.arange(6), a])
    g = engine.jit(engine.grad(lambda q, a: ops.sum(q[np.arange(6), a] ** 2)))(q, a)
    ref = np.zeros_like(q)
    ref[np.arange(6), a] = 2 * q[np.arange(6), a]
    np.testing.assert_allclose(g, ref, rtol=1e-15)
    neg = a - 4  # negative indices wrap, as in numpy
    np.testing.assert_array_equal(f(q, neg), q[np.arange(6), neg])
    vm = engine.vmap(lambda q, a: q[np.arange(6), a])(np.stack([q, 2 * q]), np.stack([a, a[::-1]]))
    np.testing.assert_array_equal(vm, np.stack([q[np.arange(6), a], 2 * q[np.arange(6), a[::-1]]]))


def test_out_of_range_and_mask_indices_are_refused_with_a_clear_error():
    with pytest.raises(engine.ShapeError, match="out of bounds"):
        engine.jit(lambda x: x[np.array([0, 3])])(X)
    with pytest.raises(engine.ShapeError, match="boolean-mask"):
        engine.jit(lambda x: x[X > 0])(X)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_static_float_inf_and_nan_survive_the_second_call(value):
    x = np.array([1.0, -2.0])
    # a Python float argument (static by default) and one marked static
    for f in (engine.jit(lambda x, s: ops.minimum(x, s)), engine.jit(lambda x, s: ops.minimum(x, s), static_argnums=1)):
        for _ in range(3):
            np.testing.assert_array_equal(f(x, value), np.minimum(x, value))
            np.testing.assert_array_equal(f(x, float(str(value))), np.minimum(x, value))  # an equal, distinct object
        assert f.cache_size == 1
    g = engine.jit(lambda x, s: x * s)  # -0.0 and 0.0 are different programs (1/(x*s) differs)
    assert np.signbit(g(np.ones(1), -0.0)[0]) and not np.signbit(g(np.ones(1), 0.0)[0])


def test_python_scalar_arguments_warn_past_a_bounded_number_of_compiles():
    f = engine.jit(lambda x, lr: x * lr)
    x = np.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(8 + 3):
            np.testing.assert_array_equal(f(x, 0.1 * i), x * (0.1 * i))
    msgs = [str(w.message) for w in caught if issubclass(w.category, engine.RecompileWarning)]
    assert len(msgs) == 1 and "lr" in msgs[0] and "np.float" in msgs[0]
    # a numpy scalar is traced: one compile for every value
    h = engine.jit(lambda x, lr: x * lr)
    for i in range(20):
        np.testing.assert_allclose(h(x, np.float64(0.1 * i)), x * 0.1 * i)
    assert h.cache_size == 1


def test_static_argnames():
    calls = []

    def f(x, *, mode):
        calls.append(mode)
        return x * 2 if mode == "double" else x * 3

    g = engine.jit(f, static_argnames="mode")
    x = np.ones(2)
    np.testing.assert_array_equal(g(x, mode="double"), 2 * x)
    np.testing.assert_array_equal(g(x, mode="triple"), 3 * x)
    np.testing.assert_array_equal(g(x, mode="double"), 2 * x)
    assert calls == ["double", "triple"]
    k = engine.jit(lambda x, n: x * n, static_argnames=("n",))
    np.testing.assert_array_equal(k(x, n=np.int64(4)), 4 * x)
    with pytest.raises(engine.EngineError, match="hashable"):
        g(x, mode=["double"])


def test_closed_over_arrays_are_baked_at_trace_time():
    """The rule (docs/engine.md): a closed-over array is copied when the function is traced;
    mutating it afterwards changes nothing until the function is traced again."""
    w = np.array([1.0, 2.0, 3.0])
    b = np.array([0.5])
    f = engine.jit(lambda x: ops.sum(x * w) + b[0] * 2.0 + ops.sum(w * w))
    x = np.ones(3)
    first = f(x)
    assert first == pytest.approx(6.0 + 1.0 + 14.0)
    w[:] = 100.0
    b[:] = 100.0
    assert f(x) == first  # baked, in every equation (also the constant-folded ones)
    assert engine.jit(lambda x: ops.sum(x * w))(x) == 300.0  # a new trace sees the new values
    g = engine.jit(engine.grad(lambda x: ops.sum(x * w)))
    w2 = w.copy()
    np.testing.assert_array_equal(g(x), w2)
    w[:] = -1.0
    np.testing.assert_array_equal(g(x), w2)


def test_numpy_ufunc_on_a_tracer_raises_the_control_flow_error_naming_the_op():
    with pytest.raises(engine.TracerControlFlowError, match=r"ops\.tanh"):
        engine.jit(lambda x: np.tanh(x))(X)
    with pytest.raises(engine.TracerControlFlowError) as info:
        engine.jit(lambda x: float(x[0, 0, 0]))(X)
    assert "not available" not in str(info.value) and "engine.cond" in str(info.value)
    # arithmetic with a numpy array on the left still records the equation
    a = np.arange(5.0)
    f = engine.jit(lambda x: (a + x) * (a - x) / (a + 1.0) + a**x[0] - (a > x) + (a @ x))
    x = np.linspace(0.5, 1.5, 5)
    np.testing.assert_allclose(f(x), (a + x) * (a - x) / (a + 1.0) + a ** x[0] - (a > x) + (a @ x), rtol=1e-14)


@pytest.mark.parametrize("labels", [np.array([0, 3]), np.array([0, -1])])
def test_cross_entropy_refuses_out_of_range_labels(labels):
    logits = np.zeros((2, 3))
    with pytest.raises(IndexError, match=r"cross_entropy: label -?\d+ .*3 classes"):
        ops.cross_entropy(logits, labels)
    with pytest.raises(IndexError, match=r"cross_entropy: label -?\d+ .*3 classes"):
        engine.jit(lambda l, y: ops.cross_entropy(l, y))(logits, labels)
    with pytest.raises(IndexError, match="cross_entropy"):
        engine.jit(engine.grad(lambda l, y: ops.cross_entropy(l, y)))(logits, labels)


def test_cross_entropy_in_range_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 4))
    labels = rng.integers(0, 4, 5)
    ref = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels)).item()
    assert engine.jit(ops.cross_entropy)(logits, labels) == pytest.approx(ref, rel=1e-14)


def test_the_compile_cache_is_bounded_and_drops_the_least_recently_used_program(monkeypatch):
    import importlib

    jit_module = importlib.import_module("fedarena.engine.jit")

    monkeypatch.setattr(jit_module, "CACHE_SIZE", 4)
    traces = []

    def f(x, s):
        traces.append(s)
        return x * s

    g = engine.jit(f)
    x = np.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", engine.RecompileWarning)
        for s in range(10):
            np.testing.assert_array_equal(g(x, float(s)), x * s)
        assert g.cache_size == 4
        assert traces == [float(s) for s in range(10)]
        for s in (9.0, 8.0, 7.0, 6.0):  # the four newest are still compiled
            np.testing.assert_array_equal(g(x, s), x * s)
        assert len(traces) == 10
        np.testing.assert_array_equal(g(x, 0.0), x * 0)  # dropped: traced again, still correct
        assert traces[-1] == 0.0 and len(traces) == 11 and g.cache_size == 4
