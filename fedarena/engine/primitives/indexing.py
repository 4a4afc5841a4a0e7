"""Indexing primitives (the indexing family): gather (take_along_axis), scatter_add, take,
index_add (take's transpose), one_hot; flat-position kernels for large index arrays.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import ShapeError, ShapedArray
from ..core.tracing import bind
from .emit import expr, stmt
from ..core.tracing import aval_of
from .base import _define, all_batched, move_to_front, reshape, shape_of, transpose
from .base import add as _add
from . import sharding as _sharding
from .reductions import _norm_axes

# ============================================================================ gather / scatter / take / one_hot


def _check_index(av: ShapedArray, what: str) -> None:
    if av.dtype.kind not in "iu":
        raise ShapeError(f"{what} indices must be integers, got {av.dtype}")


def _gather_rule(avals, attrs, weak):
    x, idx = avals
    _check_index(idx, "gather")
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    if idx.ndim != x.ndim or any(i != axis and idx.shape[i] != x.shape[i] for i in range(x.ndim)):
        raise ShapeError(f"gather along axis {axis}: indices {idx.shape} must match {x.shape} except on that axis")
    return ShapedArray(idx.shape, x.dtype)


def _grid(idx_shape, axis):
    """Open-grid index arrays for every axis but ``axis`` (``None`` at ``axis``)."""
    nd = len(idx_shape)
    g = []
    for d in range(nd):
        if d == axis:
            g.append(None)
        else:
            sh = [1] * nd
            sh[d] = idx_shape[d]
            g.append(np.arange(idx_shape[d]).reshape(sh))
    return g


def _full_index(idx, axis):
    g = _grid(idx.shape, axis % idx.ndim)
    g[axis % idx.ndim] = idx
    return tuple(g)


def _gather_impl(x, idx, axis):
    return np.take_along_axis(x, idx, axis=axis)


class FlatIndex:
    """Gather/scatter along ``axis`` through flat positions in the C-ordered array: position =
    a constant offset per element of the other axes + index * stride.  One ``np.take`` or flat
    assignment replaces fancy indexing with one index array per axis (~2-3x faster from ~1k
    elements).  Used only while every index lies in [0, size of the axis): otherwise (negative
    indices wrap, out-of-range ones raise) the fancy-indexing ``fallback`` runs."""

    def __init__(self, x_shape, idx_shape, axis):
        strides = np.cumprod((1,) + tuple(x_shape[::-1]))[:-1][::-1]
        base = np.zeros(idx_shape, np.intp)
        for d, g in enumerate(_grid(idx_shape, axis)):
            if g is not None:
                base = base + g * int(strides[d])
        self.base, self.stride, self.limit = base, int(strides[axis]), int(x_shape[axis])
        self.pos = np.empty(idx_shape, np.intp)
        self.grid, self.axis = tuple(_grid(idx_shape, axis)), axis

    def positions(self, idx):
        """Flat positions, or None when an index is outside [0, limit)."""
        u = idx.view(np.uint64 if idx.dtype.itemsize == 8 else np.uint32) if idx.dtype.kind == "i" else idx
        if u.max() >= self.limit:
            return None
        if self.stride == 1:
            np.add(idx, self.base, out=self.pos, casting="unsafe")
        else:
            np.multiply(idx, self.stride, out=self.pos, casting="unsafe")
            np.add(self.pos, self.base, out=self.pos)
        return self.pos

    def full_index(self, idx):
        g = list(self.grid)
        g[self.axis] = idx
        return tuple(g)

    def gather(self, x, idx, out):
        pos = self.positions(idx)
        if pos is None:
            out[...] = x[self.full_index(idx)]
        else:
            np.take(x, pos, out=out)
        return out

    def scatter(self, upd, idx, out):
        """out = zeros with ``upd`` placed at the indices (one index per position: no duplicates)."""
        out.fill(0)
        pos = self.positions(idx)
        if pos is None:
            out[self.full_index(idx)] = upd
        else:
            out.reshape(-1)[pos] = upd
        return out


_FLAT_INDEX_MIN = 1024  # index elements; below, one fancy-indexing call is cheaper


def _flat_index_pays(idx: ShapedArray) -> bool:
    return idx.size >= _FLAT_INDEX_MIN and idx.dtype.kind in "iu" and idx.dtype.itemsize in (4, 8)


def _gather_emit(ctx, ins, attrs, in_avals, out_aval):
    axis = attrs["axis"] % in_avals[0].ndim
    if _flat_index_pays(in_avals[1]):
        k = ctx.const(FlatIndex(in_avals[0].shape, in_avals[1].shape, axis))
        return stmt(f"{k}.gather({ins[0]}, {ins[1]}, {{o}})")
    g = _grid(in_avals[1].shape, axis)
    names = [ins[1] if a is None else ctx.const(a) for a in g]
    return expr(f"{ins[0]}[{', '.join(names)},]")


def _gather_transpose(need, ct, out, x, idx, axis):
    return (bind(scatter_add_p, ct, idx, axis=axis, shape=shape_of(x)), None)


def _gather_batch(prim, vals, batched, size, axis):
    x, idx = all_batched(vals, batched, size)
    return bind(prim, x, idx, axis=(int(axis) % (len(shape_of(x)) - 1)) + 1)


def _gather_cuda(e, lib):
    if e.inputs[0].aval.dtype not in lib.CTYPE:
        return None
    return lib.kernel(lib.gather_kernel(e.inputs[0].aval, e.inputs[1].aval, e.attrs["axis"]), e.inputs)


gather_p = _define(
    "gather", _gather_rule, _gather_impl, _gather_emit, transpose=_gather_transpose, linearity="first",
    batch=_gather_batch, cuda=_gather_cuda,
)


def _in_block(idx, rank, size):
    """Indices relative to rank ``rank``'s block of ``size`` entries and the mask of those inside it (the
    sharded kernels take non-negative indices, as cross-entropy labels and embedding ids are)."""
    rel = np.asarray(idx) - rank * size
    inside = (rel >= 0) & (rel < size)
    return np.where(inside, rel, 0), inside


def _gather_block(rank, n, x, idx, axis):
    """Gather from this rank's block of ``x`` along ``axis``; entries other ranks hold are 0 (a partial sum)."""
    rel, inside = _in_block(idx, rank, x.shape[axis])
    out = np.take_along_axis(x, rel, axis=axis)
    return np.where(inside, out, np.zeros((), x.dtype))


