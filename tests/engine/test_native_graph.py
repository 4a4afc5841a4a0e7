"""Whole-graph native code (compiler/codegen_c.py, backends/numpy/native_executor.py) against the
per-equation executor on the same graph: equal bit for bit on the registry's random programs and
their gradients, on a PPO-style training step, and the fallbacks (no compiler, unsupported
equations, non-contiguous inputs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.backends.numpy import native_executor
from fedarena.engine.backends.numpy.executor import Executable
from fedarena.engine.compiler import codegen_c
from fedarena.engine.compiler.passes import DEFAULT_PIPELINE
from fedarena.engine.core import cext

from .test_memory_plan_exec import _loss_of
from .test_passes import _random_program

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE_CACHE", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _bitwise(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), np.max(np.abs(a.astype(float) - b.astype(float)))


@pytest.mark.parametrize("dtype,seeds", [(np.float64, range(0, 6)), (np.float32, range(8, 14))])
def test_random_programs_and_gradients_equal_the_executor_bit_for_bit(dtype, seeds):
    lowered = 0
    for seed in seeds:
        rng = np.random.default_rng(200 + seed)
        fn = _random_program(rng, n_ops=10)
        x, y = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((3, 4)).astype(dtype)
        for f in (fn, engine.value_and_grad(_loss_of(fn), argnums=(0, 1))):
            g = DEFAULT_PIPELINE(engine.make_graph(f)(x, y))
            exe = native_executor.native_executable(g)
            if exe is None:
                with pytest.raises(codegen_c.Unsupported):
                    codegen_c.lower(g)
                continue
            lowered += 1
            want = Executable(exe.graph)(x, y)
            for _ in range(2):  # nothing a call leaves in the arena leaks into the next
                _bitwise(exe(x, y), want)
    assert lowered == 2 * len(seeds)  # every program and its gradient lowers completely


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_blocks_of_every_width_equal_the_executor_bit_for_bit(dtype):
    """The generated dense loop accumulates codegen_c.DENSE_BLOCK bytes of columns at once and _native.c's
    kernel (the executor's) 16: widths below, at, between and above the blocks, with and without a bias and
    relu, give the same bits."""
    rng = np.random.default_rng(7)
    seen = set()
    for n in (1, 4, 15, 16, 17, 31, 32, 33, 64, 70):
        for m, relu, bias in ((1, False, True), (5, True, True), (3, False, False)):
            x = rng.standard_normal((m, 24)).astype(dtype)
            w, b = rng.standard_normal((24, n)).astype(dtype), rng.standard_normal(n).astype(dtype)

            def f(x, w, b):
                y = x @ w + b if bias else x @ w
                return ops.relu(y) if relu else y

            g = DEFAULT_PIPELINE(engine.make_graph(f)(x, w, b))
            seen.update(e.prim.name for e in g.eqns)
            exe = native_executor.native_executable(g)
            assert exe is not None
            _bitwise(exe(x, w, b), Executable(exe.graph)(x, w, b))
    assert "dense" in seen  # the operator-selection node is what is compared


def _mlp_step(p, x, y):
    def loss(p):
        h = ops.tanh(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        logp = logits - ops.logsumexp(logits, axis=1, keepdims=True)
        return -ops.mean(ops.sum(logp * y, axis=1))

    val, g = engine.value_and_grad(loss)(p)
    return {k: p[k] - 0.1 * g[k] for k in p}, val


def _mlp_params(rng, dtype):
    return {
        "w1": (rng.standard_normal((8, 32)) * 0.3).astype(dtype), "b1": np.zeros(32, dtype),
        "w2": (rng.standard_normal((32, 4)) * 0.3).astype(dtype), "b2": np.zeros(4, dtype),
    }


@pytest.mark.parametrize("batch", [1, 16])
def test_jit_training_step_is_native_and_equals_the_executor(batch):
    rng = np.random.default_rng(batch)
    p = _mlp_params(rng, np.float32)
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, batch)]
    step = engine.jit(_mlp_step)
    new, val = step(p, x, y)
    exe = step._fast[0][1]
    assert isinstance(exe, native_executor.NativeExecutable)
    leaves = [p[k] for k in sorted(p)] + [x, y]
    _bitwise(exe(*leaves), Executable(exe.graph)(*leaves))
    # and against numpy written out (an independent oracle, to float32 rounding)
    h = np.tanh(x @ p["w1"] + p["b1"])
    z = h @ p["w2"] + p["b2"]
    z = z - z.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    np.testing.assert_allclose(val, -np.mean(np.sum((z - np.log(np.exp(z).sum(1, keepdims=True))) * y, 1)), rtol=1e-5)
    gz = (prob - y) / batch
    np.testing.assert_allclose(new["w2"], p["w2"] - 0.1 * h.T @ gz, rtol=1e-4, atol=1e-6)
    # a non-contiguous input runs the per-equation executor and gives its values bit for bit; they
    # equal the native ones to rounding only, as the executor's dense kernel takes C-contiguous
    # operands alone and BLAS computes this product instead
    xt = np.asfortranarray(x)
    got = step(p, xt, y)[1]
    np.testing.assert_array_equal(got, Executable(exe.graph)(*leaves[:-2], xt, y)[-1])
    np.testing.assert_allclose(got, val, rtol=1e-6)


def test_unlowered_equations_split_the_graph_into_native_segments():
    def f(x, w):
        h = ops.tanh(x @ w) * 2.0 + 1.0
        h = ops.exp(h - ops.max(h, axis=1, keepdims=True))
        c = ops.cumsum(h, axis=1)  # no C lowering: a per-equation segment
        return ops.sum(c * h), c / (ops.sum(c, axis=1, keepdims=True) + 1.0), ops.argmax(h, axis=1)

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((6, 5)), rng.standard_normal((5, 7))
    for fn in (f, engine.value_and_grad(lambda x, w: f(x, w)[0], argnums=(0, 1))):
        exe = native_executor.native_executable(DEFAULT_PIPELINE(engine.make_graph(fn)(x, w)))
        assert isinstance(exe, native_executor.SegmentedExecutable)
        kinds = [k for k, *_ in exe.segments]
        assert "native" in kinds and "python" in kinds
        _bitwise(exe(x, w), Executable(exe.graph)(x, w))
    s, c, a = engine.jit(f)(x, w)
    h = np.tanh(x @ w) * 2.0 + 1.0
    h = np.exp(h - h.max(1, keepdims=True))
    np.testing.assert_allclose(s, np.sum(np.cumsum(h, 1) * h), rtol=1e-12)
    np.testing.assert_array_equal(a, h.argmax(1))


def test_without_a_compiler_jit_falls_back_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("FEDARENA_NATIVE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(native_executor, "_WARNED", False)
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = engine.jit(lambda a: ops.tanh(a) * 3.0 + a)
        got = [f(x), f(x[:2].copy()), engine.jit(lambda a: ops.exp(a) - 1.0)(x)]
    mine = [w for w in caught if "native code is off" in str(w.message)]
    assert len(mine) == 1 and issubclass(mine[0].category, RuntimeWarning) and "no-such-cc" in str(mine[0].message)
    assert isinstance(f._fast[0][1], Executable)
    np.testing.assert_allclose(got[0], np.tanh(x) * 3.0 + x, rtol=1e-14)
    np.testing.assert_allclose(got[2], np.exp(x) - 1.0, rtol=1e-14)


_CHILD = """
import numpy as np, warnings
from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.backends.numpy import native_executor
warnings.simplefilter("error")
f = engine.jit(lambda a, b: ops.sum(ops.tanh(a @ b) * 0.5, axis=0))
a = np.arange(12.0).reshape(3, 4) / 10
out = f(a, a.T.copy())
assert isinstance(f._fast[0][1], native_executor.NativeExecutable), type(f._fast[0][1])
print(repr(out.tolist()))
"""


def test_a_second_process_loads_the_cached_module_without_a_compiler(tmp_path):
    env = dict(os.environ, FEDARENA_NATIVE_CACHE=str(tmp_path / "cache"), PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    first = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert len(os.listdir(tmp_path / "cache")) == 1
    # the compiler is gone: the module comes from the cache (a missing compiler would warn, an error here)
    second = subprocess.run([sys.executable, "-c", _CHILD], env=dict(env, CC=str(tmp_path / "no-such-cc")), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    a = np.arange(12.0).reshape(3, 4) / 10
    np.testing.assert_allclose(eval(first.stdout), np.sum(np.tanh(a @ a.T) * 0.5, axis=0), rtol=1e-14)


def test_label_check_raises_from_native_code():
    from fedarena.engine.primitives.checks import IndexRangeError

    def loss(logits, labels):
        return ops.cross_entropy(logits * 2.0 + 1.0, labels)

    f = engine.jit(loss)
    z = np.random.default_rng(5).standard_normal((6, 3))
    good = np.array([0, 2, 1, 1, 0, 2])
    got = f(z, good)
    assert isinstance(f._fast[0][1], native_executor.NativeExecutable)
    zz = z * 2.0 + 1.0
    want = -np.mean((zz - np.log(np.exp(zz).sum(1, keepdims=True)))[np.arange(6), good])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(IndexRangeError, match="7"):
        f(z, np.array([0, 2, 7, 1, 0, 2]))
    with pytest.raises(IndexRangeError, match="-1"):
        f(z, np.array([0, -1, 1, 1, 0, 2]))


def test_programs_sharing_one_c_source_keep_their_own_constants_and_loops():
    # x * 2 and x * 3 lower to the same C text (constants live in each arena), exp and log differ
    # only in the numpy loop they call: the module is shared, the results are not
    x = np.linspace(0.5, 2.0, 6)
    fs = [engine.jit(lambda a, c=c: a * c) for c in (2.0, 3.0)] + [engine.jit(ops.exp), engine.jit(ops.log)]
    for _ in range(2):
        got = [f(x) for f in fs]
        assert all(isinstance(f._fast[0][1], native_executor.NativeExecutable) for f in fs)
        for g, w in zip(got, (x * 2.0, x * 3.0, np.exp(x), np.log(x))):
            np.testing.assert_array_equal(g, w)


def _rnn(h0, xs, w):
    def body(h, x):
        h = ops.tanh(h @ w + x) * 0.5 + h
        return h, ops.sum(h * h)

    h, ys = engine.scan(body, h0, xs)
    return ops.sum(h), ys


def test_scan_is_a_c_loop_and_equals_the_executor_and_a_numpy_loop():
    rng = np.random.default_rng(7)
    h0, xs, w = rng.standard_normal((3, 4)), rng.standard_normal((7, 3, 4)), rng.standard_normal((4, 4)) * 0.3
    grad = engine.value_and_grad(lambda h0, xs, w: _rnn(h0, xs, w)[0], argnums=(0, 2))
    for fn in (_rnn, grad):
        g = DEFAULT_PIPELINE(engine.make_graph(fn)(h0, xs, w))
        assert "scan" in [e.prim.name for e in g.eqns]
        exe = native_executor.native_executable(g)
        assert type(exe) is native_executor.NativeExecutable  # the loops are in C, no Python segment
        _bitwise(exe(h0, xs, w), Executable(exe.graph)(h0, xs, w))
    h, ys = h0, []
    for x in xs:
        h = np.tanh(h @ w + x) * 0.5 + h
        ys.append(np.sum(h * h))
    s, got_ys = engine.jit(_rnn)(h0, xs, w)
    np.testing.assert_allclose(s, h.sum(), rtol=1e-12)
    np.testing.assert_allclose(got_ys, ys, rtol=1e-12)
    eps, e = 1e-6, np.zeros_like(w)
    e[1, 2] = eps
    fd = (_rnn_np(h0, xs, w + e) - _rnn_np(h0, xs, w - e)) / (2 * eps)
    np.testing.assert_allclose(engine.jit(grad)(h0, xs, w)[1][1][1, 2], fd, rtol=1e-6)


def _rnn_np(h, xs, w):
    for x in xs:
        h = np.tanh(h @ w + x) * 0.5 + h
    return h.sum()


def test_cond_is_a_c_branch_and_equals_the_executor():
    def f(x, w, flag):
        y = engine.cond(flag > 0, lambda a: ops.tanh(a @ w), lambda a: a * 2.0 - 1.0, x)
        return ops.sum(y * y)

    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 4))
    for flag in (np.asarray(1.0), np.asarray(-1.0)):
        for fn in (f, engine.value_and_grad(f, argnums=(0, 1))):
            exe = native_executor.native_executable(DEFAULT_PIPELINE(engine.make_graph(fn)(x, w, flag)))
            assert type(exe) is native_executor.NativeExecutable
            _bitwise(exe(x, w, flag), Executable(exe.graph)(x, w, flag))
    j = engine.jit(f)
    np.testing.assert_allclose(j(x, w, np.asarray(1.0)), np.sum(np.tanh(x @ w) ** 2), rtol=1e-12)
    np.testing.assert_allclose(j(x, w, np.asarray(-1.0)), np.sum((x * 2.0 - 1.0) ** 2), rtol=1e-12)


def _collatz_like(x, w, n):
    """A data-dependent trip count (``while``) and a ``fori_loop`` with traced bounds."""
    def body(s):
        k, h = s
        return k + 1, ops.tanh(h @ w) + h * 0.5

    k, h = engine.while_loop(lambda s: (s[0] < 40) & (ops.sum(s[1] * s[1]) < 50.0), body, (np.int64(0), x))
    g = engine.fori_loop(0, n, lambda i, a: a * 0.9 + ops.sum(a) * 0.01 + i.astype(np.float64), h)
    return k, g


def test_while_and_fori_loop_are_c_loops_and_equal_the_executor_and_a_numpy_loop():
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((3, 4)) * 0.5, rng.standard_normal((4, 4))
    for n in (np.int64(0), np.int64(5)):
        g = DEFAULT_PIPELINE(engine.make_graph(_collatz_like)(x, w, n))
        assert [e.prim.name for e in g.eqns].count("while") == 2
        exe = native_executor.native_executable(g)
        assert type(exe) is native_executor.NativeExecutable  # both loops are in C, no Python segment
        _bitwise(exe(x, w, n), Executable(exe.graph)(x, w, n))
        k, h = 0, x
        while k < 40 and np.sum(h * h) < 50.0:
            k, h = k + 1, np.tanh(h @ w) + h * 0.5
        for i in range(int(n)):
            h = h * 0.9 + np.sum(h) * 0.01 + float(i)
        got_k, got_h = engine.jit(_collatz_like)(x, w, n)
        assert int(got_k) == k and k > 0
        np.testing.assert_allclose(got_h, h, rtol=1e-12)
    # forward mode runs through the loop (one while carrying primals and tangents)
    t = rng.standard_normal((3, 4))
    f = lambda x: _collatz_like(x, w, np.int64(3))[1]  # noqa: E731
    jv = lambda x, t: engine.jvp(f, (x,), (t,))  # noqa: E731
    exe = native_executor.native_executable(DEFAULT_PIPELINE(engine.make_graph(jv)(x, t)))
    assert type(exe) is native_executor.NativeExecutable
    _bitwise(exe(x, t), Executable(exe.graph)(x, t))


def test_fast_path_leaves_shape_and_dtype_checks_to_the_c_function():
    """jit's guard for a native graph checks only the argument structure; the C function answers
    NotImplemented for another shape or dtype (a cache lookup follows) and refuses strided or
    byte-swapped arrays (the executor runs them): every call equals numpy."""
    def f(x, w):
        return ops.tanh(x @ w) * 2.0

    rng = np.random.default_rng(10)
    w = rng.standard_normal((4, 3))
    j = engine.jit(f)
    x = rng.standard_normal((2, 4))
    np.testing.assert_allclose(j(x, w), np.tanh(x @ w) * 2.0, rtol=1e-12)
    fast, exe = j._fast[0]
    assert exe.checks_signature and type(exe) is native_executor.NativeExecutable
    assert type(fast) is cext._native.FastCall  # the structure walk in C, no per-array check in Python
    x5 = rng.standard_normal((5, 4))
    for a, b in [(x5, w), (x, w), (x.astype(np.float32), w.astype(np.float32)), (x5, w), (x, w)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", engine.RecompileWarning)
            got = j(a, b)
        assert got.shape == (a.shape[0], 3) and got.dtype == a.dtype
        np.testing.assert_allclose(got, np.tanh(a @ b) * 2.0, rtol=1e-6 if a.dtype == np.float32 else 1e-12)
    assert j.cache_size == 3
    wide = rng.standard_normal((2, 8))[:, ::2]  # strided
    swapped = x.astype(">f8")
    for a in (wide, swapped):
        np.testing.assert_allclose(j(a, w), np.tanh(np.asarray(a, np.float64) @ w) * 2.0, rtol=1e-12)
    assert j.cache_size == 3
    # nor the exact ndarray type of arrays of rank >= 1: the C function answers NotImplemented for a
    # subclass, and jit's lookup converts it (same signature, no new compile)

    class Tagged(np.ndarray):
        pass

    for a in (x.view(Tagged), np.asfortranarray(x).view(Tagged)):
        got = j(a, w)
        assert type(got) is np.ndarray
        np.testing.assert_allclose(got, np.tanh(x @ w) * 2.0, rtol=1e-12)
    assert j.cache_size == 3


def test_a_strided_argument_before_an_argument_of_a_new_shape_compiles_the_new_signature():
    """The C function checks inputs in order: a strided first argument sends the call to the slow path before the
    second argument's new batch size is seen; the slow path must not run the old signature's program on it (the
    league agent's policy hit "cannot reshape array of size 4608 into shape (16,18)")."""
    from fedarena import engine
    from fedarena.engine import ops

    f = engine.jit(lambda w, x: ops.sum(ops.tanh(x @ w), axis=1))
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 4)).astype(np.float32)
    x16 = rng.normal(size=(16, 6)).astype(np.float32)
    np.testing.assert_allclose(f(w, x16), np.tanh(x16 @ w).sum(axis=1), rtol=1e-5, atol=1e-5)
    w_strided = np.asfortranarray(w)  # same shape and dtype, not C-contiguous
    x256 = rng.normal(size=(256, 6)).astype(np.float32)
    np.testing.assert_allclose(f(w_strided, x256), np.tanh(x256 @ w).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f(w, x256), np.tanh(x256 @ w).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_float32_tanh_is_the_engines_own_in_c_and_in_the_executor():
    # the engine's float32 tanh (_tanhf.h) on each C path: a standalone equation over a contiguous
    # operand (one vectorised loop), over a transposed view (element by element), and inside a fused
    # body the VM runs; bit for bit the executor's, which calls the same function (_native.tanh)
    from fedarena.engine.primitives.elementwise import tanh

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 48)) * 2).astype(np.float32)
    w = (rng.standard_normal((48, 48)) * 0.3).astype(np.float32)

    def f(x, w):
        h = ops.tanh(x @ w)
        return h, ops.tanh(ops.transpose(h @ w)), ops.tanh(x[:8] * 0.5 + 1.0)

    g = DEFAULT_PIPELINE(engine.make_graph(f)(x, w))
    exe = native_executor.native_executable(g)
    assert exe is not None and "fa_tanhf_loop(" in exe.c_source and "fa_tanhf(" in exe.c_source
    got = exe(x, w)
    _bitwise(got, Executable(exe.graph)(x, w))
    h = np.asarray(got[0])
    np.testing.assert_array_equal(h, tanh(x @ w))
    assert np.count_nonzero(h != np.tanh(x @ w)) > 10  # numpy's tanh gives other bits: the test tells them apart
    np.testing.assert_allclose(got[1], np.tanh((h @ w).T), rtol=2e-7, atol=1e-7)
