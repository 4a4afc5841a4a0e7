"""CUDA C source of the cupy backend's generated kernels: one ``__global__`` function per fused
elementwise group (a grid-stride loop; broadcasting by index arithmetic on shapes fixed when the
kernel is generated; each equation's C expression is its primitive's ``cuda_expr`` rule, written
beside the primitive with the vocabulary of ``primitives/cuda.py``), row and column reductions (sum, mean, max, min), and the row softmax and
logsumexp with the maximum subtracted first.

A kernel is plain CUDA C++ over raw pointers, so the same text is compiled by NVRTC (cupy's
``RawModule``) on a GPU, by ``nvcc --ptx`` in CI, and by a host C++ compiler through the CPU
emulation header (:mod:`.emulation`).  Semantics follow numpy's: operands are converted to the
equation's result type, ``maximum``/``minimum``/``clip`` propagate NaN, ``floor_divide``/``mod``
round toward minus infinity (and give 0 for integer division by zero, as numpy does), sums
accumulate in double (float inputs) or 64-bit integers; the fused-kernel design is the
producer-consumer loop fusion of Chen et al., "TVM" (OSDI 2018), sec. 3.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...core.ir import Graph, Literal, ShapedArray, Var
from ...core.tracing import names_with
from ...primitives.base import promote
from ...primitives.cuda import CTYPE, KernelGenerationError, c_cast, c_fn, c_literal, ctype  # noqa: F401  (the kernels' C vocabulary)

THREADS = 256
"""Threads per block of the generated kernels."""


@dataclass(frozen=True)
class Kernel:
    """One generated ``extern "C" __global__`` function: its source (without :data:`PRELUDE`),
    its name, its parameters as ``(C type, name)``, whether it uses ``__syncthreads``, and the
    launch shape: ``threads`` per block, ``blocks`` (the grid, capped; the loops are grid-stride)."""

    name: str
    source: str
    params: tuple
    barriers: bool
    threads: int
    blocks: int


# helpers every generated module starts with (numpy's semantics where C's differ)
PRELUDE = r"""
#define FE_INF_F __int_as_float(0x7f800000)
#define FE_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define FE_NAN_F __int_as_float(0x7fc00000)
#define FE_NAN_D __longlong_as_double(0x7ff8000000000000LL)
template <typename T> __device__ __forceinline__ T fe_max(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <typename T> __device__ __forceinline__ T fe_min(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
template <typename T> __device__ __forceinline__ T fe_sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
template <typename T> __device__ __forceinline__ bool fe_isfinite(T x) { return x == x && x - x == T(0); }
template <typename T> __device__ __forceinline__ T fe_ifloordiv(T a, T b) {
  if (b == T(0)) return T(0);
  T q = a / b;
  if ((a % b != T(0)) && ((a < T(0)) != (b < T(0)))) q -= T(1);
  return q;
}
template <typename T> __device__ __forceinline__ T fe_imod(T a, T b) {
  if (b == T(0)) return T(0);
  T r = a % b;
  if (r != T(0) && ((r < T(0)) != (b < T(0)))) r += b;
  return r;
}
template <typename T> __device__ __forceinline__ T fe_ipow(T a, T b) {
  if (b < T(0)) return T(0);
  T r = T(1);
  while (b) { if (b & T(1)) r *= a; a *= a; b >>= 1; }
  return r;
}
// numpy's npy_divmod for floats: the remainder has the divisor's sign, the quotient is rounded
// to the nearest integer of (a - mod) / b
__device__ __forceinline__ float fe_fmodf(float a, float b) {
  if (b == 0.0f) return fmodf(a, b);
  float m = fmodf(a, b);
  if (m != 0.0f) { if ((b < 0.0f) != (m < 0.0f)) m += b; } else { m = copysignf(0.0f, b); }
  return m;
}
__device__ __forceinline__ double fe_fmod(double a, double b) {
  if (b == 0.0) return fmod(a, b);
  double m = fmod(a, b);
  if (m != 0.0) { if ((b < 0.0) != (m < 0.0)) m += b; } else { m = copysign(0.0, b); }
  return m;
}
__device__ __forceinline__ float fe_floordivf(float a, float b) {
  if (b == 0.0f) return a / b;
  float m = fmodf(a, b);
  float d = (a - m) / b;
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
  if (d != 0.0f) { float f = floorf(d); if (d - f > 0.5f) f += 1.0f; return f; }
  return copysignf(0.0f, a / b);
}
__device__ __forceinline__ double fe_floordiv(double a, double b) {
  if (b == 0.0) return a / b;
  double m = fmod(a, b);
  double d = (a - m) / b;
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) d -= 1.0;
  if (d != 0.0) { double f = floor(d); if (d - f > 0.5) f += 1.0; return f; }
  return copysign(0.0, a / b);
}
"""


def _finish(kind: str, body: str, params: list, barriers: bool, threads: int, blocks: int) -> Kernel:
    """Name the kernel by a hash of its text (equal kernels share one compiled function)."""
    sig = ", ".join(f"{t} {n}" for t, n in params)
    digest = hashlib.sha1(f"{sig}\n{body}".encode()).hexdigest()[:16]
    name = f"fe_{kind}_{digest}"
    src = f'extern "C" __global__ void {name}({sig}) {{\n{body}}}\n'
    return Kernel(name, src, tuple(params), barriers, threads, blocks)


def _grid(work_items: int, threads: int) -> int:
    return max(1, min(-(-work_items // threads), 65535))


def _strides(shape: Sequence[int]) -> list:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _broadcast_offset(in_shape: tuple, out_shape: tuple, coord: list) -> str:
    """Offset into a C-contiguous ``in_shape`` operand read at output coordinates ``coord``
    (numpy broadcasting: shapes right-aligned, unit dimensions read at index 0)."""
    if in_shape == out_shape:
        return "i"
    if math.prod(in_shape) == 1:
        return "0"
    lead = len(out_shape) - len(in_shape)
    terms = []
    for d, (n, s) in enumerate(zip(in_shape, _strides(in_shape))):
        if n != 1:
            terms.append(coord[lead + d] if s == 1 else f"{coord[lead + d]} * {s}LL")
    return " + ".join(terms) or "0"


# ----------------------------------------------------------------------------- elementwise ops

ELEMENTWISE_OPS = names_with("elementwise") | names_with("fusible")
"""Primitives the elementwise generator writes: the engine's elementwise and fusible sets (derived from
the primitives' traits); each gives the C expression of one element as its ``cuda_expr`` rule."""


def elementwise_kernel(body: Graph) -> Kernel:
    """One kernel computing ``body`` (a fused elementwise tree: every inner value has the output's
    shape) for each output element: ``name(in0, ..., out, n)``; inputs are C-contiguous arrays of
    their own shapes, broadcast against the output by index arithmetic."""
    out = body.outvars[0]
    shape = out.aval.shape
    n = math.prod(shape)
    odt = out.aval.dtype
    params = []
    for k, v in enumerate(body.invars):
        params.append((f"const {ctype(v.aval.dtype, 'fused kernel input')}* __restrict__", f"in{k}"))
    params.append((f"{ctype(odt, 'fused kernel output')}* __restrict__", "out"))
    params.append(("long long", "n"))
    coord = [f"c{d}" for d in range(len(shape))]
    need_coord = any(v.aval.shape != shape and math.prod(v.aval.shape) != 1 for v in body.invars)
    lines = ["  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {"]
    if need_coord:
        lines.append("    long long r = i;")
        for d in reversed(range(len(shape))):
            if d == 0:
                lines.append("    long long c0 = r;")
            else:
                lines.append(f"    long long {coord[d]} = r % {shape[d]}LL; r /= {shape[d]}LL;")
    names: dict = {}
    for k, v in enumerate(body.invars):
        names[v] = f"in{k}[{_broadcast_offset(v.aval.shape, shape, coord)}]"
    if body.constvars:
        raise KernelGenerationError("fused kernel: a body with captured constants (fold them into operands first)")
    for j, e in enumerate(body.eqns):
        o = e.outputs[0]
        pname = e.prim.name
        if pname not in ELEMENTWISE_OPS:
            raise KernelGenerationError(f"fused kernel: no CUDA rule for primitive {pname!r}")
        ctype(o.aval.dtype, f"fused kernel ({pname})")
        if "view" in e.prim.traits:
            # a broadcast: its operand read at the output's coordinates (the kernel's broadcasting
            # by index arithmetic), no value of its own
            a = e.inputs[0]
            if isinstance(a, Literal):
                names[o] = c_literal(a.value, o.aval.dtype)
            elif a in body.invars:
                k = body.invars.index(a)
                names[o] = f"in{k}[{_broadcast_offset(a.aval.shape, shape, coord)}]"
            else:
                names[o] = names[a]
            continue
        ins, dts, weak = [], [], []
        for a in e.inputs:
            if isinstance(a, Literal):
                # a weak Python scalar takes the result's type, or, under a bool result of numeric
                # operands (a comparison), the type it is compared in
                ldt = o.aval.dtype if a.weak else a.aval.dtype
                if a.weak and o.aval.dtype == np.bool_:
                    others = [b.aval.dtype for b in e.inputs if isinstance(b, Var)]
                    ldt = promote([ShapedArray((), d) for d in others] + [a.aval], [False] * len(others) + [True])
                ins.append(c_literal(a.value, ldt))
                dts.append(a.aval.dtype)
                weak.append(a.weak)
            else:
                ins.append(names[a])
                dts.append(a.aval.dtype)
                weak.append(False)
        ct = CTYPE[o.aval.dtype]
        lines.append(f"    const {ct} v{j} = {e.prim.cuda_expr(ins, dts, o.aval.dtype, e.attrs, weak)};")
        names[o] = f"v{j}"
    lines.append(f"    out[i] = {c_cast(names[out], odt)};")
    lines.append("  }")
    return _finish("ew", "\n".join(lines) + "\n", params, False, THREADS, _grid(n, THREADS))


# ----------------------------------------------------------------------------- reductions


def _acc_type(kind: str, dt: np.dtype) -> str:
    if kind in ("sum", "mean"):
        if dt.kind == "f":
            return "double"
        return "long long"
    return CTYPE[dt]


def reduction_kernel(kind: str, in_aval: ShapedArray, axes: Sequence[int], out_dtype: np.dtype) -> Kernel:
    """``out[o] = reduce over the ``axes`` of x`` for ``kind`` in sum / mean / max / min.

    Reduced axes that are the trailing block of a C-contiguous operand (a row reduction) get one
    block per output, its threads striding along the row and combining through shared memory
    (a tree in ``THREADS`` lanes); any other layout (a column reduction) gets one thread per
    output looping over the reduced elements, so neighbouring threads read neighbouring memory."""
    if kind not in ("sum", "mean", "max", "min"):
        raise KernelGenerationError(f"reduction kind {kind!r}")
    shape = in_aval.shape
    nd = len(shape)
    axes = sorted({a % nd for a in axes}) if nd else []
    kept = [d for d in range(nd) if d not in axes]
    n_red = math.prod(shape[a] for a in axes)
    n_out = math.prod(shape[d] for d in kept)
    if kind in ("max", "min") and n_red == 0:
        raise KernelGenerationError("max/min over an empty axis")
    idt, odt = in_aval.dtype, np.dtype(out_dtype)
    it, ot = ctype(idt, f"reduce_{kind} input"), ctype(odt, f"reduce_{kind} output")
    at = _acc_type(kind, idt)
    strides = _strides(shape)
    params = [(f"const {it}* __restrict__", "x"), (f"{ot}* __restrict__", "out")]

    def offset(index: str, dims: list, prefix: str) -> list:
        code, terms = [f"long long {prefix}r = {index};"], []
        for d in reversed(dims):
            code.append(f"long long {prefix}{d} = {prefix}r % {shape[d]}LL; {prefix}r /= {shape[d]}LL;")
            terms.append(f"{prefix}{d} * {strides[d]}LL")
        code.append(f"long long {prefix}off = {' + '.join(terms) or '0'};")
        return code

    def combine(acc: str, v: str) -> str:
        if kind in ("sum", "mean"):
            return f"{acc} += ({at})({v});"
        return f"{acc} = fe_{kind}<{at}>({acc}, ({at})({v}));"

    init = "0" if kind in ("sum", "mean") else None
    scale = f" / (double){n_red}" if kind == "mean" else ""
    if kind == "mean" and odt.kind != "f":
        raise KernelGenerationError("mean needs a float result")
    final = (lambda acc: f"({ot})(({at})({acc}){scale})") if kind == "mean" else (lambda acc: f"({ot})({acc})")
    row = bool(axes) and axes == list(range(nd - len(axes), nd)) and n_red >= 32
    if row:
        t = THREADS
        lines = [
            f"  __shared__ {at} part[{t}];",
            f"  for (long long o = blockIdx.x; o < {n_out}LL; o += gridDim.x) {{",
            f"    const {it}* row = x + o * {n_red}LL;",
            f"    {at} acc = " + (init if init is not None else f"({at})row[0]") + ";",
            f"    for (long long r = threadIdx.x; r < {n_red}LL; r += blockDim.x) {{ {combine('acc', 'row[r]')} }}",
            "    part[threadIdx.x] = acc;",
            "    __syncthreads();",
            f"    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {{",
            f"      if (threadIdx.x < s) {{ {combine('part[threadIdx.x]', 'part[threadIdx.x + s]')} }}",
            "      __syncthreads();",
            "    }",
            f"    if (threadIdx.x == 0) out[o] = {final('part[0]')};",
            "    __syncthreads();",
            "  }",
        ]
        return _finish(f"row{kind}", "\n".join(lines) + "\n", params, True, t, _grid(n_out, 1))
    lines = [f"  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < {n_out}LL; o += (long long)blockDim.x * gridDim.x) {{"]
    lines += ["    " + l for l in offset("o", kept, "k")]
    lines.append(f"    {at} acc = " + (init if init is not None else f"({at})x[koff]") + ";")
    lines.append(f"    for (long long q = 0; q < {n_red}LL; ++q) {{")
    lines += ["      " + l for l in offset("q", axes, "a")]
    lines.append(f"      {combine('acc', 'x[koff + aoff]')}")
    lines.append("    }")
    lines.append(f"    out[o] = {final('acc')};")
    lines.append("  }")
    return _finish(f"col{kind}", "\n".join(lines) + "\n", params, False, THREADS, _grid(n_out, THREADS))


def row_softmax_kernel(rows: int, cols: int, dtype: np.dtype, log: bool = False) -> Kernel:
    """Softmax (``log=False``) or logsumexp (``log=True``) along each row of a C-contiguous
    (rows, cols) array, the row maximum subtracted first: one block per row, the maximum and the
    sum of exponentials each combined through shared memory.  Softmax writes (rows, cols),
    logsumexp (rows,)."""
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise KernelGenerationError(f"softmax/logsumexp need floats, got {dt}")
    t = ctype(dt, "softmax")
    ex, lg = c_fn("exp", dt), c_fn("log", dt)
    params = [(f"const {t}* __restrict__", "x"), (f"{t}* __restrict__", "out")]
    lines = [
        f"  __shared__ {t} pmax[{THREADS}];",
        f"  __shared__ double psum[{THREADS}];",
        f"  for (long long r = blockIdx.x; r < {rows}LL; r += gridDim.x) {{",
        f"    const {t}* row = x + r * {cols}LL;",
        f"    {t} m = row[0];",
        f"    for (long long c = threadIdx.x; c < {cols}LL; c += blockDim.x) m = fe_max<{t}>(m, row[c]);",
        "    pmax[threadIdx.x] = m;",
        "    __syncthreads();",
        "    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {",
        f"      if (threadIdx.x < s) pmax[threadIdx.x] = fe_max<{t}>(pmax[threadIdx.x], pmax[threadIdx.x + s]);",
        "      __syncthreads();",
        "    }",
        f"    const {t} mx = pmax[0];",
        "    double acc = 0.0;",
        f"    for (long long c = threadIdx.x; c < {cols}LL; c += blockDim.x) acc += (double){ex}(row[c] - mx);",
        "    psum[threadIdx.x] = acc;",
        "    __syncthreads();",
        "    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {",
        "      if (threadIdx.x < s) psum[threadIdx.x] += psum[threadIdx.x + s];",
        "      __syncthreads();",
        "    }",
        f"    const {t} total = ({t})psum[0];",
    ]
    if log:
        lines.append(f"    if (threadIdx.x == 0) out[r] = {lg}(total) + mx;")
    else:
        lines.append(f"    for (long long c = threadIdx.x; c < {cols}LL; c += blockDim.x) out[r * {cols}LL + c] = {ex}(row[c] - mx) / total;")
    lines += ["    __syncthreads();", "  }"]
    return _finish("logsumexp" if log else "softmax", "\n".join(lines) + "\n", params, True, THREADS, _grid(rows, 1))


# ----------------------------------------------------------------------------- modules

_KERNEL_DECL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)')


