"""The cupy backend's executor (schedule, arena, kernel launches, views, cuBLAS-style matmul,
device rules) run end to end on the emulated device: a PPO training step equals the numpy
backend's, and the emulation really enforces barriers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import kernels as K
from fedarena.engine.backends.cupy.emulation import EmulatedModule
from fedarena.engine.primitives.reductions import cumsum as reverse_cumsum

from .programs import assert_close

body = nn.MLP([8, 64, 64], activation="tanh", output_activation="tanh")
pi_head, v_head = nn.Linear(64, 4), nn.Linear(64, 1)
opt = optim.adam(3e-4)


def ppo_loss(params, obs, act, adv, logp_old, ret):
    h = body.apply(params["body"], obs)
    logits = pi_head.apply(params["pi"], h)
    value = v_head.apply(params["v"], h)[:, 0]
    logp_all = ops.log_softmax(logits)
    logp = ops.take_along_axis(logp_all, act[:, None], axis=1)[:, 0]
    ratio = ops.exp(logp - logp_old)
    pg = -ops.mean(ops.minimum(ratio * adv, ops.clip(ratio, 0.8, 1.2) * adv))
    vl = 0.5 * ops.mean((value - ret) ** 2)
    ent = -ops.mean(ops.sum(ops.exp(logp_all) * logp_all, axis=1))
    return pg + 0.5 * vl - 0.01 * ent


def ppo_step(params, opt_state, obs, act, adv, logp_old, ret):
    loss, grads = engine.value_and_grad(ppo_loss)(params, obs, act, adv, logp_old, ret)
    params, opt_state = opt.update(grads, opt_state, params)
    return params, opt_state, loss


def _batch(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 4, n), rng.standard_normal(n).astype(np.float32),
            (rng.standard_normal(n) * 0.1 - 1.4).astype(np.float32), rng.standard_normal(n).astype(np.float32))


def test_ppo_step_matches_numpy_backend_over_steps(emulated_device):
    rng = np.random.default_rng(0)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    state = opt.init(params)
    j, ref = cb.jit(ppo_step, device=emulated_device), engine.jit(ppo_step)
    exe = j.entry(params, state, *_batch(128))[0]
    assert exe.host_steps == []  # the whole step runs as device kernels
    assert exe.memory.arena_bytes > 0 and exe.memory.planned_bytes < exe.memory.unplanned_bytes
    p1, s1, p2, s2 = params, state, params, state
    for step in range(3):
        b = _batch(128, step)
        p1, s1, l1 = j(p1, s1, *b)
        p2, s2, l2 = ref(p2, s2, *b)
        assert_close(l1, l2, f"loss at step {step}")
    for a, r in zip(engine.tree_leaves((p1, s1)), engine.tree_leaves((p2, s2))):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)


def test_non_contiguous_and_broadcast_inputs(emulated_device):
    def f(x, y):
        return ops.tanh(x.T) * y + ops.sum(x, axis=1)[None, :] * 0.5

    base = np.random.default_rng(3).standard_normal((6, 50)).astype(np.float32)
    x = base[:, ::-1]  # a strided view
    y = np.random.default_rng(4).standard_normal((50, 1)).astype(np.float32)
    assert_close(cb.jit(f, device=emulated_device)(x, y), engine.jit(f)(np.ascontiguousarray(x), y), "strided input", (x,))


def test_unsupported_dtype_runs_on_the_host_and_says_so(emulated_device):
    from fedarena.engine.core.tracing import bind
    from fedarena.engine.primitives.indexing import index_add_p

    def f(upd, idx):  # index_add of float16: no CUDA atomicAdd for it here
        return bind(index_add_p, upd * 2, idx, axis=0, size=4)

    upd, idx = np.arange(12, dtype=np.float16).reshape(3, 4), np.array([0, 3, 0])
    j = cb.jit(f, device=emulated_device)
    assert j.entry(upd, idx)[0].host_steps == ["index_add"]  # listed as a host step
    expect = np.zeros((4, 4), np.float16)
    np.add.at(expect, idx, upd * 2)
    np.testing.assert_array_equal(j(upd, idx), expect)


# a tree reduction in shared memory: correct only if every thread's partial is written before
# thread 0 reads it -- the barrier the emulation must honour
_TREE = r"""
extern "C" __global__ void tree_sum(const float* x, float* out, int n) {
  __shared__ float part[64];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  part[threadIdx.x] = acc;
  SYNC;
  if (threadIdx.x == 0) { float s = 0.0f; for (int t = 0; t < 64; ++t) s += part[t]; out[0] = s; }
}
"""


def test_emulation_honours_syncthreads(tmp_path):
    x = np.arange(640, dtype=np.float32)
    good = EmulatedModule(_TREE.replace("SYNC", "__syncthreads()"), tmp_path)
    bad = EmulatedModule(_TREE.replace("SYNC", "(void)0"), tmp_path)
    out = np.zeros(1, np.float32)
    good.launch("tree_sum", 1, 64, x, out, 640)
    assert out[0] == x.sum()
    bad.launch("tree_sum", 1, 64, x, out, 640)  # thread 0 runs first: it sees only its own partial
    assert out[0] != x.sum()


def test_emulated_launch_checks_arguments(tmp_path):
    m = EmulatedModule(_TREE.replace("SYNC", "__syncthreads()"), tmp_path)
    with pytest.raises(cb.emulation.EmulationError, match="takes 3 arguments"):
        m.launch("tree_sum", 1, 64, np.zeros(3, np.float32))
    with pytest.raises(cb.emulation.EmulationError, match="C-contiguous"):
        m.launch("tree_sum", 1, 64, np.zeros((4, 4), np.float32)[:, 0], np.zeros(1, np.float32), 4)
    with pytest.raises(cb.emulation.EmulationError, match="failed"):
        m.launch("tree_sum", 1, 2048, np.zeros(4, np.float32), np.zeros(1, np.float32), 4)


def test_generated_kernels_are_named_by_content():
    a = K.reduction_kernel("sum", K.ShapedArray((4, 64), np.float32), (1,), np.float32)
    b = K.reduction_kernel("sum", K.ShapedArray((4, 64), np.float32), (1,), np.float32)
    c = K.reduction_kernel("sum", K.ShapedArray((4, 65), np.float32), (1,), np.float32)
    assert a == b and a.name != c.name and a.barriers


def test_backend_cupy_without_gpu_raises_one_clear_error():
    why = cb.gpu_unavailable_reason()
    if why is None:
        pytest.skip("a CUDA device is present")
    with pytest.raises(cb.GpuUnavailableError, match="jit\\(backend='cupy'\\)"):
        engine.jit(lambda x: x + 1, backend="cupy")
    with pytest.raises(engine.EngineError, match="backend must be 'numpy' or 'cupy'"):
        engine.jit(lambda x: x + 1, backend="tpu")


def test_special_values_follow_numpy(emulated_device):
    """NaN propagation of maximum/minimum/clip, infinite literals, integer division by zero
    (numpy gives 0), floor division and remainder of negative operands."""

    def f(x, i, k):
        return (ops.maximum(x, 0.5), ops.minimum(x, np.float32(np.inf)), ops.clip(x, -np.inf, 1.0), ops.where(x > 0, x, np.float32(np.nan)),
                i // k, i % k, x // np.float32(-0.75), x % np.float32(-0.75), ops.isnan(x), ops.isfinite(x * 1e38))

    x = np.array([-1.5, 0.0, -0.0, 2.5, np.nan, np.inf, -np.inf, 3e-39], np.float32)
    i = np.array([-7, 7, -7, 7, 0, 5, -5, 9], np.int32)
    k = np.array([2, -2, -2, 0, 3, 0, 3, -4], np.int32)
    with np.errstate(all="ignore"):
        ref = engine.jit(f)(x, i, k)
        got = cb.jit(f, device=emulated_device)(x, i, k)
    for n, (a, r) in enumerate(zip(got, ref)):
        np.testing.assert_array_equal(a, r, err_msg=f"output {n}")


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 1, 0, 1), (3, 2, 1, 1), (5, 3, 2, 2), (2, 2, 0, 1), (1, 1, 0, 1)])
def test_conv2d_value_and_grads_run_on_the_device(emulated_device, kernel, stride, padding, dilation):
    """im2col (plain and phase-plane layouts), the conv GEMM, the input gradient and col2im as
    device steps: outputs and gradients equal the numpy backend's (gradients are sums over
    windows and batch, so relative 1e-5)."""
    conv = nn.Conv2d(3, 5, kernel, stride=stride, padding=padding, dilation=dilation)
    params = conv.init(1)
    x = np.random.default_rng(kernel + stride).standard_normal((2, 3, 11, 13)).astype(np.float32)

    def f(p, z):
        return engine.value_and_grad(lambda q, v: ops.sum(ops.tanh(conv.apply(q, v))), argnums=(0, 1))(p, z)

    j = cb.jit(f, device=emulated_device)
    exe = j.entry(params, x)[0]
    assert exe.host_steps == []
    assert {"im2col"} <= {e.prim.name for e in exe.graph.eqns}
    for a, r in zip(engine.tree_leaves(j(params, x)), engine.tree_leaves(engine.jit(f)(params, x))):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


def test_cross_entropy_label_check_raises_on_the_device_path(emulated_device):
    def f(logits, y):
        return ops.cross_entropy(logits, y)

    logits = np.zeros((4, 3), np.float32)
    j = cb.jit(f, device=emulated_device)
    np.testing.assert_allclose(j(logits, np.array([0, 1, 2, 1])), np.log(3.0), rtol=1e-6)
    with pytest.raises(IndexError, match="3"):
        j(logits, np.array([0, 1, 3, 1]))


def test_array_module_rules_match_numpy_backend(emulated_device):
    """argmax, cumsum (both directions), prod and one_hot run as the array module's device
    functions writing into the arena."""

    def f(x, i):
        return (ops.argmax(x, axis=1), ops.cumsum(x, axis=0), reverse_cumsum(x, 1, reverse=True), ops.prod(x + 2.0, axis=1),
                ops.one_hot(i, 5, np.float32) * 2.0)

    x = np.random.default_rng(5).standard_normal((6, 7)).astype(np.float32)
    i = np.array([0, 4, 2, 1, 3, 0])
    j = cb.jit(f, device=emulated_device)
    assert j.entry(x, i)[0].host_steps == []
    for n, (a, r) in enumerate(zip(j(x, i), engine.jit(f)(x, i))):
        assert_close(a, r, f"output {n}", (x,))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pooling_value_and_grad_run_on_the_device(emulated_device, pool):
    layer = nn.MaxPool2d(3, stride=2, padding=1) if pool == "max" else nn.AvgPool2d(2)
    x = np.random.default_rng(7).standard_normal((2, 3, 9, 8)).astype(np.float32)

    def f(z):
        return engine.value_and_grad(lambda v: ops.sum(ops.tanh(layer.apply(None, v)) ** 2))(z)

    j = cb.jit(f, device=emulated_device)
    assert j.entry(x)[0].host_steps == []
    for a, r in zip(j(x), engine.jit(f)(x)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)


def test_control_flow_and_sorting_run_on_the_device(emulated_device):  # device rules: test_device_rules.py
    def f(x):
        c, ys = engine.scan(lambda c, v: (c * 0.9 + v, ops.tanh(c)), ops.zeros_like(x[0]), x)
        return c, ys, ops.sort(x, axis=0)

    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    j = cb.jit(f, device=emulated_device)
    assert j.entry(x)[0].host_steps == []
    for a, r in zip(j(x), engine.jit(f)(x)):
        assert_close(a, r, "scan/sort", (x,))
