"""The int8 kernels (``qgemm.c``: GEMM with fused requantization, quantize/dequantize, im2col, max
pooling), built with the system C compiler at first use and cached on disk, and their numpy
reference (:class:`Reference`), which they equal bit for bit.

``qgemm(x, w, bias, multiplier, zero_point, lo, hi)`` computes, for int8 ``x`` (M, K) and int8 ``w``
(N, K), ``clamp(rint((x @ w.T + bias) * multiplier) + zero_point, lo, hi)`` as int8 with int32
accumulation (Jacob et al., CVPR 2018, section 2; the multiplier is float64 and the rounding IEEE
round-to-nearest-even).  :func:`backend` gives the operations of ``"native"`` (C with SIMD),
``"scalar"`` (C without) or ``"reference"`` (numpy) under one interface.

The shared library is compiled once per (source, flags, compiler, CPU flags) into
``$FEDARENA_KERNEL_CACHE`` (default ``~/.cache/fedarena/kernels``) by the engine's run-time C
build helper (:mod:`fedarena.engine.compiler.cbuild`: compiler lookup, cache key, a file written to a
temporary name and renamed into place, so concurrent first uses do not see a half-written file).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler import cbuild

SOURCE = Path(__file__).with_name("qgemm.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c11", "-shared", "-fPIC")
SCALAR_FLAGS = FLAGS + ("-DQGEMM_FORCE_SCALAR",)
ACC_LIMIT = 2**31 - 1


class KernelBuildError(RuntimeError):
    """The C compiler is missing or rejected ``qgemm.c``."""


def _cache_dir() -> Path:
    return Path(cbuild.cache_dir("FEDARENA_KERNEL_CACHE", "kernels"))


def _compiler() -> list:
    try:
        return cbuild.compiler()
    except cbuild.BuildError:
        raise KernelBuildError("int8 kernel: no C compiler found (set CC or install gcc/clang)") from None


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
    version = subprocess.run([*cc, "--version"], capture_output=True, text=True).stdout
    key = cbuild.cache_key(SOURCE.read_text(), *flags, version, _cpu_flags())
    out = _cache_dir() / f"qgemm-{key}.so"
    if out.exists():
        return out
    try:
        cbuild.compile_shared([*cc, *flags, str(SOURCE), "-lm"], str(out))
    except OSError as e:
        raise KernelBuildError(f"int8 kernel: cannot write the kernel cache {out.parent} ({e.strerror}); "
                               "set FEDARENA_KERNEL_CACHE to a writable directory") from None
    except cbuild.BuildError as e:
        raise KernelBuildError(f"int8 kernel: {' '.join(cc)} failed on {SOURCE.name}: {e}") from None
    return out


class _Library:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        p, i64, i32, f64, i8 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.c_int8
        lib.qgemm_requant.argtypes = [p, p, p, p, i64, i64, i64, i64, i32, i32, i32, p, p]
        lib.qgemm_requant.restype = ctypes.c_int
        lib.qgemm_packed_size.argtypes = [i64, i64]
        lib.qgemm_packed_size.restype = i64
        lib.qgemm_pack.argtypes = [p, i64, i64, p]
        lib.qgemm_pack.restype = None
        lib.quantize_f32.argtypes = [p, i64, f64, i32, i32, i32, p]
        lib.quantize_f32.restype = None
        lib.dequantize_i8.argtypes = [p, i64, f64, i32, p]
        lib.dequantize_i8.restype = None
        lib.im2col_i8.argtypes = [p] + [i64] * 12 + [i8, i64, i64, p]
        lib.im2col_i8.restype = None
        lib.maxpool_i8.argtypes = [p] + [i64] * 10 + [i8, i64, i64, p]
        lib.maxpool_i8.restype = None
        lib.qgemm_isa.restype = ctypes.c_char_p
        self.lib = lib
        self.isa = lib.qgemm_isa().decode()


_LIBRARIES: dict[tuple, _Library] = {}


def library(scalar: bool = False) -> _Library:
    """The loaded kernels (``scalar=True``: the build without SIMD, for testing both paths)."""
    flags = SCALAR_FLAGS if scalar else FLAGS
    if flags not in _LIBRARIES:
        _LIBRARIES[flags] = _Library(build(flags))
    return _LIBRARIES[flags]


def isa() -> str:
    """Which instruction path the native kernel was compiled to on this machine."""
    return library().isa


def check_gemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int, lo: int, hi: int) -> None:
    """Refuse operands :func:`qgemm` cannot take (wrong dtypes or shapes, an int32 accumulator that may overflow)."""
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
    bound = x.shape[1] * 128 * 128 + (int(np.abs(bias.astype(np.int64)).max()) if n else 0)
    if bound > ACC_LIMIT:
        raise ValueError(f"qgemm: K={x.shape[1]} with |bias| up to {bound - x.shape[1] * 128 * 128} may overflow the int32 accumulator")


def _out_hw(h: int, w: int, kernel, stride, padding, dilation=(1, 1)) -> tuple[int, int]:
    oh = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"int8 window: input {h}x{w} is smaller than the kernel {kernel} with padding {padding}")
    return oh, ow


class Reference:
    """The int8 forward pass's operations in numpy: the definition the native kernels must equal."""

    name = "reference"

    @staticmethod
    def quantize(x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
        q = np.rint(np.asarray(x, np.float32).astype(np.float64) / scale) + zero_point
        return np.clip(q, qmin, qmax).astype(np.int8)

    @staticmethod
    def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
        return ((q.astype(np.float64) - zero_point) * scale).astype(np.float32)

    @staticmethod
    def gemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int, lo: int, hi: int,
             group: int = 1, return_acc: bool = False):
        acc = (x.astype(np.int64) @ w.astype(np.int64).T + bias.astype(np.int64)).astype(np.int32)
        y = np.clip(np.rint(acc.astype(np.float64) * multiplier) + float(zero_point), lo, hi).astype(np.int8)
        if group > 1:  # rows (b * group, n) -> (b, n, group)
            y = np.ascontiguousarray(y.reshape(-1, group, w.shape[0]).transpose(0, 2, 1))
            acc = np.ascontiguousarray(acc.reshape(-1, group, w.shape[0]).transpose(0, 2, 1))
        return (y, acc) if return_acc else y

    @staticmethod
    def im2col(x: np.ndarray, kernel, stride, padding, dilation, pad: int):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        oh, ow = _out_hw(x.shape[2], x.shape[3], kernel, stride, padding, dilation)
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=np.int8(pad))
        win = np.lib.stride_tricks.sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
        win = win[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw, ::dh, ::dw]
        b, c = x.shape[:2]
        return np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(b * oh * ow, c * kh * kw), (b, oh, ow)

    @staticmethod
    def maxpool(x: np.ndarray, kernel, stride, padding, pad: int) -> np.ndarray:
        (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
        oh, ow = _out_hw(x.shape[2], x.shape[3], kernel, stride, padding)
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=np.int8(pad))
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw]
        return np.ascontiguousarray(win.max(axis=(4, 5)))


