"""Boolean masks inside fused elementwise trees (the default pipeline's ``masks=True``): the
gradient masks of relu, clip and minimum join the float tree that uses them, and the results
equal numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.core import cext

pytestmark = pytest.mark.skipif(not cext.available(), reason="the default pipeline fuses only what the C extension runs")


def _names(fn, *args):
    return [e.prim.name for e in engine.inspect(fn, printer=None)(*args).graph.eqns]


def _standalone_predicates(names):
    return [n for n in names if n in ("gt", "ge", "lt", "le", "eq", "ne", "and", "or", "not")]


def test_the_relu_gradient_mask_is_fused_into_its_product():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    f = engine.grad(lambda x: ops.sum(ops.relu(x) * w))
    assert not _standalone_predicates(_names(f, x))
    np.testing.assert_array_equal(engine.jit(f)(x), np.where(x > 0, w, np.float32(0)))


def test_clip_and_minimum_masks_are_fused_and_exact():
    rng = np.random.default_rng(1)
    r = (1 + 0.5 * rng.standard_normal(4096)).astype(np.float32)
    adv = rng.standard_normal(4096).astype(np.float32)

    def surrogate(r):  # PPO's clipped surrogate
        return ops.sum(ops.minimum(r * adv, ops.clip(r, 0.8, 1.2) * adv))

    g = engine.grad(surrogate)
    assert not _standalone_predicates(_names(g, r))
    unclipped = r * adv <= np.clip(r, 0.8, 1.2) * adv
    inside = (r >= 0.8) & (r <= 1.2)
    expect = np.where(unclipped, adv, np.where(inside, adv, np.float32(0)))
    # ties (r*adv == clip(r)*adv) split the gradient between the two branches; compare elsewhere
    tie = r * adv == np.clip(r, 0.8, 1.2) * adv
    got = engine.jit(g)(r)
    np.testing.assert_allclose(got[~tie], expect[~tie], rtol=1e-6, atol=1e-7)


def test_a_boolean_argument_stays_outside_the_vm_and_is_right():
    rng = np.random.default_rng(2)
    m = rng.random((128, 512)) > 0.5
    x = rng.standard_normal((128, 512)).astype(np.float32)
    y = rng.standard_normal((128, 512)).astype(np.float32)
    f = engine.jit(lambda m, x, y: ops.where(m & (x > 0), x * 2.0, y - 1.0))
    np.testing.assert_array_equal(f(m, x, y), np.where(m & (x > 0), x * np.float32(2), y - np.float32(1)))
