"""Gathers and scatters along an axis on the compiled path: the flat-position kernels used from
1024 index elements (primitives.FlatIndex) against numpy, including negative indices (which wrap,
as in numpy) and out-of-range ones (which raise), and the gradient (a scatter) against np.add.at."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops

CASES = [((256, 16, 4), 2, (256, 16, 1)), ((64, 40), 0, (30, 40)), ((50, 30, 7), 1, (50, 2, 7)), ((2048, 3), 1, (2048, 1))]


def _add_at_reference(shape, idx, axis, values):
    out = np.zeros(shape)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    np.add.at(out, tuple(grid), values)
    return out


@pytest.mark.parametrize("shape, axis, ishape", CASES)
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_take_along_axis_matches_numpy(shape, axis, ishape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    idx = rng.integers(0, shape[axis], ishape).astype(dtype)
    f = engine.jit(lambda x, i: ops.take_along_axis(x, i, axis=axis))
    np.testing.assert_array_equal(f(x, idx), np.take_along_axis(x, idx, axis=axis))
    wrapped = idx.copy()
    wrapped.flat[3] = -1  # numpy's negative index: the last element along the axis
    np.testing.assert_array_equal(f(x, wrapped), np.take_along_axis(x, wrapped, axis=axis))
    bad = idx.copy()
    bad.flat[5] = shape[axis]
    with pytest.raises(IndexError):
        f(x, bad)


@pytest.mark.parametrize("shape, axis, ishape", CASES)
def test_gradient_of_take_along_axis_is_the_scatter(shape, axis, ishape):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape)
    w = rng.standard_normal(ishape)
    idx = rng.integers(0, shape[axis], ishape)
    g = engine.jit(engine.grad(lambda x, i: ops.sum(ops.take_along_axis(x, i, axis=axis) * w)))
    expect = _add_at_reference(shape, idx, axis, w)
    if ishape[axis] == 1:  # one index per position (the flat scatter): also with a wrapped index
        np.testing.assert_allclose(g(x, idx), expect, rtol=1e-15)
        wrapped = idx.copy()
        wrapped.flat[7] = -2
        np.testing.assert_allclose(g(x, wrapped), _add_at_reference(shape, wrapped % shape[axis], axis, w), rtol=1e-15)
    else:  # duplicates possible: accumulated
        np.testing.assert_allclose(g(x, idx), expect, rtol=1e-12)
