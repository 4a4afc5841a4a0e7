"""The C window kernels (``_native.windows``: im2col, col2im, max pooling and its gradient) against the numpy
kernels they replace (``FEDARENA_NATIVE=0``) and against PyTorch, over strides, padding, dilation, bias rows,
ties and NaN; and the max-pooling gradient primitive's own derivatives (double backward vs PyTorch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.core import cext
from fedarena.engine.primitives.conv import BiasRow, Col2Im, Im2Col
from fedarena.engine.primitives.pooling import MaxPoolGrad, PoolKernel

pytestmark = pytest.mark.skipif(not cext.available(), reason="the C extension is not built")

GEOMETRIES = [  # x shape, kernel, stride, padding, dilation
    ((2, 3, 7, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 2, 8, 9), (3, 2), (2, 3), (1, 2), (1, 1)),
    ((1, 3, 9, 9), (2, 3), (1, 2), (2, 0), (2, 2)),
    ((3, 4, 4, 4), (3, 3), (1, 1), (1, 1), (1, 1)),
]
POOLS = [((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)), ((2, 2, 7, 9), (3, 2), (2, 1), (1, 1)), ((1, 2, 5, 6), (2, 3), (3, 2), (1, 1))]


def _numpy_kernel(monkeypatch, make):
    monkeypatch.setenv("FEDARENA_NATIVE", "0")
    k = make()
    monkeypatch.delenv("FEDARENA_NATIVE")
    return k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=range(len(GEOMETRIES)))
@pytest.mark.parametrize("bias", [None, 1.0])
def test_im2col_and_col2im_match_the_numpy_kernels(monkeypatch, geo, dtype, bias):
    shape, kernel, stride, padding, dilation = geo
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)

    def im2col():
        k = Im2Col(shape, dtype, kernel, stride, padding, dilation, pad_value=0.5)
        return k if bias is None else BiasRow(k, bias)

    def col2im():
        k = Col2Im(shape, dtype, kernel, stride, padding, dilation)
        return k if bias is None else BiasRow(k)

    fast, slow = im2col(), _numpy_kernel(monkeypatch, im2col)
    assert (fast.kernel if bias else fast).native.on and not (slow.kernel if bias else slow).native.on
    base = fast.kernel if bias else fast
    cols_shape = (shape[0], base.rows + (bias is not None), base.oh * base.ow)
    a, b = np.full(cols_shape, np.nan, dtype), np.full(cols_shape, np.nan, dtype)
    fast(x, a)
    slow(x, b)
    np.testing.assert_array_equal(a, b)  # copies: bitwise
    cols = rng.standard_normal(cols_shape).astype(dtype)
    g1, g2 = np.full(shape, np.nan, dtype), np.full(shape, np.nan, dtype)
    col2im()(cols, g1)
    _numpy_kernel(monkeypatch, col2im)(cols, g2)
    np.testing.assert_allclose(g1, g2, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pool", POOLS, ids=range(len(POOLS)))
def test_max_pool_and_its_gradient_match_numpy_with_ties_and_nan(monkeypatch, pool, dtype):
    shape, kernel, stride, padding = pool
    rng = np.random.default_rng(1)
    x = np.round(rng.standard_normal(shape) * 2).astype(dtype)  # many ties
    x[0, 0, 0, 0] = np.nan  # in the first window of every geometry here
    fast = PoolKernel(shape, dtype, kernel, stride, padding, "max")
    slow = _numpy_kernel(monkeypatch, lambda: PoolKernel(shape, dtype, kernel, stride, padding, "max"))
    out_shape = shape[:2] + (fast.im2col.oh, fast.im2col.ow)
    a, b = np.empty(out_shape, dtype), np.empty(out_shape, dtype)
    fast(x, a)
    slow(x, b)
    np.testing.assert_array_equal(a, b)  # NaN where a window holds one, as numpy's maximum
    assert np.isnan(a).any()
    ct = rng.standard_normal(out_shape).astype(dtype)
    g1, g2 = np.empty(shape, dtype), np.empty(shape, dtype)
    MaxPoolGrad(shape, dtype, kernel, stride, padding)(x, a, ct, g1)
    _numpy_kernel(monkeypatch, lambda: MaxPoolGrad(shape, dtype, kernel, stride, padding))(x, a, ct, g2)
    np.testing.assert_allclose(g1, g2, rtol=1e-6, atol=1e-6)
    # ties split the window's gradient evenly: every window's gradient is passed on in full (NaN ones: none)
    fin = ~np.isnan(a)
    assert np.isclose(g1.sum(), ct[fin].sum(), rtol=1e-5)


def test_non_contiguous_operands_take_the_numpy_path():
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).transpose(0, 1, 3, 2)
    k = PoolKernel(x.shape, np.float64, (2, 2), (2, 2), (0, 0), "max")
    out = np.empty((2, 3, 4, 4))
    k(x, out)
    ref = torch.nn.functional.max_pool2d(torch.tensor(np.ascontiguousarray(x)), 2).numpy()
    np.testing.assert_array_equal(out, ref)


def test_digits_cnn_gradient_matches_torch_and_double_backward_through_max_pool():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 1, 8, 8))
    w1, b1 = rng.standard_normal((6, 1, 3, 3)) * 0.5, rng.standard_normal(6) * 0.1
    w2 = rng.standard_normal((5, 6, 3, 3)) * 0.3

    def net(x, w1, b1, w2):
        h = ops.max_pool2d(ops.relu(ops.conv2d(x, w1, padding=1, bias=b1)), 2)
        return ops.max_pool2d(ops.relu(ops.conv2d(h, w2, padding=1)), 2)

    def tnet(x, w1, b1, w2):
        F = torch.nn.functional
        h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
        return F.max_pool2d(F.relu(F.conv2d(h, w2, padding=1)), 2)

    def loss(x, w1, b1, w2):  # a gradient norm: the second derivative flows through max_pool2d_grad
        g = engine.grad(lambda x: ops.sum(ops.square(net(x, w1, b1, w2))))(x)
        return ops.sum(ops.square(g))

    ours = engine.jit(engine.grad(loss, argnums=(1, 2, 3)))(x, w1, b1, w2)
    t = [torch.tensor(a, requires_grad=True) for a in (x, w1, b1, w2)]
    (gx,) = torch.autograd.grad((tnet(*t) ** 2).sum(), t[0], create_graph=True)
    ref = torch.autograd.grad((gx**2).sum(), t[1:])
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(a, r.numpy(), rtol=1e-9, atol=1e-11)
