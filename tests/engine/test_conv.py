"""conv2d kernels: the plain and phase-plane im2col/col2im against PyTorch's conv2d and its
gradients over strides, paddings, dilations and channel counts, and the phase-plane kernels
checked directly (they equal the plain columns at the real positions; col2im is their adjoint)."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine import primitives as P

# (N, C, H, W), (O, KH, KW), stride, padding, dilation
GEOMETRIES = [
    ((3, 2, 9, 9), (4, 3, 3), (2, 2), (1, 1), (1, 1)),
    ((2, 8, 28, 28), (16, 3, 3), (2, 2), (1, 1), (1, 1)),
    ((2, 3, 11, 10), (5, 3, 2), (2, 3), (1, 2), (1, 1)),
    ((2, 3, 13, 12), (2, 3, 3), (3, 2), (0, 1), (2, 1)),
    ((2, 2, 7, 8), (3, 2, 2), (1, 2), (1, 0), (1, 2)),
    ((1, 1, 12, 12), (2, 5, 5), (4, 4), (2, 2), (1, 1)),
    ((2, 4, 10, 10), (3, 1, 1), (2, 2), (0, 0), (1, 1)),
    ((2, 3, 8, 9), (4, 4, 4), (2, 2), (1, 1), (1, 1)),
    ((2, 2, 7, 6), (3, 3, 3), (2, 2), (1, 1), (1, 1)),  # phase planes too wasteful: plain columns
    ((2, 3, 9, 8), (4, 3, 3), (1, 1), (1, 1), (1, 1)),  # stride 1: plain columns
    ((1, 2, 9, 10), (2, 3, 2), (1, 1), (2, 1), (2, 3)),
]
IDS = [f"x{g[0]}_k{g[1]}_s{g[2]}_p{g[3]}_d{g[4]}" for g in GEOMETRIES]


def _phased(x_shape, kernel, stride, padding, dilation) -> bool:
    n, c, h, w = x_shape
    oh, ow = P.conv_out_size(h, kernel[0], stride[0], padding[0], dilation[0]), P.conv_out_size(w, kernel[1], stride[1], padding[1], dilation[1])
    hq, wq = -(-(h + 2 * padding[0]) // stride[0]), -(-(w + 2 * padding[1]) // stride[1])
    return stride != (1, 1) and hq * wq <= ops.PHASED_MAX_OVERHEAD * oh * ow


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)], ids=["float64", "float32"])
@pytest.mark.parametrize("geom", GEOMETRIES, ids=IDS)
def test_conv2d_and_gradients_match_torch(geom, dtype, tol):
    torch = pytest.importorskip("torch")
    x_shape, (o, kh, kw), stride, padding, dilation = geom
    rng = np.random.default_rng(sum(x_shape) + o * kh * kw)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((o, x_shape[1], kh, kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=padding, dilation=dilation)
    ct = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.tensor(ct))

    def loss(x, w, b):
        y = ops.conv2d(x, w, stride, padding, dilation, bias=b)
        return ops.sum(ops.multiply(y, ct)), y

    step = engine.jit(engine.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    for _ in range(2):  # the second call runs on reused buffers
        (_, y), (gx, gw, gb) = step(x, w, b)
        scale = lambda a: np.abs(a).max() + 1  # noqa: E731
        assert np.abs(y - ty.detach().numpy()).max() <= tol * scale(y)
        assert np.abs(gx - tx.grad.numpy()).max() <= tol * scale(gx)
        assert np.abs(gw - tw.grad.numpy()).max() <= tol * scale(gw)
        assert np.abs(gb - tb.grad.numpy()).max() <= tol * scale(gb)
    # without bias, eagerly (kernels called through the primitives' impl)
    (_, y0), (gx0, gw0) = engine.value_and_grad(lambda x, w: loss(x, w, None), argnums=(0, 1), has_aux=True)(x, w)
    tb_y = ty.detach().numpy() - b.reshape(1, -1, 1, 1)
    assert np.abs(y0 - tb_y).max() <= tol * scale(y0)
    assert np.abs(gx0 - tx.grad.numpy()).max() <= tol * scale(gx0)
    assert np.abs(gw0 - tw.grad.numpy()).max() <= tol * scale(gw0)
    # the path taken is the one the geometry asks for; the bias rides in the GEMM
    eqns = step.graph(x, w, b).eqns
    names = [e.prim.name for e in eqns]
    im2col = next(e.attrs for e in eqns if e.prim.name == "im2col")
    assert im2col["bias_row"] == 1.0
    if _phased(x_shape, (kh, kw), stride, padding, dilation):
        assert im2col["phased"] and "conv_gemm" in names and "conv_input_grad" in names and "col2im" not in names
    else:
        assert not im2col.get("phased") and "col2im" in names and "conv_input_grad" not in names


@pytest.mark.parametrize("geom", [g for g in GEOMETRIES if g[2] != (1, 1)], ids=[i for g, i in zip(GEOMETRIES, IDS) if g[2] != (1, 1)])
def test_phase_kernels_equal_plain_columns_and_are_adjoint(geom):
    x_shape, (_, kh, kw), stride, padding, dilation = geom
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape)
    plain = P.Im2Col(x_shape, np.float64, (kh, kw), stride, padding, dilation)
    phase = P.PhaseIm2Col(x_shape, np.float64, (kh, kw), stride, padding, dilation)
    oh, ow = plain.oh, plain.ow
    want = plain(x, np.empty(plain.cols_shape)).reshape(x_shape[0], -1, oh, ow)
    for _ in range(2):
        got = phase(x, np.full(phase.cols_shape, np.nan)).reshape(x_shape[0], -1, phase.hq, phase.wq)
        np.testing.assert_array_equal(got[..., :oh, :ow], want)
        assert np.isfinite(got).all()
    # col2im is the adjoint of im2col on columns that are zero at the padding positions
    c = np.zeros(phase.cols_shape).reshape(got.shape)
    c[..., :oh, :ow] = rng.standard_normal(want.shape)
    c = c.reshape(phase.cols_shape)
    col2im = P.PhaseCol2Im(x_shape, np.float64, (kh, kw), stride, padding, dilation)
    for _ in range(2):
        back = col2im(c, np.full(x_shape, np.nan))
        np.testing.assert_allclose(np.vdot(back, x), np.vdot(c, phase(x, np.empty(phase.cols_shape))), rtol=1e-12)
        plain_back = P.Col2Im(x_shape, np.float64, (kh, kw), stride, padding, dilation)(
            np.ascontiguousarray(c.reshape(got.shape)[..., :oh, :ow]).reshape(plain.cols_shape), np.empty(x_shape)
        )
        np.testing.assert_allclose(back, plain_back, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride", [1, 2], ids=["plain", "phased"])
def test_conv_with_bias_jvp_matches_torch(stride):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 3, 9, 9)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    tx, tw, tb = rng.standard_normal(x.shape), rng.standard_normal(w.shape), rng.standard_normal(b.shape)
    for fn in (lambda a, c, d: ops.conv2d(a, c, stride, 1, bias=d), engine.jit(lambda a, c, d: ops.conv2d(a, c, stride, 1, bias=d))):
        out, t_out = engine.jvp(fn, (x, w, b), (tx, tw, tb))
        conv = lambda a, c, d: torch.nn.functional.conv2d(torch.tensor(a), torch.tensor(c), torch.tensor(d), stride=stride, padding=1).numpy()  # noqa: E731
        np.testing.assert_allclose(out, conv(x, w, b), rtol=1e-10, atol=1e-10)
        want = conv(tx, w, tb) + conv(x, tw, np.zeros_like(b))  # bilinear in (x, w), linear in b
        np.testing.assert_allclose(t_out, want, rtol=1e-10, atol=1e-10)


def test_conv_bias_shape_is_checked():
    with pytest.raises(Exception, match="bias"):
        ops.conv2d(np.zeros((1, 2, 5, 5)), np.zeros((3, 2, 3, 3)), bias=np.zeros(2))


@pytest.mark.parametrize("stride", [1, 2], ids=["plain", "phased"])
def test_vmap_of_conv_with_bias_and_its_gradient(stride):
    rng = np.random.default_rng(5)
    xs, w, b = rng.standard_normal((3, 2, 2, 9, 9)), rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4)

    def f(x, w, b):
        return ops.sum(ops.tanh(ops.conv2d(x, w, stride, 1, bias=b)))

    g = engine.grad(f, argnums=(0, 1, 2))
    got = engine.vmap(g, in_axes=(0, None, None))(xs, w, b)
    for i in range(3):
        want = g(xs[i], w, b)
        for a, e in zip(got, want):
            np.testing.assert_allclose(a[i], e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 2e-2)], ids=["float64", "float32", "float16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("geom", [g for g in GEOMETRIES if g[2] != (1, 1)][:4], ids=[i for g, i in zip(GEOMETRIES, IDS) if g[2] != (1, 1)][:4])
def test_conv_input_grad_kernel_equals_col2im_of_the_gemm(geom, bias, dtype, tol):
    """ConvInputGrad (BLAS gemm accumulating in place; a matmul + add fallback for other dtypes)
    against the two-step col2im(W2^T @ ct)."""
    x_shape, (o, kh, kw), stride, padding, dilation = geom
    rng = np.random.default_rng(11)
    k = P.ConvInputGrad(x_shape, dtype, (kh, kw), stride, padding, dilation, o)
    assert (k.gemm is None) == (dtype == np.float16)
    ct = np.zeros((x_shape[0], o, k.hq, k.wq))
    ct[..., : k.oh, : k.ow] = rng.standard_normal((x_shape[0], o, k.oh, k.ow))
    ct = ct.reshape(x_shape[0], o, -1)
    w2 = rng.standard_normal((o, kh * kw * x_shape[1] + bias))
    want = P.PhaseCol2Im(x_shape, np.float64, (kh, kw), stride, padding, dilation)(w2[:, : kh * kw * x_shape[1]].T @ ct, np.empty(x_shape))
    for _ in range(2):
        got = k(ct.astype(dtype), w2.astype(dtype), np.full(x_shape, np.nan, dtype))
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_second_order_through_a_phased_conv_matches_finite_differences():
    """hvp differentiates conv_input_grad (the first-order input gradient) once more."""
    rng = np.random.default_rng(2)
    args = (rng.standard_normal((2, 2, 9, 9)), rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3))
    vecs = tuple(rng.standard_normal(a.shape) for a in args)

    def f(x, w, b):
        return ops.sum(ops.tanh(ops.conv2d(x, w, 2, 1, bias=b)) ** 2)

    got = engine.hvp(f, args, vecs)
    g = engine.grad(f, argnums=(0, 1, 2))
    eps = 1e-5
    plus = g(*(a + eps * v for a, v in zip(args, vecs)))
    minus = g(*(a - eps * v for a, v in zip(args, vecs)))
    for h, gp, gm in zip(got, plus, minus):
        np.testing.assert_allclose(h, (gp - gm) / (2 * eps), rtol=1e-5, atol=1e-7)
    assert "conv_input_grad" in [e.prim.name for e in engine.jit(g).graph(*args).eqns]


@pytest.mark.parametrize("stride", [1, 2], ids=["plain", "phased"])
def test_vmap_over_weights_of_conv_and_its_input_gradient(stride):
    """Per-example weights: conv_gemm/conv_input_grad batch with the weights batched too."""
    rng = np.random.default_rng(6)
    x, ws, b = rng.standard_normal((2, 2, 9, 9)), rng.standard_normal((3, 4, 2, 3, 3)), rng.standard_normal(4)

    def f(w, x):
        return ops.sum(ops.tanh(ops.conv2d(x, w, stride, 1, bias=b)))

    gx = engine.grad(f, argnums=1)
    got = engine.vmap(gx, in_axes=(0, None))(ws, x)
    got_y = engine.vmap(lambda w: ops.conv2d(x, w, stride, 1, bias=b))(ws)
    for i in range(3):
        np.testing.assert_allclose(got[i], gx(ws[i], x), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got_y[i], ops.conv2d(x, ws[i], stride, 1, bias=b), rtol=1e-12, atol=1e-12)