def _gather_shard(in_avals, attrs, out_aval, n):
    """Split along another axis: both operands split alike; the gathered axis split on the table: each rank
    gathers what its block holds and the results sum (a class-sharded cross-entropy picks its label logit so);
    split indices along the gathered axis split the output."""
    x, idx = in_avals
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    R, S = _sharding.R, _sharding.S
    out = [_sharding.Strategy((R, R), R)]
    out += [_sharding.Strategy((S(k), S(k)), S(k)) for k in range(x.ndim) if k != axis and _sharding.splittable(x.shape[k], n)]
    if _sharding.splittable(x.shape[axis], n):
        out.append(_sharding.Strategy((S(axis), R), _sharding.PSUM, None, _gather_block))
    if _sharding.splittable(idx.shape[axis], n):
        out.append(_sharding.Strategy((R, S(axis)), S(axis)))
    out.append(_sharding.Strategy((_sharding.PSUM, R), _sharding.PSUM))
    return out


gather_p.shard = _gather_shard


def _scatter_rule(avals, attrs, weak):
    upd, idx = avals
    _check_index(idx, "scatter_add")
    shape = attrs["shape"]
    if upd.shape != idx.shape:
        raise ShapeError(f"updates {upd.shape} and indices {idx.shape} must have the same shape")
    (axis,) = _norm_axes((attrs["axis"],), len(shape))
    if len(shape) != idx.ndim or any(i != axis and idx.shape[i] != shape[i] for i in range(len(shape))):
        raise ShapeError(f"scatter_add along axis {axis}: indices {idx.shape} must match {shape} except on that axis")
    return ShapedArray(shape, upd.dtype)


def _scatter_impl(upd, idx, axis, shape):
    out = np.zeros(shape, upd.dtype)
    np.add.at(out, _full_index(idx, axis), upd)
    return out


