"""BLAS thread control for the numpy backend.

For the small matrices of RL networks a multi-threaded BLAS mostly adds synchronisation cost (and
is disastrous when other processes share the cores), so RL workers usually want one BLAS thread
per process — the same advice PyTorch gives with ``torch.set_num_threads(1)``.  This goes through
``threadpoolctl`` (installed with scikit-learn) and is a no-op if it is missing.  The limit covers
every BLAS loaded when it is set, so scipy's BLAS (used by the conv kernels) is loaded first.
"""

from __future__ import annotations

from typing import Any

_LIMITER: Any = None


def set_num_threads(n: int | None) -> None:
    """Limit numpy's BLAS to ``n`` threads for the whole process (``None`` restores the default)."""
    global _LIMITER
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - optional dependency
        return
    if _LIMITER is not None:
        _LIMITER.restore_original_limits()
        _LIMITER = None
    if n is not None:
        if int(n) < 1:
            raise ValueError(f"number of threads must be >= 1, got {n}")
        import scipy.linalg.blas  # noqa: F401  (its BLAS library must be loaded to be limited)

        _LIMITER = threadpoolctl.threadpool_limits(limits=int(n), user_api="blas")


def get_num_threads() -> int | None:
    """The BLAS thread count numpy currently uses (``None`` if it cannot be determined)."""
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover
        return None
    info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return int(info[0]["num_threads"]) if info else None