def parse_signatures(source: str) -> dict:
    """``{kernel name: ((C type, name), ...)}`` of every ``extern "C" __global__`` function."""
    out = {}
    for m in _KERNEL_DECL.finditer(source):
        params = []
        for p in m.group(2).split(","):
            p = " ".join(p.split())
            if not p:
                continue
            k = max(p.rfind(" "), p.rfind("*"))
            params.append((p[: k + 1].strip(), p[k + 1 :].strip()))
        out[m.group(1)] = tuple(params)
    return out


def module_source(kernels: Sequence[Kernel]) -> str:
    """One CUDA module holding ``kernels`` (each once) after the prelude."""
    seen, parts = set(), [PRELUDE]
    for k in kernels:
        if k.name not in seen:
            seen.add(k.name)
            parts.append(k.source)
    return "\n".join(parts)


# ----------------------------------------------------------------------------- gather / scatter


def gather_kernel(x_aval: ShapedArray, idx_aval: ShapedArray, axis: int) -> Kernel:
    """``out = take_along_axis(x, idx, axis)``: one thread per output element."""
    return _along_axis("gather", x_aval, idx_aval, axis)


def scatter_add_kernel(upd_aval: ShapedArray, idx_aval: ShapedArray, axis: int, shape: tuple) -> Kernel:
    """``out[.., idx, ..] += upd`` along ``axis`` into a zeroed ``out`` of ``shape`` (atomic adds:
    indices may repeat)."""
    return _along_axis("scatter", ShapedArray(shape, upd_aval.dtype), idx_aval, axis)


