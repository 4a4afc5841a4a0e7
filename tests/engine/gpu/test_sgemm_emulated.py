"""The hand-written SGEMM variants (sgemm.cu), run by the CPU emulation of CUDA, equal numpy's
float32 matmul on odd shapes (ragged tiles, K not a multiple of the tile depth, rows whose
length is not a multiple of 4 so the float4 paths fall back, misaligned operands)."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.engine.backends.cupy import gemm
from fedarena.engine.backends.cupy.emulation import EmulatedModule

SHAPES = [  # (M, N, K)
    (1, 1, 1), (1, 7, 3), (3, 1, 5), (2, 3, 1), (17, 19, 23), (31, 33, 9), (37, 53, 29), (64, 64, 64),
    (65, 63, 7), (127, 129, 8), (128, 128, 16), (129, 131, 17), (130, 5, 41), (5, 300, 3), (200, 64, 100),
    (96, 160, 12), (257, 3, 11), (3, 257, 13), (45, 77, 120), (140, 136, 33), (8, 8, 1000), (33, 130, 4),
]


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    from fedarena.engine.backends.cupy import emulation

    if emulation.host_compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    return EmulatedModule(gemm.source(), tmp_path_factory.mktemp("sgemm"), opt="-O1")


def _check(out: np.ndarray, a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Within 1e-6 of numpy's float32 matmul, relative to the products' magnitudes |A| |B|."""
    ref = a @ b
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    assert np.all(err <= 1e-6 * (1.0 + scale)), f"{what}: max error {err.max():.3g} (scale {scale.max():.3g})"


def test_every_variant_matches_numpy_on_odd_shapes(module):
    assert len(SHAPES) >= 20
    rng = np.random.default_rng(0)
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        for v in gemm.VARIANTS:
            out = np.full((m, n), np.nan, np.float32)
            gemm.sgemm(module, v, a, b, out)
            _check(out, a, b, f"{v} {m}x{n}x{k}")


def test_vector_variants_fall_back_on_misaligned_operands(module):
    """Operands that start 4 bytes past a 16-byte boundary take the scalar loads, not a
    misaligned float4 (which would fault on a GPU)."""
    rng = np.random.default_rng(1)
    m, n, k = 36, 44, 20
    raw_a = rng.standard_normal(m * k + 1).astype(np.float32)
    raw_b = rng.standard_normal(k * n + 1).astype(np.float32)
    a, b = raw_a[1:].reshape(m, k), raw_b[1:].reshape(k, n)
    assert a.ctypes.data % 16 != 0
    for v in ("vec", "dbuf"):
        out = np.empty((m, n), np.float32)
        gemm.sgemm(module, v, a, b, out)
        _check(out, a, b, f"{v} misaligned")


def test_sgemm_rejects_mismatched_shapes(module):
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match="do not match"):
        gemm.sgemm(module, "naive", a, b, np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match="variant must be one of"):
        gemm.sgemm(module, "fastest", a, a.T.copy(), np.empty((3, 3), np.float32))
