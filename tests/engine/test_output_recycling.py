"""Large outputs of a compiled function come from an OutputRecycler: an array is handed out again only when
nothing references it any more.  Oracles: the values each call must return (numpy), object identity, and an
independent copy of every output kept by the caller."""

from __future__ import annotations

import weakref

import numpy as np

from fedarena import engine
from fedarena.engine.backends.numpy.executor import RECYCLE_MIN_BYTES, OutputRecycler

N = RECYCLE_MIN_BYTES // 8 * 2  # float64 elements: above the recycling threshold


def _step(p, g):
    return p - 0.5 * g, p * g  # two large outputs (one elementwise into a fresh array each)


def test_kept_outputs_and_views_are_never_overwritten():
    f = engine.jit(_step)
    p = np.linspace(0.0, 1.0, N)
    g = np.cos(np.arange(N))
    kept, copies = [], []
    view = None
    for t in range(6):
        out = f(p, g)
        if t == 1:
            kept.append(out[0])  # the caller keeps this one
            copies.append(out[0].copy())
        if t == 2:
            view = out[1][::7]  # only a view of this one: its base must stay untouched too
            view_copy = view.copy()
        np.testing.assert_array_equal(out[0], p - 0.5 * g)
        np.testing.assert_array_equal(out[1], p * g)
        assert not np.shares_memory(out[0], p) and not np.shares_memory(out[1], p)
        p = out[0]  # the training-loop pattern: outputs go back in
    for k, c in zip(kept, copies):
        np.testing.assert_array_equal(k, c)
    np.testing.assert_array_equal(view, view_copy)


def test_outputs_of_the_call_before_last_are_reused_in_a_loop(monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE_GRAPH", "0")  # output recycling is the per-equation executor's
    f = engine.jit(_step)
    p, g = np.ones(N), np.full(N, 0.25)
    refs = []
    for _ in range(6):
        out = f(p, g)
        refs.append(weakref.ref(out[0]))  # no strong reference: a plain allocation would be freed
        p = out[0]
        del out
    # steady state: the output of call t is the (recycled) object of call t - 2
    assert refs[5]() is p and refs[3]() is p and refs[4]() is not None and refs[4]() is not p
    np.testing.assert_allclose(p, 1.0 - 6 * 0.125, rtol=1e-15)


def test_recycler_hands_out_only_unreferenced_arrays():
    r = OutputRecycler((4,), np.float32)
    a = r.take()
    b = r.take()  # a is still held here
    assert a is not b
    del a
    c = r.take()
    assert c is not b and c.shape == (4,) and c.dtype == np.float32
    held = [c, b]
    d = r.take()  # both pooled arrays are referenced: a new one, not pooled (KEEP = 2)
    assert all(d is not h for h in held) and len(r.pool) == OutputRecycler.KEEP