def _along_axis(kind: str, x_aval: ShapedArray, idx_aval: ShapedArray, axis: int) -> Kernel:
    shape, ishape = x_aval.shape, idx_aval.shape
    nd = len(shape)
    axis %= nd
    dt = x_aval.dtype
    t = ctype(dt, kind)
    it = ctype(idx_aval.dtype, f"{kind} indices")
    if idx_aval.dtype.kind not in "iu":
        raise KernelGenerationError(f"{kind}: indices must be integers, got {idx_aval.dtype}")
    if kind == "scatter" and dt not in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)):
        raise KernelGenerationError(f"scatter_add: no atomic add for {dt} here (float32, float64, int32)")
    n = math.prod(ishape)
    strides = _strides(shape)
    lines = [f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n}LL; i += (long long)blockDim.x * gridDim.x) {{",
             "    long long r = i, xoff = 0;"]
    for d in reversed(range(nd)):
        lines.append(f"    long long c{d} = r % {ishape[d]}LL; r /= {ishape[d]}LL;")
        if d == axis:
            lines.append(f"    long long j = (long long)ix[i]; if (j < 0) j += {shape[d]}LL;")
            lines.append(f"    xoff += j * {strides[d]}LL;")
        else:
            lines.append(f"    xoff += c{d} * {strides[d]}LL;")
    if kind == "gather":
        params = [(f"const {t}* __restrict__", "x"), (f"const {it}* __restrict__", "ix"), (f"{t}* __restrict__", "out")]
        lines.append("    out[i] = x[xoff];")
    else:
        params = [(f"const {t}* __restrict__", "upd"), (f"const {it}* __restrict__", "ix"), (f"{t}*", "out")]
        lines.append("    atomicAdd(out + xoff, upd[i]);")
    lines.append("  }")
    return _finish(kind, "\n".join(lines) + "\n", params, False, THREADS, _grid(n, THREADS))


# ----------------------------------------------------------------------------- convolution


def _conv_geometry(x_shape: tuple, attrs: dict) -> dict:
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    hq, wq = -(-(h + 2 * ph) // sh), -(-(w + 2 * pw) // sw)
    return dict(n=n, c=c, h=h, w=w, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, oh=oh, ow=ow, hq=hq, wq=wq)


def im2col_kernel(x_aval: ShapedArray, attrs: dict) -> Kernel:
    """The engine's ``im2col`` (NCHW -> (N, KH*KW*C [+1], L), rows in (kh, kw, c) order): one
    thread per column entry.  Plain layout: L = OH*OW, entry (oh, ow) of tap (i, j) reads padded
    pixel (oh*SH + i*DH, ow*SW + j*DW).  Phase-plane layout (``phased``, see the engine's
    ``PhaseGeometry``): L = HQ*WQ, entry p of tap (i, j) reads flat position
    ``off(i, j) + (n*C + c)*HQ*WQ + p`` of phase plane ((i*DH) % SH, (j*DW) % SW), which holds
    padded pixel (SH*q + a, SW*r + b); positions outside the image read ``pad_value``.  A
    ``bias_row`` appends a constant last row."""
    g = _conv_geometry(x_aval.shape, attrs)
    dt = x_aval.dtype
    t = ctype(dt, "im2col")
    n, c, h, w = g["n"], g["c"], g["h"], g["w"]
    kk = g["kh"] * g["kw"]
    phased = bool(attrs.get("phased"))
    bias = attrs.get("bias_row")
    rows = kk * c + (bias is not None)
    length = g["hq"] * g["wq"] if phased else g["oh"] * g["ow"]
    total = n * rows * length
    pad = c_literal(attrs.get("pad_value", 0.0), dt)
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long p = e % {length}LL, row = (e / {length}LL) % {rows}LL, img = e / ({length}LL * {rows}LL);",
    ]
    if bias is not None:
        lines.append(f"    if (row == {kk * c}LL) {{ out[e] = {c_literal(bias, dt)}; continue; }}")
    lines.append(f"    long long tap = row / {c}LL, ch = row % {c}LL, i = tap / {g['kw']}LL, j = tap % {g['kw']}LL;")
    if phased:
        plane = g["hq"] * g["wq"]
        lines += [
            f"    long long a = (i * {g['dh']}LL) % {g['sh']}LL, b = (j * {g['dw']}LL) % {g['sw']}LL;",
            f"    long long off = ((i * {g['dh']}LL) / {g['sh']}LL) * {g['wq']}LL + (j * {g['dw']}LL) / {g['sw']}LL;",
            f"    long long pos = off + (img * {c}LL + ch) * {plane}LL + p;",
            f"    {t} v = {pad};",
            f"    if (pos < {n * c * plane}LL) {{",
            f"      long long r = pos % {g['wq']}LL, q = (pos / {g['wq']}LL) % {g['hq']}LL, nc = pos / {plane}LL;",
            f"      long long y = {g['sh']}LL * q + a - {g['ph']}LL, x = {g['sw']}LL * r + b - {g['pw']}LL;",
            f"      if (y >= 0 && y < {h}LL && x >= 0 && x < {w}LL) v = src[(nc * {h}LL + y) * {w}LL + x];",
            "    }",
            "    out[e] = v;",
        ]
    else:
        lines += [
            f"    long long oh = p / {g['ow']}LL, ow = p % {g['ow']}LL;",
            f"    long long y = oh * {g['sh']}LL + i * {g['dh']}LL - {g['ph']}LL, x = ow * {g['sw']}LL + j * {g['dw']}LL - {g['pw']}LL;",
            f"    out[e] = (y >= 0 && y < {h}LL && x >= 0 && x < {w}LL) ? src[((img * {c}LL + ch) * {h}LL + y) * {w}LL + x] : {pad};",
        ]
    lines.append("  }")
    params = [(f"const {t}* __restrict__", "src"), (f"{t}* __restrict__", "out")]
    return _finish("im2col", "\n".join(lines) + "\n", params, False, THREADS, _grid(total, THREADS))


def phase_col2im_kernel(cols_rows: int, x_shape: tuple, dtype: np.dtype, attrs: dict) -> Kernel:
    """The adjoint of the phase-plane ``im2col`` (pad value 0) for columns of (N, ``cols_rows``,
    HQ*WQ), rows in (kh, kw, c) order (a trailing bias row, if any, is ignored): one thread per
    image pixel gathering, from every tap whose phase plane holds it, the column entry that read
    it (a gather, so no atomics)."""
    g = _conv_geometry(x_shape, attrs)
    t = ctype(dtype, "col2im")
    n, c, h, w = g["n"], g["c"], g["h"], g["w"]
    plane = g["hq"] * g["wq"]
    size = n * c * plane
    total = n * c * h * w
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long x = e % {w}LL, y = (e / {w}LL) % {h}LL, nc = e / ({h}LL * {w}LL);",
        f"    long long Y = y + {g['ph']}LL, X = x + {g['pw']}LL;",
        f"    long long a = Y % {g['sh']}LL, b = X % {g['sw']}LL;",
        f"    long long gpix = (nc * {g['hq']}LL + Y / {g['sh']}LL) * {g['wq']}LL + X / {g['sw']}LL;",
        "    double acc = 0.0;",
        f"    for (long long i = 0; i < {g['kh']}LL; ++i) {{",
        f"      if ((i * {g['dh']}LL) % {g['sh']}LL != a) continue;",
        f"      for (long long j = 0; j < {g['kw']}LL; ++j) {{",
        f"        if ((j * {g['dw']}LL) % {g['sw']}LL != b) continue;",
        f"        long long idx = gpix - (((i * {g['dh']}LL) / {g['sh']}LL) * {g['wq']}LL + (j * {g['dw']}LL) / {g['sw']}LL);",
        f"        if (idx < 0 || idx >= {size}LL) continue;",
        f"        long long p = idx % {plane}LL, ch = (idx / {plane}LL) % {c}LL, img = idx / ({plane}LL * {c}LL);",
        f"        acc += (double)cols[(img * {cols_rows}LL + (i * {g['kw']}LL + j) * {c}LL + ch) * {plane}LL + p];",
        "      }",
        "    }",
        f"    out[e] = ({t})acc;",
        "  }",
    ]
    params = [(f"const {t}* __restrict__", "cols"), (f"{t}* __restrict__", "out")]
    return _finish("col2im", "\n".join(lines) + "\n", params, False, THREADS, _grid(total, THREADS))


