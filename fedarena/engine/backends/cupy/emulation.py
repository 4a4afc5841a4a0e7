"""Run CUDA kernels on the CPU: compile their unchanged source with a host C++ compiler after
``cuda_emu.h`` (which emulates ``blockIdx``/``threadIdx``/``blockDim``/``gridDim``,
``__shared__`` and ``__syncthreads`` with one cooperative fibre per thread), load the shared
object with ctypes and launch kernels on numpy arrays.

This is how the generated kernels and the hand-written GEMM are checked on machines without a
GPU: the code that runs is the code NVRTC compiles on a device, only the execution model is
emulated (blocks one after another, the threads of a block interleaved at their barriers).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from ...core.ir import EngineError
from .kernels import parse_signatures

HEADER = Path(__file__).with_name("cuda_emu.h")

_SCALARS = {
    "int": ctypes.c_int,
    "unsigned": ctypes.c_uint,
    "unsigned int": ctypes.c_uint,
    "long long": ctypes.c_longlong,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}


class EmulationError(EngineError):
    """The host compiler is missing or rejected the source, or a launch was malformed."""


def host_compiler() -> str | None:
    """Path of the C++ compiler the emulation uses (``$CXX``, else g++ / c++ / clang++)."""
    env = os.environ.get("CXX")
    if env and shutil.which(env):
        return shutil.which(env)
    for c in ("g++", "c++", "clang++"):
        p = shutil.which(c)
        if p:
            return p
    return None


def _launcher(name: str, params: tuple, barriers: bool) -> str:
    args = ", ".join(f"*({t}*)args[{k}]" if "*" not in t else f"*({t.replace('__restrict__', '').strip()}*)args[{k}]" for k, (t, _) in enumerate(params))
    b = "true" if barriers else "false"
    return (
        f"static void call_{name}(void** args) {{ {name}({args}); }}\n"
        f'extern "C" int launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void** args) {{\n'
        f"  return cuda_emu::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, {b}, call_{name}, args);\n"
        "}\n"
    )


class EmulatedModule:
    """A compiled CUDA module running on the CPU: ``module.launch(name, grid, block, *args)``
    with numpy arrays for pointers (they must be C-contiguous and of the parameter's type) and
    Python/numpy numbers for scalars."""

    def __init__(self, source: str, cache_dir: str | os.PathLike | None = None, opt: str = "-O1"):
        self.source = source
        self.signatures = parse_signatures(source)
        cxx = host_compiler()
        if cxx is None:
            raise EmulationError("CUDA emulation: no C++ compiler (g++, c++ or clang++) on PATH")
        full = f'#include "{HEADER}"\n{source}\n' + "".join(
            _launcher(n, p, "__syncthreads" in _body_of(source, n)) for n, p in self.signatures.items()
        )
        digest = hashlib.sha1((full + opt + cxx).encode()).hexdigest()[:20]
        cache = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "fedarena_cuda_emu"
        cache.mkdir(parents=True, exist_ok=True)
        so = cache / f"emu_{digest}.so"
        if not so.exists():
            cpp = cache / f"emu_{digest}.cpp"
            cpp.write_text(full)
            tmp = cache / f"emu_{digest}.{os.getpid()}.so"
            cmd = [cxx, "-std=c++17", opt, "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
                   "-Wno-unknown-pragmas", "-Wno-unused-variable", "-o", str(tmp), str(cpp)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise EmulationError(f"CUDA emulation: {Path(cxx).name} failed on {cpp}:\n{res.stderr[-4000:]}")
            os.replace(tmp, so)
        self.path = so
        self._lib = ctypes.CDLL(str(so))
        self._fns = {}
        for n in self.signatures:
            f = getattr(self._lib, f"launch_{n}")
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]
            self._fns[n] = f

    def launch(self, name: str, grid: Sequence[int] | int, block: Sequence[int] | int, *args) -> None:
        params = self.signatures.get(name)
        if params is None:
            raise EmulationError(f"CUDA emulation: no kernel {name!r} in this module")
        if len(args) != len(params):
            raise EmulationError(f"CUDA emulation: {name} takes {len(params)} arguments, got {len(args)}")
        g = tuple(grid) if not isinstance(grid, int) else (grid,)
        b = tuple(block) if not isinstance(block, int) else (block,)
        g, b = (g + (1, 1))[:3], (b + (1, 1))[:3]
        holders, ptrs = [], (ctypes.c_void_p * len(args))()
        for k, ((t, pname), a) in enumerate(zip(params, args)):
            if "*" in t:
                if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                    raise EmulationError(f"CUDA emulation: {name} argument {pname} must be a C-contiguous numpy array")
                h = ctypes.c_void_p(a.ctypes.data)
            else:
                base = " ".join(w for w in t.split() if w != "const")
                ct = _SCALARS.get(base)
                if ct is None:
                    raise EmulationError(f"CUDA emulation: {name} parameter {pname} has unsupported type {t!r}")
                h = ct(a.item() if isinstance(a, np.generic) else a)
            holders.append(h)
            ptrs[k] = ctypes.cast(ctypes.pointer(h), ctypes.c_void_p)
        rc = self._fns[name](*g, *b, ptrs)
        if rc:
            raise EmulationError(f"CUDA emulation: launch of {name} with block {b} failed (code {rc})")


def _body_of(source: str, name: str) -> str:
    """The text of kernel ``name`` up to the next kernel (enough to tell whether it has barriers)."""
    start = source.find(f" {name}(")
    nxt = source.find('extern "C"', start + 1)
    return source[start : nxt if nxt >= 0 else len(source)]
