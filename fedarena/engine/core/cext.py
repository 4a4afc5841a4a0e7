"""The numpy backend's C extension (``_native.c``, built by ``pip install``; optional) loaded once,
and the facts about it that code generators at every layer share: whether it is available, the
float dtypes its kernels take and when a row max/min runs natively.  Imports nothing from the
engine but the IR, so primitives' emit rules, the compiler's operator selection and the executor
can all ask it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .ir import ShapedArray

try:  # built by `pip install` from _native.c; optional
    from .. import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None

# everything the engine takes from it (jit's call path, the kernels the code generators call): a build
# from older sources (an editable install not rebuilt after a pull) lacks some, and is then not used at
# all rather than failing in a generated program
KERNELS = ("FastCall", "JitBase", "MISS", "leaves", "tanh", "dense", "softmax", "rowreduce", "elementwise", "windows", "philox", "random", "set_threads", "get_threads", "set_blas", "gemm")
STALE = _native is not None and not all(hasattr(_native, k) for k in KERNELS)
if STALE:  # pragma: no cover - depends on the build
    warnings.warn(
        "fedarena.engine: the C extension was built from older sources and is not used; rebuild it "
        "(pip install -e . or python setup.py build_ext --inplace)",
        RuntimeWarning,
        stacklevel=2,
    )
    _native = None

FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})  # the dtypes the kernels take
ROW_REDUCE_MAX = 32  # longest last axis the native row max/min takes


def available() -> bool:
    """Whether the native kernels are built and enabled (``FEDARENA_NATIVE`` not ``0``)."""
    return _native is not None and os.environ.get("FEDARENA_NATIVE", "1") != "0"


def row_reduce_native(aval: ShapedArray, axis: int) -> bool:
    """Whether a max/min of ``aval`` over ``axis`` runs as the native row kernel (the reduction
    emitter's choice; the passes and the executor leave such reductions to it)."""
    return (
        available()
        and aval.ndim >= 2
        and axis % aval.ndim == aval.ndim - 1
        and 1 < aval.shape[-1] <= ROW_REDUCE_MAX
        and aval.dtype in FLOATS
    )


__all__ = ["FLOATS", "ROW_REDUCE_MAX", "available", "row_reduce_native"]
