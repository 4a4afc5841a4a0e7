"""Public array operations with numpy's names and signatures, plus numerically stable composites.

Each function binds engine primitives, so the same call runs eagerly on numpy arrays and
records equations on tracers inside ``jit``/``grad``.  The composites (softmax, log-softmax,
logsumexp, cross-entropy, MSE, Huber, layer norm, categorical entropy) are written from
primitives with the usual max-shift for stability (Goodfellow et al., "Deep Learning", 2016,
sec. 4.1 and 6.2.2); Huber follows Huber (1964), layer norm Ba et al. (2016).
"""

from __future__ import annotations

import builtins as _builtins
from typing import Any, Sequence

import numpy as np

from .. import primitives as P
from ..primitives.conv import _pair
from ..primitives.reductions import _norm_axes
from ..core import buckets as _buckets
from ..core.ir import ShapeError, TracerControlFlowError, check_dtype, is_float
from ..core.tracing import Tracer, aval_of, bind

Array = Any  # numpy array or Tracer

# ============================================================================ helpers


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _arr(x: Any) -> Any:
    """Leave tracers, arrays and Python scalars alone; turn lists and numpy scalars into arrays."""
    if isinstance(x, (Tracer, np.ndarray, np.generic)) or _is_weak(x):
        return x
    return np.asarray(x)


def shape(x: Array) -> tuple:
    return aval_of(x).shape


def ndim(x: Array) -> int:
    return len(aval_of(x).shape)


def _axes(axis: Any, nd: int) -> tuple:
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    return _norm_axes(tuple(axis), nd)


# ============================================================================ elementwise


def add(x: Array, y: Array) -> Array:
    return bind(P.add_p, _arr(x), _arr(y))


def subtract(x: Array, y: Array) -> Array:
    return bind(P.sub_p, _arr(x), _arr(y))


def multiply(x: Array, y: Array) -> Array:
    return bind(P.mul_p, _arr(x), _arr(y))


def divide(x: Array, y: Array) -> Array:
    return bind(P.div_p, _arr(x), _arr(y))


true_divide = divide


def power(x: Array, y: Array) -> Array:
    return bind(P.pow_p, _arr(x), _arr(y))


def negative(x: Array) -> Array:
    return bind(P.neg_p, _arr(x))


def exp(x: Array) -> Array:
    return bind(P.exp_p, _arr(x))


def log(x: Array) -> Array:
    return bind(P.log_p, _arr(x))


def log1p(x: Array) -> Array:
    return bind(P.log1p_p, _arr(x))


def expm1(x: Array) -> Array:
    return subtract(exp(x), 1.0)


def tanh(x: Array) -> Array:
    return bind(P.tanh_p, _arr(x))


def sin(x: Array) -> Array:
    return bind(P.sin_p, _arr(x))


def cos(x: Array) -> Array:
    return bind(P.cos_p, _arr(x))


def sigmoid(x: Array) -> Array:
    """The logistic function 1 / (1 + exp(-x))."""
    return bind(P.logistic_p, _arr(x))


logistic = sigmoid


def sqrt(x: Array) -> Array:
    return bind(P.sqrt_p, _arr(x))


def rsqrt(x: Array) -> Array:
    return bind(P.rsqrt_p, _arr(x))


def abs(x: Array) -> Array:  # noqa: A001 - numpy's name
    return bind(P.abs_p, _arr(x))


absolute = abs


def sign(x: Array) -> Array:
    return bind(P.sign_p, _arr(x))


def square(x: Array) -> Array:
    x = _arr(x)
    return bind(P.mul_p, x, x)


def maximum(x: Array, y: Array) -> Array:
    return bind(P.max_p, _arr(x), _arr(y))


def minimum(x: Array, y: Array) -> Array:
    return bind(P.min_p, _arr(x), _arr(y))


def relu(x: Array) -> Array:
    """max(x, 0) with derivative 0 at 0 (PyTorch's convention)."""
    return bind(P.relu_p, _arr(x))


def leaky_relu(x: Array, negative_slope: float = 0.01) -> Array:
    x = _arr(x)
    return where(greater(x, 0), x, multiply(x, negative_slope))


def softplus(x: Array) -> Array:
    """log(1 + exp(x)) computed as max(x, 0) + log1p(exp(-|x|))."""
    x = _arr(x)
    return add(relu(x), log1p(exp(negative(abs(x)))))


