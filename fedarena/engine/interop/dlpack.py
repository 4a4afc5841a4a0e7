"""Zero-copy array exchange between engine arrays, PyTorch and cupy through DLPack.

DLPack is the in-memory tensor structure of the Python array API standard (``__dlpack__`` /
``__dlpack_device__`` on the producer, ``from_dlpack`` on the consumer). Engine arrays are numpy arrays
(cupy arrays on the cupy backend), and both implement the producer side themselves, so
``torch.from_dlpack(engine_array)`` and ``cupy.from_dlpack(engine_array)`` already share memory. This
module adds the engine's consumer side: :func:`from_dlpack` gives a numpy array for a CPU producer and a
cupy array for a CUDA one (no copy in either case: devices match); moving between host and GPU is a
copy by nature and is left to the caller (``cupy.asarray`` / ``.get()``, ``tensor.cpu()``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.ir import EngineError
from ..core.tracing import Tracer

_CPU, _CUDA, _CUDA_HOST, _CUDA_MANAGED = 1, 2, 3, 13  # DLDeviceType codes (dlpack.h)


def _device(x: Any) -> tuple[int, int]:
    if isinstance(x, Tracer):
        raise EngineError("DLPack: a traced value inside jit/grad/vmap has no memory yet; exchange the "
                          "function's inputs or outputs instead")
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or not hasattr(x, "__dlpack__"):
        raise TypeError(f"DLPack: {type(x).__name__} does not implement __dlpack__ / __dlpack_device__")
    kind, index = dev()
    return int(kind), int(index)


def _exportable(x: Any) -> Any:
    """A torch tensor that requires grad exports its (shared) storage through ``detach()``."""
    if getattr(x, "requires_grad", False) and hasattr(x, "detach"):
        return x.detach()
    return x


def from_dlpack(x: Any) -> Any:
    """An engine array sharing ``x``'s memory: numpy for a CPU producer (torch CPU tensors, numpy, ...),
    cupy for a CUDA producer (torch CUDA tensors, cupy, ...; needs cupy). No copy is made."""
    kind, _ = _device(x)
    x = _exportable(x)
    if kind in (_CPU, _CUDA_HOST):
        return np.from_dlpack(x)
    if kind in (_CUDA, _CUDA_MANAGED):
        try:
            import cupy
        except ImportError:
            raise EngineError("from_dlpack: the array lives on a CUDA device; install cupy to use it "
                              "without a copy (or copy it to the host first)") from None
        return cupy.from_dlpack(x)
    raise EngineError(f"from_dlpack: DLPack device type {kind} is neither CPU nor CUDA")


def to_dlpack(x: Any) -> Any:
    """A DLPack capsule of the engine array ``x`` (numpy or cupy) for consumers that take capsules
    (``torch.utils.dlpack.from_dlpack``); a consumer that takes arrays can be given ``x`` itself.
    numpy refuses read-only arrays here (legacy capsules cannot mark them read-only): copy first."""
    _device(x)
    try:
        return x.__dlpack__()
    except BufferError as e:
        raise EngineError(f"to_dlpack: {e} (pass a writable array, e.g. x.copy())") from None


def to_torch(x: Any) -> Any:
    """A torch tensor sharing the engine array's memory (CPU for numpy, CUDA for cupy)."""
    import torch

    _device(x)
    return torch.from_dlpack(x)