def plain_col2im_kernel(cols_rows: int, x_shape: tuple, dtype: np.dtype, attrs: dict) -> Kernel:
    """The adjoint of the plain ``im2col`` (columns (N, ``cols_rows``, OH*OW), a trailing bias row
    ignored): one thread per image pixel summing the column entries of the windows covering it."""
    g = _conv_geometry(x_shape, attrs)
    t = ctype(dtype, "col2im")
    n, c, h, w = g["n"], g["c"], g["h"], g["w"]
    length = g["oh"] * g["ow"]
    total = n * c * h * w
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long x = e % {w}LL, y = (e / {w}LL) % {h}LL, ch = (e / ({h}LL * {w}LL)) % {c}LL, img = e / ({c}LL * {h}LL * {w}LL);",
        "    double acc = 0.0;",
        f"    for (long long i = 0; i < {g['kh']}LL; ++i) {{",
        f"      long long ty = y + {g['ph']}LL - i * {g['dh']}LL;",
        f"      if (ty < 0 || ty % {g['sh']}LL != 0 || ty / {g['sh']}LL >= {g['oh']}LL) continue;",
        f"      for (long long j = 0; j < {g['kw']}LL; ++j) {{",
        f"        long long tx = x + {g['pw']}LL - j * {g['dw']}LL;",
        f"        if (tx < 0 || tx % {g['sw']}LL != 0 || tx / {g['sw']}LL >= {g['ow']}LL) continue;",
        f"        acc += (double)cols[(img * {cols_rows}LL + (i * {g['kw']}LL + j) * {c}LL + ch) * {length}LL + (ty / {g['sh']}LL) * {g['ow']}LL + tx / {g['sw']}LL];",
        "      }",
        "    }",
        f"    out[e] = ({t})acc;",
        "  }",
    ]
    params = [(f"const {t}* __restrict__", "cols"), (f"{t}* __restrict__", "out")]
    return _finish("col2im", "\n".join(lines) + "\n", params, False, THREADS, _grid(total, THREADS))


