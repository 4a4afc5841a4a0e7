"""The vectorised Philox-4x64-10 of primitives/random.py against independent oracles: its words
are numpy's ``np.random.Philox(key=...).random_raw()`` (sampling and split counters, C kernel and
numpy fallback); its uniforms are numpy's ``Generator.random`` (float64 and float32) bit for bit;
its normals are the documented Box-Muller transform of numpy's words; eager == jit == vmap bit
for bit with and without the extension; the new normal and the uniforms pass KS / chi-square
tests (fixed seeds, thresholds p > 1e-6)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.stats

from fedarena import engine
from fedarena.engine import random as R
from fedarena.engine.core import cext
from fedarena.engine.primitives import random as P

MODES = [False] + ([True] if cext._native is not None else [])
"""Native kernel off (the numpy fallback) and, when the extension is built, on."""


@pytest.fixture(params=MODES, ids=lambda m: "native" if m else "numpy")
def native(request, monkeypatch):
    monkeypatch.setenv("FEDARENA_NATIVE", "1" if request.param else "0")
    assert cext.available() == request.param
    return request.param


def _keys(seed: int, shape: tuple) -> np.ndarray:
    i64 = np.iinfo(np.int64)
    return np.random.default_rng(seed).integers(i64.min, i64.max, shape + (2,), dtype=np.int64, endpoint=True)


def _numpy_raw(keys: np.ndarray, n: int, top: int = 0) -> np.ndarray:
    counter = np.array([0, 0, 0, top], np.uint64)
    flat = keys.reshape(-1, 2)
    return np.stack([np.random.Philox(key=k.view(np.uint64), counter=counter).random_raw(n) for k in flat])


def test_words_are_numpys_philox_stream(native):
    for seed, shape in enumerate([(1,), (5,), (2, 3)]):
        keys = _keys(seed, shape)
        for n in (1, 3, 4, 5, 8, 31):
            for top in (0, P.SPLIT_TOP):
                want = _numpy_raw(keys, n, top)
                np.testing.assert_array_equal(P.philox_words(keys, n, top), want)
                np.testing.assert_array_equal(P.philox_numpy(keys.reshape(-1, 2).view(np.uint64), n, top), want)
    # extreme keys (all bits set, zero) and a non-contiguous batch of keys
    ext = np.array([[-1, -1], [0, 0], [np.iinfo(np.int64).min, np.iinfo(np.int64).max]], np.int64)
    np.testing.assert_array_equal(P.philox_words(ext, 9), _numpy_raw(ext, 9))
    strided = _keys(9, (6, 2))[:, 1]
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(P.philox_words(strided, 6), _numpy_raw(np.ascontiguousarray(strided), 6))


def test_uniforms_are_numpys_generator_random(native):
    keys = _keys(11, (7,))
    for dt in (np.float32, np.float64):
        for shape in [(), (1,), (3,), (2, 5), (17,)]:
            got = R.uniform(keys[0], shape, dt)
            np.testing.assert_array_equal(got, P._generator(keys[0]).random(shape, dtype=dt))
            batch = engine.vmap(lambda k: R.uniform(k, shape, dt))(keys)
            np.testing.assert_array_equal(batch, np.stack([P._generator(k).random(shape, dtype=dt) for k in keys]))


def test_split_keys_are_numpys_split_counter_words(native):
    keys = _keys(12, (4,))
    for num in (1, 2, 3, 7):
        got = R.split(keys, num)
        assert got.shape == (4, num, 2) and got.dtype == np.int64
        want = np.stack([P._generator(k, P._SPLIT_COUNTER).bit_generator.random_raw(2 * num) for k in keys])
        np.testing.assert_array_equal(got.reshape(4, -1).view(np.uint64), want)


def _box_muller(keys: np.ndarray, n: int) -> np.ndarray:
    """The documented normal transform, written from numpy's own words."""
    w = _numpy_raw(keys, 2 * ((n + 1) // 2))
    u1 = 1.0 - (w[:, 0::2] >> np.uint64(11)).astype(np.float64) / 2.0**53
    u2 = (w[:, 1::2] >> np.uint64(11)).astype(np.float64) / 2.0**53
    r = np.sqrt(-2.0 * np.log(u1))
    out = np.empty((keys.shape[0], 2 * u1.shape[1]))
    out[:, 0::2], out[:, 1::2] = r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)
    return out[:, :n]


def test_normals_are_the_documented_box_muller_transform(native):
    keys = _keys(13, (6,))
    for n in (1, 2, 5, 8, 33):
        want = _box_muller(keys, n)
        for dt in (np.float64, np.float32):
            got = engine.vmap(lambda k: R.normal(k, (n,), dt))(keys)
            assert got.dtype == dt
            np.testing.assert_array_max_ulp(got, want.astype(dt), maxulp=4)


def test_native_and_numpy_paths_agree(monkeypatch):
    if cext._native is None:
        pytest.skip("the C extension is not built")
    keys = _keys(14, (5,))
    out = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("FEDARENA_NATIVE", flag)
        out[flag] = [P.Sampler(k, (3, 7), dt)(keys) for k in ("uniform", "normal") for dt in (np.float32, np.float64)]
    for a, b in zip(out["1"], out["0"]):
        np.testing.assert_array_max_ulp(a, b, maxulp=4)
    for a, b in zip(out["1"][:2], out["0"][:2]):  # the uniforms: the same bits
        np.testing.assert_array_equal(a, b)


def test_eager_jit_and_vmap_agree_bit_for_bit(native):
    keys = _keys(15, (9,))

    def draws(k):
        a, b = R.split(k)
        return R.normal(a, (4, 3)), R.normal(b, (5,), np.float64), R.uniform(a, (6,)), R.bernoulli(b, 0.4, (8,))

    per_key = [draws(k) for k in keys]
    for batched in (engine.vmap(draws)(keys), engine.jit(engine.vmap(draws))(keys)):
        for i, out in enumerate(batched):
            np.testing.assert_array_equal(out, np.stack([p[i] for p in per_key]))
    for got, want in zip(engine.jit(draws)(keys[0]), per_key[0]):
        np.testing.assert_array_equal(got, want)
    # keys of shape (B, 2) given directly: each row draws what it draws alone
    np.testing.assert_array_equal(R.normal(keys, (3,)), np.stack([R.normal(k, (3,)) for k in keys]))


def test_empty_draws_and_empty_key_batches(native):
    assert R.normal(R.key(0), (0,)).shape == (0,)
    assert R.uniform(np.zeros((0, 2), np.int64), (3,)).shape == (0, 3)
    assert R.split(np.zeros((0, 2), np.int64), 2).shape == (0, 2, 2)


def test_native_kernels_refuse_bad_buffers():
    if cext._native is None:
        pytest.skip("the C extension is not built")
    nat = cext._native
    keys = _keys(16, (3,)).view(np.uint64)
    out = np.empty((3, 5), np.uint64)
    assert nat.philox(keys, out, 3, 5, 0)
    assert not nat.philox(keys, out, 3, 6, 0)  # wrong size
    assert not nat.philox(keys, np.empty((3, 5), np.float64), 3, 5, 0)  # not 64-bit integers
    assert not nat.philox(keys, np.empty((5, 3), np.uint64).T, 3, 5, 0)  # not C-contiguous
    assert not nat.random(keys, np.empty((3, 5), np.float32), 3, 5, 0, True)  # float32 buffer, float64 asked
    assert not nat.random(keys, np.empty((3, 5), np.float64), 3, 5, 2, True)  # no transform 2
    with pytest.raises(ValueError):
        nat.philox(keys, out, -1, 5, 0)


def test_normal_and_uniform_distributions(native):
    n = 50000
    for dt in (np.float64, np.float32):
        z = R.normal(R.key(21), (n,), dt).astype(np.float64)
        assert scipy.stats.kstest(z, "norm").pvalue > 1e-6
        # tails: P(|z| > 3) = 0.0027; a binomial count within 5 sigma
        p3 = 2 * scipy.stats.norm.sf(3)
        assert abs((np.abs(z) > 3).mean() - p3) < 5 * np.sqrt(p3 * (1 - p3) / n)
        # the two members of a Box-Muller pair are independent: uncorrelated, squares too
        for a, b in ((z[0::2], z[1::2]), (z[0::2] ** 2, z[1::2] ** 2)):
            assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n / 2)
        u = R.uniform(R.key(22), (n,), dt).astype(np.float64)
        assert scipy.stats.kstest(u, "uniform").pvalue > 1e-6
        counts = np.bincount((u * 64).astype(int), minlength=64)
        assert scipy.stats.chisquare(counts).pvalue > 1e-6
    # many keys at once (the vmapped path): each key's normals pass, and all of them pooled
    zs = engine.vmap(lambda k: R.normal(k, (64,), np.float64))(R.split(R.key(23), 1024))
    assert scipy.stats.kstest(zs.ravel(), "norm").pvalue > 1e-6
    assert scipy.stats.kstest(zs.mean(axis=1) * 8.0, "norm").pvalue > 1e-6  # per-key means ~ N(0, 1/64)
