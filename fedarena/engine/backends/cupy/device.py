"""Where the cupy backend's kernels run: :class:`CupyDevice` (a CUDA GPU through cupy: NVRTC
compiles each module, cuBLAS runs matmuls) or :class:`EmulatedDevice` (numpy arrays, the same
kernel source compiled for the CPU by :mod:`.emulation`).  Both give ``xp`` (the array module),
``load(source)`` (a module with ``launch(name, grid, block, *args)``), ``to_device`` and
``to_host``, ``matmul(a, b, out)`` and ``capture(fn)`` (a CUDA graph of the work ``fn`` launches, replayed
by ``graph.launch()``); the executor is written once against this interface.

Matmuls of float16/bfloat16 operands go through ``cublasGemmEx`` (``cublasGemmStridedBatchedEx`` for
batches) with ``CUBLAS_COMPUTE_32F`` (tensor cores, float32 accumulation, the result rounded to the
operands' dtype); float32 operands use ``CUBLAS_COMPUTE_32F_FAST_TF32`` only when the device was made
with ``allow_tf32=True``.  The emulated device computes the same products with a reference GEMM:
inputs rounded to the compute precision, float32 accumulation, the result rounded to the dtype."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from ...core.ir import LOW_PRECISION, EngineError
from . import emulation
from .kernels import module_source, parse_signatures


class GpuUnavailableError(EngineError, RuntimeError):
    """The cupy backend was asked for but cupy or a CUDA device is missing."""


_NP_SCALAR = {"int": np.int32, "unsigned": np.uint32, "unsigned int": np.uint32, "long long": np.int64, "float": np.float32, "double": np.float64}


def gpu_unavailable_reason() -> str | None:
    """Why :class:`CupyDevice` cannot start here (``None`` when it can)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cupy is not installed (pip install 'fedarena[gpu]', or cupy-cuda12x / cupy-cuda13x matching the driver)"
    except Exception as exc:  # noqa: BLE001 - a broken install says why
        return f"cupy failed to import: {exc}"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return f"no CUDA device is visible to cupy ({type(exc).__name__}: {exc})"
    if n < 1:
        return "no CUDA device is visible to cupy"
    return None


# cuBLAS / CUDA library constants (cublas_api.h, library_types.h)
_CUDA_R = {"float16": 2, "bfloat16": 14, "float32": 0}
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
_CUBLAS_GEMM_DEFAULT = -1
_CUBLAS_OP_N = 0


def gemm_compute(a_dtype: np.dtype, b_dtype: np.dtype, allow_tf32: bool) -> str | None:
    """Which cuBLAS compute mode a product of these operand dtypes takes: ``"32F"`` (float16/bfloat16
    on tensor cores, float32 accumulation), ``"TF32"`` (float32 when allowed), ``None`` (``xp.matmul``)."""
    if a_dtype != b_dtype:
        return None
    if a_dtype in LOW_PRECISION:
        return "32F"
    if allow_tf32 and a_dtype == np.float32:
        return "TF32"
    return None


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10-bit mantissa (round to nearest even), held as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    r = (bits + np.uint32(0xFFF) + ((bits >> 13) & 1)) & np.uint32(0xFFFFE000)
    return np.where(finite, r, bits).astype(np.uint32).view(np.float32)


def _gemm_shapes(a: Any, b: Any, out: Any) -> tuple | None:
    """``(batch, m, n, k)`` when ``out = a @ b`` is one GEMM or a strided batch of equal GEMMs."""
    if a.ndim < 2 or b.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
        return None
    m, k = a.shape[-2:]
    if b.shape[-2] != k:
        return None
    batch = int(np.prod(a.shape[:-2], dtype=np.int64))
    return batch, m, b.shape[-1], k


class _CupyModule:
    def __init__(self, cupy: Any, source: str):
        self._mod = cupy.RawModule(code=source, options=("--std=c++17",))
        self.signatures = parse_signatures(source)
        self._fns: dict = {}

    def launch(self, name: str, grid: Sequence[int] | int, block: Sequence[int] | int, *args: Any) -> None:
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self._mod.get_function(name)
        params = self.signatures[name]
        conv = []
        for (t, _), a in zip(params, args):
            if "*" in t:
                conv.append(a)
            else:
                base = " ".join(w for w in t.split() if w != "const")
                conv.append(_NP_SCALAR[base](a))
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        b = (block,) if isinstance(block, int) else tuple(block)
        fn(g, b, tuple(conv))


