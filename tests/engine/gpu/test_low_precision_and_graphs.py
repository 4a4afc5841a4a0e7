"""float16/bfloat16 kernels, tensor-core GEMMs, the mixed-precision loss scaler and CUDA graphs of
the cupy backend, checked on the emulated device: against a float32 numpy reference (within the
dtype's rounding), against the numpy backend (bit for bit: both round each operation's float32
result to nearest even), against PyTorch's ``GradScaler`` for the scale schedule, and against the
uncaptured executor for graph replay; the generated float16/bfloat16 kernels also compile with
NVRTC (and nvcc, where installed) for sm_90."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops, optim, precision
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import toolchain
from fedarena.engine.backends.cupy.device import CaptureError, round_to_tf32

from .test_executor_emulated import _batch, body, pi_head, ppo_loss, ppo_step, v_head

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # the device image may lack ml_dtypes: the bfloat16 cases skip
    BF16 = None
EPS = {np.dtype(np.float16): 2.0**-11, BF16: 2.0**-8}  # unit roundoff
LOW = [np.dtype(np.float16), pytest.param(BF16, marks=pytest.mark.skipif(BF16 is None, reason="no ml_dtypes"))]
NVRTC = toolchain.find_nvrtc()


def fused(x, y):
    return ops.tanh(x * y + 1.5) * ops.exp(-x) - ops.maximum(x, 0.25) / (1.0 + y * y)


def reduced(x, y):
    return ops.sum(x * y, axis=1), ops.sum(x, axis=0)


@pytest.mark.parametrize("dt", LOW, ids=["float16", "bfloat16"])
def test_low_precision_programs_match_float32_reference(emulated_device, dt):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((48, 300)).astype(dt)
    y = rng.standard_normal((48, 300)).astype(dt)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    j = cb.jit(fused, device=emulated_device)
    assert j.entry(x, y)[0].host_steps == [] and "fe_to_float" in j.source(x, y)
    out = j(x, y)
    assert out.dtype == dt
    ref = np.tanh(xf * yf + 1.5) * np.exp(-xf) - np.maximum(xf, 0.25) / (1 + yf * yf)
    # eight rounded operations: each off by at most the dtype's roundoff of its value, carried to
    # the result with the terms' magnitudes (tanh' <= 1; exp(-x) scales its argument's error)
    terms = (2.5 + np.abs(xf * yf) + np.abs(xf)) * np.exp(-xf) + (1 + np.abs(xf)) * (1 + yf * yf) / (1 + yf * yf) ** 1
    assert np.all(np.abs(out.astype(np.float32) - ref) <= 8 * EPS[dt] * terms)
    # each operation rounded as numpy's float16 / ml_dtypes' bfloat16 loops round it
    np.testing.assert_array_equal(out.view(np.uint16), np.asarray(engine.jit(fused)(x, y)).view(np.uint16))
    jr = cb.jit(reduced, device=emulated_device)
    assert jr.entry(x, y)[0].host_steps == []
    rows, cols = jr(x, y)
    # float32 accumulation: only the final rounding to the dtype (plus float32 summation error)
    np.testing.assert_allclose(rows.astype(np.float32), (xf * yf).sum(1), rtol=2 * EPS[dt], atol=0.05)
    np.testing.assert_allclose(cols.astype(np.float32), xf.sum(0), rtol=2 * EPS[dt], atol=0.05)


@pytest.mark.parametrize("dt", LOW, ids=["float16", "bfloat16"])
def test_low_precision_matmul_is_a_float32_accumulated_gemm(emulated_device, dt):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((33, 257)).astype(dt)
    b = rng.standard_normal((257, 19)).astype(dt)
    before = emulated_device.gemm_calls.get("32F", 0)
    out = cb.jit(lambda p, q: p @ q, device=emulated_device)(a, b)
    assert emulated_device.gemm_calls.get("32F", 0) == before + 1  # the tensor-core path was taken
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    # rounding the float32-accumulated result once: |err| <= eps |C| + K 2^-24 |A||B|
    assert np.all(np.abs(out.astype(np.float64) - exact) <= EPS[dt] * np.abs(exact) + 257 * 2.0**-24 * scale + 1e-30)


def test_tf32_only_when_allowed(tmp_path):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    plain = cb.EmulatedDevice(cache_dir=tmp_path)
    tf32 = cb.EmulatedDevice(cache_dir=tmp_path, allow_tf32=True)
    np.testing.assert_array_equal(cb.jit(lambda p, q: p @ q, device=plain)(a, b), a @ b)
    assert plain.gemm_calls == {}
    out = cb.jit(lambda p, q: p @ q, device=tf32)(a, b)
    assert tf32.gemm_calls == {"TF32": 1}
    r = round_to_tf32(a)
    assert np.all(np.abs(r - a) <= 2.0**-11 * np.abs(a)) and np.all(r.view(np.uint32) & 0x1FFF == 0)
    np.testing.assert_allclose(out, a @ b, rtol=0, atol=64 * 2.0**-10 * (np.abs(a) @ np.abs(b)).max())


@pytest.mark.skipif(BF16 is None, reason="no ml_dtypes")
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_emulated_conversions_round_to_nearest_even(emulated_device):
    """Every float32 bit pattern class through the kernels' conversions equals ml_dtypes/numpy."""
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.float32([65504, 65519.99, 65520, 2.0**-25, 2.0**-24 * 1.5, 3e-8, -0.0, np.inf, -np.inf])])
    for dt in (np.dtype(np.float16), BF16):
        got = cb.jit(lambda v: ops.astype(v, dt), device=emulated_device)(x)
        np.testing.assert_array_equal(got.view(np.uint16), x.astype(dt).view(np.uint16))
        back = cb.jit(lambda v: ops.astype(v, np.float32), device=emulated_device)(got)
        np.testing.assert_array_equal(back, got.astype(np.float32))


