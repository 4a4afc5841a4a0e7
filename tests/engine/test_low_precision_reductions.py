"""max/min of float16 and bfloat16 arrays (their identity for masked rows is +-inf, not an integer bound):
eager and jitted on the numpy backend, against numpy on the same values in float32."""

import ml_dtypes
import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("jit", [False, True])
def test_max_and_min_of_low_precision_arrays(dtype, jit):
    x = np.random.default_rng(0).normal(size=(5, 7)).astype(dtype)
    fmax = (lambda a: ops.max(a, axis=1))
    fmin = (lambda a: ops.min(a))
    if jit:
        fmax, fmin = engine.jit(fmax), engine.jit(fmin)
    got_max, got_min = np.asarray(fmax(x)), np.asarray(fmin(x))
    assert got_max.dtype == np.dtype(dtype) and got_min.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got_max.astype(np.float32), x.astype(np.float32).max(axis=1))
    assert float(got_min) == float(x.astype(np.float32).min())