def max_pool_grad_kernel(x_aval: ShapedArray, attrs: dict) -> Kernel:
    """``max_pool2d_grad(x, pooled, ct)`` (NCHW): one thread per input pixel gathers, from every window
    covering it whose maximum it holds, that window's gradient divided by the window's count of in-image
    positions holding the maximum (ties share evenly; a NaN maximum equals nothing and passes nothing)."""
    g = _conv_geometry(x_aval.shape, dict(attrs, dilation=(1, 1)))
    dt = x_aval.dtype
    t = ctype(dt, "max_pool2d_grad")
    n, c, h, w, oh, ow = g["n"], g["c"], g["h"], g["w"], g["oh"], g["ow"]
    kh, kw, sh, sw, ph, pw = g["kh"], g["kw"], g["sh"], g["sw"], g["ph"], g["pw"]
    total = n * c * h * w
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long x = e % {w}LL, y = (e / {w}LL) % {h}LL, nc = e / ({h}LL * {w}LL);",
        f"    {t} v = src[e];",
        "    double acc = 0.0;",
        f"    for (long long i = 0; i < {kh}LL; ++i) {{",
        f"      long long ty = y + {ph}LL - i;",
        f"      if (ty < 0 || ty % {sh}LL != 0 || ty / {sh}LL >= {oh}LL) continue;",
        f"      long long oy = ty / {sh}LL;",
        f"      for (long long j = 0; j < {kw}LL; ++j) {{",
        f"        long long tx = x + {pw}LL - j;",
        f"        if (tx < 0 || tx % {sw}LL != 0 || tx / {sw}LL >= {ow}LL) continue;",
        f"        long long ox = tx / {sw}LL, o = (nc * {oh}LL + oy) * {ow}LL + ox;",
        f"        {t} m = pooled[o];",
        "        if (!(v == m)) continue;",
        "        long long cnt = 0;",
        f"        for (long long a = 0; a < {kh}LL; ++a) {{",
        f"          long long yy = oy * {sh}LL + a - {ph}LL;",
        f"          if (yy < 0 || yy >= {h}LL) continue;",
        f"          for (long long b = 0; b < {kw}LL; ++b) {{",
        f"            long long xx = ox * {sw}LL + b - {pw}LL;",
        f"            if (xx >= 0 && xx < {w}LL && src[(nc * {h}LL + yy) * {w}LL + xx] == m) ++cnt;",
        "          }",
        "        }",
        "        acc += (double)ct[o] / (double)cnt;",
        "      }",
        "    }",
        f"    out[e] = ({t})acc;",
        "  }",
    ]
    params = [(f"const {t}* __restrict__", "src"), (f"const {t}* __restrict__", "pooled"),
              (f"const {t}* __restrict__", "ct"), (f"{t}* __restrict__", "out")]
    return _finish("maxpoolgrad", "\n".join(lines) + "\n", params, False, THREADS, _grid(total, THREADS))


