"""The ``engine_backend`` config switch of the RL learners and the FL simulation.

``engine_backend`` names where a component's compiled steps run:

- ``numpy``: ``engine.jit`` (the numpy backend, the default);
- ``cupy``: ``jit(backend="cupy")`` on the current CUDA device (:class:`.backends.cupy.device.CupyDevice`);
- ``cupy-emulated``: the cupy backend on :class:`.backends.cupy.device.EmulatedDevice`, the same generated CUDA
  kernels compiled for the CPU by g++. This is a testing aid (it is slow); it lets CI check that a
  learner on the device backend computes what the numpy backend computes.

:func:`check_engine_backend` is what the configs' ``__post_init__`` call: an unknown name, or
``cupy`` without cupy or a CUDA device, is a one-line ``ValueError`` naming the field.
:func:`backend_jit` compiles a step for the chosen backend, :func:`to_host` brings its device
outputs back as numpy arrays (the identity for numpy arrays).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from .backends.cupy import emulation
from .backends.cupy.device import CupyDevice, EmulatedDevice, gpu_unavailable_reason
from .backends.cupy.jit import jit as cupy_jit
from .core.pytree import tree_map
from .jit import jit as numpy_jit

ENGINE_BACKENDS = ("numpy", "cupy", "cupy-emulated")
"""The values ``engine_backend`` takes."""

_DEVICES: dict = {}
_LOCK = threading.Lock()


def check_engine_backend(value: Any, field: str) -> None:
    """Raise ``ValueError("<field>: ...")`` unless ``value`` names a backend that can run here."""
    if value not in ENGINE_BACKENDS:
        raise ValueError(f"{field}: expected numpy, cupy or cupy-emulated, got {value!r}")
    if value == "cupy":
        why = gpu_unavailable_reason()
        if why is not None:
            raise ValueError(f"{field}: cupy selected but {why}")
    elif value == "cupy-emulated" and emulation.host_compiler() is None:
        raise ValueError(f"{field}: cupy-emulated needs a C++ compiler (g++, c++ or clang++) on PATH")


def device_for(backend: str) -> Any:
    """The process's device of ``backend`` (``cupy`` or ``cupy-emulated``), created on first use."""
    with _LOCK:
        dev = _DEVICES.get(backend)
        if dev is None:
            if backend == "cupy":
                dev = CupyDevice()
            elif backend == "cupy-emulated":
                dev = EmulatedDevice()
            else:
                raise ValueError(f"engine_backend: no device for {backend!r}")
            _DEVICES[backend] = dev
        return dev


def backend_jit(fn: Callable, backend: str, static_argnums: int | Sequence[int] = (), *,
                shape_varies: bool = False) -> Any:
    """``fn`` compiled for ``backend``: ``engine.jit`` for numpy, the cupy backend's ``jit`` on
    :func:`device_for` otherwise (arguments may be numpy or device arrays, outputs are device
    arrays: each call copies its numpy inputs to the device once and nothing else crosses)."""
    if backend == "numpy":
        return numpy_jit(fn, static_argnums=static_argnums, shape_varies=shape_varies)
    return cupy_jit(fn, static_argnums=static_argnums, device=device_for(backend))


def _leaf_to_host(x: Any) -> Any:
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        return x.get()  # a cupy array: one device-to-host copy
    return x


def to_host(tree: Any) -> Any:
    """``tree`` with every cupy array replaced by its numpy copy (other leaves unchanged)."""
    return tree_map(_leaf_to_host, tree)
