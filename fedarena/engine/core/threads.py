"""Thread control for the numpy backend: numpy's BLAS and the engine's own kernel pool.

For the small matrices of RL networks a multi-threaded BLAS mostly adds synchronisation cost (and
is disastrous when other processes share the cores), so RL workers usually want one BLAS thread
per process — the same advice PyTorch gives with ``torch.set_num_threads(1)``.  The BLAS limit goes
through ``threadpoolctl`` (installed with scikit-learn; without it the limit is not set) and covers
every BLAS loaded when it is set, so scipy's BLAS (used by the conv kernels) is loaded first.

``set_num_threads(n)`` with ``n > 1`` also starts the engine's pool of ``n - 1`` worker threads
(``_parallel.c``): compiled programs split their large matrix products over it, each thread calling
numpy's OpenBLAS for one block with OpenBLAS limited to that thread
(``openblas_set_num_threads_local``, OpenBLAS >= 0.3.27), so OpenBLAS's own pool stays idle and
does not compete with the engine's threads for the cores, and their large fused elementwise
programs.  Until ``set_num_threads`` is called with ``n > 1``, or when numpy's BLAS is not such an
OpenBLAS, products go to ``np.dot`` as they are.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from . import cext

_LIMITER: Any = None
_BLAS_SET = False

# cblas names of numpy's OpenBLAS builds: numpy >= 2.0 wheels (scipy-openblas, 64-bit integers),
# other 64-bit-integer builds, and a plain OpenBLAS
_GEMM_NAMES = (("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True), ("cblas_sgemm64_", "cblas_dgemm64_", True), ("cblas_sgemm", "cblas_dgemm", False))


def set_num_threads(n: int | None) -> None:
    """Limit numpy's BLAS to ``n`` threads for the whole process and run the engine's large
    kernels on ``n`` threads (``None`` restores numpy's default and stops the engine's pool)."""
    global _LIMITER
    if n is not None and int(n) < 1:
        raise ValueError(f"number of threads must be >= 1, got {n}")
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - optional dependency
        threadpoolctl = None
    if threadpoolctl is not None:
        if _LIMITER is not None:
            _LIMITER.restore_original_limits()
            _LIMITER = None
        if n is not None:
            import scipy.linalg.blas  # noqa: F401  (its BLAS library must be loaded to be limited)

            _LIMITER = threadpoolctl.threadpool_limits(limits=int(n), user_api="blas")
    if cext._native is not None:
        if n is not None and int(n) > 1:
            _connect_blas()
        cext._native.set_threads(1 if n is None else int(n))


def get_num_threads() -> int | None:
    """The BLAS thread count numpy currently uses (``None`` if it cannot be determined)."""
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover
        return None
    info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return int(info[0]["num_threads"]) if info else None


def kernel_threads() -> int:
    """Threads the engine's own kernels run on now (1 without the C extension)."""
    return cext._native.get_threads() if cext._native is not None else 1


def _connect_blas() -> None:
    """Hand the pool numpy's OpenBLAS ``cblas_?gemm`` and ``openblas_set_num_threads_local``
    (once; nothing if numpy's BLAS has not got them)."""
    global _BLAS_SET
    if _BLAS_SET:
        return
    _BLAS_SET = True
    found = numpy_openblas()
    if found is not None:
        cext._native.set_blas(*found)


def openblas_libraries():
    """The OpenBLAS libraries loaded in this process, as ``ctypes.CDLL``: numpy's own (in
    numpy.libs / numpy/.dylibs) before another one (scipy's); none without threadpoolctl."""
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover
        return
    libs = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    libs.sort(key=lambda i: "numpy" not in os.path.basename(os.path.dirname(i["filepath"])))
    for info in libs:
        try:
            yield ctypes.CDLL(info["filepath"])
        except OSError:  # pragma: no cover
            continue


def numpy_openblas() -> tuple[int, int, int, bool] | None:
    """``(sgemm, dgemm, set_num_threads_local, ilp64)`` addresses in numpy's OpenBLAS, or ``None``."""
    for lib in openblas_libraries():
        local = getattr(lib, "openblas_set_num_threads_local", None)
        if local is None:
            continue
        for s, d, ilp64 in _GEMM_NAMES:
            if hasattr(lib, s) and hasattr(lib, d):
                addr = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in (s, d)]
                return addr[0], addr[1], ctypes.cast(local, ctypes.c_void_p).value, ilp64
    return None
