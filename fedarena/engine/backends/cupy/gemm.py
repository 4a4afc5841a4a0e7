"""The hand-written tiled SGEMM (``sgemm.cu``): its variants, one per optimisation step of the
accelerator chapter, and their launch geometry.  ``sgemm(module, variant, a, b, out)`` runs one
on a loaded module (cupy's ``RawModule`` on a GPU, :class:`.emulation.EmulatedModule` on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_PATH = Path(__file__).with_name("sgemm.cu")


@dataclass(frozen=True)
class GemmVariant:
    """One step: the kernel's name, its block shape and the C tile one block computes."""

    name: str
    kernel: str
    block: tuple
    tile: tuple  # (rows, cols) of C per block
    step: str


VARIANTS = {
    v.name: v
    for v in (
        GemmVariant("naive", "sgemm_naive", (16, 16, 1), (16, 16), "one thread per output, global memory"),
        GemmVariant("smem", "sgemm_smem", (16, 16, 1), (16, 16), "16x16 shared-memory tiles"),
        GemmVariant("regblock", "sgemm_regblock", (256, 1, 1), (128, 128), "128x128x8 block tiles, 8x8 register micro-tiles"),
        GemmVariant("vec", "sgemm_vec", (256, 1, 1), (128, 128), "+ 128-bit (float4) loads and stores"),
        GemmVariant("dbuf", "sgemm_dbuf", (256, 1, 1), (128, 128), "+ double-buffered shared tiles"),
    )
}
"""The variants in the order of the chapter's steps."""


def source() -> str:
    return SOURCE_PATH.read_text()


def geometry(variant: str, m: int, n: int) -> tuple[tuple, tuple]:
    """``(grid, block)`` for an (m, n) result."""
    v = VARIANTS[variant]
    rows, cols = v.tile
    return (max(1, -(-n // cols)), max(1, -(-m // rows)), 1), v.block


def sgemm(module: Any, variant: str, a: Any, b: Any, out: Any) -> Any:
    """``out = a @ b`` for C-contiguous float32 (m, k) and (k, n) arrays with ``variant``;
    ``module.launch(kernel, grid, block, *args)`` runs the kernel (see :mod:`.device`)."""
    if variant not in VARIANTS:
        raise ValueError(f"sgemm: variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    m, k = a.shape
    k2, n = b.shape
    if k != k2 or tuple(out.shape) != (m, n):
        raise ValueError(f"sgemm: shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)} do not match")
    grid, block = geometry(variant, m, n)
    module.launch(VARIANTS[variant].kernel, grid, block, a, b, out, int(m), int(n), int(k))
    return out
