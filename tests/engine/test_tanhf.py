"""The engine's float32 tanh (``fedarena/engine/_tanhf.h``, ``primitives.elementwise.tanh``) against numpy's
float64 tanh (the oracle, rounded exactly enough for a float32 ulp bound), its special values, and the
same bits on every path the per-equation executor takes (the ``_native.tanh`` kernel, the elementwise VM,
numpy code of fused bodies, eager ops, strided operands); the whole-graph C code's equality with these is
in test_native_graph.py."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.core import cext
from fedarena.engine.primitives.elementwise import tanh

pytestmark = pytest.mark.skipif(cext._native is None, reason="the C extension is not built")

ULP_BOUND = 1.5
"""Measured over every float32 in [-10, 10]: at most 1.32 ulp (numpy's own float32 tanh: 1.37)."""


def _ulp_error(x32: np.ndarray) -> np.ndarray:
    got = tanh(x32).astype(np.float64)
    exact = np.tanh(x32.astype(np.float64))
    return np.abs(got - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def test_ulp_error_over_a_sample_of_every_binade():
    # every 211th float32 bit pattern from 0 to 10 (all binades, ~5 M values) and their negatives
    bits = np.arange(0, np.float32(10.0).view(np.uint32) + 1, 211, dtype=np.uint32)
    x = bits.view(np.float32)
    err = _ulp_error(np.concatenate([x, -x]))
    assert err.max() <= ULP_BOUND, err.max()
    # and it is a real approximation, not numpy's loop under another name
    assert not np.array_equal(tanh(x), np.tanh(x))


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-30, 9.5, 1e30, -1e30, 0.625, -0.625], np.float32)
    got = tanh(x)
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:3], [1.0, -1.0])
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])
    np.testing.assert_array_equal(got[5:8], x[5:8])  # tanh(x) rounds to x for tiny x
    np.testing.assert_array_equal(got[8:11], [1.0, 1.0, -1.0])
    assert got[11] == -got[12] and abs(float(got[11]) - np.tanh(0.625)) <= 1e-7


def test_every_executor_path_gives_the_same_bits():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 24)) * 3).astype(np.float32)
    want = np.empty_like(x)
    assert cext._native.tanh(x, want)
    assert np.count_nonzero(want != np.tanh(x)) > 10  # the data tells the engine's tanh from numpy's
    # the wrapper: fresh output, into an output, in place, strided operand, 0-d and numpy scalar
    np.testing.assert_array_equal(tanh(x), want)
    out = np.empty_like(x)
    assert tanh(x, out) is out and np.array_equal(out, want)
    y = x.copy()
    tanh(y, y)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(tanh(np.asfortranarray(x)), want)
    np.testing.assert_array_equal(tanh(x[:, ::2]), want[:, ::2])
    np.testing.assert_array_equal(tanh(x.astype(">f4")), want)
    o64 = np.empty(x.shape)  # an output of another dtype: the float32 results, cast as a ufunc casts
    assert tanh(x, o64) is o64 and np.array_equal(o64, want.astype(np.float64))
    ob = np.empty((2,) + x.shape, np.float32)  # an operand broadcast to the output's shape
    tanh(x, ob)
    np.testing.assert_array_equal(ob, np.broadcast_to(want, ob.shape))
    s = tanh(np.float32(x[0, 0]))
    assert isinstance(s, np.float32) and s == want[0, 0]
    # float64 stays numpy's
    np.testing.assert_array_equal(tanh(x.astype(np.float64)), np.tanh(x.astype(np.float64)))
    # eager ops, and jit's per-equation executor: standalone, fused with arithmetic in the VM (16x24 elements),
    # and a fused body too long for the VM (numpy code calling the wrapper)
    np.testing.assert_array_equal(ops.tanh(x), want)
    h = (x * np.float32(0.5)).astype(np.float32)
    ref = tanh(h) + np.float32(1.0)
    np.testing.assert_array_equal(engine.jit(lambda a: ops.tanh(a))(x), want)
    np.testing.assert_array_equal(engine.jit(lambda a: ops.tanh(a * 0.5) + 1.0)(x), ref)
    big = (rng.standard_normal((64, 64)) * 3).astype(np.float32)
    np.testing.assert_array_equal(engine.jit(lambda a: ops.tanh(a * 0.5) + 1.0)(big), tanh((big * np.float32(0.5)).astype(np.float32)) + np.float32(1.0))
