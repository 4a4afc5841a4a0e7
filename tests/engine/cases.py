"""Table of differentiable operations used by the finite-difference and PyTorch tests.

Each case: name, our function (engine ops), the same function written with torch (or None),
and a builder of float64 inputs (values kept away from kinks: |x| > 0.1, no ties).
"""

from __future__ import annotations

import numpy as np

from fedarena import engine
from fedarena.engine import ops


def _r(rng, *shape, lo=None, hi=None, away=0.1):
    if lo is not None:
        return rng.uniform(lo, hi, size=shape)
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < away, np.sign(x + 1e-12) * away + x, x)


def _pos(rng, *shape):
    return rng.uniform(0.5, 2.0, size=shape)


def _distinct(rng, *shape):
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) * 0.37 - n * 0.15 + rng.uniform(0, 0.05, size=shape))


IDX = np.array([[2], [0], [3]])
TAKE_IDX = np.array([1, 0, 1, 2])

CASES = [
    # name, ours, torch_fn, inputs(rng)
    ("neg", lambda x: -x, lambda x: -x, lambda r: [_r(r, 3, 4)]),
    ("exp", ops.exp, lambda x: x.exp(), lambda r: [_r(r, 3, 4)]),
    ("log", ops.log, lambda x: x.log(), lambda r: [_pos(r, 3, 4)]),
    ("log1p", ops.log1p, lambda x: x.log1p(), lambda r: [_pos(r, 3, 4)]),
    ("tanh", ops.tanh, lambda x: x.tanh(), lambda r: [_r(r, 3, 4)]),
    ("sigmoid", ops.sigmoid, lambda x: x.sigmoid(), lambda r: [_r(r, 3, 4)]),
    ("sqrt", ops.sqrt, lambda x: x.sqrt(), lambda r: [_pos(r, 3, 4)]),
    ("rsqrt", ops.rsqrt, lambda x: x.rsqrt(), lambda r: [_pos(r, 3, 4)]),
    ("abs", ops.abs, lambda x: x.abs(), lambda r: [_r(r, 3, 4)]),
    ("sin", ops.sin, lambda x: x.sin(), lambda r: [_r(r, 3, 4)]),
    ("cos", ops.cos, lambda x: x.cos(), lambda r: [_r(r, 3, 4)]),
    ("relu", ops.relu, lambda x: x.relu(), lambda r: [_r(r, 3, 4)]),
    ("softplus", ops.softplus, lambda x: __import__("torch").nn.functional.softplus(x), lambda r: [_r(r, 3, 4)]),
    ("add_bcast", lambda x, y: x + y, lambda x, y: x + y, lambda r: [_r(r, 3, 4), _r(r, 4)]),
    ("sub_bcast", lambda x, y: x - y, lambda x, y: x - y, lambda r: [_r(r, 3, 1), _r(r, 1, 4)]),
    ("mul_bcast", lambda x, y: x * y, lambda x, y: x * y, lambda r: [_r(r, 2, 3, 4), _r(r, 3, 1)]),
    ("div_bcast", lambda x, y: x / y, lambda x, y: x / y, lambda r: [_r(r, 3, 4), _pos(r, 4)]),
    ("pow_arrays", lambda x, y: x**y, lambda x, y: x**y, lambda r: [_pos(r, 3, 4), _r(r, 3, 4)]),
    ("pow_scalar", lambda x: x**3, lambda x: x**3, lambda r: [_r(r, 3, 4)]),
    ("square", ops.square, lambda x: x * x, lambda r: [_r(r, 3, 4)]),
    ("maximum", ops.maximum, lambda x, y: __import__("torch").maximum(x, y), lambda r: [_distinct(r, 3, 4), _distinct(r, 4) + 0.011]),
    ("minimum", ops.minimum, lambda x, y: __import__("torch").minimum(x, y), lambda r: [_distinct(r, 3, 4), _distinct(r, 4) + 0.011]),
    (
        "where",
        lambda x, y: ops.where(x > 0, x, y),
        lambda x, y: __import__("torch").where(x > 0, x, y),
        lambda r: [_r(r, 3, 4), _r(r, 4)],
    ),
    ("clip", lambda x: ops.clip(x, -0.5, 0.7), lambda x: x.clamp(-0.5, 0.7), lambda r: [_r(r, 4, 5) * 0.9 + 0.013]),
    ("sum_axis", lambda x: ops.sum(x, axis=1), lambda x: x.sum(1), lambda r: [_r(r, 3, 4, 2)]),
    ("sum_keepdims", lambda x: ops.sum(x, axis=(0, 2), keepdims=True), lambda x: x.sum((0, 2), keepdim=True), lambda r: [_r(r, 3, 4, 2)]),
    ("sum_all", ops.sum, lambda x: x.sum(), lambda r: [_r(r, 3, 4)]),
    ("mean_axis", lambda x: ops.mean(x, axis=0), lambda x: x.mean(0), lambda r: [_r(r, 3, 4)]),
    ("max_axis", lambda x: ops.max(x, axis=1), lambda x: x.max(1).values, lambda r: [_distinct(r, 3, 5)]),
    ("min_keepdims", lambda x: ops.min(x, axis=0, keepdims=True), lambda x: x.min(0, keepdim=True).values, lambda r: [_distinct(r, 3, 5)]),
    ("max_unit_dims", lambda x: ops.max(x * 1.0, axis=(0, 2), keepdims=True), lambda x: (x * 1.0).amax((0, 2), keepdim=True), lambda r: [_distinct(r, 1, 3, 4)]),
    ("sum_unit_dims", lambda x: ops.sum(x * 2.0, axis=(1, 2)), lambda x: (x * 2.0).sum((1, 2)), lambda r: [_r(r, 3, 1, 4)]),
    ("min_unit_only", lambda x: ops.min(x * 1.0, axis=1), lambda x: (x * 1.0).amin(1), lambda r: [_r(r, 3, 1, 4)]),
    ("var", lambda x: ops.var(x, axis=1), lambda x: x.var(1, unbiased=False), lambda r: [_r(r, 3, 5)]),
    ("matmul_2d", ops.matmul, lambda x, y: x @ y, lambda r: [_r(r, 3, 4), _r(r, 4, 5)]),
    ("matmul_batched", ops.matmul, lambda x, y: x @ y, lambda r: [_r(r, 2, 3, 4), _r(r, 4, 5)]),
    ("matmul_bcast_batch", ops.matmul, lambda x, y: x @ y, lambda r: [_r(r, 3, 4), _r(r, 2, 4, 5)]),
    ("matmul_vec", ops.matmul, lambda x, y: x @ y, lambda r: [_r(r, 4), _r(r, 4, 5)]),
    ("matmul_matvec", ops.matmul, lambda x, y: x @ y, lambda r: [_r(r, 3, 4), _r(r, 4)]),
    ("transpose", lambda x: ops.transpose(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), lambda r: [_r(r, 2, 3, 4)]),
    ("reshape", lambda x: ops.reshape(x, (4, -1)), lambda x: x.reshape(4, -1), lambda r: [_r(r, 2, 3, 4)]),
    ("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), lambda x: x.expand(2, 3, 4), lambda r: [_r(r, 3, 1)]),
    ("squeeze", lambda x: ops.squeeze(x, 1), lambda x: x.squeeze(1), lambda r: [_r(r, 3, 1, 4)]),
    ("expand_dims", lambda x: ops.expand_dims(x, 1), lambda x: x.unsqueeze(1), lambda r: [_r(r, 3, 4)]),
    ("strided_slice", lambda x: x[1:5:2, ::3], lambda x: x[1:5:2, ::3], lambda r: [_r(r, 6, 7)]),
    ("index_int", lambda x: x[:, 2], lambda x: x[:, 2], lambda r: [_r(r, 3, 4)]),
    ("pad", lambda x: ops.pad(x, [(1, 2), (0, 1)]), lambda x: __import__("torch").nn.functional.pad(x, (0, 1, 1, 2)), lambda r: [_r(r, 3, 4)]),
    ("concatenate", lambda x, y: ops.concatenate([x, y, x], axis=1), lambda x, y: __import__("torch").cat([x, y, x], 1), lambda r: [_r(r, 3, 2), _r(r, 3, 4)]),
    ("stack", lambda x, y: ops.stack([x, y], axis=1), lambda x, y: __import__("torch").stack([x, y], 1), lambda r: [_r(r, 3, 4), _r(r, 3, 4)]),
    (
        "gather",
        lambda x: ops.take_along_axis(x, IDX, axis=1),
        lambda x: x.gather(1, __import__("torch").as_tensor(IDX)),
        lambda r: [_r(r, 3, 5)],
    ),
    (
        "scatter_add",
        lambda u: ops.scatter_add(u, np.array([[0, 2, 0], [1, 1, 3]]), 1, (2, 4)),
        lambda u: __import__("torch").zeros(2, 4, dtype=u.dtype).scatter_add(1, __import__("torch").tensor([[0, 2, 0], [1, 1, 3]]), u),
        lambda r: [_r(r, 2, 3)],
    ),
    ("take_dupes", lambda x: ops.take(x, TAKE_IDX, axis=0), lambda x: x[__import__("torch").as_tensor(TAKE_IDX)], lambda r: [_r(r, 3, 4)]),
    ("take_axis1", lambda x: ops.take(x, np.array([[2, 0], [1, 1]]), axis=1), lambda x: x[:, __import__("torch").tensor([[2, 0], [1, 1]])], lambda r: [_r(r, 3, 4)]),
    (
        "conv2d",
        lambda x, w: ops.conv2d(x, w, stride=2, padding=1, dilation=1),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, stride=2, padding=1),
        lambda r: [_r(r, 2, 3, 7, 6), _r(r, 4, 3, 3, 3)],
    ),
    (
        "conv2d_phased",  # phase-plane columns (primitives.PhaseGeometry)
        lambda x, w: ops.conv2d(x, w, stride=2, padding=1),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, stride=2, padding=1),
        lambda r: [_r(r, 2, 3, 9, 9), _r(r, 4, 3, 3, 3)],
    ),
    (
        "conv2d_phased_rect",
        lambda x, w: ops.conv2d(x, w, stride=(2, 3), padding=(1, 2)),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, stride=(2, 3), padding=(1, 2)),
        lambda r: [_r(r, 2, 2, 11, 10), _r(r, 3, 2, 3, 2)],
    ),
    (
        "conv2d_primitive",
        lambda x, w: ops.conv2d(x, w, stride=(1, 2), padding=1, lowered=False),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, stride=(1, 2), padding=1),
        lambda r: [_r(r, 2, 3, 6, 7), _r(r, 2, 3, 3, 2)],
    ),
    (
        "conv2d_dilated",
        lambda x, w: ops.conv2d(x, w, stride=1, padding=(2, 1), dilation=2),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, stride=1, padding=(2, 1), dilation=2),
        lambda r: [_r(r, 1, 2, 6, 6), _r(r, 3, 2, 2, 3)],
    ),
    (
        "max_pool2d",
        lambda x: ops.max_pool2d(x, 2, stride=2, padding=1),
        lambda x: __import__("torch").nn.functional.max_pool2d(x, 2, stride=2, padding=1),
        lambda r: [_distinct(r, 2, 2, 5, 5)],
    ),
    (
        "max_pool2d_grad",  # the pooling gradient primitive, differentiated again (x: zero almost everywhere)
        lambda x, c: engine.grad(lambda x: ops.sum(ops.max_pool2d(x, 2, stride=2, padding=1) * c))(x),
        lambda x, c: __import__("torch").autograd.grad(
            (__import__("torch").nn.functional.max_pool2d(x, 2, stride=2, padding=1) * c).sum(), x, create_graph=True)[0],
        lambda r: [_distinct(r, 2, 2, 5, 5), _r(r, 2, 2, 3, 3)],
    ),
    (
        "avg_pool2d",
        lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1),
        lambda x: __import__("torch").nn.functional.avg_pool2d(x, 3, stride=2, padding=1),
        lambda r: [_r(r, 2, 2, 5, 6)],
    ),
    ("softmax", lambda x: ops.softmax(x, axis=-1), lambda x: x.softmax(-1), lambda r: [_r(r, 3, 5) * 3]),
    ("log_softmax", lambda x: ops.log_softmax(x, axis=0), lambda x: x.log_softmax(0), lambda r: [_r(r, 3, 5) * 3]),
    ("logsumexp", lambda x: ops.logsumexp(x, axis=1), lambda x: x.logsumexp(1), lambda r: [_r(r, 3, 5) * 3]),
    (
        "cross_entropy_int",
        lambda x: ops.cross_entropy(x, np.array([1, 0, 4])),
        lambda x: __import__("torch").nn.functional.cross_entropy(x, __import__("torch").tensor([1, 0, 4])),
        lambda r: [_r(r, 3, 5)],
    ),
    (
        "cross_entropy_probs",
        lambda x, p: ops.cross_entropy(x, p),
        lambda x, p: __import__("torch").nn.functional.cross_entropy(x, p),
        lambda r: [_r(r, 3, 5), _pos(r, 3, 5) / 6.0],
    ),
    ("mse", ops.mse, lambda x, y: __import__("torch").nn.functional.mse_loss(x, y), lambda r: [_r(r, 3, 4), _r(r, 3, 4)]),
    (
        "huber",
        lambda x, y: ops.huber(x, y, delta=0.7),
        lambda x, y: __import__("torch").nn.functional.huber_loss(x, y, delta=0.7),
        lambda r: [_r(r, 4, 5), _r(r, 4, 5) * 0.3],
    ),
    (
        "layer_norm",
        lambda x, g, b: ops.layer_norm(x, g, b, eps=1e-5),
        lambda x, g, b: __import__("torch").nn.functional.layer_norm(x, (5,), g, b, eps=1e-5),
        lambda r: [_r(r, 3, 5), _r(r, 5), _r(r, 5)],
    ),
    (
        "categorical_entropy",
        ops.categorical_entropy,
        lambda x: __import__("torch").distributions.Categorical(logits=x).entropy(),
        lambda r: [_r(r, 3, 5)],
    ),
]



