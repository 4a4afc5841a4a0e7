"""Where the cupy backend's kernels run: :class:`CupyDevice` (a CUDA GPU through cupy: NVRTC
compiles each module, cuBLAS runs matmuls) or :class:`EmulatedDevice` (numpy arrays, the same
kernel source compiled for the CPU by :mod:`.emulation`).  Both give ``xp`` (the array module),
``load(source)`` (a module with ``launch(name, grid, block, *args)``), ``to_device`` and
``to_host``; the executor is written once against this interface."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from ...core.ir import EngineError
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

    def __init__(self) -> None:
        why = gpu_unavailable_reason()
        if why is not None:
            raise GpuUnavailableError(f"jit(backend='cupy'): {why}")
        import cupy

        self.xp = cupy
        self._modules: dict = {}

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


class EmulatedDevice:
    """A stand-in GPU on the CPU: arrays are numpy arrays, kernels run through
    :class:`.emulation.EmulatedModule` (compiled once per module source, cached in ``cache_dir``).
    ``prepare(sources)`` compiles several modules' kernels in one compiler run."""

    name = "cpu-emulation"

    def __init__(self, cache_dir: str | os.PathLike | None = None, opt: str = "-O0"):
        if emulation.host_compiler() is None:
            raise GpuUnavailableError("CUDA emulation: no C++ compiler (g++, c++ or clang++) on PATH")
        self._emulation = emulation
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
            return self._batch
        mod = self._modules.get(source)
        if mod is None:
            mod = self._modules[source] = self._emulation.EmulatedModule(source, self.cache_dir, self.opt)
        return mod

    def to_device(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def synchronize(self) -> None:
        pass
