"""Every generated kernel of the random programs, the softmax/logsumexp/reduction/convolution/
pooling/gather kernels and the SGEMM variants compile for the GPU: ``nvcc --ptx -arch=sm_90``
(skipped when nvcc is absent), and through NVRTC with the options cupy's ``RawModule`` gets
(skipped when no NVRTC library is found; ``pip install nvidia-cuda-nvrtc``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedarena.engine.backends.cupy import gemm, kernels as K, toolchain

NVCC = toolchain.find_nvcc()
NVRTC = toolchain.find_nvrtc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="no NVRTC library (pip install nvidia-cuda-nvrtc)")


def _entries(ptx: str) -> set:
    return set(re.findall(r"\.entry\s+(\w+)", ptx))


def _families() -> list:
    """One kernel of every generated family, float32 and float64."""
    kernels = []
    for dt in (np.float32, np.float64):
        kernels.append(K.row_softmax_kernel(7, 100, dt))
        kernels.append(K.row_softmax_kernel(7, 100, dt, log=True))
        for kind in ("sum", "mean", "max", "min"):
            kernels.append(K.reduction_kernel(kind, K.ShapedArray((6, 50, 40), dt), (2,), dt))
            kernels.append(K.reduction_kernel(kind, K.ShapedArray((6, 50, 4), dt), (0, 2), dt))
        x = K.ShapedArray((2, 3, 11, 13), dt)
        geo = dict(kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1))
        kernels.append(K.im2col_kernel(x, dict(geo, pad_value=0.0)))
        kernels.append(K.im2col_kernel(x, dict(geo, pad_value=0.0, phased=True, bias_row=1.0)))
        kernels.append(K.phase_col2im_kernel(28, (2, 3, 11, 13), dt, geo))
        kernels.append(K.plain_col2im_kernel(27, (2, 3, 11, 13), dt, geo))
        kernels.append(K.pool_kernel("max", x, geo))
        kernels.append(K.pool_kernel("avg", x, geo))
        idx = K.ShapedArray((6, 1), np.int64)
        kernels.append(K.gather_kernel(K.ShapedArray((6, 5), dt), idx, 1))
        kernels.append(K.scatter_add_kernel(K.ShapedArray((6, 1), dt), idx, 1, (6, 5)))
    return kernels


@needs_nvcc
def test_generated_kernels_compile_with_nvcc(compiled_programs):
    """The random programs' kernels without NVVM's optimiser (``-Xcicc -O0``: the front end and
    PTX generation, ~6x faster); each kernel family once more with full optimisation."""
    kernels = [k for p, j, _ in compiled_programs for k in j.entry(*p.args)[0].kernels]
    ptx = toolchain.ptx(K.module_source(kernels), nvcc=NVCC, optimize=False)
    assert {k.name for k in kernels} <= _entries(ptx)
    kernels = _families()
    ptx = toolchain.ptx(K.module_source(kernels), nvcc=NVCC)
    assert {k.name for k in kernels} <= _entries(ptx)


@needs_nvcc
def test_sgemm_variants_compile_with_nvcc_and_use_vector_loads():
    ptx = toolchain.ptx(gemm.source(), nvcc=NVCC)
    assert {v.kernel for v in gemm.VARIANTS.values()} <= _entries(ptx)
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx  # the 128-bit loads of steps 4-5


@needs_nvcc
def test_nvcc_rejects_broken_source():
    with pytest.raises(toolchain.NvccError, match="failed"):
        toolchain.ptx('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }', nvcc=NVCC)


@needs_nvrtc
def test_kernels_compile_with_nvrtc_as_cupy_will(compiled_programs):
    """NVRTC sees no headers: every family, the SGEMM module and the first 40 random programs'
    kernels (the nvcc test covers all 200) must compile with the prelude alone."""
    kernels = _families() + [k for p, j, _ in compiled_programs[:40] for k in j.entry(*p.args)[0].kernels]
    ptx = toolchain.nvrtc_ptx(K.module_source(kernels), library=NVRTC)
    assert {k.name for k in kernels} <= _entries(ptx)
    assert {v.kernel for v in gemm.VARIANTS.values()} <= _entries(toolchain.nvrtc_ptx(gemm.source(), library=NVRTC))
    with pytest.raises(toolchain.NvccError, match="undefined"):
        toolchain.nvrtc_ptx('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }', library=NVRTC)
