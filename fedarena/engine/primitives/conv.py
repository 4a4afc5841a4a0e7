"""Convolution and pooling (the convolution family): im2col + GEMM lowering (Chellapilla et al.,
"High performance convolutional neural networks for document processing", 2006) in NCHW layout with
OIHW weights, phase-plane columns for strided convolutions, the input-gradient kernel, and max/avg
pooling.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..core import cext
from ..core.ir import LOW_PRECISION, ShapeError, ShapedArray
from ..core.tracing import bind, user_source
from .emit import expr, stmt
from .base import _define, fold_batch, host_only, loop_batching, broadcast_to, cast, div, dtype_of, eq, matmul, mul, promote, reduce_sum, reshape, shape_of, transpose
from .elementwise import _sum_tangents
from .linalg import _low_precision_matmul, _matmul_impl
from .shapes import slice_p, stack_p

# ============================================================================ convolution and pooling


def conv_out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _pair(v) -> tuple:
    return (int(v), int(v)) if np.isscalar(v) else tuple(int(a) for a in v)


def window_geometry(x_shape, kernel, stride, padding, dilation) -> tuple:
    """The geometry tuple of ``_native.windows``: (N, C, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW)."""
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
    return tuple(int(v) for v in (n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow))


class _NativeWindows:
    """The C window kernels (``_native.windows``) for one geometry, when built and the dtype is
    float32/float64; each call returns False (nothing written) when an operand does not fit, and
    the caller runs its numpy kernel instead."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation):
        self.geometry = window_geometry(x_shape, kernel, stride, padding, dilation)
        self.on = cext.available() and np.dtype(dtype) in cext.FLOATS
        self.double = np.dtype(dtype) == np.float64
        self.fn = cext._native.windows if self.on else None

    def im2col(self, x, out, rows: int, pad: float, bias_value=None) -> bool:
        return self.on and self.fn(0, self.geometry, self.double, rows, pad, bias_value is not None, bias_value or 0.0, out, x)

    def col2im(self, cols, out, rows: int) -> bool:
        return self.on and self.fn(1, self.geometry, self.double, rows, 0.0, False, 0.0, out, cols)

    def max_pool(self, x, out) -> bool:
        return self.on and self.fn(2, self.geometry, self.double, 0, 0.0, False, 0.0, out, x)

    def max_pool_grad(self, x, pooled, ct, out) -> bool:
        return self.on and self.fn(3, self.geometry, self.double, 0, 0.0, False, 0.0, out, x, pooled, ct)


