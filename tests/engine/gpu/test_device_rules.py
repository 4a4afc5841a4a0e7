"""Device rules of the cupy backend for control flow (``scan``, ``cond``, ``while``), ``take``,
``index_add`` and the stable ``argsort`` (so ``sort``), run on the emulated device (the generated
CUDA kernels compiled for the CPU) and, with ``-m gpu`` on a machine with one, on the CUDA device,
against the numpy backend; ``host_steps`` is empty and only ``cond``'s and ``while``'s predicates
cross to the host."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import control, indexing, toolchain
from fedarena.engine.backends.cupy import kernels as K
from fedarena.engine.backend_selection import to_host
from fedarena.engine.core.pytree import tree_leaves


class _Counting:
    """A device counting its device-to-host copies."""

    to_host_calls = 0

    def to_host(self, x):
        self.to_host_calls += 1
        return super().to_host(x)


class CountingEmulated(_Counting, cb.EmulatedDevice):
    pass


class CountingCuda(_Counting, cb.CupyDevice):
    pass


_NO_GPU = cb.gpu_unavailable_reason()


@pytest.fixture(scope="module", params=["emulated", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(_NO_GPU is not None, reason=f"no CUDA device: {_NO_GPU}")])])
def device(request, tmp_path_factory):
    if request.param == "cuda":
        return CountingCuda()
    if cb.emulation.host_compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    return CountingEmulated(cache_dir=tmp_path_factory.mktemp("cuda_emu_rules"))


def _check(device, fn, *args, prims=(), crossings=0, exact=False):
    """``fn`` on the emulated device equals the numpy backend, with no host step, the primitives
    ``prims`` present in the compiled graph, and ``crossings`` device-to-host copies per call."""
    j = cb.jit(fn, device=device)
    exe = j.entry(*args)[0]
    names = {e.prim.name for e in exe.graph.eqns}
    assert set(prims) <= names, names
    assert exe.host_steps == []
    ref = engine.jit(fn)(*args)
    j(*args)  # first call builds the arena and compiles the kernels
    before = device.to_host_calls
    got = j(*args)
    assert device.to_host_calls - before == crossings
    for r, g in zip(tree_leaves(ref), tree_leaves(to_host(got))):
        assert np.asarray(g).dtype == np.asarray(r).dtype and np.shape(g) == np.shape(r)
        if exact:
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    return exe


rng = np.random.default_rng(0)
X = rng.standard_normal((6, 5)).astype(np.float32)


def _rnn(c, x):
    c = ops.tanh(c * 0.9 + x)
    return c, ops.sum(c * c)


def test_scan_forward_and_reverse_with_int_carry_and_gradient(device):
    def fn(x):
        c, ys = engine.scan(_rnn, ops.zeros((5,), np.float32), x)
        (i, s), zs = engine.scan(lambda c, xi: ((c[0] + 1, c[1] + xi), c[0] * 2),
                                 (np.int32(0), ops.zeros((5,), np.float32)), x, reverse=True)
        return c, ys, i, s, zs

    _check(device, fn, X, prims=("scan",))

    def loss(x):
        c, ys = engine.scan(_rnn, ops.zeros((5,), np.float32), x)
        return ops.sum(c) + ops.sum(ys)

    _check(device, engine.grad(loss), X, prims=("scan",))  # the forward scan and the reverse (backward) scan


def test_cond_takes_each_branch_and_reads_only_its_predicate(device):
    def fn(x):
        return engine.cond(ops.sum(x) > 0, lambda a: (a * 2, ops.max(a)), lambda a: (a - 1, ops.min(a)), x)

    for sign in (1.0, -1.0):
        _check(device, fn, np.abs(X) * np.float32(sign), prims=("cond",), crossings=1)


def test_cond_nested_in_scan(device):
    def fn(x):
        def body(c, xi):
            c2 = engine.cond(ops.sum(xi) > 0, lambda a: a + xi, lambda a: a * 0.5, c)
            return c2, ops.max(c2)

        return engine.scan(body, ops.ones((5,), np.float32), x)

    _check(device, fn, X, prims=("scan",), crossings=X.shape[0])  # one predicate per step


def test_while_loop_reads_one_predicate_per_iteration(device):
    def fn(x, n):
        return engine.fori_loop(np.int64(0), n, lambda i, c: c * 1.5 + ops.astype(i, np.float32), x)

    _check(device, fn, X, np.int64(4), prims=("while",), crossings=5)  # 4 iterations + the final test
    _check(device, fn, X, np.int64(0), prims=("while",), crossings=1)  # no iteration: the carry is the input


def test_take_and_its_gradient_index_add(device):
    x3 = rng.standard_normal((3, 4, 5))
    idx = np.array([[3, -1], [0, 3], [2, 2]])
    for axis in (0, 1, 2):
        exe = _check(device, lambda a, axis=axis: ops.take(a, idx % 3 if axis == 0 else idx, axis=axis), x3,
                     prims=("take",), exact=True)
        assert any(k.name.startswith("fe_take_") for k in exe.kernels)
    rows = np.array([4, 1, 4, 0, 4])  # repeated rows: the atomic adds must accumulate
    exe = _check(device, engine.grad(lambda a: ops.sum(ops.take(a, rows, axis=0) ** 2)), X, prims=("index_add",))
    assert any(k.name.startswith("fe_idxadd_") for k in exe.kernels)
    ints = rng.integers(-9, 9, (4, 6)).astype(np.int32)
    _check(device, lambda a: ops.take(a, np.array([5, 0, -6]), axis=1), ints, prims=("take",), exact=True)


def test_take_writes_zero_for_an_out_of_range_index(device):
    got = cb.jit(lambda a: ops.take(a, np.array([0, 7]), axis=0), device=device)(np.arange(3.0))
    np.testing.assert_array_equal(to_host(got), [0.0, 0.0])


def test_argsort_and_sort_are_numpys_stable_order(device):
    ties = np.array([[2.0, -0.0, 1.0, np.nan, 0.0, 1.0, -np.inf, np.nan, 2.0],
                     [np.inf, 0.0, 0.0, -1.0, np.nan, -1.0, 3.0, 3.0, 0.0]], np.float32)
    for axis in (0, 1):
        exe = _check(device, lambda a, axis=axis: (ops.argsort(a, axis), ops.sort(a, axis)), ties, prims=("argsort",),
                     exact=True)
        assert any(k.name.startswith("fe_argsort_") for k in exe.kernels)
    ints = rng.integers(0, 4, (3, 7, 2)).astype(np.int64)  # many ties
    _check(device, lambda a: ops.argsort(a, 1), ints, prims=("argsort",), exact=True)
    _check(device, lambda a: ops.argsort(a, 0), rng.standard_normal((33, 3)), prims=("argsort",), exact=True)


def test_long_rows_fall_back_to_the_array_modules_stable_sort(device, monkeypatch):
    monkeypatch.setattr(indexing, "RANK_SORT_MAX", 4)
    exe = _check(device, lambda a: ops.argsort(a, 1), np.round(X), prims=("argsort",), exact=True)
    assert not any(k.name.startswith("fe_argsort_") for k in exe.kernels)


def test_store_outputs_writes_one_output_per_result_with_its_own_dtype():
    from fedarena.engine.core.ir import Eqn, ShapedArray, Var
    from fedarena.engine.core.tracing import PRIMITIVES

    a, b = np.arange(6, dtype=np.int64).reshape(2, 3) + 2**60, np.array([0.5, 1.5], np.float32)
    env: dict = {}
    outs = [Var(ShapedArray((2, 3), np.int64)), Var(ShapedArray((2,), np.float32))]
    e = Eqn(PRIMITIVES["scan"], [], outs, {}, None)
    buf = np.zeros(2, np.float32)
    control.store_outputs(np, e, [None, buf], [a, b], env)
    np.testing.assert_array_equal(env[outs[0]], a)  # int64 beyond 2**53 stays exact
    assert env[outs[0]] is not a and env[outs[1]] is buf and buf.tolist() == [0.5, 1.5]
    with pytest.raises(AssertionError, match="2 results for 1 outputs"):
        control.store_outputs(np, Eqn(e.prim, [], outs[:1], {}, None), [None], [a, b], env)


def _rule_kernels() -> list:
    from fedarena.engine.core.ir import ShapedArray

    out = []
    for dt in (np.float32, np.float64, np.int32):
        x, idx = ShapedArray((3, 4, 5), dt), ShapedArray((2, 2), np.int64)
        out.append(indexing.take_kernel(x, idx, 1))
        out.append(indexing.index_add_kernel(ShapedArray((3, 2, 2, 5), dt), idx, 1, 4))
        out.append(indexing.argsort_kernel(x, 2))
    return out


@pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")
def test_rule_kernels_compile_with_nvcc():
    import re

    kernels = _rule_kernels()
    ptx = toolchain.ptx(K.module_source(kernels), nvcc=toolchain.find_nvcc())
    assert {k.name for k in kernels} <= set(re.findall(r"\.entry\s+(\w+)", ptx))


@pytest.mark.skipif(toolchain.find_nvrtc() is None, reason="no NVRTC library (pip install nvidia-cuda-nvrtc)")
def test_rule_kernels_compile_with_nvrtc():
    import re

    kernels = _rule_kernels()
    ptx = toolchain.nvrtc_ptx(K.module_source(kernels), library=toolchain.find_nvrtc())
    assert {k.name for k in kernels} <= set(re.findall(r"\.entry\s+(\w+)", ptx))