def equal(x: Array, y: Array) -> Array:
    return bind(P.eq_p, _arr(x), _arr(y))


def not_equal(x: Array, y: Array) -> Array:
    return bind(P.ne_p, _arr(x), _arr(y))


def less(x: Array, y: Array) -> Array:
    return bind(P.lt_p, _arr(x), _arr(y))


def less_equal(x: Array, y: Array) -> Array:
    return bind(P.le_p, _arr(x), _arr(y))


def greater(x: Array, y: Array) -> Array:
    return bind(P.gt_p, _arr(x), _arr(y))


def greater_equal(x: Array, y: Array) -> Array:
    return bind(P.ge_p, _arr(x), _arr(y))


def logical_and(x: Array, y: Array) -> Array:
    return bind(P.and_p, _arr(x), _arr(y))


def logical_or(x: Array, y: Array) -> Array:
    return bind(P.or_p, _arr(x), _arr(y))


def logical_not(x: Array) -> Array:
    return bind(P.not_p, _arr(x))


def where(condition: Array, x: Array, y: Array) -> Array:
    """Elementwise ``x if condition else y`` (broadcasting); gradients flow to the chosen side."""
    c = _arr(condition)
    if aval_of(c).dtype != np.bool_:
        c = not_equal(c, 0)
    return bind(P.select_p, c, _arr(x), _arr(y))


def clip(x: Array, a_min: Any = None, a_max: Any = None) -> Array:
    """Clip to [a_min, a_max]; gradient 1 inside the closed interval (PyTorch's clamp convention)."""
    x = _arr(x)
    if (a_min is None or _is_weak(a_min)) and (a_max is None or _is_weak(a_max)):
        lo = -np.inf if a_min is None else a_min
        hi = np.inf if a_max is None else a_max
        if not is_float(aval_of(x).dtype):
            lo = np.iinfo(aval_of(x).dtype).min if a_min is None else lo
            hi = np.iinfo(aval_of(x).dtype).max if a_max is None else hi
        return bind(P.clip_p, x, lo=lo, hi=hi)
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


def astype(x: Array, dtype: Any) -> Array:
    dtype = check_dtype(dtype, "astype")
    return P.cast(_arr(x), dtype)


def stop_gradient(x: Array) -> Array:
    """Identity whose derivative is zero (the value is treated as a constant by autodiff)."""
    return bind(P.stop_gradient_p, _arr(x))


# ============================================================================ creation