@pytest.mark.skipif(NVRTC is None or BF16 is None, reason="no NVRTC library (pip install nvidia-cuda-nvrtc) or no ml_dtypes")
def test_low_precision_kernels_compile_with_nvrtc_for_sm90(emulated_device):
    x = np.ones((8, 64), np.float16)
    y = np.ones((8, 64), BF16)
    src = cb.jit(lambda a, b: (ops.sum(a * 2.0, axis=1), ops.exp(b) + 1.0, ops.astype(a, BF16) * b), device=emulated_device).source(x, y)
    assert "fe_half" in src and "fe_bf16" in src
    ptx = toolchain.nvrtc_ptx(src, arch="compute_90", library=NVRTC)
    assert "cvt.rn.f16.f32" in ptx and "cvt.rn.bf16.f32" in ptx
    if toolchain.find_nvcc() is not None:  # and with nvcc for sm_90, NVVM's optimiser on
        ptx = toolchain.ptx(src, arch="sm_90")
        assert "cvt.rn.f16.f32" in ptx and "cvt.rn.bf16.f32" in ptx


def test_loss_scaler_follows_torch_grad_scaler():
    torch = pytest.importorskip("torch")
    pattern = [True, True, False, True, True, True, False, False, True, True, True, True]
    w = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    state = precision.loss_scale_init(1024.0)
    update = engine.jit(lambda s, f: precision.update_loss_scale(s, f, 2.0, 0.5, 3))
    for finite in pattern:
        sgd.zero_grad()
        scaler.scale((w * 1.0).sum()).backward()
        if not finite:
            w.grad.fill_(float("inf"))
        scaler.step(sgd)
        scaler.update()
        state = update(state, np.asarray(finite))
        assert float(state["scale"]) == scaler.get_scale()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_mixed_precision_step_skips_non_finite_steps():
    rng = np.random.default_rng(5)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    opt = optim.adam(3e-4)
    state, scale = opt.init(params), precision.loss_scale_init(2.0**16)
    step = engine.jit(precision.mixed_precision_step(ppo_loss, opt, precision.policy("float16"), growth_interval=2))
    b = _batch(64)
    p1, s1, sc1, loss, finite = step(params, state, scale, *b)
    assert bool(finite) and float(sc1["scale"]) == 2.0**16
    # float32 parameters move as the float32 step moves them, up to float16's precision
    ref_p, _, ref_loss = engine.jit(ppo_step)(params, state, *b)
    assert abs(float(loss) - float(ref_loss)) < 0.01 * (1 + abs(float(ref_loss)))
    bad = list(b)
    bad[2] = np.full_like(b[2], 1e30)  # an advantage float16 cannot hold: non-finite gradients
    p2, s2, sc2, _, finite2 = step(p1, s1, sc1, *bad)
    assert not bool(finite2) and float(sc2["scale"]) == 2.0**15 and int(sc2["good_steps"]) == 0
    for a, r in zip(engine.tree_leaves((p2, s2)), engine.tree_leaves((p1, s1))):
        np.testing.assert_array_equal(a, r)  # the step was skipped
    assert all(a.dtype == np.float32 for a in engine.tree_leaves(p2))