class CupyDevice:
    """The current CUDA device through cupy (raises :class:`GpuUnavailableError` without one)."""

    name = "cuda"

    def __init__(self, allow_tf32: bool = False) -> None:
        why = gpu_unavailable_reason()
        if why is not None:
            raise GpuUnavailableError(f"jit(backend='cupy'): {why}")
        import cupy

        self.xp = cupy
        self.allow_tf32 = bool(allow_tf32)
        self._modules: dict = {}

    def matmul(self, a: Any, b: Any, out: Any) -> None:
        """``out[...] = a @ b``; float16/bfloat16 (and float32 with ``allow_tf32``) on tensor cores."""
        mode = gemm_compute(a.dtype, b.dtype, self.allow_tf32)
        dims = _gemm_shapes(a, b, out) if mode is not None else None
        if dims is None or out.dtype != a.dtype or not out.flags.c_contiguous:
            self.xp.matmul(a, b, out=out)
            return
        from cupy.cuda import device as cuda_device
        from cupy_backends.cuda.libs import cublas

        a, b = self.xp.ascontiguousarray(a), self.xp.ascontiguousarray(b)
        batch, m, n, k = dims
        t = _CUDA_R[a.dtype.name]
        compute = CUBLAS_COMPUTE_32F if mode == "32F" else CUBLAS_COMPUTE_32F_FAST_TF32
        one, zero = np.ones((), np.float32), np.zeros((), np.float32)
        handle = cuda_device.get_cublas_handle()
        cublas.setStream(handle, self.xp.cuda.get_current_stream().ptr)
        # row-major out (m, n) = a (m, k) @ b (k, n) is column-major out^T (n, m) = b^T (n, k) @ a^T (k, m)
        if batch == 1:
            cublas.gemmEx(handle, _CUBLAS_OP_N, _CUBLAS_OP_N, n, m, k, one.ctypes.data, b.data.ptr, t, n,
                          a.data.ptr, t, k, zero.ctypes.data, out.data.ptr, t, n, compute, _CUBLAS_GEMM_DEFAULT)
        else:
            cublas.gemmStridedBatchedEx(handle, _CUBLAS_OP_N, _CUBLAS_OP_N, n, m, k, one.ctypes.data, b.data.ptr, t, n,
                                        k * n, a.data.ptr, t, k, m * k, zero.ctypes.data, out.data.ptr, t, n, m * n,
                                        batch, compute, _CUBLAS_GEMM_DEFAULT)

    def capture(self, fn: Any) -> "_CupyGraph":
        """Capture the work ``fn()`` launches on a fresh stream as one CUDA graph.  Temporaries come
        from a memory pool kept with the graph, so no later allocation reuses an address it holds."""
        cupy = self.xp
        pool = cupy.cuda.MemoryPool()
        stream = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.get_current_stream().synchronize()
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            try:
                result = fn()
            finally:
                graph = stream.end_capture()
        return _CupyGraph(graph, stream, pool, result)

    def load(self, source: str, names: Sequence[str] | None = None) -> _CupyModule:
        mod = self._modules.get(source)
        if mod is None:
            mod = self._modules[source] = _CupyModule(self.xp, source)
        return mod

    def to_device(self, x: Any) -> Any:
        return self.xp.asarray(x)

    def to_host(self, x: Any) -> np.ndarray:
        return self.xp.asnumpy(x)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, self.xp.ndarray)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()


class _CupyGraph:
    def __init__(self, graph: Any, stream: Any, pool: Any, result: Any):
        self.graph, self.stream, self.pool, self.result = graph, stream, pool, result

    def launch(self) -> None:
        self.graph.launch(stream=self.stream)
        self.stream.synchronize()  # callers then read the outputs on the current stream


class CaptureError(EngineError):
    """Work that a CUDA graph cannot hold was attempted while capturing (a host transfer)."""


class _EmulatedGraph:
    """The captured work of :meth:`EmulatedDevice.capture`: ``launch()`` runs it again as one launch."""

    def __init__(self, device: "EmulatedDevice", fn: Any, result: Any):
        self.device, self.fn, self.result = device, fn, result

    def launch(self) -> None:
        dev = self.device
        dev.graph_launches += 1
        dev._in_graph = True
        try:
            self.fn()
        finally:
            dev._in_graph = False