class Im2Col:
    """im2col for fixed shapes: (N,C,H,W) -> (N, KH*KW*C, OH*OW), rows ordered (kh, kw, c) so that
    each kernel offset's block is contiguous; one C loop (``_NativeWindows``) when it applies,
    otherwise a strided copy through a padded scratch buffer."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, pad_value=0.0):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        self.native = _NativeWindows(x_shape, dtype, kernel, stride, padding, dilation)
        self.pad_value = float(pad_value)
        self.rows = kh * kw * c
        self.oh, self.ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        self.pad = ph > 0 or pw > 0
        self.xp = np.full((n, c, h + 2 * ph, w + 2 * pw), pad_value, dtype)
        self.inner = self.xp[:, :, ph : ph + h, pw : pw + w]
        self.geom = (kh, kw, sh, sw, dh, dw)
        self.view = self._view(self.xp)
        self.cols_shape = (n, kh * kw * c, self.oh * self.ow)

    def _view(self, xp):
        n, c = xp.shape[:2]
        s = xp.strides
        kh, kw, sh, sw, dh, dw = self.geom
        return as_strided(xp, (n, kh, kw, c, self.oh, self.ow), (s[0], s[2] * dh, s[3] * dw, s[1], s[2] * sh, s[3] * sw), writeable=False)

    def windows(self, x):
        """Strided (N, KH, KW, C, OH, OW) view of the padded input (valid until the next call)."""
        if self.pad:
            self.inner[...] = x
            return self.view
        return self._view(x)

    def __call__(self, x, out):
        if not self.native.im2col(x, out, self.rows, self.pad_value):
            np.copyto(_reshaped(out, self.view.shape), self.windows(x))
        return out


class PhaseGeometry:
    """The phase-plane ("polyphase") layout of a strided convolution.

    The padded input is split into SH*SW phase planes, plane (a, b) holding the padded pixels
    (SH*q + a, SW*r + b) on a (HQ, WQ) grid, HQ = ceil(Hp/SH), WQ = ceil(Wp/SW).  Kernel offset
    (i, j) then reads plane ((i*DH) % SH, (j*DW) % SW) shifted by ((i*DH)//SH, (j*DW)//SW): a
    stride-1 window, and over the flattened planes a single contiguous span of N*C*HQ*WQ elements
    starting at ``off = di*WQ + dj``.  So im2col is one contiguous copy per kernel offset (and
    col2im one contiguous add) instead of N*C*OH strided rows.  The price: the columns have
    HQ*WQ >= OH*OW entries per image; the entries with q >= OH or r >= OW are padding (they read
    whatever lies at the shifted position: finite when the input is).  The same trick is the
    sub-pixel / polyphase decomposition of strided convolutions (e.g. Shi et al., CVPR 2016).
    """

    def __init__(self, x_shape, kernel, stride, padding, dilation):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        self.n, self.c, self.h, self.w, self.sh, self.sw, self.pw = n, c, h, w, sh, sw, pw
        self.oh, self.ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        self.hq, self.wq = -(-(h + 2 * ph) // sh), -(-(w + 2 * pw) // sw)
        self.plane = self.hq * self.wq
        self.size = n * c * self.plane  # one phase, all images and channels
        self.kk = kh * kw
        self.cols_shape = (n, kh * kw * c, self.plane)
        # (phase row, phase col, span offset) of each kernel offset, in (kh, kw) order
        self.taps = [((i * dh) % sh, (j * dw) % sw, ((i * dh) // sh) * self.wq + (j * dw) // sw) for i in range(kh) for j in range(kw)]
        self.length = self.size + max(off for _, _, off in self.taps)
        # (a, b, plane rows, plane cols, image rows, image cols) of every phase that holds pixels
        self.parts = []
        for a in range(sh):
            qa, xa, na = self._phase(sh, ph, a, h)
            for b in range(sw):
                rb, xb, nb = self._phase(sw, pw, b, w)
                if na and nb:
                    self.parts.append((a, b, slice(qa, qa + na), slice(rb, rb + nb), slice(xa, None, sh), slice(xb, None, sw)))

    @staticmethod
    def _phase(s, p, a, size):
        """First plane index, first image index and count of the pixels of phase ``a``."""
        q0 = max(0, -(-(p - a) // s))
        x0 = s * q0 + a - p
        return q0, x0, len(range(x0, size, s))

    def planes(self, flat):
        """(SH, SW, N, C, HQ, WQ) view of a (SH, SW, length) phase buffer."""
        return flat[:, :, : self.size].reshape(self.sh, self.sw, self.n, self.c, self.hq, self.wq)


class PhaseIm2Col(PhaseGeometry):
    """im2col in the phase-plane layout: (N,C,H,W) -> (N, KH*KW*C, HQ*WQ) (see PhaseGeometry)."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, pad_value=0.0):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        self.flat = np.full((self.sh, self.sw, self.length), pad_value, dtype)
        pl = self.planes(self.flat)
        self.src = [self.flat[a, b, off : off + self.size].reshape(self.n, self.c * self.plane) for a, b, off in self.taps]
        self.o3 = (self.n, self.kk, self.c * self.plane)
        self.fill = [(pl[a, b, :, :, qs, rs], (Ellipsis, xs, ys)) for a, b, qs, rs, xs, ys in self.parts]

    def __call__(self, x, out):
        for dst, idx in self.fill:
            np.copyto(dst, x[idx])
        o = _reshaped(out, self.o3)
        for t, src in enumerate(self.src):
            np.copyto(o[:, t], src)
        return out


class PhaseCol2Im(PhaseGeometry):
    """The transpose of :class:`PhaseIm2Col` for columns whose padding entries are zero (as
    conv2d's backward pass produces them): one contiguous add per kernel offset into the phase
    planes (a padding entry lands on some other position and adds nothing), then the planes are
    interleaved into the image."""

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        self.acc = np.zeros((self.sh, self.sw, self.length), dtype)
        pl = self.planes(self.acc)
        self.dst = [self.acc[a, b, off : off + self.size].reshape(self.n, self.c * self.plane) for a, b, off in self.taps]
        self.o3 = (self.n, self.kk, self.c * self.plane)
        self.out_parts = [((Ellipsis, xs, ys), pl[a, b, :, :, qs, rs]) for a, b, qs, rs, xs, ys in self.parts]

    def __call__(self, cols, out):
        self.acc.fill(0)
        c3 = cols.reshape(self.o3)
        for t, dst in enumerate(self.dst):
            np.add(dst, c3[:, t], dst)
        for idx, src in self.out_parts:
            np.copyto(out[idx], src)
        return out


class ConvInputGrad(PhaseGeometry):
    """The input gradient of a phase-plane convolution, col2im(W2^T @ ct), without the columns.

    ``ct`` (N, O, HQ*WQ) is the output gradient, zero at the padding positions; ``w2`` (O, K) the
    GEMM weights in im2col's (kh, kw, c) row order (a trailing bias column is ignored).  With the
    phase planes laid out (C, N, HQ*WQ), kernel offset t adds W_t^T @ ct to one contiguous
    (C, N*HQ*WQ) span of them, so each offset is one GEMM that accumulates in place (BLAS
    ``gemm`` with beta = 1): no (N, K, HQ*WQ) column buffer is written and read back, and no
    separate add passes.  Then the planes are interleaved into the image as in PhaseCol2Im.
    """

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation, out_channels):
        super().__init__(x_shape, kernel, stride, padding, dilation)
        n, c, o, pl = self.n, self.c, out_channels, self.plane
        self.o = o
        self.ct = np.empty((o, n, pl), dtype)  # the gradient with (N, O) swapped: a (O, N*P) matrix
        self.wt = np.empty((self.kk, c, o), dtype)  # W_t^T per offset; W_t = wt[t].T is Fortran-ordered
        self.acc = np.zeros((self.sh, self.sw, self.length), dtype)  # planes as (C, N, HQ, WQ)
        span = c * n * pl
        # the first offset-0 kernel offset of a phase overwrites its whole span (gemm beta = 0), so
        # only phases without one are zeroed per call (phases with no kernel offset stay zero)
        self.dst, self.beta, self.zero, seen = [], [], [], set()
        for t in sorted(range(self.kk), key=lambda t: self.taps[t][2]):
            a, b, off = self.taps[t]
            self.dst.append((t, self.acc[a, b, off : off + span].reshape(c, n * pl)))
            self.beta.append(0.0 if off == 0 and (a, b) not in seen else 1.0)
            if (a, b) not in seen and off != 0:
                self.zero.append(self.acc[a, b])
            seen.add((a, b))
        planes = self.acc[:, :, : self.size].reshape(self.sh, self.sw, c, n, self.hq, self.wq)
        self.out_parts = [((Ellipsis, xs, ys), planes[a, b, :, :, qs, rs].transpose(1, 0, 2, 3)) for a, b, qs, rs, xs, ys in self.parts]
        dt = np.dtype(dtype)
        self.gemm = None
        if dt in (np.dtype(np.float32), np.dtype(np.float64)):
            from scipy.linalg import blas

            self.gemm = blas.sgemm if dt == np.float32 else blas.dgemm
        self.tmp = None if self.gemm is not None else np.empty((c, n * pl), dtype)

    def __call__(self, ct, w2, out):
        np.copyto(self.ct, ct.reshape(self.n, self.o, self.plane).transpose(1, 0, 2), casting="unsafe")
        k = self.kk * self.c
        np.copyto(self.wt, w2[:, :k].reshape(self.o, self.kk, self.c).transpose(1, 2, 0), casting="unsafe")
        for plane in self.zero:
            plane.fill(0)
        a = self.ct.reshape(self.o, -1)
        for (t, dst), beta in zip(self.dst, self.beta):
            if self.gemm is not None:
                # Fortran view: dst^T (N*P, C) = ct^T (N*P, O) @ W_t (O, C) + beta dst^T, in place
                r = self.gemm(1.0, a.T, self.wt[t].T, beta, dst.T, overwrite_c=True)
                if r.ctypes.data != dst.ctypes.data:  # pragma: no cover - a BLAS wrapper that copied
                    raise RuntimeError("conv input gradient: BLAS gemm did not accumulate in place")
            elif beta:
                np.matmul(self.wt[t], a, self.tmp)
                np.add(dst, self.tmp, dst)
            else:
                np.matmul(self.wt[t], a, dst)
        for idx, src in self.out_parts:
            np.copyto(out[idx], src)
        return out