def zeros(shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
    return np.zeros(shape, check_dtype(dtype))


def ones(shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
    return np.ones(shape, check_dtype(dtype))


def full(shape: Sequence[int] | int, fill_value: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.full(shape, fill_value, check_dtype(dtype))


def zeros_like(x: Array, dtype: Any = None) -> Array:
    av = aval_of(x)
    if isinstance(x, Tracer):
        return P.full(av.shape, dtype or av.dtype, 0)
    return np.zeros(av.shape, dtype or av.dtype)


def ones_like(x: Array, dtype: Any = None) -> Array:
    av = aval_of(x)
    if isinstance(x, Tracer):
        return P.full(av.shape, dtype or av.dtype, 1)
    return np.ones(av.shape, dtype or av.dtype)


def full_like(x: Array, fill_value: Any, dtype: Any = None) -> Array:
    av = aval_of(x)
    if isinstance(x, Tracer):
        return P.full(av.shape, dtype or av.dtype, fill_value)
    return np.full(av.shape, fill_value, dtype or av.dtype)


arange = np.arange  # shapes are static, so ranges are constants


# ============================================================================ reductions


def _mask_padded(x: Array, axes: tuple, fill: Any) -> Array:
    """Under ``jit(..., shape_buckets=...)``: ``x`` with the padded rows replaced by ``fill`` when ``axes``
    cross the padded batch axis (see core/buckets.py), else ``x`` unchanged."""
    s = _buckets.padded(shape(x), axes)
    if s is None:
        return x
    mask = reshape(s.mask, (s.size,) + (1,) * (ndim(x) - 1))
    return where(mask, x, np.asarray(fill, dtype=aval_of(x).dtype))


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else False if dtype == np.bool_ else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    return np.inf if dtype.kind == "f" else True if dtype == np.bool_ else np.iinfo(dtype).max


def _count(x: Array, axes: tuple) -> Any:
    """The number of elements ``axes`` reduce: a Python int, or under shape buckets crossing the padded
    axis a traced float64 (valid rows times the other reduced lengths)."""
    n = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    s = _buckets.padded(shape(x), axes)
    if s is None:
        return n
    return multiply(astype(s.valid, np.float64), float(n // s.size))


def sum(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    x = _mask_padded(x, axes, 0)
    return bind(P.reduce_sum_p, x, axes=axes, keepdims=bool(keepdims))


def max(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    x = _mask_padded(x, axes, _lowest(aval_of(x).dtype))
    return bind(P.reduce_max_p, x, axes=axes, keepdims=bool(keepdims))


def min(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    x = _mask_padded(x, axes, _highest(aval_of(x).dtype))
    return bind(P.reduce_min_p, x, axes=axes, keepdims=bool(keepdims))


amax, amin = max, min


def mean(x: Array, axis: Any = None, keepdims: bool = False) -> Array:
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    n = _count(x, axes)
    if not is_float(aval_of(x).dtype):
        x = astype(x, np.float64)
    if not isinstance(n, int):  # shape buckets: divide by the valid count
        return divide(sum(x, axes, keepdims), astype(n, aval_of(x).dtype))
    return multiply(sum(x, axes, keepdims), 1.0 / n if n else np.nan)


def var(x: Array, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Array:
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    n = _count(x, axes)
    d = subtract(x, mean(x, axes, keepdims=True))
    if not isinstance(n, int):  # shape buckets: divide by the valid count
        return divide(sum(multiply(d, d), axes, keepdims), astype(subtract(n, float(ddof)), aval_of(d).dtype))
    return multiply(sum(multiply(d, d), axes, keepdims), 1.0 / (n - ddof))


def std(x: Array, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Array:
    return sqrt(var(x, axis, keepdims, ddof))


def argmax(x: Array, axis: int | None = None, keepdims: bool = False) -> Array:
    x = _arr(x)
    if axis is None:
        if _buckets.leading(shape(x)) is not None and ndim(x) > 1:
            _buckets.refuse("argmax/argmin over all axes of a batch (flattening the padded axis)")
        x = reshape(x, (-1,))
        axis = 0
    x = _mask_padded(x, (int(axis) % ndim(x),), _lowest(aval_of(x).dtype))
    return bind(P.argmax_p, x, axis=int(axis) % ndim(x), keepdims=bool(keepdims))


def argmin(x: Array, axis: int | None = None, keepdims: bool = False) -> Array:
    return argmax(negative(x), axis, keepdims)


# ============================================================================ linear algebra


def matmul(x: Array, y: Array) -> Array:
    """numpy.matmul semantics, including 1-d operands and broadcast batch dimensions."""
    x, y = _arr(x), _arr(y)
    xv, yv = ndim(x) == 1, ndim(y) == 1
    if ndim(x) == 0 or ndim(y) == 0:
        raise ShapeError(f"matmul: operands must not be scalars; inputs: {shape(x)}, {shape(y)}")
    if xv:
        x = reshape(x, (1,) + shape(x))
    if yv:
        y = reshape(y, shape(y) + (1,))
    if ndim(y) == 2 and _buckets.leading(shape(y)) is not None:
        _buckets.refuse(f"matmul {shape(x)} @ {shape(y)} contracting the padded batch axis")
    out = bind(P.matmul_p, x, y)
    if xv and yv:
        return reshape(out, shape(out)[:-2])
    if xv:
        return reshape(out, shape(out)[:-2] + shape(out)[-1:])
    if yv:
        return reshape(out, shape(out)[:-1])
    return out


def dot(x: Array, y: Array) -> Array:
    if ndim(x) == 0 or ndim(y) == 0:
        return multiply(x, y)
    if ndim(y) > 2:
        raise ShapeError("dot with rank > 2 right operand is not supported; use matmul or tensordot-style reshapes")
    return matmul(x, y)


def vdot(x: Array, y: Array) -> Array:
    return sum(multiply(reshape(x, (-1,)), reshape(y, (-1,))))


def outer(x: Array, y: Array) -> Array:
    return multiply(reshape(x, (-1, 1)), reshape(y, (1, -1)))


# ============================================================================ shapes


def _resolve_shape(newshape: Sequence[int], size: int) -> tuple:
    newshape = tuple(int(s) for s in newshape)
    if newshape.count(-1) > 1:
        raise ShapeError(f"reshape: at most one -1 in {newshape}")
    if -1 in newshape:
        known = int(np.prod([s for s in newshape if s != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ShapeError(f"reshape: cannot reshape {size} elements into {newshape}")
        newshape = tuple(size // known if s == -1 else s for s in newshape)
    return newshape


def reshape(x: Array, newshape: Sequence[int] | int) -> Array:
    x = _arr(x)
    if isinstance(newshape, (int, np.integer)):
        newshape = (int(newshape),)
    new = _resolve_shape(newshape, aval_of(x).size)
    if _buckets.leading(shape(x)) is not None and (not new or new[0] != shape(x)[0]):
        _buckets.refuse(f"reshape {shape(x)} -> {tuple(new)} (moves the padded batch axis)")
    return P.reshape(x, new)


def ravel(x: Array) -> Array:
    return reshape(x, (-1,))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    x = _arr(x)
    n = ndim(x)
    perm = tuple(range(n))[::-1] if axes is None else tuple(int(a) % n for a in axes)
    if perm and perm[0] != 0 and _buckets.leading(shape(x)) is not None:
        _buckets.refuse(f"transposing {shape(x)} with axes {perm} (moves the padded batch axis)")
    return bind(P.transpose_p, x, perm=perm) if perm != tuple(range(n)) else x


def swapaxes(x: Array, a: int, b: int) -> Array:
    n = ndim(x)
    perm = list(range(n))
    perm[a % n], perm[b % n] = perm[b % n], perm[a % n]
    return transpose(x, perm)


def moveaxis(x: Array, source: int, destination: int) -> Array:
    n = ndim(x)
    perm = [i for i in range(n) if i != source % n]
    perm.insert(destination % n, source % n)
    return transpose(x, perm)


def broadcast_to(x: Array, shape_: Sequence[int]) -> Array:
    return bind(P.broadcast_to_p, _arr(x), shape=tuple(int(s) for s in shape_))


def squeeze(x: Array, axis: Any = None) -> Array:
    x = _arr(x)
    if axis is None:
        axes = tuple(i for i, s in enumerate(shape(x)) if s == 1)
    else:
        axes = _axes(axis, ndim(x))
    return bind(P.squeeze_p, x, axes=axes) if axes else x


def expand_dims(x: Array, axis: Any) -> Array:
    x = _arr(x)
    axis = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    n = ndim(x) + len(axis)
    return bind(P.expand_dims_p, x, axes=_norm_axes(axis, n))


def concatenate(arrays: Sequence[Array], axis: int = 0) -> Array:
    arrays = [_arr(a) for a in arrays]
    ax = int(axis) % ndim(arrays[0]) if arrays else 0
    if ax == 0 and _any_leading(arrays):
        _buckets.refuse("concatenating batches along the padded batch axis")
    return bind(P.concatenate_p, *arrays, axis=ax)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    arrays = [_arr(a) for a in arrays]
    ax = int(axis) % (ndim(arrays[0]) + 1) if arrays else 0
    if ax == 0 and _any_leading(arrays):
        _buckets.refuse("stacking batches in front of the padded batch axis")
    return bind(P.stack_p, *arrays, axis=ax)


def _any_leading(arrays: Sequence[Array]) -> bool:
    return _buckets.current() is not None and _builtins.any(_buckets.leading(shape(a)) is not None for a in arrays)


def split(x: Array, indices_or_sections: Any, axis: int = 0) -> list:
    n = shape(x)[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ShapeError(f"split: axis of size {n} does not divide into {indices_or_sections} sections")
        step = n // indices_or_sections
        bounds = list(range(0, n + 1, step))
    else:
        bounds = [0, *indices_or_sections, n]
    return [slice_axis(x, a, b, axis=axis) for a, b in zip(bounds[:-1], bounds[1:])]


def slice_axis(x: Array, start: int, stop: int, step: int = 1, axis: int = 0) -> Array:
    x = _arr(x)
    nd = ndim(x)
    axis %= nd
    sh = shape(x)
    starts = tuple(start if i == axis else 0 for i in range(nd))
    limits = tuple(stop if i == axis else sh[i] for i in range(nd))
    strides = tuple(step if i == axis else 1 for i in range(nd))
    return bind(P.slice_p, x, starts=starts, limits=limits, strides=strides)


def pad(x: Array, pad_width: Sequence[tuple[int, int]] | int) -> Array:
    """Zero padding (numpy's ``mode='constant'`` with 0)."""
    x = _arr(x)
    nd = ndim(x)
    if isinstance(pad_width, int):
        pad_width = [(pad_width, pad_width)] * nd
    low = tuple(int(a) for a, _ in pad_width)
    high = tuple(int(b) for _, b in pad_width)
    return bind(P.pad_p, x, low=low, high=high, interior=(0,) * nd)


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    """numpy.take along ``axis`` (embedding lookup); the gradient scatter-adds into rows."""
    x = _arr(x)
    idx = _arr(indices)
    if _is_weak(idx):
        idx = np.asarray(idx)
    if int(axis) % ndim(x) == 0 and _buckets.leading(shape(x)) is not None:
        _buckets.refuse("taking rows of a batch along the padded batch axis")
    return bind(P.take_p, x, idx, axis=int(axis) % ndim(x))


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    """numpy.take_along_axis, e.g. picking Q(s, a) with ``indices`` of shape (B, 1)."""
    x, idx = _arr(x), _arr(indices)
    if int(axis) % ndim(x) == 0 and _buckets.leading(shape(x)) is not None:
        _buckets.refuse("take_along_axis along the padded batch axis")
    return bind(P.gather_p, x, idx, axis=int(axis) % ndim(x))


def scatter_add(updates: Array, indices: Array, axis: int, shape_: Sequence[int]) -> Array:
    """Zeros of ``shape_`` plus ``updates`` added at ``indices`` along ``axis`` (take_along_axis's transpose)."""
    return bind(P.scatter_add_p, _arr(updates), _arr(indices), axis=int(axis) % len(shape_), shape=tuple(shape_))


def one_hot(indices: Array, num_classes: int, dtype: Any = np.float32) -> Array:
    return bind(P.one_hot_p, _arr(indices), num_classes=int(num_classes), dtype=check_dtype(dtype))


# ============================================================================ convolution and pooling


PHASED_MAX_OVERHEAD = 1.5
"""A strided conv2d uses phase-plane columns when they have at most this many times the OH*OW
output positions (the extra ones are computed and dropped; the columns are copied 2-4x faster)."""


def conv2d(x: Array, w: Array, stride: Any = 1, padding: Any = 0, dilation: Any = 1, lowered: bool = True, bias: Array | None = None) -> Array:
    """2-d cross-correlation, NCHW input, OIHW weights (PyTorch's ``conv2d``), plus ``bias`` (O,).

    ``lowered=True`` (default) writes it as ``im2col`` + ``matmul`` equations, so the backward
    pass reuses the forward's columns; the bias rides in the GEMM as an extra weight column against
    a constant row of ones in the columns (its gradient then comes out of the weight-gradient GEMM).
    ``lowered=False`` binds the single ``conv2d`` primitive (and adds the bias after).
    """
    x, w = _arr(x), _arr(w)
    attrs = dict(stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation))
    if not lowered:
        y = bind(P.conv2d_p, x, w, **attrs)
        return y if bias is None else add(y, reshape(_arr(bias), (1, -1, 1, 1)))
    out_aval = P.abstract_eval_conv(aval_of(x), aval_of(w), attrs)  # shape checks with a conv2d message
    n = shape(x)[0]
    o, c, kh, kw = shape(w)
    # strided convolutions use the phase-plane columns (primitives.PhaseGeometry): (HQ, WQ) >=
    # (OH, OW) positions per image, the extra ones cut off below; worth it unless they are many more
    _, _, oh, ow = out_aval.shape
    (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
    hq, wq = -(-(shape(x)[2] + 2 * ph) // sh), -(-(shape(x)[3] + 2 * pw) // sw)
    phased = attrs["stride"] != (1, 1) and hq * wq <= PHASED_MAX_OVERHEAD * oh * ow
    extra: dict = {"phased": True} if phased else {}
    w2 = P.reshape(P.transpose(w, (0, 2, 3, 1)), (o, kh * kw * c))  # rows in im2col's (kh, kw, c) order
    if bias is not None:
        b = _arr(bias)
        if shape(b) != (o,):
            raise ShapeError(f"conv2d: bias of shape {shape(b)} does not match the {o} output channels")
        extra["bias_row"] = 1.0
        w2 = concatenate([w2, reshape(b, (o, 1))], axis=1)
    cols = bind(P.im2col_p, x, kernel=(kh, kw), pad_value=0.0, **attrs, **extra)
    if phased:  # w2 @ cols, whose input gradient skips the columns (see primitives.conv_gemm_p)
        y = bind(P.conv_gemm_p, w2, cols, x, kernel=(kh, kw), **attrs, **extra)
        y = P.reshape(y, (n, o, hq, wq))
        if (hq, wq) != (oh, ow):
            y = bind(P.slice_p, y, starts=(0, 0, 0, 0), limits=(n, o, oh, ow), strides=(1, 1, 1, 1))
        return y
    return P.reshape(bind(P.matmul_p, w2, cols), (n, o, oh, ow))


def max_pool2d(x: Array, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Array:
    k = _pair(kernel_size)
    return bind(P.max_pool2d_p, _arr(x), kernel=k, stride=_pair(stride) if stride is not None else k, padding=_pair(padding))


def avg_pool2d(x: Array, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Array:
    """Average pooling; padded zeros count in the average (PyTorch's count_include_pad=True)."""
    k = _pair(kernel_size)
    return bind(P.avg_pool2d_p, _arr(x), kernel=k, stride=_pair(stride) if stride is not None else k, padding=_pair(padding))


# ============================================================================ composites


def logsumexp(x: Array, axis: Any = -1, keepdims: bool = False) -> Array:
    """log(sum(exp(x))) with the maximum subtracted first."""
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    m = stop_gradient(max(x, axes, keepdims=True))
    s = log(sum(exp(subtract(x, m)), axes, keepdims=True))
    out = add(s, m)
    return squeeze(out, axes) if not keepdims else out


def softmax(x: Array, axis: int = -1) -> Array:
    x = _arr(x)
    e = exp(subtract(x, stop_gradient(max(x, axis, keepdims=True))))
    return divide(e, sum(e, axis, keepdims=True))


def log_softmax(x: Array, axis: int = -1) -> Array:
    x = _arr(x)
    shifted = subtract(x, stop_gradient(max(x, axis, keepdims=True)))
    return subtract(shifted, log(sum(exp(shifted), axis, keepdims=True)))


def _reduce_loss(v: Array, reduction: str) -> Array:
    if reduction == "mean":
        return mean(v)
    if reduction == "sum":
        return sum(v)
    if reduction == "none":
        return v
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def cross_entropy(logits: Array, labels: Array, reduction: str = "mean", axis: int = -1) -> Array:
    """Softmax cross-entropy. ``labels``: integer class indices (shape of logits without ``axis``)
    or probabilities (same shape as logits)."""
    logits, labels = _arr(logits), _arr(labels)
    logp = log_softmax(logits, axis)
    lav = aval_of(labels)
    if lav.dtype.kind in "iu":
        if lav.ndim != ndim(logits) - 1:
            raise ShapeError(f"cross_entropy: integer labels {lav.shape} must drop the class axis of logits {shape(logits)}")
        ax = axis % ndim(logits)
        n_classes = shape(logits)[ax]
        labels = P.checks.check_range(
            labels, 0, n_classes, "cross_entropy: label {value} is out of range for {hi} classes (labels must lie in [0, {hi}))"
        )
        picked = take_along_axis(logp, expand_dims(labels, ax), ax)
        nll = negative(squeeze(picked, ax))
    else:
        if lav.shape != shape(logits):
            raise ShapeError(f"cross_entropy: probability labels {lav.shape} must match logits {shape(logits)}")
        nll = negative(sum(multiply(labels, logp), axis))
    return _reduce_loss(nll, reduction)


def mse(pred: Array, target: Array, reduction: str = "mean") -> Array:
    d = subtract(pred, target)
    return _reduce_loss(multiply(d, d), reduction)


def huber(pred: Array, target: Array, delta: float = 1.0, reduction: str = "mean") -> Array:
    """0.5 d^2 for |d| <= delta, else delta (|d| - delta / 2) (Huber 1964; PyTorch's HuberLoss)."""
    d = subtract(pred, target)
    a = abs(d)
    quad = multiply(multiply(d, d), 0.5)
    lin = multiply(subtract(a, 0.5 * delta), delta)
    return _reduce_loss(where(less_equal(a, delta), quad, lin), reduction)


def layer_norm(x: Array, gamma: Array | None = None, beta: Array | None = None, eps: float = 1e-5, axis: Any = -1) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta over ``axis`` (Ba, Kiros & Hinton 2016)."""
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    mu = mean(x, axes, keepdims=True)
    d = subtract(x, mu)
    v = mean(multiply(d, d), axes, keepdims=True)
    y = multiply(d, rsqrt(add(v, eps)))
    if gamma is not None:
        y = multiply(y, gamma)
    if beta is not None:
        y = add(y, beta)
    return y


def categorical_entropy(logits: Array, axis: int = -1) -> Array:
    """Entropy -sum p log p of the categorical distribution softmax(logits)."""
    logp = log_softmax(logits, axis)
    return negative(sum(multiply(exp(logp), logp), axis))


def global_norm(tree_leaves: Sequence[Array]) -> Array:
    """sqrt of the sum of squares of all leaves."""
    total = None
    for g in tree_leaves:
        s = sum(multiply(g, g))
        total = s if total is None else add(total, s)
    return sqrt(total)


# ============================================================================ numpy's integer division, tests, scans, sorting


def floor_divide(x: Array, y: Array) -> Array:
    """numpy.floor_divide (``x // y``); piecewise constant, so its gradient is zero."""
    return bind(P.elementwise.floor_divide_p, _arr(x), _arr(y))


def mod(x: Array, y: Array) -> Array:
    """numpy.mod / remainder (``x % y``, the sign of the divisor); d/dx = 1, d/dy = -floor(x / y)."""
    return bind(P.elementwise.mod_p, _arr(x), _arr(y))


remainder = mod


def erf(x: Array) -> Array:
    """The error function (scipy.special.erf)."""
    return bind(P.elementwise.erf_p, _arr(x))


def gelu(x: Array, approximate: str = "none") -> Array:
    """GELU (Hendrycks & Gimpel 2016) as PyTorch defines it: ``x * Phi(x)`` with the exact normal
    CDF (``approximate="none"``) or its tanh approximation (``approximate="tanh"``)."""
    x = _arr(x)
    if approximate == "none":
        return multiply(multiply(x, 0.5), add(erf(multiply(x, 0.7071067811865476)), 1.0))
    if approximate == "tanh":
        inner = multiply(add(x, multiply(power(x, 3), 0.044715)), 0.7978845608028654)
        return multiply(multiply(x, 0.5), add(tanh(inner), 1.0))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def isnan(x: Array) -> Array:
    return bind(P.elementwise.isnan_p, _arr(x))


def isfinite(x: Array) -> Array:
    return bind(P.elementwise.isfinite_p, _arr(x))


def prod(x: Array, axis: Any = None, keepdims: bool = False) -> Array:
    """numpy.prod; the gradient is the product of the other elements (exact with zeros)."""
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    return P.reductions.reduce_prod(_mask_padded(x, axes, 1), axes, keepdims)


def any(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001 - numpy's name
    """numpy.any: whether some element along ``axis`` is nonzero / True."""
    x = _arr(x)
    nonzero = x if aval_of(x).dtype == np.bool_ else not_equal(x, 0)
    return greater(sum(astype(nonzero, np.int64), axis, keepdims), 0)


def all(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001 - numpy's name
    """numpy.all: whether every element along ``axis`` is nonzero / True."""
    x = _arr(x)
    zero = logical_not(x) if aval_of(x).dtype == np.bool_ else equal(x, 0)
    return equal(sum(astype(zero, np.int64), axis, keepdims), 0)


def cumsum(x: Array, axis: int | None = None) -> Array:
    """numpy.cumsum (``axis=None``: over the flattened array); ints accumulate in int64."""
    x = _arr(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    return P.reductions.cumsum(x, axis)


def argsort(x: Array, axis: int = -1) -> Array:
    """numpy.argsort with ``kind="stable"`` (ties keep their order)."""
    x = _arr(x)
    ax = _norm_axes((axis,), ndim(x))[0]
    if ax == 0 and _buckets.leading(shape(x)) is not None:
        _buckets.refuse("sorting along the padded batch axis")
    return bind(P.reductions.argsort_p, x, axis=ax)


def sort(x: Array, axis: int = -1) -> Array:
    """numpy.sort along ``axis``; the gradient flows back to where each value came from."""
    x = _arr(x)
    return take_along_axis(x, argsort(x, axis), axis)
