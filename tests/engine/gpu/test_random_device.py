"""The cupy backend's random kernels (backends/cupy/random_kernels.py): the generated Philox-4x64-10
kernels compile with nvcc and NVRTC, and through the CPU emulation they give the numpy backend's
numbers (split keys and uniforms bit for bit, and numpy's own ``Philox.random_raw`` words; normals
bit for bit against the C extension, which uses the same C library functions, and to 4 ulps
against the numpy fallback); a jitted function drawing keys, normals, uniforms, Bernoullis and
categoricals runs without host steps on the emulated device and equals the numpy backend.
The ``gpu`` test repeats the comparison on a CUDA device (skipped without one)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import random as R
from fedarena.engine.backends import cupy as cb
from fedarena.engine.backends.cupy import kernels as K
from fedarena.engine.backends.cupy import random_kernels as RK
from fedarena.engine.backends.cupy import toolchain
from fedarena.engine.backends.cupy.emulation import EmulatedModule, host_compiler
from fedarena.engine.core import cext
from fedarena.engine.primitives import random as P

SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 13, 64]
NKEYS = [1, 3, 17]


def _keys(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (n, 2), dtype=np.int64, endpoint=True)


def _sample(kind: str, keys: np.ndarray, n: int, dtype, native: bool) -> np.ndarray:
    old = os.environ.get("FEDARENA_NATIVE")
    os.environ["FEDARENA_NATIVE"] = "1" if native else "0"
    try:
        return P.Sampler(kind, (n,), dtype)(keys)
    finally:
        if old is None:
            del os.environ["FEDARENA_NATIVE"]
        else:
            os.environ["FEDARENA_NATIVE"] = old


def _all_kernels() -> list:
    ks = []
    for nk in NKEYS:
        for n in SIZES:
            for dt in (np.float32, np.float64):
                ks += [RK.sample_kernel("uniform", nk, n, dt), RK.sample_kernel("normal", nk, n, dt)]
        for num in (1, 2, 3, 5):
            ks.append(RK.split_kernel(nk, num))
    return ks


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    if host_compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    return EmulatedModule(K.module_source(_all_kernels()), tmp_path_factory.mktemp("rng_emu"), "-O1")


def _launch(module, kern, keys: np.ndarray, out: np.ndarray) -> np.ndarray:
    module.launch(kern.name, kern.blocks, kern.threads, np.ascontiguousarray(keys), out)
    return out


def test_emulated_split_kernel_gives_numpys_philox_words(module):
    for nk in NKEYS:
        keys = _keys(nk, nk)
        for num in (1, 2, 3, 5):
            got = _launch(module, RK.split_kernel(nk, num), keys, np.zeros((nk, num, 2), np.int64))
            counter = np.array([0, 0, 0, 1 << 63], np.uint64)
            want = np.stack([np.random.Philox(key=k.view(np.uint64), counter=counter).random_raw(2 * num) for k in keys])
            np.testing.assert_array_equal(got.reshape(nk, -1).view(np.uint64), want)
            np.testing.assert_array_equal(got, P.Splitter(num)(keys))


def test_emulated_uniform_kernels_equal_numpy_backend_and_numpy_generator(module):
    for nk in NKEYS:
        keys = _keys(100 + nk, nk)
        for n in SIZES:
            for dt in (np.float32, np.float64):
                got = _launch(module, RK.sample_kernel("uniform", nk, n, dt), keys, np.full((nk, n), np.nan, dt))
                want = np.stack([P._generator(k).random(n, dtype=dt) for k in keys])  # numpy's own Generator.random
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(got, _sample("uniform", keys, n, dt, native=False))
                if cext._native is not None:
                    np.testing.assert_array_equal(got, _sample("uniform", keys, n, dt, native=True))


def test_emulated_normal_kernels_equal_numpy_backend(module):
    for nk in NKEYS:
        keys = _keys(200 + nk, nk)
        for n in SIZES:
            for dt in (np.float32, np.float64):
                got = _launch(module, RK.sample_kernel("normal", nk, n, dt), keys, np.full((nk, n), np.nan, dt))
                assert np.isfinite(got).all()
                np.testing.assert_array_max_ulp(got, _sample("normal", keys, n, dt, native=False), maxulp=4)
                if cext._native is not None:  # the same C library log/cos/sin: the same bits
                    np.testing.assert_array_equal(got, _sample("normal", keys, n, dt, native=True))
                # Box-Muller written out from numpy's own Philox words (the definition)
                w = np.stack([np.random.Philox(key=k.view(np.uint64)).random_raw(2 * (-(-n // 2))) for k in keys])
                u = (w >> np.uint64(11)).astype(np.float64) * 2.0**-53
                r = np.sqrt(-2 * np.log(1 - u[:, 0::2]))
                z = np.stack([r * np.cos(2 * np.pi * u[:, 1::2]), r * np.sin(2 * np.pi * u[:, 1::2])], -1).reshape(nk, -1)[:, :n]
                np.testing.assert_array_max_ulp(got, z.astype(dt), maxulp=4)


def _draws(k):
    k1, k2, k3, k4 = R.split(k, 4)
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    return (R.normal(k1, (5, 3)), R.uniform(k2, (7,), np.float64, -1.0, 2.0), R.bernoulli(k3, 0.3, (6,)),
            R.categorical(k4, logits, shape=(9,)), R.normal(k1, (4,), np.float64))


def test_jitted_sampling_runs_on_device_and_equals_numpy_backend(emulated_device):
    for fn, arg in ((_draws, R.key(5)), (engine.vmap(_draws), R.split(R.key(6), 11))):
        j = cb.jit(fn, device=emulated_device)
        exe = j.entry(arg)[0]
        assert not set(exe.host_steps) & RK.RANDOM_PRIMITIVES
        assert {k.name.split("_")[1] for k in exe.kernels} >= {"rng"}
        got, want = j(arg), engine.jit(fn)(arg)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.shape == w.shape and g.dtype == w.dtype
            if g.dtype.kind == "f" and cext._native is None:
                np.testing.assert_array_max_ulp(g, w, maxulp=4)
            else:
                np.testing.assert_array_equal(g, w)


def _entries(ptx: str) -> set:
    return set(re.findall(r"\.entry\s+(\w+)", ptx))


@pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")
def test_random_kernels_compile_with_nvcc():
    kernels = [RK.sample_kernel(kind, 17, 13, dt) for kind in ("uniform", "normal") for dt in (np.float32, np.float64)]
    kernels.append(RK.split_kernel(17, 3))
    ptx = toolchain.ptx(K.module_source(kernels))
    assert {k.name for k in kernels} <= _entries(ptx)
    assert "mul.hi.u64" in ptx  # __umul64hi: the 128-bit products of Philox


@pytest.mark.skipif(toolchain.find_nvrtc() is None, reason="no NVRTC library (pip install nvidia-cuda-nvrtc)")
def test_random_kernels_compile_with_nvrtc():
    kernels = [RK.sample_kernel(kind, 3, 5, dt) for kind in ("uniform", "normal") for dt in (np.float32, np.float64)]
    kernels.append(RK.split_kernel(3, 2))
    assert {k.name for k in kernels} <= _entries(toolchain.nvrtc_ptx(K.module_source(kernels)))


def test_kernel_generation_refuses_other_dtypes():
    with pytest.raises(K.KernelGenerationError, match="float16"):
        RK.sample_kernel("normal", 2, 3, np.float16)


@pytest.mark.gpu
@pytest.mark.skipif(cb.gpu_unavailable_reason() is not None, reason=f"no CUDA device: {cb.gpu_unavailable_reason()}")
def test_sampling_on_gpu_equals_numpy_backend():
    import cupy

    for fn, arg in ((_draws, R.key(5)), (engine.vmap(_draws), R.split(R.key(6), 4096))):
        got, want = engine.jit(fn, backend="cupy")(arg), engine.jit(fn)(arg)
        for i, (g, w) in enumerate(zip(got, want)):
            g = cupy.asnumpy(g)
            if g.dtype.kind == "f":
                np.testing.assert_array_max_ulp(g, w, maxulp=8)  # the device's log/cos/sin
            elif i == 3:  # categorical: argmax of logits + Gumbel noise, whose log may differ by an ulp
                assert g.shape == w.shape and (g != w).mean() < 1e-3
            else:
                np.testing.assert_array_equal(g, w)