def _scatter_emit(ctx, ins, attrs, in_avals, out_aval):
    axis = attrs["axis"] % len(attrs["shape"])
    g = _grid(in_avals[1].shape, axis)
    names = ", ".join(ins[1] if a is None else ctx.const(a) for a in g)
    if in_avals[1].shape[axis] == 1:  # one index per position: no duplicates, plain assignment
        if _flat_index_pays(in_avals[1]):
            k = ctx.const(FlatIndex(tuple(attrs["shape"]), in_avals[1].shape, axis))
            return stmt(f"{k}.scatter({ins[0]}, {ins[1]}, {{o}})")
        return stmt(f"{{o}}.fill(0); {{o}}[{names},] = {ins[0]}")
    return stmt(f"{{o}}.fill(0); np.add.at({{o}}, ({names},), {ins[0]})")


def _scatter_transpose(need, ct, out, upd, idx, axis, shape):
    return (bind(gather_p, ct, idx, axis=axis), None)


def _scatter_batch(prim, vals, batched, size, axis, shape):
    upd, idx = all_batched(vals, batched, size)
    return bind(prim, upd, idx, axis=(int(axis) % len(shape)) + 1, shape=(size,) + tuple(shape))


def _scatter_cuda(e, lib):
    if e.inputs[0].aval.dtype not in lib.ATOMIC_ADD:
        return None
    return lib.scatter(lib.scatter_add_kernel(e.inputs[0].aval, e.inputs[1].aval, e.attrs["axis"], tuple(e.attrs["shape"])), e.inputs)


scatter_add_p = _define(
    "scatter_add", _scatter_rule, _scatter_impl, _scatter_emit, transpose=_scatter_transpose, linearity="first",
    batch=_scatter_batch, cuda=_scatter_cuda,
)


def _scatter_block(rank, n, upd, idx, axis, shape):
    """Scatter-add the updates whose indices fall in this rank's block of the output's ``axis``."""
    rel, inside = _in_block(idx, rank, shape[axis])
    out = np.zeros(shape, upd.dtype)
    np.add.at(out, _full_index(rel, axis), np.where(inside, upd, np.zeros((), upd.dtype)))
    return out


def _scatter_shard(in_avals, attrs, out_aval, n):
    upd, idx = in_avals
    shape = attrs["shape"]
    (axis,) = _norm_axes((attrs["axis"],), len(shape))
    R, S = _sharding.R, _sharding.S
    local = lambda k: {**attrs, "shape": _sharding.with_axis(shape, k, n)}  # noqa: E731
    out = [_sharding.Strategy((R, R), R)]
    out += [_sharding.Strategy((S(k), S(k)), S(k), local(k)) for k in range(len(shape))
            if k != axis and _sharding.splittable(shape[k], n)]
    if _sharding.splittable(shape[axis], n):
        out.append(_sharding.Strategy((R, R), S(axis), local(axis), _scatter_block))
    if _sharding.splittable(idx.shape[axis], n):
        out.append(_sharding.Strategy((S(axis), S(axis)), _sharding.PSUM))
    out.append(_sharding.Strategy((_sharding.PSUM, R), _sharding.PSUM))
    return out


scatter_add_p.shard = _scatter_shard


def _take_rule(avals, attrs, weak):
    x, idx = avals
    _check_index(idx, "take")
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    return ShapedArray(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)


def _take_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.take({ins[0]}, {ins[1]}, axis={attrs['axis']}, out={{o}})")


def _take_transpose(need, ct, out, x, idx, axis):
    return (bind(index_add_p, ct, idx, axis=axis % len(shape_of(x)), size=shape_of(x)[axis]), None)


def _batch_offsets(idx, size: int, n: int):
    """``idx[b] + b * n``: indices into the batch-flattened axis."""
    off = np.arange(size, dtype=aval_of(idx).dtype) * n
    return _add(idx, np.reshape(off, (size,) + (1,) * (len(shape_of(idx)) - 1)))


