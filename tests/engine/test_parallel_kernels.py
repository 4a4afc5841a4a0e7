"""The engine's kernel pool (``_parallel.c``): matrix products split over ``engine.set_num_threads``
threads, checked against float64 numpy products, and the pool's lifecycle (resizing, fork,
concurrent callers)."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.core import cext, threads

pytestmark = pytest.mark.skipif(not cext.available(), reason="the C extension is not built")


@pytest.fixture
def two_threads():
    engine.set_num_threads(2)
    yield
    engine.set_num_threads(1)


def _operand(rng, rows, cols, dtype, transposed):
    a = rng.standard_normal((cols, rows) if transposed else (rows, cols)).astype(dtype)
    return a.T if transposed else a


def _tol(dtype, k):
    return (2e-6 if dtype == np.float32 else 1e-14) * k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(128, 784, 512), (784, 128, 512), (600, 300, 37), (37, 300, 600), (17, 5, 33)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_split_gemm_matches_float64_products(two_threads, dtype, shape, ta, tb):
    if threads.numpy_openblas() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS with per-thread thread counts")
    m, k, n = shape
    rng = np.random.default_rng(m * 7 + k + n)
    a, b = _operand(rng, m, k, dtype, ta), _operand(rng, k, n, dtype, tb)
    out = np.full((m, n), np.nan, dtype)
    assert cext._native.gemm(a, b, out) is True
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=0, atol=_tol(dtype, k) * np.abs(ref).max())


def test_gemm_declines_what_blas_cannot_take(two_threads):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 80)).astype(np.float32)
    out = np.zeros((64, 80), np.float32)
    assert cext._native.gemm(a[:, ::2], b[::2], out) is False  # strided columns
    assert cext._native.gemm(a, b.astype(np.float64), out) is False  # mixed dtypes
    assert cext._native.gemm(a, b, np.zeros((80, 64), np.float32).T) is False  # transposed output
    buf = np.zeros((64, 96 + 80), np.float32)
    assert cext._native.gemm(buf[:, :96], b, buf[:, 96:]) is False  # output overlaps an operand
    assert cext._native.gemm(a, b[:95], out) is False  # inner sizes differ
    assert not out.any()


def test_gemm_declines_with_one_thread():
    engine.set_num_threads(1)
    a = np.ones((64, 64), np.float32)
    out = np.zeros((64, 64), np.float32)
    assert threads.kernel_threads() == 1
    assert cext._native.gemm(a, a, out) is False and not out.any()


def _mlp_step():
    from fedarena.engine import nn, optim

    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    y = rng.integers(0, 10, 128)
    mlp = nn.MLP([784, 512, 512, 10], activation="relu")
    opt = optim.adam(1e-3)

    def step(p, s):
        loss, g = engine.value_and_grad(lambda p: ops.cross_entropy(mlp.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    p = mlp.init(0)
    return engine.jit(step), p, opt.init(p)


def test_a_training_step_on_two_threads_equals_one_thread():
    step, p, s = _mlp_step()
    results = {}
    for n in (1, 2, 1):
        engine.set_num_threads(n)
        assert threads.kernel_threads() == n
        q, t = p, s
        for _ in range(3):
            q, t, loss = step(q, t)
        results.setdefault(n, []).append((q, float(loss)))
    engine.set_num_threads(1)
    (q1, l1), (q2, l2), (q1b, l1b) = results[1][0], results[2][0], results[1][1]
    assert l1 == l1b  # the program itself is deterministic
    assert abs(l1 - l2) < 1e-5 * abs(l1)
    for a, b in zip(engine.tree_leaves(q1), engine.tree_leaves(q2)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_resizing_the_pool_and_bad_sizes():
    for n in (3, 2, 4, 1, 2, 2):
        engine.set_num_threads(n)
        assert threads.kernel_threads() == n
    engine.set_num_threads(None)
    assert threads.kernel_threads() == 1
    with pytest.raises(ValueError, match="number of threads"):
        engine.set_num_threads(0)
    with pytest.raises(ValueError, match="1..64"):
        cext._native.set_threads(65)


def _child_product(q):
    a = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    f = engine.jit(lambda x: x @ x)
    q.put(float(np.abs(np.asarray(f(a)) - a.astype(np.float64) @ a).max()))


def test_a_forked_child_runs_without_the_parents_workers(two_threads):
    f = engine.jit(lambda x: x @ x)
    a = np.ones((256, 256), np.float32)
    f(a)  # the pool has run a product before the fork
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_child_product, args=(q,))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the forked child hung or crashed"
    assert q.get(timeout=5) < 1e-3


def test_concurrent_callers_share_the_pool(two_threads):
    rng = np.random.default_rng(2)
    mats = [rng.standard_normal((384, 384)).astype(np.float32) for _ in range(4)]
    f = engine.jit(lambda x: x @ x)
    errors = []

    def work(m):
        ref = m.astype(np.float64) @ m
        for _ in range(20):
            errors.append(float(np.abs(np.asarray(f(m)) - ref).max()))

    ts = [threading.Thread(target=work, args=(m,)) for m in mats]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errors) == 80 and max(errors) < 1e-3


def test_a_fused_program_split_over_threads_is_bitwise_the_one_thread_result():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 1000)).astype(np.float32)  # 300k elements: split at 2 threads
    row = rng.standard_normal(1000).astype(np.float32)
    col = rng.standard_normal((300, 1)).astype(np.float32)

    def f(x, row, col):
        return (x * row + col) * x + ops.sqrt(ops.abs(x) + 1.0) / (x * x + 2.0)

    fj = engine.jit(f)
    graph = engine.inspect(f, printer=None)(x, row, col).graph
    assert [e.prim.name for e in graph.eqns] == ["fused_elementwise"]  # one VM program
    engine.set_num_threads(1)
    one = np.asarray(fj(x, row, col)).copy()
    engine.set_num_threads(2)
    try:
        two = np.asarray(fj(x, row, col)).copy()
    finally:
        engine.set_num_threads(1)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, (x * row + col) * x + np.sqrt(np.abs(x) + 1.0) / (x * x + 2.0), rtol=2e-6, atol=2e-6)


def test_a_stale_extension_is_not_used(monkeypatch):
    """A build from older sources (missing a kernel) is refused with a warning, not called."""
    import importlib.util
    import sys
    import types

    stale = types.ModuleType("fedarena.engine._native")
    stale.dense = stale.elementwise = lambda *a: True  # an old build: no pool, no gemm
    monkeypatch.setitem(sys.modules, "fedarena.engine._native", stale)
    monkeypatch.setattr(sys.modules["fedarena.engine"], "_native", stale, raising=False)
    spec = importlib.util.spec_from_file_location("fedarena.engine.core._cext_probe", cext.__file__)
    probe = importlib.util.module_from_spec(spec)
    with pytest.warns(RuntimeWarning, match="older sources"):
        spec.loader.exec_module(probe)
    assert probe.STALE and probe._native is None and not probe.available()
