"""The int8 GEMM with fused requantization (``qgemm.c``), built with the system C compiler at first
use and cached on disk, and its numpy reference, which it equals bit for bit.

``qgemm(x, w, bias, multiplier, zero_point, lo, hi)`` computes, for int8 ``x`` (M, K) and int8 ``w``
(N, K), ``clamp(rint((x @ w.T + bias) * multiplier) + zero_point, lo, hi)`` as int8 with int32
accumulation (Jacob et al., CVPR 2018, section 2; the multiplier is float64 and the rounding IEEE
round-to-nearest-even).  ``backend="native"`` runs the C kernel, ``"reference"`` the numpy one.

The shared library is compiled once per (source, flags, compiler, CPU flags) into
``$FEDARENA_KERNEL_CACHE`` (default ``~/.cache/fedarena/kernels``), written to a temporary name and
renamed into place, so concurrent first uses do not see a half-written file.  The engine has no
build-and-cache helper for C compiled at run time (``engine/core/cext.py`` loads the extension
``pip install`` built), hence this module's own.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("qgemm.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c11", "-shared", "-fPIC")
SCALAR_FLAGS = FLAGS + ("-DQGEMM_FORCE_SCALAR",)
ACC_LIMIT = 2**31 - 1


class KernelBuildError(RuntimeError):
    """The C compiler is missing or rejected ``qgemm.c``."""


def _cache_dir() -> Path:
    return Path(os.environ.get("FEDARENA_KERNEL_CACHE") or Path.home() / ".cache" / "fedarena" / "kernels")


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise KernelBuildError("int8 kernel: no C compiler found (set CC or install gcc/clang)")
    return cc


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:  # pragma: no cover - not Linux
        pass
    return os.uname().machine


def build(flags: tuple[str, ...] = FLAGS) -> Path:
    """The path of the shared library built from ``qgemm.c`` with ``flags`` (compiled on first use)."""
    cc = _compiler()
    src = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), version.encode(), _cpu_flags().encode()]))
    out = _cache_dir() / f"qgemm-{key.hexdigest()[:20]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True)
        if res.returncode != 0:
            raise KernelBuildError(f"int8 kernel: {cc} failed on {SOURCE.name}: {res.stderr.strip()[:2000]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class _Kernel:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
        lib.qgemm_requant.argtypes = [p, p, p, p, i64, i64, i64, i32, i32, i32, p, p]
        lib.qgemm_requant.restype = ctypes.c_int
        lib.qgemm_isa.restype = ctypes.c_char_p
        self.lib = lib
        self.isa = lib.qgemm_isa().decode()


_KERNELS: dict[tuple, _Kernel] = {}


def kernel(scalar: bool = False) -> _Kernel:
    """The loaded kernel (``scalar=True``: the build without SIMD, for testing both paths)."""
    flags = SCALAR_FLAGS if scalar else FLAGS
    if flags not in _KERNELS:
        _KERNELS[flags] = _Kernel(build(flags))
    return _KERNELS[flags]


def isa() -> str:
    """Which instruction path the native kernel was compiled to on this machine."""
    return kernel().isa


def _check(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int, lo: int, hi: int) -> None:
    if x.dtype != np.int8 or w.dtype != np.int8:
        raise ValueError(f"qgemm: x and w must be int8, got {x.dtype} and {w.dtype}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"qgemm: x (M, K) and w (N, K) must share K, got {x.shape} and {w.shape}")
    n = w.shape[0]
    if bias.shape != (n,) or bias.dtype != np.int32:
        raise ValueError(f"qgemm: bias must be int32 of shape ({n},), got {bias.dtype} {bias.shape}")
    if multiplier.shape != (n,) or multiplier.dtype != np.float64:
        raise ValueError(f"qgemm: multiplier must be float64 of shape ({n},), got {multiplier.dtype} {multiplier.shape}")
    if not (-128 <= lo <= hi <= 127) or not -128 <= zero_point <= 127:
        raise ValueError(f"qgemm: need -128 <= lo <= hi <= 127 and an int8 zero point, got lo={lo} hi={hi} zero_point={zero_point}")
    # the int32 accumulator cannot overflow: |sum| <= K * 128 * 128, plus |bias|
    bound = x.shape[1] * 128 * 128 + (int(np.abs(bias.astype(np.int64)).max()) if n else 0)
    if bound > ACC_LIMIT:
        raise ValueError(f"qgemm: K={x.shape[1]} with |bias| up to {bound - x.shape[1] * 128 * 128} may overflow the int32 accumulator")


def qgemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int,
          lo: int = -128, hi: int = 127, backend: str = "native", return_acc: bool = False):
    """int8 (M, N) = clamp(rint((x @ w.T + bias) * multiplier) + zero_point, lo, hi); with
    ``return_acc`` also the int32 accumulators (before requantization)."""
    _check(x, w, bias, multiplier, zero_point, lo, hi)
    if backend == "reference":
        return qgemm_reference(x, w, bias, multiplier, zero_point, lo, hi, return_acc)
    if backend not in ("native", "scalar"):
        raise ValueError(f"qgemm: backend must be 'native', 'scalar' or 'reference', got {backend!r}")
    k = kernel(scalar=backend == "scalar")
    x = np.ascontiguousarray(x)
    w = np.ascontiguousarray(w)
    bias = np.ascontiguousarray(bias)
    multiplier = np.ascontiguousarray(multiplier)
    m, n = x.shape[0], w.shape[0]
    y = np.empty((m, n), np.int8)
    acc = np.empty((m, n), np.int32) if return_acc else None
    k.lib.qgemm_requant(x.ctypes.data, w.ctypes.data, bias.ctypes.data, multiplier.ctypes.data, m, n, x.shape[1],
                        int(zero_point), int(lo), int(hi), None if acc is None else acc.ctypes.data, y.ctypes.data)
    return (y, acc) if return_acc else y


def qgemm_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int,
                    lo: int = -128, hi: int = 127, return_acc: bool = False):
    """The numpy definition of :func:`qgemm` (int64 products, exact; then the same float64 rounding)."""
    acc = (x.astype(np.int64) @ w.astype(np.int64).T + bias.astype(np.int64)).astype(np.int32)
    v = np.clip(np.rint(acc.astype(np.float64) * multiplier) + float(zero_point), lo, hi)
    y = v.astype(np.int8)
    return (y, acc) if return_acc else y


__all__ = ["KernelBuildError", "build", "isa", "kernel", "qgemm", "qgemm_reference"]
