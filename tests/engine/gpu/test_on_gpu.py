"""The cupy backend on a real CUDA device (``-m gpu``; skipped without cupy or a device): the
generated kernels, the SGEMM variants and a PPO step agree with the numpy backend, and a step
makes no host round trip."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import gemm

from .programs import assert_close, make_program

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cb.gpu_unavailable_reason() is not None, reason=f"no CUDA device: {cb.gpu_unavailable_reason()}"),
]


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def test_random_programs_on_gpu_match_numpy_backend(cp):
    """The first 100 of the CI's random programs (each a fresh NVRTC compile; the CPU emulation
    covers all 200)."""
    for seed in range(100):
        p = make_program(seed)
        ref = np.asarray(engine.jit(p.fn)(*p.args))
        got = engine.jit(p.fn, backend="cupy")(*p.args)
        assert isinstance(got, cp.ndarray)
        assert_close(cp.asnumpy(got), ref, p.text, p.args)


def test_sgemm_variants_on_gpu(cp):
    dev = cb.CupyDevice()
    mod = dev.load(gemm.source())
    rng = np.random.default_rng(0)
    for m, n, k in [(1, 1, 1), (37, 53, 29), (129, 131, 17), (256, 256, 256), (1000, 1001, 999), (4096, 64, 8)]:
        a = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        b = cp.asarray(rng.standard_normal((k, n)).astype(np.float32))
        ref = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
        scale = np.abs(cp.asnumpy(a)).astype(np.float64) @ np.abs(cp.asnumpy(b)).astype(np.float64)
        for v in gemm.VARIANTS:
            out = cp.full((m, n), cp.nan, cp.float32)
            gemm.sgemm(mod, v, a, b, out)
            err = np.abs(cp.asnumpy(out) - ref)
            assert np.all(err <= 1e-5 * (1 + scale)), f"{v} {m}x{n}x{k}: {err.max()}"


def test_ppo_step_on_gpu(cp):
    from .test_executor_emulated import _batch, body, opt, pi_head, ppo_step, v_head

    rng = np.random.default_rng(0)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    state = opt.init(params)
    j = engine.jit(ppo_step, backend="cupy")
    batch = _batch(4096)
    exe = j.entry(params, state, *batch)[0]
    assert exe.host_steps == []
    dp, ds = engine.tree_map(cp.asarray, params), engine.tree_map(cp.asarray, state)
    p1, s1, loss = j(dp, ds, *[cp.asarray(b) for b in batch])
    p2, s2, loss2 = engine.jit(ppo_step)(params, state, *batch)
    assert_close(cp.asnumpy(loss), loss2, "loss")
    for a, r in zip(engine.tree_leaves(p1), engine.tree_leaves(p2)):
        np.testing.assert_allclose(cp.asnumpy(a), r, rtol=1e-5, atol=1e-6)


def test_cnn_step_on_gpu(cp):
    from fedarena.engine import nn, ops, optim

    cnn = nn.Sequential([nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 14 * 14, 10)])
    opt = optim.adam(1e-3)

    def step(p, s, x, y):
        loss, g = engine.value_and_grad(lambda q: ops.cross_entropy(cnn.apply(q, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 64)
    p0 = cnn.init(0)
    j = engine.jit(step, backend="cupy")
    assert j.entry(p0, opt.init(p0), x, y)[0].host_steps == []
    got = j(p0, opt.init(p0), x, y)
    ref = engine.jit(step)(p0, opt.init(p0), x, y)
    for a, r in zip(engine.tree_leaves(got), engine.tree_leaves(ref)):
        np.testing.assert_allclose(cp.asnumpy(a), r, rtol=1e-4, atol=1e-5)


def test_device_inputs_stay_on_device(cp):
    x = cp.arange(10, dtype=cp.float32)
    out = engine.jit(lambda v: v * 2.0 + 1.0, backend="cupy")(x)
    assert isinstance(out, cp.ndarray) and out.device == x.device
    np.testing.assert_array_equal(cp.asnumpy(out), np.arange(10, dtype=np.float32) * 2 + 1)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_low_precision_program_and_gemm_on_gpu(cp, name):
    """A float16/bfloat16 fused program equals the numpy backend bit for bit (both round each
    float32 result to nearest even; the device's expf may differ by an ulp of float32, which
    rounding to the dtype almost always hides: at most one unit of the dtype here), and the
    tensor-core GEMM is within one rounding of the float32-accumulated product."""
    dt = np.dtype(np.float16) if name == "float16" else np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((256, 384)).astype(dt) for _ in range(2))

    def f(a, b):
        return engine.ops.tanh(a * b + 1.5) * engine.ops.exp(-a), engine.ops.sum(a * b, axis=1), a @ b.T

    dev = cb.CupyDevice()
    j = cb.jit(f, device=dev)
    assert j.entry(x, y)[0].host_steps == []
    got = [cp.asnumpy(v) for v in j(cp.asarray(x), cp.asarray(y))]
    ref = engine.jit(f)(x, y)
    units = np.abs(got[0].view(np.int16).astype(np.int32) - np.asarray(ref[0]).view(np.int16).astype(np.int32))
    assert units.max() <= 1
    eps = 2.0**-11 if name == "float16" else 2.0**-8
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(got[1].astype(np.float64), (xf * yf).sum(1), rtol=2 * eps, atol=2 * eps * 384)
    exact, scale = xf @ yf.T, np.abs(xf) @ np.abs(yf).T
    assert np.all(np.abs(got[2].astype(np.float64) - exact) <= eps * np.abs(exact) + 384 * 2.0**-23 * scale)


def test_ppo_step_as_one_cuda_graph_on_gpu(cp):
    from .test_executor_emulated import _batch, body, opt, pi_head, ppo_step, v_head

    rng = np.random.default_rng(0)
    params = {"body": body.init(rng), "pi": pi_head.init(rng), "v": v_head.init(rng)}
    dev = cb.CupyDevice()
    jg, j = cb.jit(ppo_step, device=dev, cuda_graph=True), cb.jit(ppo_step, device=dev)
    p1 = p2 = params
    s1 = s2 = opt.init(params)
    for step in range(4):
        b = [cp.asarray(v) for v in _batch(512, step)]
        p1, s1, l1 = jg(p1, s1, *b)
        p2, s2, l2 = j(p2, s2, *b)
    assert jg.entry(p1, s1, *b)[0].graph_status == "captured"
    for a, r in zip(engine.tree_leaves((p1, s1, l1)), engine.tree_leaves((p2, s2, l2))):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(r), rtol=1e-6, atol=1e-7)
