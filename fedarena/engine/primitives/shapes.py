"""Shape primitives (the shape family, views in the compiled executor where possible): transpose,
reshape, broadcast_to, squeeze, expand_dims, slice, pad, concatenate, stack.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import ShapeError, ShapedArray
from ..core.tracing import bind
from .emit import expr, stmt
from .base import _define, _stand_in, all_batched, shift_axes, promote, reshape, shape_of, transpose, unbroadcast
from . import sharding as _sharding
from .reductions import _norm_axes

# ============================================================================ shapes (views)


def _transpose_rule(avals, attrs, weak):
    av = avals[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(av.ndim)):
        raise ShapeError(f"perm {perm} is not a permutation of the {av.ndim} axes")
    return ShapedArray(tuple(av.shape[p] for p in perm), av.dtype)


def _perm_transpose(need, ct, out, x, perm):
    inv = tuple(int(i) for i in np.argsort(perm))
    return (transpose(ct, inv),)


def _reshape_view(e, lib):
    """The cupy rule of the reshaping views (reshape, squeeze, expand_dims): a reshaped device array."""
    return lib.view(lambda xp, x, shape=e.outputs[0].aval.shape: xp.reshape(x, shape), e)


def _broadcast_batch(prim, vals, batched, size, shape):
    x = vals[0]
    s = shape_of(x)
    if len(s) - 1 < len(shape):  # the batch axis in front of the unit axes broadcasting adds
        x = reshape(x, (s[0],) + (1,) * (len(shape) - (len(s) - 1)) + s[1:])
    return bind(prim, x, shape=(size,) + tuple(shape))


transpose_p = _define(
    "transpose",
    _transpose_rule,
    lambda x, perm: np.transpose(x, perm),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.transpose({attrs['perm']!r})"),
    transpose=_perm_transpose,
    linearity="first",
    batch=lambda prim, vals, batched, size, perm: bind(prim, vals[0], perm=(0,) + tuple(int(p) + 1 for p in perm)),
    cuda=lambda e, lib: lib.view(lambda xp, x, perm=tuple(e.attrs["perm"]): xp.transpose(x, perm), e),
)
transpose_p.shard = lambda in_avals, attrs, out_aval, n: _sharding.axis_map(
    in_avals[0], out_aval, n, [(p, j) for j, p in enumerate(attrs["perm"])])


def _reshape_rule(avals, attrs, weak):
    av = avals[0]
    shape = attrs["shape"]
    if int(np.prod(shape, dtype=np.int64)) != av.size or any(s < 0 for s in shape):
        raise ShapeError(f"cannot reshape {av.shape} ({av.size} elements) into {shape}")
    return ShapedArray(shape, av.dtype)


reshape_p = _define(
    "reshape",
    _reshape_rule,
    lambda x, shape: np.reshape(x, shape),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({attrs['shape']!r})"),
    transpose=lambda need, ct, out, x, shape: (reshape(ct, shape_of(x)),),
    linearity="first",
    batch=lambda prim, vals, batched, size, shape: bind(prim, vals[0], shape=(size,) + tuple(shape)),
    cuda=lambda e, lib: _reshape_view(e, lib),
)


def _reshape_shard(in_avals, attrs, out_aval, n):
    # input axis i and output axis j hold the same contiguous blocks when the axes before them have the same
    # number of elements: rank r's block of i is then elements [r, r+1) * size / n of both
    ins, outs = in_avals[0].shape, out_aval.shape
    pairs = [(i, j) for i in range(len(ins)) for j in range(len(outs))
             if int(np.prod(ins[:i], dtype=np.int64)) == int(np.prod(outs[:j], dtype=np.int64))]
    return _sharding.axis_map(in_avals[0], out_aval, n, pairs,
                              lambda j: {"shape": _sharding.with_axis(attrs["shape"], j, n)})


reshape_p.shard = _reshape_shard


def _broadcast_rule(avals, attrs, weak):
    av = avals[0]
    shape = attrs["shape"]
    lead = len(shape) - av.ndim
    if lead < 0 or any(s != 1 and s != shape[lead + i] for i, s in enumerate(av.shape)):
        raise ShapeError(f"cannot broadcast {av.shape} to {shape}")
    dt = av.dtype
    if weak[0]:
        dt = np.result_type(_stand_in(av))
    return ShapedArray(shape, dt)


broadcast_to_p = _define(
    "broadcast_to",
    _broadcast_rule,
    lambda x, shape: np.broadcast_to(x, shape),
    lambda ctx, ins, attrs, ia, oa: expr(f"np.broadcast_to({ins[0]}, {attrs['shape']!r})"),
    transpose=lambda need, ct, out, x, shape: (unbroadcast(ct, shape_of(x)),),
    linearity="first",
    batch=_broadcast_batch,
    cuda=lambda e, lib: lib.view(lambda xp, x, shape=e.outputs[0].aval.shape: xp.broadcast_to(x, shape), e),
)


def _broadcast_shard(in_avals, attrs, out_aval, n):
    av, shape = in_avals[0], attrs["shape"]
    lead = len(shape) - av.ndim
    local = lambda j: {"shape": _sharding.with_axis(shape, j, n)}  # noqa: E731
    out = _sharding.axis_map(av, out_aval, n, [(i, i + lead) for i in range(av.ndim) if av.shape[i] == shape[i + lead]],
                             local)
    # a replicated operand broadcast along an axis the output splits: each rank broadcasts to its block
    out += [_sharding.Strategy((_sharding.R,), _sharding.S(j), local(j)) for j in range(len(shape))
            if _sharding.splittable(shape[j], n) and (j < lead or av.shape[j - lead] == 1)]
    return out


broadcast_to_p.shard = _broadcast_shard


def _squeeze_rule(avals, attrs, weak):
    av = avals[0]
    axes = _norm_axes(attrs["axes"], av.ndim)
    for a in axes:
        if av.shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {av.shape[a]}")
    return ShapedArray(tuple(s for i, s in enumerate(av.shape) if i not in axes), av.dtype)


squeeze_p = _define(
    "squeeze",
    _squeeze_rule,
    lambda x, axes: np.squeeze(x, axis=tuple(axes)),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({oa.shape!r})"),
    transpose=lambda need, ct, out, x, axes: (reshape(ct, shape_of(x)),),
    linearity="first",
    batch=lambda prim, vals, batched, size, axes: bind(prim, vals[0], axes=shift_axes(axes, len(shape_of(vals[0])) - 1)),
    cuda=lambda e, lib: _reshape_view(e, lib),
)


def _squeeze_shard(in_avals, attrs, out_aval, n):
    axes = _norm_axes(attrs["axes"], in_avals[0].ndim)
    kept = [i for i in range(in_avals[0].ndim) if i not in axes]
    return _sharding.axis_map(in_avals[0], out_aval, n, [(i, j) for j, i in enumerate(kept)])


squeeze_p.shard = _squeeze_shard


def _expand_dims_rule(avals, attrs, weak):
    av = avals[0]
    n = av.ndim + len(attrs["axes"])
    axes = _norm_axes(attrs["axes"], n)
    it = iter(av.shape)
    return ShapedArray(tuple(1 if i in axes else next(it) for i in range(n)), av.dtype)


expand_dims_p = _define(
    "expand_dims",
    _expand_dims_rule,
    lambda x, axes: np.expand_dims(x, tuple(axes)),
    lambda ctx, ins, attrs, ia, oa: expr(f"{ins[0]}.reshape({oa.shape!r})"),
    transpose=lambda need, ct, out, x, axes: (reshape(ct, shape_of(x)),),
    linearity="first",
    batch=lambda prim, vals, batched, size, axes: bind(prim, vals[0], axes=shift_axes(axes, len(shape_of(vals[0])) - 1 + len(axes))),
    cuda=lambda e, lib: _reshape_view(e, lib),
)


def _expand_dims_shard(in_avals, attrs, out_aval, n):
    axes = _norm_axes(attrs["axes"], out_aval.ndim)
    kept = [j for j in range(out_aval.ndim) if j not in axes]
    return _sharding.axis_map(in_avals[0], out_aval, n, list(enumerate(kept)))


expand_dims_p.shard = _expand_dims_shard


# ---------------------------------------------------------------------------- slice / pad


def _slice_rule(avals, attrs, weak):
    av = avals[0]
    starts, limits, strides = attrs["starts"], attrs["limits"], attrs["strides"]
    if not (len(starts) == len(limits) == len(strides) == av.ndim):
        raise ShapeError(f"slice needs one start/limit/stride per axis of {av.shape}")
    shape = []
    for s, lo, hi, st in zip(av.shape, starts, limits, strides):
        if not (0 <= lo <= hi <= s) or st < 1:
            raise ShapeError(f"slice [{lo}:{hi}:{st}] is out of bounds for an axis of size {s}")
        shape.append(max(0, (hi - lo + st - 1) // st))
    return ShapedArray(tuple(shape), av.dtype)


def _slices(starts, limits, strides):
    return tuple(slice(a, b, c) for a, b, c in zip(starts, limits, strides))


def _slice_impl(x, starts, limits, strides):
    return x[_slices(starts, limits, strides)]


def _slice_emit(ctx, ins, attrs, in_avals, out_aval):
    name = ctx.const(_slices(attrs["starts"], attrs["limits"], attrs["strides"]))
    return expr(f"{ins[0]}[{name}]")


def _slice_transpose(need, ct, out, x, starts, limits, strides):
    shape = shape_of(x)
    lows = tuple(starts)
    interior = tuple(s - 1 for s in strides)
    n_out = shape_of(ct)
    highs = tuple(dim - (lo + (n - 1) * st + 1) if n > 0 else dim - lo for dim, lo, n, st in zip(shape, lows, n_out, strides))
    return (bind(pad_p, ct, low=lows, high=highs, interior=interior),)


def _slice_cuda(e, lib):
    sl = tuple(slice(s, l, st) for s, l, st in zip(e.attrs["starts"], e.attrs["limits"], e.attrs["strides"]))
    return lib.view(lambda xp, x: x[sl], e)


slice_p = _define(
    "slice", _slice_rule, _slice_impl, _slice_emit, transpose=_slice_transpose, linearity="first",
    batch=lambda prim, vals, batched, size, starts, limits, strides: bind(
        prim, vals[0], starts=(0,) + tuple(starts), limits=(size,) + tuple(limits), strides=(1,) + tuple(strides)
    ),
    cuda=_slice_cuda,
)


def _slice_shard(in_avals, attrs, out_aval, n):
    # an axis taken whole (start 0, stride 1, to the end) can stay split; its local limit is the block size
    shape = in_avals[0].shape
    whole = [i for i in range(len(shape))
             if attrs["starts"][i] == 0 and attrs["limits"][i] == shape[i] and attrs["strides"][i] == 1]
    return _sharding.axis_map(in_avals[0], out_aval, n, [(i, i) for i in whole],
                              lambda j: {**attrs, "limits": _sharding.with_axis(attrs["limits"], j, n)})


slice_p.shard = _slice_shard


def _pad_rule(avals, attrs, weak):
    av = avals[0]
    low, high, interior = attrs["low"], attrs["high"], attrs["interior"]
    if not (len(low) == len(high) == len(interior) == av.ndim):
        raise ShapeError(f"pad needs low/high/interior for each axis of {av.shape}")
    if min(low + high + interior, default=0) < 0:
        raise ShapeError("pad amounts must be non-negative")
    shape = tuple(lo + hi + s + max(0, s - 1) * it for s, lo, hi, it in zip(av.shape, low, high, interior))
    return ShapedArray(shape, av.dtype)


def _pad_index(in_shape, low, interior):
    return tuple(slice(lo, lo + max(0, s - 1) * (it + 1) + 1, it + 1) for s, lo, it in zip(in_shape, low, interior))


def _pad_impl(x, low, high, interior):
    shape = _pad_rule([ShapedArray(x.shape, x.dtype)], dict(low=low, high=high, interior=interior), [False]).shape
    out = np.zeros(shape, x.dtype)
    out[_pad_index(x.shape, low, interior)] = x
    return out


def _pad_emit(ctx, ins, attrs, in_avals, out_aval):
    name = ctx.const(_pad_index(in_avals[0].shape, attrs["low"], attrs["interior"]))
    return stmt(f"{{o}}.fill(0); {{o}}[{name}] = {ins[0]}")


def _pad_transpose(need, ct, out, x, low, high, interior):
    shape = shape_of(x)
    starts = tuple(low)
    strides = tuple(i + 1 for i in interior)
    limits = tuple(lo + max(0, s - 1) * st + 1 if s > 0 else lo for s, lo, st in zip(shape, starts, strides))
    return (bind(slice_p, ct, starts=starts, limits=limits, strides=strides),)


def _pad_xp(xp, ins, attrs, out):
    out.fill(0)
    out[tuple(slice(lo, lo + max(0, s - 1) * (it + 1) + 1, it + 1) for s, lo, it in zip(ins[0].shape, attrs["low"], attrs["interior"]))] = ins[0]


pad_p = _define(
    "pad", _pad_rule, _pad_impl, _pad_emit, transpose=_pad_transpose, linearity="first",
    batch=lambda prim, vals, batched, size, low, high, interior: bind(
        prim, vals[0], low=(0,) + tuple(low), high=(0,) + tuple(high), interior=(0,) + tuple(interior)
    ),
    cuda=lambda e, lib: lib.xp(_pad_xp, e),
)


# ---------------------------------------------------------------------------- concatenate / stack


def _concat_rule(avals, attrs, weak):
    if not avals:
        raise ShapeError("nothing to concatenate")
    nd = avals[0].ndim
    (axis,) = _norm_axes((attrs["axis"],), nd)
    for a in avals:
        if a.ndim != nd or any(s != t for i, (s, t) in enumerate(zip(a.shape, avals[0].shape)) if i != axis):
            raise ShapeError(f"all shapes must agree except along axis {axis}: {[x.shape for x in avals]}")
    shape = list(avals[0].shape)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return ShapedArray(tuple(shape), promote(avals, weak))


def _concat_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.concatenate(({', '.join(ins)},), axis={attrs['axis']}, out={{o}})")


def _concat_transpose(need, ct, out, *xs, axis):
    nd = len(shape_of(ct))
    axis = axis % nd
    res = []
    off = 0
    cshape = shape_of(ct)
    for x, nd_ in zip(xs, need):
        n = shape_of(x)[axis]
        if nd_:
            starts = tuple(off if i == axis else 0 for i in range(nd))
            limits = tuple(off + n if i == axis else cshape[i] for i in range(nd))
            res.append(bind(slice_p, ct, starts=starts, limits=limits, strides=(1,) * nd))
        else:
            res.append(None)
        off += n
    return tuple(res)


def _join_batch(prim, vals, batched, size, axis):
    """concatenate/stack: every operand batched, the joined axis shifted past the batch axis."""
    vals = all_batched(vals, batched, size)
    nd = len(shape_of(vals[0])) - 1 + (1 if prim.name == "stack" else 0)
    return bind(prim, *vals, axis=(int(axis) % nd) + 1)


concatenate_p = _define(
    "concatenate", _concat_rule, lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_emit,
    transpose=_concat_transpose, linearity="joint",
    batch=_join_batch,
    cuda=lambda e, lib: lib.xp(lambda xp, ins, attrs, out: xp.concatenate(ins, axis=attrs["axis"], out=out), e),
)


def _concat_shard(in_avals, attrs, out_aval, n):
    k, nd = len(in_avals), out_aval.ndim
    (axis,) = _norm_axes((attrs["axis"],), nd)
    R, S = _sharding.R, _sharding.S
    return [_sharding.Strategy((R,) * k, R)] + [
        _sharding.Strategy((S(j),) * k, S(j)) for j in range(nd) if j != axis and _sharding.splittable(out_aval.shape[j], n)
    ] + [_sharding.Strategy((_sharding.PSUM,) * k, _sharding.PSUM)]


concatenate_p.shard = _concat_shard


def _stack_rule(avals, attrs, weak):
    if not avals:
        raise ShapeError("nothing to stack")
    for a in avals:
        if a.shape != avals[0].shape:
            raise ShapeError(f"all shapes must be equal: {[x.shape for x in avals]}")
    nd = avals[0].ndim + 1
    (axis,) = _norm_axes((attrs["axis"],), nd)
    shape = list(avals[0].shape)
    shape.insert(axis, len(avals))
    return ShapedArray(tuple(shape), promote(avals, weak))


def _stack_emit(ctx, ins, attrs, in_avals, out_aval):
    return stmt(f"np.stack(({', '.join(ins)},), axis={attrs['axis']}, out={{o}})")


def _stack_transpose(need, ct, out, *xs, axis):
    cshape = shape_of(ct)
    nd = len(cshape)
    axis = axis % nd
    res = []
    for i, nd_ in enumerate(need):
        if not nd_:
            res.append(None)
            continue
        starts = tuple(i if a == axis else 0 for a in range(nd))
        limits = tuple(i + 1 if a == axis else cshape[a] for a in range(nd))
        s = bind(slice_p, ct, starts=starts, limits=limits, strides=(1,) * nd)
        res.append(reshape(s, shape_of(xs[i])))
    return tuple(res)


stack_p = _define(
    "stack", _stack_rule, lambda *xs, axis: np.stack(xs, axis=axis), _stack_emit, transpose=_stack_transpose, linearity="joint",
    batch=_join_batch,
    cuda=lambda e, lib: lib.xp(lambda xp, ins, attrs, out: xp.stack(ins, axis=attrs["axis"], out=out), e),
)


for _p in (transpose_p, reshape_p, squeeze_p, expand_dims_p, slice_p):
    _p.traits = frozenset({"view"})
broadcast_to_p.traits = frozenset({"view", "fusible"})