def _take_batch(prim, vals, batched, size, axis):
    x, idx = vals
    bx, bi = batched
    if bx and not bi:
        return bind(prim, x, idx, axis=(int(axis) % (len(shape_of(x)) - 1)) + 1)
    if bi and not bx:
        ax = int(axis) % len(shape_of(x))
        return move_to_front(bind(prim, x, idx, axis=ax), ax)
    # both batched: move the taken axis next to the batch axis, flatten the two, offset the indices
    ax = (int(axis) % (len(shape_of(x)) - 1)) + 1
    if ax != 1:
        x = transpose(x, (0, ax) + tuple(i for i in range(1, len(shape_of(x))) if i != ax))
    s = shape_of(x)
    flat = reshape(x, (s[0] * s[1],) + s[2:])
    out = bind(prim, flat, _batch_offsets(idx, size, s[1]), axis=0)  # (B, *idx, *rest)
    if ax != 1:
        k = len(shape_of(idx)) - 1  # index dims after the batch
        rest = list(range(1 + k, len(shape_of(out))))
        # rest dims of x in original order were [1..ax-1] then [ax+1..]; those before ax go first
        before, after = rest[: ax - 1], rest[ax - 1 :]
        out = transpose(out, tuple([0] + before + list(range(1, 1 + k)) + after))
    return out


def _take_cuda(e, lib):
    if lib.has_literal(e):
        return None
    x, idx = e.inputs
    return lib.kernel(lib.take_kernel(x.aval, idx.aval, e.attrs["axis"]), [x, idx])


take_p = _define(
    "take", _take_rule, lambda x, idx, axis: np.take(x, idx, axis=axis), _take_emit, transpose=_take_transpose, linearity="first",
    batch=_take_batch, cuda=_take_cuda,
)


def _take_block(rank, n, x, idx, axis):
    """Look up the rows of this rank's block of the table (vocabulary-parallel embedding); other rows give 0."""
    rel, inside = _in_block(idx, rank, x.shape[axis])
    out = np.take(x, rel, axis=axis)
    mask = inside.reshape((1,) * axis + inside.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, out, np.zeros((), x.dtype))


def _take_shard(in_avals, attrs, out_aval, n):
    """An embedding lookup: a table split by rows (the looked-up axis) gives partial sums; split along another
    axis of the table or of the indices, the output is split along the matching axis."""
    x, idx = in_avals
    (axis,) = _norm_axes((attrs["axis"],), x.ndim)
    R, S = _sharding.R, _sharding.S
    out = [_sharding.Strategy((R, R), R)]
    if _sharding.splittable(x.shape[axis], n):
        out.append(_sharding.Strategy((S(axis), R), _sharding.PSUM, None, _take_block))
    out += [_sharding.Strategy((S(k), R), S(k if k < axis else k + idx.ndim - 1)) for k in range(x.ndim)
            if k != axis and _sharding.splittable(x.shape[k], n)]
    out += [_sharding.Strategy((R, S(j)), S(axis + j)) for j in range(idx.ndim) if _sharding.splittable(idx.shape[j], n)]
    out.append(_sharding.Strategy((_sharding.PSUM, R), _sharding.PSUM))
    return out


take_p.shard = _take_shard


def _index_add_rule(avals, attrs, weak):
    upd, idx = avals
    _check_index(idx, "index_add")
    axis, size = attrs["axis"], attrs["size"]
    if upd.shape[axis : axis + idx.ndim] != idx.shape:
        raise ShapeError(f"index_add: updates {upd.shape} must contain the index shape {idx.shape} at axis {axis}")
    return ShapedArray(upd.shape[:axis] + (size,) + upd.shape[axis + idx.ndim :], upd.dtype)


def _index_add_impl(upd, idx, axis, size):
    shape = upd.shape[:axis] + (size,) + upd.shape[axis + idx.ndim :]
    out = np.zeros(shape, upd.dtype)
    np.add.at(out, (slice(None),) * axis + (idx,), upd)
    return out


def _index_add_emit(ctx, ins, attrs, in_avals, out_aval):
    pre = ctx.const((slice(None),) * attrs["axis"])
    return stmt(f"{{o}}.fill(0); np.add.at({{o}}, {pre} + ({ins[1]},), {ins[0]})")