class _CountingModule:
    """A module whose launches from Python (outside a graph replay) the emulated device counts."""

    def __init__(self, mod: Any, device: "EmulatedDevice"):
        self._mod, self._device = mod, device
        self.signatures = mod.signatures

    def launch(self, name: str, grid: Any, block: Any, *args: Any) -> None:
        if not self._device._in_graph:
            self._device.kernel_launches += 1
        self._mod.launch(name, grid, block, *args)


class EmulatedDevice:
    """A stand-in GPU on the CPU: arrays are numpy arrays, kernels run through
    :class:`.emulation.EmulatedModule` (compiled once per module source, cached in ``cache_dir``).
    ``prepare(sources)`` compiles several modules' kernels in one compiler run."""

    name = "cpu-emulation"

    def __init__(self, cache_dir: str | os.PathLike | None = None, opt: str = "-O0", allow_tf32: bool = False):
        if emulation.host_compiler() is None:
            raise GpuUnavailableError("CUDA emulation: no C++ compiler (g++, c++ or clang++) on PATH")
        self._emulation = emulation
        self.allow_tf32 = bool(allow_tf32)
        self.kernel_launches = 0  # kernels launched from Python (not from a graph replay)
        self.graph_launches = 0
        self.gemm_calls: dict = {}  # compute mode -> products run with it
        self._in_graph = False
        self._capturing = False
        self.cache_dir = cache_dir
        self.opt = opt  # the host compiler's optimisation level (-O0 compiles large batches fastest)
        self.xp = np
        self._modules: dict = {}
        self._batch: Any = None
        self._batched: set = set()

    def prepare(self, kernels_of_modules: Sequence[Sequence[Any]]) -> None:
        """Compile every kernel of these modules at once (one C++ translation unit); later
        ``load`` calls whose kernels are all in it use it without compiling."""
        kernels = [k for ks in kernels_of_modules for k in ks]
        self._batch = self._emulation.EmulatedModule(module_source(kernels), self.cache_dir, self.opt)
        self._batched = set(self._batch.signatures)

    def load(self, source: str, names: Sequence[str] | None = None) -> Any:
        if names is not None and self._batch is not None and set(names) <= self._batched:
            return _CountingModule(self._batch, self)
        mod = self._modules.get(source)
        if mod is None:
            mod = self._modules[source] = self._emulation.EmulatedModule(source, self.cache_dir, self.opt)
        return _CountingModule(mod, self)

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """``out[...] = a @ b`` as the device computes it: float16/bfloat16 operands multiplied with
        float32 accumulation and the result rounded to their dtype; float32 with ``allow_tf32``
        rounded to TF32 first; anything else numpy's matmul."""
        mode = gemm_compute(a.dtype, b.dtype, self.allow_tf32)
        if mode is not None and not self._in_graph:
            self.kernel_launches += 1
        if mode == "32F":
            self.gemm_calls["32F"] = self.gemm_calls.get("32F", 0) + 1
            out[...] = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(out.dtype)
        elif mode == "TF32":
            self.gemm_calls["TF32"] = self.gemm_calls.get("TF32", 0) + 1
            out[...] = np.matmul(round_to_tf32(a), round_to_tf32(b))
        else:
            np.matmul(a, b, out=out)

    def capture(self, fn: Any) -> _EmulatedGraph:
        """Run ``fn()`` once as a stream capture: a host transfer inside it raises :class:`CaptureError`
        (CUDA refuses synchronous copies while a stream is capturing)."""
        self._capturing = True
        self._in_graph = True
        try:
            result = fn()
        finally:
            self._capturing = False
            self._in_graph = False
        return _EmulatedGraph(self, fn, result)

    def _no_capture(self, what: str) -> None:
        if self._capturing:
            raise CaptureError(f"CUDA graph capture: {what} is a host synchronisation, not allowed while capturing")

    def to_device(self, x: Any) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            self._no_capture("a host-to-device copy")
        return np.asarray(x)

    def to_host(self, x: Any) -> np.ndarray:
        self._no_capture("a device-to-host copy")
        return np.asarray(x)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def synchronize(self) -> None:
        pass
