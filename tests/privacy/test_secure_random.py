"""fedarena.privacy.secure_random: the OS-CSPRNG draws behind LDP, SignDS, DP-SGD and DP-FedAvg, checked against
their distributions (Kolmogorov-Smirnov against scipy's CDFs, exact counts for sampling without replacement),
and the rule that a mechanism called without an rng never falls back to a seeded generator."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedarena.privacy import ldp, signds
from fedarena.privacy.secure_random import SecureRandom, random_source


def test_draws_follow_their_distributions():
    r = SecureRandom()
    n = 20_000
    assert stats.kstest(r.random(n), "uniform").pvalue > 1e-4
    assert stats.kstest(r.normal(1.0, 2.0, n), "norm", args=(1.0, 2.0)).pvalue > 1e-4
    assert stats.kstest(r.laplace(0.5, 3.0, n), "laplace", args=(0.5, 3.0)).pvalue > 1e-4
    assert np.shape(r.standard_normal((3, 4))) == (3, 4) and isinstance(r.random(), float)


def test_choice_is_a_uniform_sample_without_replacement():
    r = SecureRandom()
    counts = np.zeros(10)
    for _ in range(3000):
        s = r.choice(10, 3)
        assert len(set(s.tolist())) == 3 and s.min() >= 0 and s.max() < 10
        counts[s] += 1
    # each element is in a 3-subset with probability 3/10: 900 of 3000 draws expected
    assert stats.chisquare(counts).pvalue > 1e-4
    pool = np.array([7, 11, 13, 17])
    assert sorted(r.choice(pool, 4).tolist()) == [7, 11, 13, 17]
    with pytest.raises(ValueError, match="choice"):
        r.choice(3, 4)


def test_mechanisms_without_an_rng_use_the_os_csprng(monkeypatch):
    """No rng -> SecureRandom; a numpy seed is used only when given explicitly (tests)."""
    assert isinstance(random_source(None), SecureRandom)
    assert isinstance(random_source(3), np.random.Generator)
    calls = []
    real = SecureRandom.random

    def spy(self, size=None):
        calls.append(size)
        return real(self, size)

    monkeypatch.setattr(SecureRandom, "random", spy)
    ldp.GaussianMechanism(epsilon=1.0, delta=1e-5, clip_norm=1.0)(np.ones(8), None)
    ldp.LaplaceMechanism(epsilon=1.0, clip_norm=1.0)(np.ones(8), None)
    cfg = signds.SignDSConfig(d=50, k=5, h=3, epsilon=1.0)
    rep = signds.signds_report(np.arange(50.0), cfg, None)
    assert len(rep.indices) == 3 and len(calls) >= 3
    # an explicit seed reproduces (and never touches the OS CSPRNG)
    calls.clear()
    a = ldp.GaussianMechanism(epsilon=1.0, delta=1e-5, clip_norm=1.0)(np.ones(8), 5)
    b = ldp.GaussianMechanism(epsilon=1.0, delta=1e-5, clip_norm=1.0)(np.ones(8), 5)
    np.testing.assert_array_equal(a, b)
    assert not calls


def test_both_box_muller_outputs_are_independent_normals():
    """standard_normal uses r cos and r sin of each uniform pair: the two halves of a draw are its pair partners
    and must be uncorrelated (|rho| < 0.05 is 5 standard errors for 10,000 pairs), each N(0, 1), odd sizes too."""
    r = SecureRandom()
    z = r.standard_normal(20_001)
    first, second = z[:10_000], z[10_001:]  # partners: i and i + 10,001
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.05
    assert stats.kstest(first, "norm").pvalue > 1e-4 and stats.kstest(second, "norm").pvalue > 1e-4
    assert stats.kstest((first + second) / np.sqrt(2.0), "norm").pvalue > 1e-4  # jointly normal, independent
    assert r.standard_normal(0).shape == (0,) and isinstance(r.standard_normal(), float)