def pool_kernel(mode: str, x_aval: ShapedArray, attrs: dict) -> Kernel:
    """``max_pool2d`` / ``avg_pool2d`` (NCHW): one thread per output, the window's maximum
    (NaN-propagating; padding is -inf) or its mean (padding counts as 0, divided by KH*KW)."""
    g = _conv_geometry(x_aval.shape, dict(attrs, dilation=(1, 1)))
    dt = x_aval.dtype
    t = ctype(dt, f"{mode}_pool2d")
    if mode == "max":
        init = c_literal(-np.inf, dt) if dt.kind == "f" else c_literal(np.iinfo(dt).min, dt)
    else:
        if dt.kind != "f":
            raise KernelGenerationError(f"avg_pool2d needs floats, got {dt}")
        init = c_literal(0, dt)
    n, c, h, w, oh, ow = g["n"], g["c"], g["h"], g["w"], g["oh"], g["ow"]
    total = n * c * oh * ow
    comb = f"acc = fe_max<{t}>(acc, v);" if mode == "max" else "acc += v;"
    lines = [
        f"  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {total}LL; e += (long long)blockDim.x * gridDim.x) {{",
        f"    long long ox = e % {ow}LL, oy = (e / {ow}LL) % {oh}LL, nc = e / ({oh}LL * {ow}LL);",
        f"    {t} acc = {init};",
        f"    for (long long i = 0; i < {g['kh']}LL; ++i) {{",
        f"      long long y = oy * {g['sh']}LL + i - {g['ph']}LL;",
        f"      for (long long j = 0; j < {g['kw']}LL; ++j) {{",
        f"        long long x = ox * {g['sw']}LL + j - {g['pw']}LL;",
        f"        {t} v = (y >= 0 && y < {h}LL && x >= 0 && x < {w}LL) ? src[(nc * {h}LL + y) * {w}LL + x] : {init};",
        f"        {comb}",
        "      }",
        "    }",
        "    out[e] = acc;" if mode == "max" else f"    out[e] = acc * {c_literal(1.0 / (g['kh'] * g['kw']), dt)};",
        "  }",
    ]
    params = [(f"const {t}* __restrict__", "src"), (f"{t}* __restrict__", "out")]
    return _finish(f"{mode}pool", "\n".join(lines) + "\n", params, False, THREADS, _grid(total, THREADS))