def _t():
    return __import__("torch")


def _custom_square():
    f = engine.custom_vjp(lambda x: x * x)
    f.defvjp(lambda x: (x * x, x), lambda x, g: (2.0 * x * g,))
    return f


_SQUARE = _custom_square()
ACTIONS = np.array([2, 0, 3])

CASES += [
    # issue 18's primitives and indexing
    ("dense_relu", lambda x, w, b: ops.relu(x @ w + b), lambda x, w, b: (x @ w + b).relu(), lambda r: [_r(r, 2, 4), _r(r, 4, 3), _r(r, 3)]),
    ("mod", ops.mod, lambda x, y: _t().remainder(x, y), lambda r: [_r(r, 3, 4) * 3.0 + 0.05, _pos(r, 4) + 0.013]),
    ("mod_operator", lambda x: x % 0.7, lambda x: x % 0.7, lambda r: [_r(r, 3, 4) * 3.0 + 0.011]),
    ("erf", ops.erf, lambda x: x.erf(), lambda r: [_r(r, 3, 4)]),
    ("gelu", ops.gelu, lambda x: _t().nn.functional.gelu(x), lambda r: [_r(r, 3, 4) * 2]),
    ("gelu_tanh", lambda x: ops.gelu(x, "tanh"), lambda x: _t().nn.functional.gelu(x, approximate="tanh"), lambda r: [_r(r, 3, 4) * 2]),
    ("prod_axis", lambda x: ops.prod(x, axis=1), lambda x: x.prod(1), lambda r: [_r(r, 3, 4)]),
    ("prod_with_zeros", lambda x: ops.prod(x * np.array([[0.0, 1, 1], [0, 0, 1], [1, 1, 1]]), axis=1), lambda x: (x * _t().tensor([[0.0, 1, 1], [0, 0, 1], [1, 1, 1]], dtype=x.dtype)).prod(1), lambda r: [_r(r, 3, 3)]),
    ("prod_all_keepdims", lambda x: ops.prod(x, axis=(0, 1), keepdims=True), lambda x: x.prod(1, keepdim=True).prod(0, keepdim=True), lambda r: [_pos(r, 2, 3)]),
    ("cumsum", lambda x: ops.cumsum(x, axis=1), lambda x: x.cumsum(1), lambda r: [_r(r, 3, 4)]),
    ("cumsum_flat", ops.cumsum, lambda x: x.reshape(-1).cumsum(0), lambda r: [_r(r, 3, 4)]),
    ("sort", lambda x: ops.sort(x, axis=1), lambda x: _t().sort(x, 1).values, lambda r: [_distinct(r, 3, 5)]),
    ("sort_axis0", lambda x: ops.sort(x, axis=0), lambda x: _t().sort(x, 0).values, lambda r: [_distinct(r, 4, 3)]),
    ("einsum_matmul", lambda x, y: ops.einsum("ij,jk->ik", x, y), lambda x, y: _t().einsum("ij,jk->ik", x, y), lambda r: [_r(r, 3, 4), _r(r, 4, 2)]),
    ("einsum_batch", lambda x, y: ops.einsum("bij,bkj->bki", x, y), lambda x, y: _t().einsum("bij,bkj->bki", x, y), lambda r: [_r(r, 2, 3, 4), _r(r, 2, 5, 4)]),
    ("einsum_three", lambda x, y, z: ops.einsum("ij,j,jk", x, y, z), lambda x, y, z: _t().einsum("ij,j,jk", x, y, z), lambda r: [_r(r, 2, 3), _r(r, 3), _r(r, 3, 2)]),
    ("einsum_reduce", lambda x: ops.einsum("ijk->k", x), lambda x: _t().einsum("ijk->k", x), lambda r: [_r(r, 2, 3, 4)]),
    ("index_pairs", lambda q: q[np.arange(3), ACTIONS], lambda q: q[_t().arange(3), _t().as_tensor(ACTIONS)], lambda r: [_r(r, 3, 4)]),
    ("index_array", lambda x: x[np.array([2, 0, 2])], lambda x: x[_t().tensor([2, 0, 2])], lambda r: [_r(r, 3, 4)]),
    ("index_negative_step", lambda x: x[::-1, 3:0:-2], lambda x: x.flip(0)[:, [3, 1]], lambda r: [_r(r, 3, 5)]),
    ("remat", engine.remat(lambda x, w: ops.tanh(x @ w) * x[:, :2]), lambda x, w: (x @ w).tanh() * x[:, :2], lambda r: [_r(r, 3, 4), _r(r, 4, 2)]),
    ("custom_vjp", lambda x: _SQUARE(x) + x, lambda x: x * x + x, lambda r: [_r(r, 3, 4)]),
    (
        "scan",
        lambda x, w: engine.scan(lambda h, xt: (ops.tanh(h @ w + xt),) * 2, x[0], x)[1],
        lambda x, w: _scan_torch(x, w),
        lambda r: [_r(r, 4, 3) * 0.5, _r(r, 3, 3) * 0.5],
    ),
    (
        "cond",
        lambda x, y: engine.cond(ops.sum(x) > 0, lambda a, b: a * b, lambda a, b: a - b, x, y),
        lambda x, y: x * y if x.sum() > 0 else x - y,
        lambda r: [_pos(r, 3), _r(r, 3)],
    ),
]

