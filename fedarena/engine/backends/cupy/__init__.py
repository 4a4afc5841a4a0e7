"""backends.cupy: the engine's GPU backend.

``jit(fn)`` (reached as ``engine.jit(fn, backend="cupy")``) traces ``fn`` as the numpy backend
does, runs :data:`PIPELINE` (the default passes without the numpy backend's native-kernel
selection, the softmax/logsumexp row kernels, and fusion of every elementwise tree) and executes
the schedule with generated CUDA kernels, cuBLAS and one device arena (:mod:`.executor`).
``device=EmulatedDevice()`` runs the same kernels on the CPU (:mod:`.emulation`), which is how
CI checks them without a GPU.  Modules: ``kernels`` (CUDA source generation), ``sgemm.cu`` and
``gemm`` (the hand-tiled SGEMM variants), ``emulation`` + ``cuda_emu.h`` (CPU emulation of the
CUDA execution model), ``toolchain`` (nvcc), ``device``, ``patterns``, ``executor``, ``jit``.
"""

from .device import CupyDevice, EmulatedDevice, GpuUnavailableError, gpu_unavailable_reason
from .jit import PIPELINE, CupyJitted, jit

__all__ = ["PIPELINE", "CupyDevice", "CupyJitted", "EmulatedDevice", "GpuUnavailableError", "gpu_unavailable_reason", "jit"]
