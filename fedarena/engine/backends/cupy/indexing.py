"""Kernel generators of the cupy backend for ``take``, ``index_add`` and ``argsort`` (``sort`` is
``argsort`` followed by the existing ``gather`` kernel); the primitives' cupy rules (beside them in
``primitives/indexing.py`` and ``primitives/reductions.py``) choose them.

- ``take(x, idx, axis)``: one thread per output element ``(p, j, q)`` reading
  ``x[p, idx[j], q]`` (``x`` seen as ``(pre, A, post)``); negative indices wrap as in numpy.
  numpy raises on an index outside ``[-A, A)``; the kernel cannot raise, so it reads nothing
  and writes 0 there (an out-of-range index is not reported on the device).
- ``index_add(upd, idx, axis, size)`` (``take``'s transpose): the output is zeroed, then one
  thread per update element adds it at ``out[p, idx[j], q]`` with ``atomicAdd`` (indices may
  repeat; float32, float64 and int32); out-of-range indices are skipped.
- ``argsort(x, axis)`` (numpy's ``kind="stable"`` order: NaNs last, ties by position): one thread
  per element counts the elements of its row that come before it (smaller, or equal and earlier;
  NaN after every number, NaNs by position) and writes its position at that rank: O(n) work per
  element, no barriers, exactly numpy's stable order.  Rows longer than
  :data:`RANK_SORT_MAX` use the array module's ``argsort`` instead (cupy's stable sort on a GPU).
"""

from __future__ import annotations

import math

import numpy as np

from ...core.ir import ShapedArray
from . import kernels as K

RANK_SORT_MAX = 4096
"""Longest row sorted by the generated rank kernel (O(n^2) comparisons per row)."""

ATOMIC_ADD = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32))
"""Dtypes with a CUDA ``atomicAdd`` (scatter_add and index_add on the device)."""


def _split(shape: tuple, axis: int) -> tuple[int, int, int]:
    """``(pre, n, post)``: the sizes before, at and after ``axis``."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _indexed_loop(total: int, post: int, m: int, size: int, body: str) -> list[str]:
    """A grid-stride loop over element ``e = (p, j, q)`` of a ``(pre, m, post)`` index space, with
    ``k = ix[j]`` wrapped once for negative indices into an axis of ``size``; ``body`` uses them."""
    return [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long q = e % {post}LL, j = (e / {post}LL) % {m}LL, p = e / ({post}LL * {m}LL);",
        f"    long long k = (long long)ix[j]; if (k < 0) k += {size}LL;",
        f"    {body}",
        "  }",
    ]


def take_kernel(x_aval: ShapedArray, idx_aval: ShapedArray, axis: int) -> K.Kernel:
    """``out = numpy.take(x, idx, axis)``: one thread per output element."""
    t = K.ctype(x_aval.dtype, "take")
    it = K.ctype(idx_aval.dtype, "take indices")
    if idx_aval.dtype.kind not in "iu":
        raise K.KernelGenerationError(f"take: indices must be integers, got {idx_aval.dtype}")
    pre, a, post = _split(x_aval.shape, axis)
    m = math.prod(idx_aval.shape)
    total = pre * m * post
    body = f"out[e] = (k >= 0 && k < {a}LL) ? x[(p * {a}LL + k) * {post}LL + q] : ({t})0;"
    lines = _indexed_loop(total, post, m, a, body)
    params = [(f"const {t}* __restrict__", "x"), (f"const {it}* __restrict__", "ix"), (f"{t}* __restrict__", "out")]
    return K._finish("take", "\n".join(lines) + "\n", params, False, K.THREADS, K._grid(total, K.THREADS))


def index_add_kernel(upd_aval: ShapedArray, idx_aval: ShapedArray, axis: int, size: int) -> K.Kernel:
    """``out[p, idx[j], q] += upd[p, j, q]`` into a zeroed ``out`` (atomic adds)."""
    dt = upd_aval.dtype
    if dt not in ATOMIC_ADD:
        raise K.KernelGenerationError(f"index_add: no atomic add for {dt} here (float32, float64, int32)")
    if idx_aval.dtype.kind not in "iu":
        raise K.KernelGenerationError(f"index_add: indices must be integers, got {idx_aval.dtype}")
    t, it = K.ctype(dt, "index_add"), K.ctype(idx_aval.dtype, "index_add indices")
    m = math.prod(idx_aval.shape)
    pre = math.prod(upd_aval.shape[:axis])
    post = math.prod(upd_aval.shape[axis + len(idx_aval.shape):])
    total = pre * m * post
    body = f"if (k >= 0 && k < {size}LL) atomicAdd(out + (p * {size}LL + k) * {post}LL + q, upd[e]);"
    lines = _indexed_loop(total, post, m, size, body)
    params = [(f"const {t}* __restrict__", "upd"), (f"const {it}* __restrict__", "ix"), (f"{t}*", "out")]
    return K._finish("idxadd", "\n".join(lines) + "\n", params, False, K.THREADS, K._grid(total, K.THREADS))


def argsort_kernel(x_aval: ShapedArray, axis: int) -> K.Kernel:
    """Stable ``argsort`` along ``axis`` (int64 positions) by ranking: see the module docstring."""
    dt = x_aval.dtype
    if dt == np.bool_:
        raise K.KernelGenerationError("argsort of bool values: cast them to an integer type first")
    t = K.ctype(dt, "argsort")
    pre, n, post = _split(x_aval.shape, axis)
    total = pre * n * post
    if dt.kind == "f":
        before = "(xj != xj) ? (xi != xi && j < i) : ((xi != xi) || xj < xi || (xj == xi && j < i))"
    else:
        before = "xj < xi || (xj == xi && j < i)"
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long q = e % {post}LL, i = (e / {post}LL) % {n}LL, p = e / ({post}LL * {n}LL);",
        f"    const {t}* row = x + p * {n}LL * {post}LL + q;",
        f"    {t} xi = row[i * {post}LL];",
        "    long long rank = 0;",
        f"    for (long long j = 0; j < {n}LL; ++j) {{",
        f"      {t} xj = row[j * {post}LL];",
        f"      rank += ({before}) ? 1 : 0;",
        "    }",
        f"    out[(p * {n}LL + rank) * {post}LL + q] = i;",
        "  }",
    ]
    params = [(f"const {t}* __restrict__", "x"), ("long long* __restrict__", "out")]
    return K._finish("argsort", "\n".join(lines) + "\n", params, False, K.THREADS, K._grid(total, K.THREADS))
