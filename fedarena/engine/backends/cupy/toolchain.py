"""The CUDA compiler on the host: find ``nvcc`` and compile a module's source to PTX, which
checks that generated kernels are valid CUDA without a GPU (CI runs it for every kernel)."""

from __future__ import annotations

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
