"""The numerics guarantee of docs/engine.md ("Numerics"): a compiled program is deterministic
(bitwise, call after call); eager vs jit, batch size, and the C kernels vs plain numpy
(FEDARENA_NATIVE=0) agree to round-off — a few float32 ulps — but not necessarily bitwise."""

from __future__ import annotations

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops

F32_TOL = 4e-6  # a few float32 ulps relative to the largest magnitude


def _policy():
    body = nn.MLP([8, 64, 64, 4], activation="tanh")
    params = body.init(0)
    return lambda p, x: ops.softmax(body.apply(p, x)), params


def _close(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def test_numerics_guarantee(monkeypatch):
    f, params = _policy()
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    jf = engine.jit(f)
    ref = jf(params, x)
    for _ in range(3):  # deterministic: bitwise the same every call
        np.testing.assert_array_equal(jf(params, x), ref)
    exact = f(engine.tree_map(lambda a: a.astype(np.float64), params), x.astype(np.float64))
    eager = f(params, x)
    one = np.concatenate([jf(params, x[i : i + 1]) for i in range(64)])  # batch 1 (native dense/softmax kernels)
    monkeypatch.setenv("FEDARENA_NATIVE", "0")
    plain = engine.jit(f)(params, x)
    plain_one = engine.jit(f)(params, x[:1])
    for got in (ref, eager, one, plain):
        assert got.dtype == np.float32
        assert _close(got, exact) < F32_TOL
    assert _close(plain_one, one[:1]) < F32_TOL