# primitives without a gradient: their batching rule is checked against a loop (test_vmap.py)
NONDIFF_CASES = [
    ("floor_divide", lambda x, y: x // y, lambda r: [_r(r, 3, 4) * 3.0, _pos(r, 4)]),
    (
        "isnan_isfinite",
        lambda x: ops.stack([ops.isnan(ops.where(x > 0.5, np.nan, x)), ops.isfinite(ops.where(x < -0.5, -np.inf, x))]),
        lambda r: [_r(r, 3, 4)],
    ),
    ("any_all", lambda x: ops.logical_and(ops.any(x > 1.0, axis=1), ops.all(x > -2.0, axis=1)), lambda r: [_r(r, 3, 4)]),
    ("argsort", lambda x: ops.argsort(x, axis=0), lambda r: [_distinct(r, 4, 3)]),
    ("argmax_one_hot", lambda x: ops.one_hot(ops.argmax(x, axis=1), 4), lambda r: [_distinct(r, 3, 4)]),
    ("not_equal_or", lambda x, y: (x != y) | (x > 0.5), lambda r: [_r(r, 3, 4), _r(r, 4)]),
    ("cross_entropy_traced_labels", lambda x, y: ops.cross_entropy(x, y, reduction="none"), lambda r: [_r(r, 3, 5), r.integers(0, 5, 3)]),
    ("while_loop", lambda x: engine.while_loop(lambda c: ops.sum(c) < 10.0, lambda c: c * 2.0, x), lambda r: [_pos(r, 3)]),
    ("random", lambda k: engine.random.normal(k, (3,)) + engine.random.uniform(engine.random.split(k)[1], (3,)), lambda r: [engine.random.key(int(r.integers(0, 2**31)))]),
]

NONDIFF_IDS = [c[0] for c in NONDIFF_CASES]


def _scan_torch(x, w):
    h = x[0]
    ys = []
    for t in range(x.shape[0]):
        h = (h @ w + x[t]).tanh()
        ys.append(h)
    return _t().stack(ys)


CASE_IDS = [c[0] for c in CASES]
