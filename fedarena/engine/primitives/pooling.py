"""Pooling (the convolution family's window reductions): max and average pooling over NCHW images,
and the max-pooling gradient as a primitive of its own (one pass over the windows instead of
columns, a comparison, a tie count and a col2im).  Windows come from the convolution kernels of
:mod:`.conv`; the C kernels (``_native.windows``) run them when the extension is built.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import ShapeError, ShapedArray
from ..core.tracing import PRIMITIVES, bind
from .base import _define, broadcast_to, cast, div, dtype_of, eq, mul, reduce_sum, reshape, shape_of
from .conv import fold_batching, Col2Im, Im2Col, _NativeWindows, _conv_geometry, col2im_p, im2col_p
from .emit import stmt


def _pool_rule(avals, attrs, weak):
    av = avals[0]
    oh, ow = _conv_geometry(av.shape, dict(attrs, dilation=(1, 1)), attrs["kernel"])
    return ShapedArray(av.shape[:2] + (oh, ow), av.dtype)


class PoolKernel:
    def __init__(self, x_shape, dtype, kernel, stride, padding, mode):
        pad_value = -np.inf if mode == "max" else 0.0
        if mode == "max" and np.dtype(dtype).kind != "f":
            pad_value = np.iinfo(dtype).min
        self.im2col = Im2Col(x_shape, dtype, kernel, stride, padding, (1, 1), pad_value)
        self.mode = mode
        self.scale = 1.0 / (kernel[0] * kernel[1])

    def __call__(self, x, out):
        if self.mode == "max":
            if not self.im2col.native.max_pool(x, out):
                np.maximum.reduce(self.im2col.windows(x), axis=(1, 2), out=out)
        else:
            np.add.reduce(self.im2col.windows(x), axis=(1, 2), out=out)
            np.multiply(out, self.scale, out=out)
        return out


class MaxPoolGrad:
    """``max_pool2d_grad(x, pooled, ct)``: each window's output gradient goes to the in-image
    positions holding the window's maximum, split evenly between ties (a window with none, i.e. a
    NaN maximum, passes nothing).  One C pass when it applies; otherwise window views of ``x``
    padded with NaN (never equal to a maximum), the tie counts and a col2im."""

    def __init__(self, x_shape, dtype, kernel, stride, padding):
        self.native = _NativeWindows(x_shape, dtype, kernel, stride, padding, (1, 1))
        self.dtype = np.dtype(dtype)
        self.windows = Im2Col(x_shape, dtype, kernel, stride, padding, (1, 1), np.nan)
        self.col2im = Col2Im(x_shape, dtype, kernel, stride, padding, (1, 1))
        n, c = x_shape[:2]
        self.cols = (n, kernel[0] * kernel[1] * c, self.windows.oh * self.windows.ow)

    def __call__(self, x, pooled, ct, out):
        if self.native.max_pool_grad(x, pooled, ct, out):
            return out
        win = self.windows.windows(x)  # (N, KH, KW, C, OH, OW)
        loc = win == pooled[:, None, None]
        cnt = loc.sum(axis=(1, 2), keepdims=True)
        share = np.divide(ct[:, None, None], np.maximum(cnt, 1)).astype(self.dtype)
        cols = np.where(loc, share, np.zeros((), self.dtype))
        return self.col2im(np.ascontiguousarray(cols).reshape(self.cols), out)


def _pool_def(mode):
    def kernel(shape, dtype, attrs):
        return PoolKernel(shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"], mode)

    def impl(x, **attrs):
        k = kernel(x.shape, x.dtype, attrs)
        return k(x, np.empty(x.shape[:2] + (k.im2col.oh, k.im2col.ow), x.dtype))

    def emit(ctx, ins, attrs, in_avals, out_aval):
        k = ctx.const(kernel(in_avals[0].shape, in_avals[0].dtype, attrs))
        return stmt(f"{k}({ins[0]}, {{o}})")

    def vjp(need, ct, out, x, kernel, stride, padding):
        if mode == "max":
            return (bind(max_pool2d_grad_p, x, out, ct, kernel=kernel, stride=stride, padding=padding),)
        n, c, h, w = shape_of(x)
        kh, kw = kernel
        oh, ow = shape_of(out)[2:]
        geo = dict(kernel=kernel, stride=stride, padding=padding, dilation=(1, 1))
        g = broadcast_to(mul(reshape(ct, (n, 1, c, oh, ow)), 1.0 / (kh * kw)), (n, kh * kw, c, oh, ow))
        return (bind(col2im_p, reshape(g, (n, kh * kw * c, oh * ow)), x_shape=(n, c, h, w), **geo),)

    return impl, emit, vjp


def _pool_cuda(mode: str):
    return lambda e, lib: lib.kernel(lib.pool_kernel(mode, e.inputs[0].aval, e.attrs), [e.inputs[0]])


max_pool2d_p = _define("max_pool2d", _pool_rule, *_pool_def("max"), batch=fold_batching, cuda=_pool_cuda("max"))


def _patches(x, pooled, kernel, stride, padding):
    """(windows of x as (N, KH*KW, C, OH, OW) padded with NaN, where they equal the maximum as 0/1)."""
    n, c = shape_of(x)[:2]
    oh, ow = shape_of(pooled)[2:]
    kk = kernel[0] * kernel[1]
    geo = dict(kernel=kernel, stride=stride, padding=padding, dilation=(1, 1))
    patches = reshape(bind(im2col_p, x, pad_value=np.nan, **geo), (n, kk, c, oh, ow))
    return cast(eq(patches, reshape(pooled, (n, 1, c, oh, ow))), dtype_of(x)), geo


def _max_pool_jvp(ts, out, x, kernel, stride, padding):
    """Tangent of the window maximum: the tangent at the arg-max (averaged over ties)."""
    n, c = shape_of(x)[:2]
    oh, ow = shape_of(out)[2:]
    loc, geo = _patches(x, out, kernel, stride, padding)
    t_patches = reshape(bind(im2col_p, ts[0], pad_value=0.0, **geo), (n, kernel[0] * kernel[1], c, oh, ow))
    return div(reduce_sum(mul(t_patches, loc), (1,)), reduce_sum(loc, (1,)))


max_pool2d_p.jvp = _max_pool_jvp
avg_pool2d_p = _define("avg_pool2d", _pool_rule, *_pool_def("avg"), batch=fold_batching, cuda=_pool_cuda("avg"))
avg_pool2d_p.jvp = lambda ts, out, x, **a: bind(avg_pool2d_p, ts[0], **a)


# max_pool2d_grad(x, pooled, ct; kernel, stride, padding) -> gx of x's shape: the VJP of max_pool2d
# (pooled = max_pool2d(x)).  Linear in ct; piecewise constant in x and pooled (no gradient flows
# to them, as for the arg-max it stands for).


def _max_pool_grad_rule(avals, attrs, weak):
    x, pooled, ct = avals
    want = _pool_rule([x], attrs, weak)
    if pooled.shape != want.shape or ct.shape != want.shape:
        raise ShapeError(f"max_pool2d_grad: pooled {pooled.shape} and gradient {ct.shape} do not fit input {x.shape} (pooled {want.shape})")
    if not (x.dtype == pooled.dtype == ct.dtype):
        raise ShapeError("max_pool2d_grad: operands must share one dtype")
    return ShapedArray(x.shape, ct.dtype)


def _max_pool_grad_kernel(x_shape, dtype, attrs):
    return MaxPoolGrad(x_shape, dtype, attrs["kernel"], attrs["stride"], attrs["padding"])


def _max_pool_grad_impl(x, pooled, ct, **attrs):
    return _max_pool_grad_kernel(x.shape, ct.dtype, attrs)(x, pooled, ct, np.empty(x.shape, ct.dtype))


def _max_pool_grad_emit(ctx, ins, attrs, in_avals, out_aval):
    k = ctx.const(_max_pool_grad_kernel(in_avals[0].shape, out_aval.dtype, attrs))
    return stmt(f"{k}({ins[0]}, {ins[1]}, {ins[2]}, {{o}})")


def _max_pool_grad_vjp(need, g, out, x, pooled, ct, kernel, stride, padding):
    if not need[2]:
        return (None, None, None)
    n, c = shape_of(x)[:2]
    oh, ow = shape_of(pooled)[2:]
    loc, geo = _patches(x, pooled, kernel, stride, padding)
    g_patches = reshape(bind(im2col_p, g, pad_value=0.0, **geo), (n, kernel[0] * kernel[1], c, oh, ow))
    cnt = bind(PRIMITIVES["maximum"], reduce_sum(loc, (1,)), 1.0)
    return (None, None, div(reduce_sum(mul(g_patches, loc), (1,)), cnt))


def _max_pool_grad_jvp(ts, out, x, pooled, ct, **attrs):
    return None if ts[2] is None else bind(max_pool2d_grad_p, x, pooled, ts[2], **attrs)


def _max_pool_grad_batch(prim, vals, batched, size, **attrs):
    vals = [v if b else broadcast_to(v, (size,) + shape_of(v)) for v, b in zip(vals, batched)]
    merged = [reshape(v, (size * shape_of(v)[1],) + shape_of(v)[2:]) for v in vals]
    out = bind(prim, *merged, **attrs)
    return reshape(out, (size,) + shape_of(vals[0])[1:])


def _max_pool_grad_cuda(e, lib):
    if e.inputs[0].aval.dtype not in (np.float32, np.float64):
        return None
    return lib.kernel(lib.max_pool_grad_kernel(e.inputs[0].aval, e.attrs), e.inputs)


max_pool2d_grad_p = _define(
    "max_pool2d_grad", _max_pool_grad_rule, _max_pool_grad_impl, _max_pool_grad_emit, _max_pool_grad_vjp, _max_pool_grad_jvp,
    batch=_max_pool_grad_batch, cuda=_max_pool_grad_cuda,
)

__all__ = ["MaxPoolGrad", "PoolKernel", "avg_pool2d_p", "max_pool2d_grad_p", "max_pool2d_p"]
