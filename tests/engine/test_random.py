"""engine.random: explicit keys give the same numbers eagerly, under jit and under vmap; split
streams are independent (statistical tests with fixed seeds, thresholds at ~5 sigma); the
distributions match their definitions (moments, frequencies) and PyTorch's dropout scaling."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.engine import random as R


def test_same_key_same_numbers_eager_jit_and_vmap():
    k = R.key(42)
    eager = R.normal(k, (4, 3))
    np.testing.assert_array_equal(engine.jit(lambda k: R.normal(k, (4, 3)))(k), eager)
    keys = R.split(k, 5)
    per_key = np.stack([R.normal(kk, (4, 3)) for kk in keys])
    np.testing.assert_array_equal(engine.vmap(lambda kk: R.normal(kk, (4, 3)))(keys), per_key)
    np.testing.assert_array_equal(engine.jit(engine.vmap(lambda kk: R.normal(kk, (4, 3))))(keys), per_key)
    np.testing.assert_array_equal(engine.jit(lambda k: R.split(k, 5))(k), keys)
    for fn in (
        lambda kk: R.uniform(kk, (6,), np.float64, -2.0, 3.0),
        lambda kk: R.bernoulli(kk, 0.3, (6,)),
        lambda kk: R.categorical(kk, np.log(np.array([0.1, 0.2, 0.7])), shape=(6,)),
    ):
        want = np.stack([fn(kk) for kk in keys])
        np.testing.assert_array_equal(engine.vmap(fn)(keys), want)
        np.testing.assert_array_equal(engine.jit(engine.vmap(fn))(keys), want)
        np.testing.assert_array_equal(engine.jit(fn)(keys[0]), want[0])
    assert not np.array_equal(R.normal(R.key(0), (8,)), R.normal(R.key(1), (8,)))


def test_split_streams_are_independent():
    n = 20000
    k1, k2 = R.split(R.key(7))
    a, b = R.uniform(k1, (n,), np.float64), R.uniform(k2, (n,), np.float64)
    parent = R.uniform(R.key(7), (n,), np.float64)
    for x, y in ((a, b), (a, parent), (b, parent)):
        assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(n)
        # joint uniformity on a 10x10 grid (chi-square, 81 degrees of freedom)
        counts = np.histogram2d(x, y, bins=10, range=[[0, 1], [0, 1]])[0]
        chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum()
        assert scipy.stats.chi2.sf(chi2, 81) > 1e-6
    # many children of one key: pairwise uncorrelated, none repeats another
    kids = R.split(R.key(3), 64)
    assert len({tuple(k) for k in kids}) == 64
    draws = engine.vmap(lambda kk: R.normal(kk, (2000,), np.float64))(kids)
    corr = np.corrcoef(draws)
    off = corr[~np.eye(64, dtype=bool)]
    assert np.abs(off).max() < 5.5 / np.sqrt(2000)
    # a grandchild stream is not its parent's stream
    g = R.split(kids[0])[0]
    assert abs(np.corrcoef(R.normal(g, (n,), np.float64), R.normal(kids[0], (n,), np.float64))[0, 1]) < 5 / np.sqrt(n)


def test_distributions_match_their_definitions():
    n = 40000
    z = R.normal(R.key(1), (n,), np.float64)
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-6
    u = R.uniform(R.key(2), (n,), np.float32, minval=-1.0, maxval=3.0)
    assert u.dtype == np.float32 and u.min() >= -1.0 and u.max() < 3.0
    assert scipy.stats.kstest((u + 1.0) / 4.0, "uniform").pvalue > 1e-6
    b = R.bernoulli(R.key(3), 0.25, (n,))
    assert b.dtype == np.bool_ and abs(b.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / n)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    c = R.categorical(R.key(4), np.log(p) + 5.0, shape=(n,))
    counts = np.bincount(c, minlength=4)
    assert scipy.stats.chisquare(counts, p * n).pvalue > 1e-6
    # batch of logits along axis 0
    logits = np.log(np.array([[0.9, 0.1], [0.1, 0.9]])).T  # classes on axis 0
    cc = engine.vmap(lambda kk: R.categorical(kk, logits, axis=0))(R.split(R.key(5), 4000))
    assert abs(cc[:, 0].mean() - 0.1) < 0.03 and abs(cc[:, 1].mean() - 0.9) < 0.03


def test_bad_keys_are_refused():
    with pytest.raises(engine.ShapeError, match="key"):
        R.normal(np.zeros(3, np.int64), (2,))
    with pytest.raises(TypeError, match="seed"):
        R.key(1.5)


def test_dropout_matches_pytorch_in_train_and_eval_mode():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((200, 50)).astype(np.float32) + 3.0
    drop = nn.Dropout(0.3)
    np.testing.assert_array_equal(drop(None, x), x)  # eval: identity, as torch's .eval()
    tdrop = torch.nn.Dropout(0.3).eval()
    np.testing.assert_array_equal(tdrop(torch.tensor(x)).numpy(), x)
    k = R.key(9)
    y = drop(None, x, k)
    np.testing.assert_array_equal(engine.jit(lambda x, k: drop(None, x, k))(x, k), y)
    tdrop.train()
    torch.manual_seed(0)
    ty = tdrop(torch.tensor(x)).numpy()
    for out in (y, ty):  # kept entries are x / (1 - p), the rest 0; the rate is p
        kept = out != 0
        np.testing.assert_allclose(out[kept], x[kept] / 0.7, rtol=1e-6)
        assert abs(1 - kept.mean() - 0.3) < 5 * np.sqrt(0.21 / x.size)
    g = engine.grad(lambda x: ops.sum(drop(None, x, k)))(x)
    np.testing.assert_allclose(g, (y != 0) / 0.7, rtol=1e-6)
