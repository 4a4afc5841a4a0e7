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

from . import primitives as P
from .ir import ShapeError, TracerControlFlowError, check_dtype, is_float
from .tracing import Tracer, aval_of, bind

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
    return P._norm_axes(tuple(axis), nd)


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


def sum(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    return bind(P.reduce_sum_p, x, axes=_axes(axis, ndim(x)), keepdims=bool(keepdims))


def max(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    return bind(P.reduce_max_p, x, axes=_axes(axis, ndim(x)), keepdims=bool(keepdims))


def min(x: Array, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A001
    x = _arr(x)
    return bind(P.reduce_min_p, x, axes=_axes(axis, ndim(x)), keepdims=bool(keepdims))


amax, amin = max, min


def mean(x: Array, axis: Any = None, keepdims: bool = False) -> Array:
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    n = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    if not is_float(aval_of(x).dtype):
        x = astype(x, np.float64)
    return multiply(sum(x, axes, keepdims), 1.0 / n if n else np.nan)


def var(x: Array, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Array:
    x = _arr(x)
    axes = _axes(axis, ndim(x))
    n = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    d = subtract(x, mean(x, axes, keepdims=True))
    return multiply(sum(multiply(d, d), axes, keepdims), 1.0 / (n - ddof))


def std(x: Array, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Array:
    return sqrt(var(x, axis, keepdims, ddof))


def argmax(x: Array, axis: int | None = None, keepdims: bool = False) -> Array:
    x = _arr(x)
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
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
    return P.reshape(x, _resolve_shape(newshape, aval_of(x).size))


def ravel(x: Array) -> Array:
    return reshape(x, (-1,))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    x = _arr(x)
    n = ndim(x)
    perm = tuple(range(n))[::-1] if axes is None else tuple(int(a) % n for a in axes)
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
    return bind(P.expand_dims_p, x, axes=P._norm_axes(axis, n))


def concatenate(arrays: Sequence[Array], axis: int = 0) -> Array:
    arrays = [_arr(a) for a in arrays]
    return bind(P.concatenate_p, *arrays, axis=int(axis) % ndim(arrays[0]) if arrays else 0)


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    arrays = [_arr(a) for a in arrays]
    return bind(P.stack_p, *arrays, axis=int(axis) % (ndim(arrays[0]) + 1) if arrays else 0)


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
    return bind(P.take_p, x, idx, axis=int(axis) % ndim(x))


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    """numpy.take_along_axis, e.g. picking Q(s, a) with ``indices`` of shape (B, 1)."""
    x, idx = _arr(x), _arr(indices)
    return bind(P.gather_p, x, idx, axis=int(axis) % ndim(x))


def scatter_add(updates: Array, indices: Array, axis: int, shape_: Sequence[int]) -> Array:
    """Zeros of ``shape_`` plus ``updates`` added at ``indices`` along ``axis`` (take_along_axis's transpose)."""
    return bind(P.scatter_add_p, _arr(updates), _arr(indices), axis=int(axis) % len(shape_), shape=tuple(shape_))


def one_hot(indices: Array, num_classes: int, dtype: Any = np.float32) -> Array:
    return bind(P.one_hot_p, _arr(indices), num_classes=int(num_classes), dtype=check_dtype(dtype))


def _index_tuple(key: Any, sh: tuple) -> tuple:
    """``key`` as a tuple with the Ellipsis expanded (and missing trailing axes as full slices)."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ellipsis = _builtins.sum(1 for k in key if k is Ellipsis)
    if n_ellipsis > 1:
        raise ShapeError("an index can only have a single ellipsis ('...')")
    n_real = len([k for k in key if k is not None and k is not Ellipsis])
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (len(sh) - n_real))
        else:
            out.append(k)
    if not n_ellipsis:
        out.extend([slice(None)] * (len(sh) - n_real))
    return tuple(out)


def _is_array_index(k: Any) -> bool:
    return isinstance(k, (np.ndarray, Tracer, list))


def _int_index_array(k: Any, n: int, wrap: bool) -> Any:
    """An integer index array; concrete ones are bounds-checked and their negatives wrapped, traced
    ones get a ``where`` wrapping negatives when ``wrap`` (``take`` itself wraps a lone index)."""
    if isinstance(k, list):
        k = np.asarray(k)
    av = aval_of(k)
    if av.dtype == np.bool_:
        raise ShapeError("boolean-mask indexing has a data-dependent shape; use ops.where instead")
    if av.dtype.kind not in "iu":
        raise ShapeError(f"array indices must be integers, got {av.dtype}")
    if isinstance(k, np.ndarray):
        if k.size and (k.max() >= n or k.min() < -n):
            bad = k.max() if k.max() >= n else k.min()
            raise ShapeError(f"index {int(bad)} is out of bounds for an axis of size {n}")
        return np.where(k < 0, k + n, k).astype(np.int64)
    return where(less(k, 0), add(k, n), k) if wrap else k


def getitem(x: Array, key: Any) -> Array:
    """numpy indexing: ints, slices (any step), None, ``...`` and integer arrays (numpy's
    advanced-indexing rules: several index arrays broadcast together and pick elements pointwise,
    e.g. ``q[np.arange(B), a]``).  Boolean masks are refused (data-dependent shape)."""
    x = _arr(x)
    key = _index_tuple(key, shape(x))
    if _builtins.any(_is_array_index(k) for k in key):
        return _advanced_getitem(x, key)
    sh = shape(x)
    starts, limits, strides, squeeze_axes, new_axes, flips = [], [], [], [], [], []
    axis = 0
    out_pos = 0
    for k in key:
        if k is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        if axis >= len(sh):
            raise ShapeError(f"too many indices for an array of shape {sh}")
        n = sh[axis]
        if isinstance(k, slice):
            a, b, c = k.indices(n)
            if c < 0:  # a reversed range: gather its positions (take has every rule)
                flips.append((axis, np.arange(a, b, c, dtype=np.int64)))
                a, b, c = 0, n, 1
            starts.append(a)
            limits.append(_builtins.max(a, b))
            strides.append(c)
            out_pos += 1
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            k = int(k)
            if not -n <= k < n:
                raise ShapeError(f"index {k} is out of bounds for an axis of size {n}")
            k %= n
            starts.append(k)
            limits.append(k + 1)
            strides.append(1)
            squeeze_axes.append(axis)
        else:
            raise ShapeError(f"unsupported index {k!r}")
        axis += 1
    y = x
    if tuple(starts) != (0,) * len(sh) or tuple(limits) != sh or tuple(strides) != (1,) * len(sh):
        y = bind(P.slice_p, x, starts=tuple(starts), limits=tuple(limits), strides=tuple(strides))
    for ax, positions in flips:
        y = take(y, positions, axis=ax)
    if squeeze_axes:
        y = bind(P.squeeze_p, y, axes=tuple(squeeze_axes))
    if new_axes:
        y = bind(P.expand_dims_p, y, axes=tuple(new_axes))
    return y


def _advanced_getitem(x: Array, key: tuple) -> Array:
    # new axes first, so that every remaining key entry names one axis of x
    new = [i for i, k in enumerate(key) if k is None]
    if new:
        x = bind(P.expand_dims_p, x, axes=tuple(new))
        key = tuple(slice(None) if k is None else k for k in key)
    sh = shape(x)
    if len(key) > len(sh):
        raise ShapeError(f"too many indices for an array of shape {sh}")
    # basic slices on the other axes; integers take part in the advanced index (numpy's rule)
    adv = [i for i, k in enumerate(key) if _is_array_index(k) or (isinstance(k, (int, np.integer)) and not isinstance(k, bool))]
    basic = tuple(slice(None) if i in adv else k for i, k in enumerate(key))
    y = getitem(x, basic)
    idx = [_int_index_array(np.asarray(key[i]) if not _is_array_index(key[i]) else key[i], sh[i], len(adv) > 1) for i in adv]
    idx_shape = P.broadcast_shapes(*[shape(i) for i in idx])
    adjacent = adv == list(range(adv[0], adv[0] + len(adv)))
    pos = adv[0] if adjacent else 0
    if not adjacent:
        y = transpose(y, adv + [i for i in range(len(sh)) if i not in adv])
    ysh = shape(y)
    sizes = ysh[pos : pos + len(adv)]
    # one flat index into the merged advanced axes: sum_i idx_i * stride_i
    flat = None
    stride = 1
    for i, n in zip(reversed(idx), reversed(sizes)):
        term = i if stride == 1 else multiply(i, stride)
        flat = term if flat is None else add(flat, term)
        stride *= n
    flat = broadcast_to(flat, idx_shape)
    merged = reshape(y, ysh[:pos] + (stride,) + ysh[pos + len(adv) :])
    return take(merged, flat, axis=pos)


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
    attrs = dict(stride=P._pair(stride), padding=P._pair(padding), dilation=P._pair(dilation))
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
    k = P._pair(kernel_size)
    return bind(P.max_pool2d_p, _arr(x), kernel=k, stride=P._pair(stride) if stride is not None else k, padding=P._pair(padding))


def avg_pool2d(x: Array, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Array:
    """Average pooling; padded zeros count in the average (PyTorch's count_include_pad=True)."""
    k = P._pair(kernel_size)
    return bind(P.avg_pool2d_p, _arr(x), kernel=k, stride=P._pair(stride) if stride is not None else k, padding=P._pair(padding))


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
    return P.reductions.reduce_prod(x, _axes(axis, ndim(x)), keepdims)


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
    return bind(P.reductions.argsort_p, x, axis=P._norm_axes((axis,), ndim(x))[0])


def sort(x: Array, axis: int = -1) -> Array:
    """numpy.sort along ``axis``; the gradient flows back to where each value came from."""
    x = _arr(x)
    return take_along_axis(x, argsort(x, axis), axis)


def einsum(subscripts: str, *operands: Array) -> Array:
    """numpy.einsum for explicit (``"ij,jk->ik"``) and implicit (``"ij,jk"``) subscripts, any
    number of operands (contracted left to right), written as transposes, reshapes, products,
    sums and batched matmuls, so every transformation applies.  Repeated indices within one
    operand (traces, diagonals) and ``...`` are not supported."""
    if "." in subscripts:
        raise ShapeError("einsum: '...' (ellipsis) subscripts are not supported; name the axes")
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        lhs, out = spec.split("->")
    else:
        lhs = spec
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ShapeError(f"einsum: {len(terms)} subscript groups for {len(operands)} operands")
    ops_ = [_arr(o) for o in operands]
    sizes: dict = {}
    for t, o in zip(terms, ops_):
        if len(t) != ndim(o):
            raise ShapeError(f"einsum: subscripts {t!r} do not match an operand of shape {shape(o)}")
        if len(set(t)) != len(t):
            raise ShapeError(f"einsum: repeated index in {t!r} (traces/diagonals) is not supported")
        for c, n in zip(t, shape(o)):
            if sizes.setdefault(c, n) != n:
                raise ShapeError(f"einsum: index {c!r} has sizes {sizes[c]} and {n}")
    if len(set(out)) != len(out) or _missing_index(out, sizes):
        raise ShapeError(f"einsum: bad output subscripts {out!r}")
    cur, cur_t = ops_[0], terms[0]
    for k in range(1, len(ops_)):
        later = "".join(terms[k + 1 :]) + out
        cur, cur_t = _einsum_pair(cur, cur_t, ops_[k], terms[k], later, sizes)
    # whatever the output does not keep is summed; then order the axes as asked
    drop = tuple(i for i, c in enumerate(cur_t) if c not in out)
    if drop:
        cur = sum(cur, drop)
        cur_t = "".join(c for c in cur_t if c in out)
    return transpose(cur, [cur_t.index(c) for c in out]) if cur_t != out else cur


def _missing_index(out: str, sizes: dict) -> bool:
    return _builtins.any(c not in sizes for c in out)


def _einsum_pair(a: Array, ta: str, b: Array, tb: str, later: str, sizes: dict) -> tuple:
    """Contract two operands; indices still needed ``later`` are kept."""
    # indices seen only in one operand and not needed later are summed out first
    for arr_name in ("a", "b"):
        x, t, other = (a, ta, tb) if arr_name == "a" else (b, tb, ta)
        lone = tuple(i for i, c in enumerate(t) if c not in other and c not in later)
        if lone:
            x = sum(x, lone)
            t = "".join(c for i, c in enumerate(t) if i not in lone)
        if arr_name == "a":
            a, ta = x, t
        else:
            b, tb = x, t
    batch = [c for c in ta if c in tb and c in later]
    contract = [c for c in ta if c in tb and c not in later]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    a = transpose(a, [ta.index(c) for c in batch + free_a + contract])
    b = transpose(b, [tb.index(c) for c in batch + contract + free_b])
    nb = [sizes[c] for c in batch]
    m = int(np.prod([sizes[c] for c in free_a], dtype=np.int64))
    kk = int(np.prod([sizes[c] for c in contract], dtype=np.int64))
    n = int(np.prod([sizes[c] for c in free_b], dtype=np.int64))
    a3 = reshape(a, tuple(nb) + (m, kk))
    b3 = reshape(b, tuple(nb) + (kk, n))
    res = reshape(matmul(a3, b3), tuple(nb) + tuple(sizes[c] for c in free_a) + tuple(sizes[c] for c in free_b))
    return res, "".join(batch + free_a + free_b)


# ============================================================================ tracer operators


def _swap(f):
    return lambda a, b: f(b, a)


# numpy ufuncs that Python operators with an ndarray on the left reach (``a + tracer`` calls
# ``np.add(a, tracer)``, which asks the tracer's ``__array_ufunc__``): recorded as equations
_OPERATOR_UFUNCS = {
    np.add: lambda a, b: add(a, b),
    np.subtract: lambda a, b: subtract(a, b),
    np.multiply: lambda a, b: multiply(a, b),
    np.true_divide: lambda a, b: divide(a, b),
    np.power: lambda a, b: power(a, b),
    np.matmul: lambda a, b: matmul(a, b),
    np.less: lambda a, b: less(a, b),
    np.less_equal: lambda a, b: less_equal(a, b),
    np.greater: lambda a, b: greater(a, b),
    np.greater_equal: lambda a, b: greater_equal(a, b),
    np.equal: lambda a, b: equal(a, b),
    np.not_equal: lambda a, b: not_equal(a, b),
    np.logical_and: lambda a, b: logical_and(a, b),
    np.logical_or: lambda a, b: logical_or(a, b),
    np.bitwise_and: lambda a, b: logical_and(a, b),
    np.bitwise_or: lambda a, b: logical_or(a, b),
    np.floor_divide: lambda a, b: floor_divide(a, b),
    np.remainder: lambda a, b: mod(a, b),
}


def _tracer_array_ufunc(self: Tracer, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    fn = _OPERATOR_UFUNCS.get(ufunc)
    if fn is not None and method == "__call__" and not kwargs and len(inputs) == 2:
        return fn(*inputs)
    name = getattr(ufunc, "__name__", str(ufunc))
    ours = f"ops.{name}" if name in globals() else "the ops module's equivalent"
    raise TracerControlFlowError(
        f"numpy's np.{name}{'' if method == '__call__' else '.' + method} was applied to a traced value; numpy "
        f"functions need concrete arrays, but this value is only known when the compiled graph runs. "
        f"Use {ours} (fedarena.engine.ops follows numpy's names) instead."
    )


def _install_operators() -> None:
    T = Tracer
    T.__array_ufunc__ = _tracer_array_ufunc  # numpy operators on tracers record; other ufuncs refuse
    T.__add__ = add
    T.__radd__ = _swap(add)
    T.__sub__ = subtract
    T.__rsub__ = _swap(subtract)
    T.__mul__ = multiply
    T.__rmul__ = _swap(multiply)
    T.__truediv__ = divide
    T.__rtruediv__ = _swap(divide)
    T.__pow__ = power
    T.__rpow__ = _swap(power)
    T.__matmul__ = matmul
    T.__floordiv__ = floor_divide
    T.__rfloordiv__ = _swap(floor_divide)
    T.__mod__ = mod
    T.__rmod__ = _swap(mod)
    T.__rmatmul__ = _swap(matmul)
    T.__neg__ = negative
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__lt__ = less
    T.__le__ = less_equal
    T.__gt__ = greater
    T.__ge__ = greater_equal
    T.__eq__ = equal
    T.__ne__ = not_equal
    T.__and__ = logical_and
    T.__or__ = logical_or
    T.__invert__ = logical_not
    T.__getitem__ = getitem
    T.__hash__ = lambda self: id(self)
    T.T = property(lambda self: transpose(self))
    T.reshape = lambda self, *s: reshape(self, s[0] if len(s) == 1 and not isinstance(s[0], int) else s)
    T.transpose = lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else (axes or None))
    T.sum = lambda self, axis=None, keepdims=False: sum(self, axis, keepdims)
    T.mean = lambda self, axis=None, keepdims=False: mean(self, axis, keepdims)
    T.max = lambda self, axis=None, keepdims=False: max(self, axis, keepdims)
    T.min = lambda self, axis=None, keepdims=False: min(self, axis, keepdims)
    T.std = lambda self, axis=None, keepdims=False: std(self, axis, keepdims)
    T.argmax = lambda self, axis=None, keepdims=False: argmax(self, axis, keepdims)
    T.prod = lambda self, axis=None, keepdims=False: prod(self, axis, keepdims)
    T.cumsum = lambda self, axis=None: cumsum(self, axis)
    T.any = lambda self, axis=None, keepdims=False: any(self, axis, keepdims)
    T.all = lambda self, axis=None, keepdims=False: all(self, axis, keepdims)
    T.astype = astype
    T.squeeze = lambda self, axis=None: squeeze(self, axis)
    T.clip = lambda self, a_min=None, a_max=None: clip(self, a_min, a_max)
    T.flatten = lambda self: reshape(self, (-1,))
    T.ravel = T.flatten
    T.dot = dot
    T.exp = exp
    T.log = log
    T.tanh = tanh
    T.sqrt = sqrt


_install_operators()