def test_ppo_step_is_one_graph_launch_and_equals_the_uncaptured_path(emulated_device):
    rng = np.random.default_rng(0)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    state = optim.adam(3e-4).init(params)
    jg = cb.jit(ppo_step, device=emulated_device, cuda_graph=True)
    j = cb.jit(ppo_step, device=emulated_device)
    p1, s1, p2, s2 = params, state, params, state
    for step in range(4):
        b = _batch(128, step)
        k0, g0 = emulated_device.kernel_launches, emulated_device.graph_launches
        p1, s1, l1 = jg(p1, s1, *b)
        launched = (emulated_device.kernel_launches - k0, emulated_device.graph_launches - g0)
        exe = jg.entry(p1, s1, *b)[0]
        if step == 0:
            assert exe.graph_status == "warm-up" and launched[0] > 20 and launched[1] == 0
        else:
            assert exe.graph_status == "captured" and launched == (0, 1)  # one launch from Python
        p2, s2, l2 = j(p2, s2, *b)
        np.testing.assert_array_equal(l1, l2)
    for a, r in zip(engine.tree_leaves((p1, s1)), engine.tree_leaves((p2, s2))):
        np.testing.assert_array_equal(a, r)
    # a new signature (batch size) is a new executable, warmed up and captured anew
    b = _batch(64, 9)
    jg(p1, s1, *b)
    assert jg.entry(p1, s1, *b)[0].graph_status == "warm-up"
    g0 = emulated_device.graph_launches
    jg(p1, s1, *b)
    assert jg.entry(p1, s1, *b)[0].graph_status == "captured" and emulated_device.graph_launches == g0 + 1
    assert jg.cache_size == 2


def test_graph_capture_is_refused_with_a_reason(emulated_device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([0, 1, 3])
    j = cb.jit(lambda lg, lab: ops.cross_entropy(lg, lab), device=emulated_device, cuda_graph=True)
    for _ in range(3):
        np.testing.assert_allclose(j(x, y), engine.jit(lambda lg, lab: ops.cross_entropy(lg, lab))(x, y), rtol=1e-6)
    assert j.entry(x, y)[0].graph_status == "not captured: 'check_range' reads a flag back to the host"
    # the emulated capture itself refuses a host transfer, as CUDA refuses it while capturing
    with pytest.raises(CaptureError, match="device-to-host"):
        emulated_device.capture(lambda: emulated_device.to_host(x))


@pytest.mark.parametrize("name", ["float16", pytest.param("bfloat16", marks=pytest.mark.skipif(BF16 is None, reason="no ml_dtypes"))])
def test_mixed_precision_ppo_step_runs_on_the_device_as_one_graph(emulated_device, name):
    """The policy's step (float32 parameters, the loss in float16/bfloat16: low-precision kernels
    and tensor-core GEMMs) has no host step, is captured, and equals the numpy backend's step."""
    rng = np.random.default_rng(6)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    opt = optim.adam(3e-4)
    step = precision.mixed_precision_step(ppo_loss, opt, precision.policy(name))
    args = (params, opt.init(params), precision.loss_scale_init(), *_batch(64, 1))
    j = cb.jit(step, device=emulated_device, cuda_graph=True)
    exe = j.entry(*args)[0]
    assert exe.host_steps == [] and "fe_to_float" in exe.source
    g0 = emulated_device.graph_launches
    ref = engine.jit(step)(*args)
    for _ in range(3):
        out = j(*args)
        for a, r in zip(engine.tree_leaves(out), engine.tree_leaves(ref)):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(r, np.float64), rtol=1e-5, atol=1e-6)
    assert exe.graph_status == "captured" and emulated_device.graph_launches == g0 + 2


def test_engine_jit_passes_cuda_graph_to_the_cupy_backend(monkeypatch):
    """``engine.jit(..., backend="cupy", cuda_graph=True)`` reaches the cupy backend's jit; on numpy it is refused."""
    import importlib

    ej = importlib.import_module("fedarena.engine.jit")  # the module (fedarena.engine.jit the attribute is the function)

    seen = {}
    monkeypatch.setattr(ej, "_cupy_jit", lambda fn, static_argnums, passes, cuda_graph=False: seen.update(
        cuda_graph=cuda_graph) or fn)
    ej.jit(lambda x: x + 1, backend="cupy", cuda_graph=True)
    assert seen == {"cuda_graph": True}
    with pytest.raises(ej.EngineError, match="cuda_graph needs backend='cupy'"):
        ej.jit(lambda x: x + 1, cuda_graph=True)
