"""``jit`` of a gradient of a function that itself calls ``engine.grad`` (the gradient-inversion objective).

The native-kernel selection pass used to claim ``add(x1 @ w1, x2 @ w2)`` for both matmuls when the second
product had one row (it fits a dense layer's bias either way), dropping a product the other chain read:
graph validation then failed with "uses Var before it is defined".  Oracles: central finite differences and
PyTorch's double backward."""

from __future__ import annotations

import numpy as np
import torch

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.engine.compiler import native

SIZES = [4, 5, 3]


def _problem():
    mlp = nn.MLP(SIZES, activation="tanh")
    params = engine.tree_map(lambda a: a.astype(np.float64), mlp.init(0))
    rng = np.random.default_rng(1)
    targets = [rng.standard_normal(a.shape) for a in engine.tree_leaves(params)]
    y = np.array([1])
    x = rng.random((1, SIZES[0]))
    param_grad = engine.grad(lambda p, x: ops.cross_entropy(mlp.apply(p, x), y))

    def matching(x, p):
        leaves = engine.tree_leaves(param_grad(p, x))
        total = ops.sum(ops.square(leaves[0] - targets[0]))
        for a, b in zip(leaves[1:], targets[1:]):
            total = total + ops.sum(ops.square(a - b))
        return total

    return matching, params, targets, x, y


def _torch_reference(params, targets, x, y):
    leaves = engine.tree_leaves(params)  # dict keys sorted: per layer "b" then "w"
    tp = [torch.tensor(a, requires_grad=True) for a in leaves]
    tx = torch.tensor(x, requires_grad=True)
    h = tx
    for layer in range(len(SIZES) - 1):
        b, w = tp[2 * layer], tp[2 * layer + 1]
        h = h @ w + b
        if layer < len(SIZES) - 2:
            h = torch.tanh(h)
    loss = torch.nn.functional.cross_entropy(h, torch.tensor(y))
    grads = torch.autograd.grad(loss, tp, create_graph=True)
    total = sum(((g - torch.tensor(t)) ** 2).sum() for g, t in zip(grads, targets))
    (gx,) = torch.autograd.grad(total, tx)
    return total.item(), gx.numpy()


def test_jit_of_value_and_grad_over_a_nested_grad_matches_torch_and_finite_differences():
    matching, params, targets, x, y = _problem()
    value, grad = engine.jit(engine.value_and_grad(matching))(x, params)
    ref_value, ref_grad = _torch_reference(params, targets, x, y)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in range(x.size):
        d = np.zeros_like(x)
        d.flat[i] = eps
        fd.flat[i] = (float(matching(x + d, params)) - float(matching(x - d, params))) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_native_selection_claims_a_shared_add_for_one_matmul_only():
    x1, w1 = np.ones((1, 3)), np.full((3, 2), 0.5)
    x2, w2 = np.full((1, 4), 2.0), np.arange(8.0).reshape(4, 2)
    graph = engine.make_graph(lambda a, b, c, d: ops.relu(a @ b + c @ d))(x1, w1, x2, w2)
    out = native.select_native_kernels(graph)
    out.validate()
    if native.available():
        assert [e.prim.name for e in out.eqns].count("dense") == 1
    np.testing.assert_allclose(engine.jit(lambda a, b, c, d: ops.relu(a @ b + c @ d))(x1, w1, x2, w2),
                               np.maximum(x1 @ w1 + x2 @ w2, 0), rtol=1e-15)