def _index_add_batch(prim, vals, batched, bsize, **attrs):
    axis, n = int(attrs["axis"]), int(attrs["size"])  # ``size`` is the primitive's attribute, ``bsize`` the batch's
    upd, idx = vals
    bu, bi = batched
    if bu and not bi:
        return bind(prim, upd, idx, axis=axis + 1, size=n)
    upd, idx = all_batched(vals, batched, bsize)
    k = len(shape_of(idx)) - 1
    if axis != 0:
        # bring the index dims right after the batch axis
        idx_dims = list(range(1 + axis, 1 + axis + k))
        others = [i for i in range(1, len(shape_of(upd))) if i not in idx_dims]
        upd = transpose(upd, tuple([0] + idx_dims + others))
    s = shape_of(upd)
    rows = s[0] * int(np.prod(s[1 : 1 + k], dtype=np.int64))
    upd2 = reshape(upd, (rows,) + s[1 + k :])
    idx2 = reshape(_batch_offsets(idx, bsize, n), (rows,))
    out = bind(prim, upd2, idx2, axis=0, size=bsize * n)  # (B*n, *rest)
    out = reshape(out, (bsize, n) + s[1 + k :])
    if axis != 0:
        nd = len(shape_of(out))
        out = transpose(out, tuple([0] + list(range(2, 2 + axis)) + [1] + list(range(2 + axis, nd))))
    return out


def _index_add_cuda(e, lib):
    upd, idx = e.inputs
    if lib.has_literal(e) or upd.aval.dtype not in lib.ATOMIC_ADD:
        return None
    return lib.scatter(lib.index_add_kernel(upd.aval, idx.aval, e.attrs["axis"], e.attrs["size"]), [upd, idx])


index_add_p = _define(
    "index_add",
    _index_add_rule,
    _index_add_impl,
    _index_add_emit,
    transpose=lambda need, ct, out, upd, idx, axis, size: (bind(take_p, ct, idx, axis=axis), None),
    linearity="first",
    batch=_index_add_batch,
    cuda=_index_add_cuda,
)


def _index_add_block(rank, n, upd, idx, axis, size):
    """Add the updates whose indices fall in this rank's block of ``size`` rows (an embedding gradient)."""
    rel, inside = _in_block(idx, rank, size)
    out = np.zeros(upd.shape[:axis] + (size,) + upd.shape[axis + idx.ndim:], upd.dtype)
    mask = inside.reshape((1,) * axis + inside.shape + (1,) * (upd.ndim - axis - idx.ndim))
    np.add.at(out, (slice(None),) * axis + (rel,), np.where(mask, upd, np.zeros((), upd.dtype)))
    return out


def _index_add_shard(in_avals, attrs, out_aval, n):
    upd, idx = in_avals
    axis, size = attrs["axis"], attrs["size"]
    R, S = _sharding.R, _sharding.S
    out = [_sharding.Strategy((R, R), R)]
    if _sharding.splittable(size, n):
        out.append(_sharding.Strategy((R, R), S(axis), {**attrs, "size": size // n}, _index_add_block))
    out += [_sharding.Strategy((S(axis + j), S(j)), _sharding.PSUM) for j in range(idx.ndim)
            if _sharding.splittable(idx.shape[j], n)]
    out.append(_sharding.Strategy((_sharding.PSUM, R), _sharding.PSUM))
    return out


index_add_p.shard = _index_add_shard


def _one_hot_rule(avals, attrs, weak):
    _check_index(avals[0], "one_hot")
    return ShapedArray(avals[0].shape + (attrs["num_classes"],), attrs["dtype"])


def _one_hot_impl(x, num_classes, dtype):
    return (np.asarray(x)[..., None] == np.arange(num_classes)).astype(dtype)


def _one_hot_emit(ctx, ins, attrs, in_avals, out_aval):
    ar = ctx.const(np.arange(attrs["num_classes"]))
    return stmt(f"np.equal({ins[0]}[..., None], {ar}, {{o}})")


def _one_hot_xp(xp, ins, attrs, out):
    out[...] = ins[0][..., None] == xp.arange(attrs["num_classes"])


one_hot_p = _define(
    "one_hot", _one_hot_rule, _one_hot_impl, _one_hot_emit, differentiable=False,
    batch=lambda prim, vals, batched, size, **attrs: bind(prim, *vals, **attrs),  # classes go last: the batch axis stays in front
    cuda=lambda e, lib: lib.xp(_one_hot_xp, e),
)
