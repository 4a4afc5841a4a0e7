"""Interop with other frameworks: PyTorch modules into engine functions through ``torch.fx``
(:func:`from_torch`) and zero-copy array exchange through DLPack (:func:`from_dlpack`,
:func:`to_dlpack`, :func:`to_torch`). torch and cupy are imported only when these are called."""

from .dlpack import from_dlpack, to_dlpack, to_torch
from .torch_fx import TorchConversionError, TorchFunction, from_torch, load_torch_factory

__all__ = ["TorchConversionError", "TorchFunction", "from_dlpack", "from_torch", "load_torch_factory",
           "to_dlpack", "to_torch"]
