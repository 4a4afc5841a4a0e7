"""float16 / bfloat16 storage (ml_dtypes) with float32 accumulation: sums and matmuls of
low-precision arrays accumulate in float32 (oracle: the float32 computation rounded once; a
bfloat16 running sum would stall), and a jitted MLP/conv step in low precision stays within the
storage precision of the float32 reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


@pytest.mark.parametrize("dt", [F16, BF16], ids=["f16", "bf16"])
def test_sums_and_matmuls_accumulate_in_float32(dt):
    x = np.full(5000, 0.1, dt)
    exact = np.add.reduce(x, dtype=np.float32).astype(dt)
    for f in (ops.sum, engine.jit(ops.sum)):
        got = f(x)
        assert got.dtype == dt and got == exact
    if dt == BF16:
        assert np.add.reduce(x) != exact  # what accumulating in bfloat16 would give (it stalls at 32)
    a, b = np.full((2, 3000), 0.1, dt), np.ones((3000, 3), dt)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(dt)
    for f in (ops.matmul, engine.jit(ops.matmul)):
        got = f(a, b)
        assert got.dtype == dt
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt, tol", [(F16, 3e-3), (BF16, 3e-2)], ids=["f16", "bf16"])
def test_mlp_and_conv_training_step_in_low_precision(dt, tol):
    rng = np.random.default_rng(0)
    mlp = nn.MLP([16, 32, 4], activation="tanh")
    conv = nn.Conv2d(2, 3, 3, padding=1)
    params = {"mlp": mlp.init(0, dtype=dt), "conv": conv.init(1, dtype=dt)}
    x = rng.standard_normal((8, 16)).astype(dt)
    img = rng.standard_normal((8, 2, 4, 4)).astype(dt)
    y = rng.integers(0, 4, 8)

    def loss(p, x, img, y):
        feats = ops.reshape(conv.apply(p["conv"], img), (8, -1))[:, :16] + x
        return ops.cross_entropy(ops.astype(mlp.apply(p["mlp"], feats), np.float32), y)

    v, g = engine.jit(engine.value_and_grad(loss))(params, x, img, y)
    up = lambda t: engine.tree_map(lambda a: a.astype(np.float32), t)  # noqa: E731
    v32, g32 = engine.value_and_grad(loss)(up(params), x.astype(np.float32), img.astype(np.float32), y)
    assert abs(float(v) - float(v32)) < tol * abs(float(v32))
    for a, b in zip(engine.tree_leaves(g), engine.tree_leaves(g32)):
        assert a.dtype == dt
        assert np.abs(a.astype(np.float32) - b).max() <= tol * np.abs(b).max() + 1e-6