class Col2Im:
    """The transpose of :class:`Im2Col`: scatter-add columns back into an (N,C,H,W) image.

    Strided kernels are accumulated per stride phase into contiguous planes, then interleaved.
    """

    def __init__(self, x_shape, dtype, kernel, stride, padding, dilation):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        self.native = _NativeWindows(x_shape, dtype, kernel, stride, padding, dilation)
        self.rows = kh * kw * c
        oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        hp, wp = h + 2 * ph, w + 2 * pw
        hq = max(-(-hp // sh), (dh * (kh - 1)) // sh + oh)
        wq = max(-(-wp // sw), (dw * (kw - 1)) // sw + ow)
        self.acc = np.zeros((sh, sw, n, c, hq, wq), dtype)
        self.targets = [
            (i, j, self.acc[(i * dh) % sh, (j * dw) % sw, :, :, (i * dh) // sh : (i * dh) // sh + oh, (j * dw) // sw : (j * dw) // sw + ow])
            for i in range(kh)
            for j in range(kw)
        ]
        self.phased = sh > 1 or sw > 1
        if self.phased:
            self.full = np.empty((n, c, hq * sh, wq * sw), dtype)
            self.phases = [(self.full[:, :, a::sh, b::sw], self.acc[a, b]) for a in range(sh) for b in range(sw)]
            self.inner = self.full[:, :, ph : ph + h, pw : pw + w]
        else:
            self.inner = self.acc[0, 0, :, :, ph : ph + h, pw : pw + w]
        self.cols6 = (n, kh, kw, c, oh, ow)

    def __call__(self, cols, out):
        if self.native.col2im(cols, out, self.rows):
            return out
        self.acc.fill(0)
        c6 = cols.reshape(self.cols6)
        for i, j, t in self.targets:
            np.add(t, c6[:, i, j], t)
        if self.phased:
            for dst, src in self.phases:
                np.copyto(dst, src)
        np.copyto(out, self.inner)
        return out


def _reshaped(a, shape):
    """A view of ``a`` with ``shape``; raises instead of silently copying (kernels write into it)."""
    v = a.view()
    v.shape = shape
    return v


class BiasRow:
    """An im2col/col2im kernel on columns with one extra, constant last row: im2col writes
    ``value`` there (1 in the forward pass, so a GEMM with the bias as an extra weight column
    adds the bias and its weight gradient sums the output gradient: no separate passes), col2im
    ignores it (the row does not depend on the image)."""

    def __init__(self, kernel, value=None):
        self.kernel, self.value = kernel, value

    def __call__(self, a, out):
        native = getattr(self.kernel, "native", None)  # the plain layout's C kernels take the row
        if self.value is None:  # col2im: drop the row
            if native is not None and native.col2im(a, out, self.kernel.rows + 1):
                return out
            return self.kernel(a[:, :-1], out)
        if native is not None and native.im2col(a, out, self.kernel.rows + 1, self.kernel.pad_value, float(self.value)):
            return out
        self.kernel(a, out[:, :-1])
        out[:, -1] = self.value
        return out


def _conv_geometry(x_shape, attrs, kernel):
    if len(x_shape) != 4:
        raise ShapeError(f"expected an NCHW input of rank 4, got shape {x_shape}")
    n, c, h, w = x_shape
    kh, kw = kernel
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    oh, ow = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
    if oh < 1 or ow < 1:
        raise ShapeError(f"kernel {kernel} (dilation {(dh, dw)}) does not fit the padded input {(h + 2 * ph, w + 2 * pw)}")
    return oh, ow


def _im2col_rule(avals, attrs, weak):
    av = avals[0]
    oh, ow = _conv_geometry(av.shape, attrs, attrs["kernel"])
    n, c, h, w = av.shape
    kh, kw = attrs["kernel"]
    rows = c * kh * kw + (attrs.get("bias_row") is not None)
    if attrs.get("phased"):
        (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
        return ShapedArray((n, rows, -(-(h + 2 * ph) // sh) * -(-(w + 2 * pw) // sw)), av.dtype)
    return ShapedArray((n, rows, oh * ow), av.dtype)


def _im2col_kernel(av_shape, dtype, attrs):
    cls = PhaseIm2Col if attrs.get("phased") else Im2Col
    k = cls(av_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], attrs["pad_value"])
    return k if attrs.get("bias_row") is None else BiasRow(k, attrs["bias_row"])


def _im2col_impl(x, **attrs):
    k = _im2col_kernel(x.shape, x.dtype, attrs)
    return k(x, np.empty(_im2col_rule([ShapedArray(x.shape, x.dtype)], attrs, [False]).shape, x.dtype))


def _im2col_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_im2col_kernel(in_avals[0].shape, in_avals[0].dtype, attrs))
    return stmt(f"{k}({ins[0]}, {{o}})")


def _col2im_attrs(attrs):
    """The col2im attributes of the transpose of an im2col (and back: _im2col_attrs)."""
    out = {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}
    if attrs.get("phased"):
        out["phased"] = True
    if attrs.get("bias_row") is not None:
        out["bias_row"] = 0.0
    return out


def _im2col_vjp(need, ct, out, x, **attrs):
    return (bind(col2im_p, ct, x_shape=shape_of(x), **_col2im_attrs(attrs)),)


def _im2col_jvp(ts, out, x, **attrs):
    if attrs.get("bias_row") is not None:
        attrs = dict(attrs, bias_row=0.0)  # the constant row has no tangent
    return bind(im2col_p, ts[0], **attrs)


def fold_batching(prim, vals, batched, size, **attrs):
    """Batching rule of the image primitives of one NCHW operand (im2col, pooling): the batch axis
    folded into the images, ``(B, N, ...) -> (B*N, ...)``, and unfolded from the result."""
    xf, s = fold_batch(vals[0])
    out = bind(prim, xf, **attrs)
    return reshape(out, (s[0], s[1]) + shape_of(out)[1:])


def _im2col_cuda(e, lib):
    if e.inputs[0].aval.dtype not in (np.float32, np.float64):
        return None
    return lib.kernel(lib.im2col_kernel(e.inputs[0].aval, e.attrs), [e.inputs[0]])


im2col_p = _define(
    "im2col", _im2col_rule, _im2col_impl, _im2col_emit, _im2col_vjp, batch=fold_batching, cuda=_im2col_cuda
)
# im2col(x; kernel, stride, padding, dilation, pad_value, phased=False, bias_row=None): the
# convolution windows of an NCHW image as columns (N, KH*KW*C, L), rows in (kh, kw, c) order, plus
# a last row of constant ``bias_row`` if given (see BiasRow).  Plain: L = OH*OW.
# ``phased=True``: the phase-plane layout of :class:`PhaseGeometry`, L = HQ*WQ, whose entries with
# q >= OH or r >= OW are padding with unspecified (finite for finite x) values; its transpose
# (``col2im(phased=True)``) assumes those entries of its input are zero, which conv2d's backward
# pass guarantees (the cotangent is zero-padded), so use it only as ops.conv2d does.


def _col2im_rule(avals, attrs, weak):
    x_shape = attrs["x_shape"]
    exp_ = _im2col_rule([ShapedArray(x_shape, avals[0].dtype)], dict(attrs, pad_value=0.0), [False])
    if avals[0].shape != exp_.shape:
        raise ShapeError(f"col2im: columns {avals[0].shape} do not match image {x_shape} (expected {exp_.shape})")
    return ShapedArray(x_shape, avals[0].dtype)


def _col2im_kernel(x_shape, dtype, attrs):
    cls = PhaseCol2Im if attrs.get("phased") else Col2Im
    k = cls(x_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    return k if attrs.get("bias_row") is None else BiasRow(k)


def _col2im_impl(cols, **attrs):
    k = _col2im_kernel(attrs["x_shape"], cols.dtype, attrs)
    return k(cols, np.empty(attrs["x_shape"], cols.dtype))


def _col2im_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_col2im_kernel(attrs["x_shape"], in_avals[0].dtype, attrs))
    return stmt(f"{k}({ins[0]}, {{o}})")


def _col2im_transpose(need, ct, out, cols, x_shape, **attrs):
    return (bind(im2col_p, ct, pad_value=0.0, **attrs),)


def _col2im_batch(prim, vals, batched, size, **attrs):
    xf, s = fold_batch(vals[0])
    xs = tuple(attrs["x_shape"])
    out = bind(prim, xf, **dict(attrs, x_shape=(size * xs[0],) + xs[1:]))
    return reshape(out, (size,) + xs)


def _col2im_cuda(e, lib):
    cols = e.inputs[0]
    if cols.aval.dtype not in (np.float32, np.float64):
        return None
    make = lib.phase_col2im_kernel if e.attrs.get("phased") else lib.plain_col2im_kernel
    return lib.kernel(make(cols.aval.shape[1], tuple(e.attrs["x_shape"]), cols.aval.dtype, e.attrs), [cols])


col2im_p = _define(
    "col2im", _col2im_rule, _col2im_impl, _col2im_emit, transpose=_col2im_transpose, linearity="first",
    batch=_col2im_batch, cuda=_col2im_cuda,
)
im2col_p.jvp = _im2col_jvp


# conv_gemm(w2, cols, x; geometry) = w2 @ cols, where cols must be im2col(x, phased=True, ...) with
# the same geometry (ops.conv2d builds it so).  It is w2 @ im2col(x) with the columns computed once:
# its derivatives treat it as that function of (w2, x), so the input gradient skips the columns
# (conv_input_grad: GEMMs accumulating into the image's phase planes) and the cols operand gets
# no cotangent or tangent of its own.


def _conv_gemm_rule(avals, attrs, weak):
    w2, cols, x = avals
    want = _im2col_rule([x], dict(attrs, pad_value=0.0), [False]).shape
    if cols.shape != want or w2.ndim != 2 or w2.shape[1] != want[1]:
        raise ShapeError(f"conv_gemm: weights {w2.shape} and columns {cols.shape} do not fit image {x.shape} (columns {want})")
    return ShapedArray((cols.shape[0], w2.shape[0], cols.shape[2]), promote(avals[:2], weak[:2]))


def _conv_gemm_emit(ctx, ins, attrs, in_avals, out_aval):
    if in_avals[0].dtype in LOW_PRECISION:
        return expr(f"{ctx.const(_low_precision_matmul)}({ins[0]}, {ins[1]})")
    return stmt(f"np.matmul({ins[0]}, {ins[1]}, {{o}})")


def _geometry(attrs):
    return {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}


def _conv_gemm_vjp(need, ct, out, w2, cols, x, **attrs):
    g_w2 = reduce_sum(matmul(ct, transpose(cols, (0, 2, 1))), (0,)) if need[0] else None
    g_x = bind(conv_input_grad_p, ct, w2, x_shape=shape_of(x), **_geometry(attrs)) if need[2] else None
    return (g_w2, None, g_x)


def _conv_gemm_jvp(ts, out, w2, cols, x, **attrs):
    a = None if ts[0] is None else matmul(ts[0], cols)
    b = None
    if ts[2] is not None:
        extra = {"bias_row": 0.0} if attrs.get("bias_row") is not None else {}
        b = matmul(w2, bind(im2col_p, ts[2], pad_value=0.0, phased=True, **_geometry(attrs), **extra))
    return _sum_tangents(out, a, b)


def _conv_gemm_batch(prim, vals, batched, size, **attrs):
    w2, cols, x = vals
    if not batched[0] and batched[1] and batched[2]:
        cs, xs = shape_of(cols), shape_of(x)
        out = bind(prim, w2, reshape(cols, (cs[0] * cs[1],) + cs[2:]), reshape(x, (xs[0] * xs[1],) + xs[2:]), **attrs)
        return reshape(out, (cs[0], cs[1]) + shape_of(out)[1:])
    # weights batched (or cols/x not both): plain batched matmuls on the columns
    w = reshape(w2, (size, 1) + shape_of(w2)[1:]) if batched[0] else w2
    c = cols if batched[1] else broadcast_to(cols, (size,) + shape_of(cols))
    return matmul(w, c)


conv_gemm_p = _define(
    "conv_gemm", _conv_gemm_rule, lambda w2, cols, x, **a: _matmul_impl(w2, cols), _conv_gemm_emit, _conv_gemm_vjp, _conv_gemm_jvp,
    batch=_conv_gemm_batch,
    cuda=lambda e, lib: lib.xp(lambda xp, ins, attrs, out: xp.matmul(ins[0], ins[1], out=out), e),
)


def _conv_input_grad_rule(avals, attrs, weak):
    ct, w2 = avals
    x_shape = attrs["x_shape"]
    geo = PhaseGeometry(x_shape, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    if ct.shape != (x_shape[0], w2.shape[0], geo.plane) or w2.ndim != 2 or w2.shape[1] not in (geo.kk * geo.c, geo.kk * geo.c + 1):
        raise ShapeError(f"conv_input_grad: gradient {ct.shape} and weights {w2.shape} do not fit image {x_shape}")
    return ShapedArray(tuple(x_shape), promote(avals, weak))


def _conv_input_grad_kernel(x_shape, dtype, attrs, out_channels):
    return ConvInputGrad(x_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], out_channels)


def _conv_input_grad_impl(ct, w2, **attrs):
    dt = np.result_type(ct.dtype, w2.dtype)
    return _conv_input_grad_kernel(attrs["x_shape"], dt, attrs, w2.shape[0])(ct, w2, np.empty(attrs["x_shape"], dt))


def _conv_input_grad_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_conv_input_grad_kernel(attrs["x_shape"], out_aval.dtype, attrs, in_avals[1].shape[0]))
    return stmt(f"{k}({ins[0]}, {ins[1]}, {{o}})")


def _conv_input_grad_transpose(need, g, out, ct, w2, x_shape, **geo):
    # conv_input_grad(ct, w2) = col2im(w2[:, :K]^T @ ct): transpose through im2col of g
    extra = {"bias_row": 0.0} if shape_of(w2)[1] != geo["kernel"][0] * geo["kernel"][1] * x_shape[1] else {}
    cols = bind(im2col_p, g, pad_value=0.0, phased=True, **geo, **extra)
    g_ct = matmul(w2, cols) if need[0] else None
    g_w2 = reduce_sum(matmul(ct, transpose(cols, (0, 2, 1))), (0,)) if need[1] else None
    return (g_ct, g_w2)


def _conv_input_grad_batch(prim, vals, batched, size, **attrs):
    ct, w2 = vals
    xs = tuple(attrs["x_shape"])
    if batched[0] and not batched[1]:
        cs = shape_of(ct)
        out = bind(prim, reshape(ct, (cs[0] * cs[1],) + cs[2:]), w2, **dict(attrs, x_shape=(size * xs[0],) + xs[1:]))
        return reshape(out, (size,) + xs)
    outs = []
    for i in range(size):
        c = reshape(bind(slice_p, ct, starts=(i, 0, 0, 0), limits=(i + 1,) + shape_of(ct)[1:], strides=(1, 1, 1, 1)), shape_of(ct)[1:]) if batched[0] else ct
        w = reshape(bind(slice_p, w2, starts=(i, 0, 0), limits=(i + 1,) + shape_of(w2)[1:], strides=(1, 1, 1)), shape_of(w2)[1:]) if batched[1] else w2
        outs.append(bind(prim, c, w, **attrs))
    return bind(stack_p, *outs, axis=0)


def _conv_input_grad_cuda(e, lib):
    """A GEMM ``w2^T @ ct`` into columns, then the phase-plane col2im kernel."""
    odt = e.outputs[0].aval.dtype
    if odt not in (np.float32, np.float64) or any(a.aval.dtype != odt for a in e.inputs):
        return None
    ct, w2 = e.inputs
    return lib.col2im(lib.phase_col2im_kernel(w2.aval.shape[1], tuple(e.attrs["x_shape"]), odt, e.attrs), [ct, w2])


conv_input_grad_p = _define(
    "conv_input_grad", _conv_input_grad_rule, _conv_input_grad_impl, _conv_input_grad_emit,
    transpose=_conv_input_grad_transpose, linearity="bilinear",
    batch=_conv_input_grad_batch,
    cuda=_conv_input_grad_cuda,
)


def _conv_rule(avals, attrs, weak):
    x, w = avals
    if w.ndim != 4:
        raise ShapeError(f"expected OIHW weights of rank 4, got shape {w.shape}")
    oh, ow = _conv_geometry(x.shape, attrs, w.shape[2:])
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"input has {x.shape[1]} channels but the weights expect {w.shape[1]}")
    return ShapedArray((x.shape[0], w.shape[0], oh, ow), promote(avals, weak))


def abstract_eval_conv(x_aval: ShapedArray, w_aval: ShapedArray, attrs: dict) -> ShapedArray:
    """The conv2d shape rule, raising a ShapeError that names conv2d, the shapes and the user line."""
    try:
        return _conv_rule([x_aval, w_aval], attrs, [False, False])
    except ShapeError as exc:
        raise ShapeError(f"conv2d: {exc}; inputs: {x_aval.str_short()}, {w_aval.str_short()} (at {user_source()})") from None


class Conv2dKernel:
    """conv2d = W(O, C*KH*KW) @ im2col(x)(N, C*KH*KW, OH*OW), reshaped to NCHW."""

    def __init__(self, x_shape, w_shape, dtype, stride, padding, dilation):
        self.im2col = Im2Col(x_shape, dtype, w_shape[2:], stride, padding, dilation)
        self.cols = np.empty(self.im2col.cols_shape, dtype)
        self.w2 = (w_shape[0], -1)
        self.o3 = (x_shape[0], w_shape[0], self.im2col.oh * self.im2col.ow)

    def __call__(self, x, w, out):
        self.im2col(x, self.cols)
        np.matmul(w.transpose(0, 2, 3, 1).reshape(self.w2), self.cols, out=out.reshape(self.o3))
        return out


def _conv_kernel(x_shape, w_shape, dtype, attrs):
    return Conv2dKernel(x_shape, w_shape, dtype, attrs["stride"], attrs["padding"], attrs["dilation"])


def _conv_impl(x, w, **attrs):
    dt = np.result_type(x.dtype, w.dtype)
    k = _conv_kernel(x.shape, w.shape, dt, attrs)
    out = np.empty((x.shape[0], w.shape[0], k.im2col.oh, k.im2col.ow), dt)
    return k(x, w, out)


def _conv_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_conv_kernel(in_avals[0].shape, in_avals[1].shape, out_aval.dtype, attrs))
    return stmt(f"{k}({ins[0]}, {ins[1]}, {{o}})")


def _conv_transpose(need, ct, out, x, w, stride, padding, dilation):
    n = shape_of(x)[0]
    o, c, kh, kw = shape_of(w)
    cs = shape_of(ct)
    geo = dict(kernel=(kh, kw), stride=stride, padding=padding, dilation=dilation)
    ct2 = reshape(ct, (n, o, cs[2] * cs[3]))
    gx = gw = None
    if need[1]:
        cols = bind(im2col_p, x, pad_value=0.0, **geo)
        gw2 = reduce_sum(matmul(ct2, transpose(cols, (0, 2, 1))), (0,))
        gw = transpose(reshape(gw2, (o, kh, kw, c)), (0, 3, 1, 2))
    if need[0]:
        w2t = transpose(reshape(transpose(w, (0, 2, 3, 1)), (o, kh * kw * c)), (1, 0))
        gx = bind(col2im_p, matmul(w2t, ct2), x_shape=shape_of(x), **geo)
    return (gx, gw)


def _conv2d_batch(prim, vals, batched, size, **attrs):
    x, w = vals
    if batched[1]:  # per-example filters: one convolution per example
        return loop_batching(prim, vals, batched, size, **attrs)
    xf, s = fold_batch(x)
    out = bind(prim, xf, w, **attrs)
    return reshape(out, (s[0], s[1]) + shape_of(out)[1:])


conv2d_p = _define(
    "conv2d", _conv_rule, _conv_impl, _conv_emit, transpose=_conv_transpose, linearity="bilinear",
    batch=_conv2d_batch,
    cuda=host_only,  # the cupy backend's graphs carry im2col + conv_gemm (ops.conv2d), not conv2d
)
