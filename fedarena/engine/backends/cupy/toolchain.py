"""The CUDA compiler on the host: find ``nvcc`` and compile a module's source to PTX, which
checks that generated kernels are valid CUDA without a GPU (CI runs it for every kernel)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...core.ir import EngineError

ARCH = "sm_90"
"""The architecture kernels are checked for (Hopper: H100/H200)."""


class NvccError(EngineError):
    """nvcc rejected a module (the message holds its diagnostics)."""


def find_nvcc() -> str | None:
    """``nvcc`` on PATH, else under ``$CUDA_HOME``/``$CUDA_PATH`` or /usr/local/cuda."""
    p = shutil.which("nvcc")
    if p:
        return p
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def ptx(source: str, arch: str = ARCH, nvcc: str | None = None, optimize: bool = True) -> str:
    """PTX of a CUDA module's source (``nvcc --ptx -arch=<arch>``); raises :class:`NvccError`.
    ``optimize=False`` passes ``-Xcicc -O0`` (parse, type-check and generate PTX without NVVM's
    optimiser: ~6x faster for checking hundreds of generated kernels)."""
    exe = nvcc or find_nvcc()
    if exe is None:
        raise NvccError("nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")
    with tempfile.TemporaryDirectory(prefix="fedarena_nvcc_") as d:
        cu, out = Path(d) / "module.cu", Path(d) / "module.ptx"
        cu.write_text(source)
        flags = [] if optimize else ["-Xcicc", "-O0"]
        res = subprocess.run([exe, "--ptx", f"-arch={arch}", "-std=c++17", *flags, "-o", str(out), str(cu)], capture_output=True, text=True)
        if res.returncode != 0:
            raise NvccError(f"nvcc --ptx -arch={arch} failed:\n{res.stderr[-4000:]}")
        return out.read_text()


def find_nvrtc() -> str | None:
    """Path of an NVRTC library (the runtime compiler cupy uses): the ``nvidia-cuda-nvrtc``
    wheel's, else one under ``$CUDA_HOME``/``$CUDA_PATH``/``/usr/local/cuda``, else the loader's."""
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels

        for base in getattr(nvidia, "__path__", []):
            hits = sorted(Path(base).glob("*/lib/libnvrtc.so*")) + sorted(Path(base).glob("cuda_nvrtc/lib/libnvrtc.so*"))
            hits = [h for h in hits if "builtins" not in h.name]
            if hits:
                return str(hits[0])
    except ImportError:
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            hits = sorted((Path(root) / "lib64").glob("libnvrtc.so*"))
            if hits:
                return str(hits[0])
    return ctypes.util.find_library("nvrtc")


def nvrtc_ptx(source: str, arch: str = "compute_90", library: str | None = None) -> str:
    """PTX of a module through NVRTC with the options the cupy backend gives ``RawModule``
    (``--std=c++17``, no include paths): checks that a kernel compiles as it will on a GPU."""
    path = library or find_nvrtc()
    if path is None:
        raise NvccError("NVRTC not found (pip install nvidia-cuda-nvrtc, or a CUDA toolkit)")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    src = source.encode()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            msg = lib.nvrtcGetErrorString(rc).decode()
            log = ""
            if prog.value:
                n = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
                buf = ctypes.create_string_buffer(n.value)
                lib.nvrtcGetProgramLog(prog, buf)
                log = buf.value.decode(errors="replace")
            raise NvccError(f"NVRTC {what} failed ({msg}):\n{log[-4000:]}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"module.cu", 0, None, None), "create")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        check(lib.nvrtcCompileProgram(prog, len(opts), arr), "compile")
        n = ctypes.c_size_t()
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(n)), "PTX size")
        buf = ctypes.create_string_buffer(n.value)
        check(lib.nvrtcGetPTX(prog, buf), "PTX")
        return buf.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
