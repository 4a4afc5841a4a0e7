"""numpy indexing on arrays and tracers (``x[key]``): ints, slices of any step, ``None``, ``...`` and
integer arrays with numpy's advanced-indexing rules, written with slice/take/transpose/reshape
equations so every transformation applies."""

from __future__ import annotations

import builtins as _builtins
from typing import Any

import numpy as np

from .. import primitives as P
from ..core import buckets as _buckets
from ..core.ir import ShapeError
from ..core.tracing import Tracer, aval_of, bind
from .basic import *  # noqa: F403  (the numpy-named operations these are written with)
from .basic import Array, _arr

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


def _keeps_rows(k: Any, n: int) -> bool:
    """Whether the index ``k`` of axis 0 keeps every row in order (``:`` or a concrete ``arange(n)``)."""
    if isinstance(k, slice):
        return k.indices(n) == (0, n, 1)
    return isinstance(k, np.ndarray) and k.shape == (n,) and bool(np.array_equal(k, np.arange(n)))


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
    if key and _buckets.leading(shape(x)) is not None:
        if not _keeps_rows(key[0], shape(x)[0]):
            _buckets.refuse("indexing the padded batch axis (anything but ':' or np.arange(len(x)) in front)")
        with _buckets.quiet():  # checked here for the whole index (advanced indexing flattens internally)
            return _getitem(x, key)
    return _getitem(x, key)


def _getitem(x: Array, key: tuple) -> Array:
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