def _addr(a: np.ndarray) -> int:
    """The data address of a C-contiguous array: through ctypes' buffer export where the array is
    writable and not empty (about 3x cheaper than ``a.ctypes.data``, which dominates a batch-1 call)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return a.ctypes.data


class Native:
    """The same operations on the C kernels (``scalar=True``: the build without SIMD).  A weight
    matrix is packed for the kernel on its first use and the packing kept (keyed by the array's
    identity, which the caller keeps alive: a layer's weights)."""

    def __init__(self, scalar: bool = False):
        self.lib = library(scalar).lib
        self.name = "scalar" if scalar else "native"
        self._packed: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def pack(self, w: np.ndarray) -> np.ndarray:
        """``w`` (N, K) int8 in the kernel's int16-pair layout."""
        return self._pointers(w)[1]

    def _pointers(self, w: np.ndarray) -> tuple[int, np.ndarray]:
        got = self._packed.get(id(w))
        if got is not None and got[0] is w:
            return got[1], got[2]
        w8 = np.ascontiguousarray(w, np.int8)
        out = np.empty(self.lib.qgemm_packed_size(*w8.shape), np.int16)
        self.lib.qgemm_pack(w8.ctypes.data, w8.shape[0], w8.shape[1], _addr(out))
        if len(self._packed) > 4096:
            self._packed.clear()
        self._packed[id(w)] = (w, _addr(out), out)
        return _addr(out), out

    def _address(self, a: np.ndarray) -> int:
        """The data address of a layer's constant array (bias, multiplier), looked up once."""
        got = self._packed.get(id(a))
        if got is not None and got[0] is a:
            return got[1]
        self._packed[id(a)] = (a, a.ctypes.data, a)
        return a.ctypes.data

    def quantize(self, x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty(x.shape, np.int8)
        self.lib.quantize_f32(_addr(x), x.size, scale, zero_point, qmin, qmax, _addr(out))
        return out

    def dequantize(self, q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
        q = np.ascontiguousarray(q)
        out = np.empty(q.shape, np.float32)
        self.lib.dequantize_i8(_addr(q), q.size, scale, zero_point, _addr(out))
        return out

    def gemm(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int, lo: int, hi: int,
             group: int = 1, return_acc: bool = False, constant: bool = True):
        """``w``, ``bias`` and ``multiplier`` C-contiguous; with ``constant`` (a layer's arrays) they
        must not change afterwards: their packing and addresses are kept."""
        x = np.ascontiguousarray(x)
        m, n = x.shape[0], w.shape[0]
        if m % group:
            raise ValueError(f"qgemm: {m} rows do not split into groups of {group}")
        shape = (m, n) if group == 1 else (m // group, n, group)
        y = np.empty(shape, np.int8)
        acc = np.empty(shape, np.int32) if return_acc else None
        if constant:
            pw, pb, pm = self._pointers(w)[0], self._address(bias), self._address(multiplier)
        else:
            packed = np.empty(self.lib.qgemm_packed_size(*w.shape), np.int16)
            self.lib.qgemm_pack(w.ctypes.data, w.shape[0], w.shape[1], packed.ctypes.data)
            pw, pb, pm = packed.ctypes.data, bias.ctypes.data, multiplier.ctypes.data
        rc = self.lib.qgemm_requant(_addr(x), pw, pb, pm, m, n,
                                    x.shape[1], group, zero_point, lo, hi, None if acc is None else _addr(acc), _addr(y))
        if rc != 0:  # pragma: no cover - out of memory
            raise MemoryError("qgemm: the kernel could not allocate its row buffer")
        return (y, acc) if return_acc else y

    def im2col(self, x: np.ndarray, kernel, stride, padding, dilation, pad: int):
        x = np.ascontiguousarray(x)
        b, c, h, w = x.shape
        oh, ow = _out_hw(h, w, kernel, stride, padding, dilation)
        out = np.empty((b * oh * ow, c * kernel[0] * kernel[1]), np.int8)
        self.lib.im2col_i8(_addr(x), b, c, h, w, *kernel, *stride, *padding, *dilation, pad, oh, ow, _addr(out))
        return out, (b, oh, ow)

    def maxpool(self, x: np.ndarray, kernel, stride, padding, pad: int) -> np.ndarray:
        x = np.ascontiguousarray(x)
        b, c, h, w = x.shape
        oh, ow = _out_hw(h, w, kernel, stride, padding)
        out = np.empty((b, c, oh, ow), np.int8)
        self.lib.maxpool_i8(_addr(x), b, c, h, w, *kernel, *stride, *padding, pad, oh, ow, _addr(out))
        return out


BACKENDS = ("native", "scalar", "reference")
_BACKENDS: dict[str, Any] = {"reference": Reference()}


def backend(name: str):
    """The int8 operations of ``name``: ``"native"`` (C, SIMD), ``"scalar"`` (C, no SIMD) or ``"reference"`` (numpy)."""
    if name not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name not in _BACKENDS:
        _BACKENDS[name] = Native(scalar=name == "scalar")
    return _BACKENDS[name]


def qgemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int,
          lo: int = -128, hi: int = 127, backend_name: str = "native", return_acc: bool = False):
    """int8 (M, N) = clamp(rint((x @ w.T + bias) * multiplier) + zero_point, lo, hi), operands checked
    first; with ``return_acc`` also the int32 accumulators (before requantization)."""
    check_gemm(x, w, bias, multiplier, zero_point, lo, hi)
    be = backend(backend_name)
    if be.name == "reference":
        return be.gemm(x, w, bias, multiplier, int(zero_point), int(lo), int(hi), return_acc=return_acc)
    w, bias, multiplier = (np.ascontiguousarray(a) for a in (w, bias, multiplier))
    return be.gemm(x, w, bias, multiplier, int(zero_point), int(lo), int(hi), return_acc=return_acc, constant=False)


def qgemm_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray, zero_point: int,
                    lo: int = -128, hi: int = 127, return_acc: bool = False):
    """The numpy definition of :func:`qgemm` (int64 products, exact; then the same float64 rounding)."""
    return qgemm(x, w, bias, multiplier, zero_point, lo, hi, "reference", return_acc)


__all__ = ["BACKENDS", "KernelBuildError", "Native", "Reference", "backend", "build", "check_gemm", "isa", "library", "qgemm", "qgemm_reference"]
