"""CUDA kernels of the random family: Philox-4x64-10 over many keys on the device and the
engine's transforms of its words (``random_uniform``, ``random_normal``, ``random_split``).

The stream and the transforms are those of :mod:`fedarena.engine.primitives.random` (its
docstring is the definition): block ``b`` of a key is Philox-4x64-10 of the counter
``(b + 1, 0, 0, top)``, ``top`` 0 for samples and 2^63 for split keys.  One thread computes one
(key, counter block) pair, a grid-stride loop over ``keys x blocks``, and writes what that block
gives: 4 float64 uniforms, 8 float32 uniforms (the words' 32-bit halves, low first), 4 normals
(two Box-Muller pairs, computed in double) or 2 child keys.  The 128-bit products use CUDA's
``__umul64hi`` (the CPU emulation header defines it through ``unsigned __int128``).

Integer words, uniforms and split keys are bit-identical to the numpy backend's.  The normals
call the device's ``log``/``cos``/``sin`` (CUDA's double-precision functions, within 1-2 ulp of
the correctly rounded value, CUDA C Programming Guide, "Mathematical functions"), so on a GPU they
agree with the numpy backend to a few ulps of float64; through the CPU emulation they use the C
library's functions and equal the C extension's bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.ir import Eqn, Var
from ...primitives.random import PHILOX_M, PHILOX_W, ROUNDS, SPLIT_TOP
from .kernels import THREADS, Kernel, KernelGenerationError, _finish, _grid

RANDOM_PRIMITIVES = frozenset({"random_normal", "random_uniform", "random_split"})
"""The primitives this module writes kernels for."""

PHILOX_DEVICE = rf"""
#ifndef FE_PHILOX_DEFINED
#define FE_PHILOX_DEFINED
// Philox-4x64-{ROUNDS} of counter c under key (k0, k1), in place (Salmon et al., SC 2011)
__device__ __forceinline__ void fe_philox(unsigned long long* c, unsigned long long k0, unsigned long long k1) {{
  for (int r = 0; r < {ROUNDS}; ++r) {{
    if (r) {{ k0 += {PHILOX_W[0]:#x}ULL; k1 += {PHILOX_W[1]:#x}ULL; }}
    const unsigned long long hi0 = __umul64hi({PHILOX_M[0]:#x}ULL, c[0]), lo0 = {PHILOX_M[0]:#x}ULL * c[0];
    const unsigned long long hi1 = __umul64hi({PHILOX_M[1]:#x}ULL, c[2]), lo1 = {PHILOX_M[1]:#x}ULL * c[2];
    const unsigned long long n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
  }}
}}
// Box-Muller of two words (u1 = 1 - (w0 >> 11) 2^-53 in (0, 1], u2 = (w1 >> 11) 2^-53), in double
__device__ __forceinline__ void fe_box_muller(unsigned long long w0, unsigned long long w1, double* z0, double* z1) {{
  const double u1 = 1.0 - (double)(w0 >> 11) * 0x1p-53, u2 = (double)(w1 >> 11) * 0x1p-53;
  const double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
  *z0 = r * cos(t);
  *z1 = r * sin(t);
}}
#endif
"""


def _loop(nkeys: int, nblocks: int, top: int) -> list:
    """Head of the grid-stride loop over (key, block): ``k``, ``b`` and the block's words ``c``."""
    return [
        f"  const long long total = {nkeys}LL * {nblocks}LL;",
        "  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (long long)blockDim.x * gridDim.x) {",
        f"    const long long k = t / {nblocks}LL, b = t % {nblocks}LL;",
        f"    unsigned long long c[4] = {{(unsigned long long)b + 1ULL, 0ULL, 0ULL, {top}ULL}};",
        "    fe_philox(c, (unsigned long long)keys[2 * k], (unsigned long long)keys[2 * k + 1]);",
    ]


def _kernel(kind: str, lines: list, out_type: str, nkeys: int, nblocks: int) -> Kernel:
    params = [("const long long* __restrict__", "keys"), (f"{out_type}* __restrict__", "out")]
    k = _finish(kind, "\n".join(lines) + "\n  }\n", params, False, THREADS, _grid(nkeys * nblocks, THREADS))
    return Kernel(k.name, PHILOX_DEVICE + k.source, k.params, k.barriers, k.threads, k.blocks)


def sample_kernel(kind: str, nkeys: int, n: int, dtype: np.dtype) -> Kernel:
    """``out[k, :n]`` = ``n`` samples of key ``k`` (``kind`` ``"uniform"`` or ``"normal"``, float32
    or float64), ``keys`` int64 of shape (nkeys, 2), ``out`` C-contiguous (nkeys, n)."""
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)) or kind not in ("uniform", "normal"):
        raise KernelGenerationError(f"random_{kind}: no CUDA kernel for dtype {dt}")
    t = "double" if dt == np.float64 else "float"
    per = 8 if (kind == "uniform" and dt == np.float32) else 4
    nblocks = max(1, -(-n // per))
    lines = _loop(nkeys, nblocks, 0) + [f"    {t}* o = out + k * {n}LL;", f"    const long long s0 = b * {per}LL;"]
    if kind == "uniform" and dt == np.float64:
        lines.append(f"    for (int j = 0; j < 4 && s0 + j < {n}LL; ++j) o[s0 + j] = (double)(c[j] >> 11) * 0x1p-53;")
    elif kind == "uniform":
        lines += [
            f"    for (int j = 0; j < 8 && s0 + j < {n}LL; ++j) {{",
            "      const unsigned int h = (unsigned int)((j & 1) ? (c[j >> 1] >> 32) : (c[j >> 1] & 0xffffffffULL));",
            "      o[s0 + j] = (float)(h >> 8) * 0x1p-24f;",
            "    }",
        ]
    else:
        lines += [
            "    double z[4];",
            "    fe_box_muller(c[0], c[1], &z[0], &z[1]);",
            "    fe_box_muller(c[2], c[3], &z[2], &z[3]);",
            f"    for (int j = 0; j < 4 && s0 + j < {n}LL; ++j) o[s0 + j] = ({t})z[j];",
        ]
    return _kernel(f"rng_{kind}", lines, t, nkeys, nblocks)


def split_kernel(nkeys: int, num: int) -> Kernel:
    """``out[k]`` = ``num`` child keys of key ``k`` (words ``0 .. 2 num - 1`` of its split stream,
    ``top = 2^63``), ``out`` C-contiguous int64 (nkeys, num, 2)."""
    nwords = 2 * num
    nblocks = -(-nwords // 4)
    lines = _loop(nkeys, nblocks, SPLIT_TOP) + [
        f"    long long* o = out + k * {nwords}LL;",
        f"    for (int j = 0; j < 4 && b * 4 + j < {nwords}LL; ++j) o[b * 4 + j] = (long long)c[j];",
    ]
    return _kernel("rng_split", lines, "long long", nkeys, nblocks)


def random_kernel(e: Eqn) -> Kernel:
    """The kernel of one ``random_*`` equation (its key operand must be a variable)."""
    key = e.inputs[0]
    if not isinstance(key, Var):
        raise KernelGenerationError(f"{e.prim.name}: the key is not a variable")
    nkeys = math.prod(key.aval.shape[:-1])
    if e.prim.name == "random_split":
        return split_kernel(nkeys, int(e.attrs["num"]))
    kind = "normal" if e.prim.name == "random_normal" else "uniform"
    return sample_kernel(kind, nkeys, math.prod(e.attrs["shape"]), e.attrs["dtype"])


__all__ = ["PHILOX_DEVICE", "RANDOM_PRIMITIVES", "random_kernel", "sample_kernel", "split_kernel"]
