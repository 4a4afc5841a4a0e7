"""SignDS (Jiang, Zhou, Grossklags 2022): threshold vs brute force, nu distribution (chi-square), exact
epsilon-LDP ratio over every pair of top-k sets, upload format, server update."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from fedarena.privacy.signds import (
    SignDSConfig,
    SignDSReport,
    expected_nu,
    nu_probabilities,
    optimal_threshold,
    sample_nu,
    select_dimensions,
    signds_aggregate,
    signds_report,
    top_k_set,
)


def brute_force_expected_nu(d, k, h, eps, th):
    """E[nu | nu_th] by enumerating every output set J with S = {0..k-1}."""
    num = den = 0.0
    for J in itertools.combinations(range(d), h):
        nu = sum(1 for j in J if j < k)
        w = math.exp(eps * (nu >= th))
        num += nu * w
        den += w
    return num / den


@pytest.mark.parametrize("d,k,h,eps", [(8, 3, 4, 1.0), (10, 2, 5, 3.0), (9, 4, 2, 0.5), (12, 5, 6, 2.0),
                                       (7, 1, 6, 5.0), (10, 6, 9, 1.5)])
@pytest.mark.quick
def test_threshold_equals_brute_force_argmax(d, k, h, eps):
    cfg = SignDSConfig(d, k, h, eps)
    brute = {th: brute_force_expected_nu(d, k, h, eps, th) for th in cfg.taus}
    np.testing.assert_allclose(expected_nu(cfg), [brute[t] for t in cfg.taus], rtol=1e-10)
    best = max(brute.values())
    assert optimal_threshold(cfg) == min(t for t, v in brute.items() if v == pytest.approx(best, rel=1e-12))


def test_large_d_in_log_space():
    cfg = SignDSConfig(d=10**6, k=10_000, h=50_000, epsilon=2.0)
    th = optimal_threshold(cfg)
    p = nu_probabilities(cfg, th)
    assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
    # uniform selection would give E[nu] = h k / d = 500; the mechanism must beat it
    assert expected_nu(cfg).max() > 500
    r = signds_report(np.random.default_rng(0).normal(size=cfg.d), cfg, 0)
    assert r.indices.size == cfg.h and np.unique(r.indices).size == cfg.h
    assert r.upload_bytes == 1 + 4 * cfg.h and len(r.to_bytes()) == r.upload_bytes


def test_nu_distribution_chi_square():
    cfg = SignDSConfig(d=200, k=20, h=30, epsilon=2.0)
    th = optimal_threshold(cfg)
    draws = sample_nu(cfg, np.random.default_rng(1), size=100_000)
    p = nu_probabilities(cfg, th)
    counts = np.array([(draws == t).sum() for t in cfg.taus])
    keep = p * 100_000 >= 5  # pool the tail cells with tiny expected counts
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep], p[~keep].sum()) * 100_000
    assert counts.sum() == 100_000
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    # a wrong threshold's distribution is rejected (the test has power)
    wrong = nu_probabilities(cfg, th + 2)
    exp_w = np.append(wrong[keep], wrong[~keep].sum()) * 100_000
    assert stats.chisquare(obs, exp_w).pvalue < 1e-6


def test_selected_sets_follow_em_mds_and_exact_ratio_bound():
    d, k, h, eps = 7, 2, 3, 1.3
    cfg = SignDSConfig(d, k, h, eps)
    th = optimal_threshold(cfg)
    p_nu = dict(zip(cfg.taus.tolist(), nu_probabilities(cfg, th)))
    omega = {t: math.comb(k, t) * math.comb(d - k, h - t) for t in cfg.taus.tolist()}
    outputs = list(itertools.combinations(range(d), h))

    def prob(J, S):
        nu = len(set(J) & set(S))
        return p_nu[nu] / omega[nu]

    sets = list(itertools.combinations(range(d), k))
    for S in sets:
        assert sum(prob(J, S) for J in outputs) == pytest.approx(1.0)
    worst = max(prob(J, S1) / prob(J, S2) for S1 in sets for S2 in sets for J in outputs)
    assert worst <= math.exp(eps) * (1 + 1e-12)
    assert worst == pytest.approx(math.exp(eps))  # tight: the bound is attained

    # the sampler's output sets follow exactly these probabilities (chi-square over all 35 outputs)
    S = (1, 4)
    rng = np.random.default_rng(2)
    n = 40_000
    index = {J: i for i, J in enumerate(outputs)}
    counts = np.zeros(len(outputs))
    for _ in range(n):
        counts[index[tuple(int(j) for j in select_dimensions(cfg, np.array(S), rng, threshold=th))]] += 1
    expected = np.array([prob(J, S) for J in outputs]) * n
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_top_k_by_sign_and_report_roundtrip():
    u = np.array([0.5, -3.0, 2.0, 0.1, -1.0, 4.0])
    np.testing.assert_array_equal(top_k_set(u, 2, +1), [2, 5])
    np.testing.assert_array_equal(top_k_set(u, 2, -1), [1, 4])
    cfg = SignDSConfig(d=6, k=2, h=3, epsilon=1.0)
    r = signds_report(u, cfg, 3)
    back = SignDSReport.from_bytes(r.to_bytes(), cfg)
    np.testing.assert_array_equal(back.indices, r.indices)
    assert back.sign == r.sign
    with pytest.raises(ValueError, match="expected 13 bytes"):
        SignDSReport.from_bytes(r.to_bytes()[:-1], cfg)
    with pytest.raises(ValueError, match="out of range"):
        SignDSReport.from_bytes(bytes([1]) + np.array([0, 1, 6], "<u4").tobytes(), cfg)
    with pytest.raises(ValueError, match="distinct"):
        SignDSReport.from_bytes(bytes([1]) + np.array([0, 1, 1], "<u4").tobytes(), cfg)
    with pytest.raises(ValueError, match="sign byte"):
        SignDSReport.from_bytes(bytes([7]) + np.array([0, 1, 2], "<u4").tobytes(), cfg)


def test_server_sparse_update():
    reports = [SignDSReport(np.array([0, 2], np.uint32), 1), SignDSReport(np.array([2, 3], np.uint32), -1)]
    np.testing.assert_allclose(signds_aggregate(reports, 5, 0.1), [0.05, 0, 0, -0.05, 0])


@pytest.mark.parametrize("kw,field", [(dict(d=5, k=5, h=2, epsilon=1.0), "k"), (dict(d=5, k=2, h=6, epsilon=1.0), "h"),
                                      (dict(d=5, k=2, h=2, epsilon=0.0), "epsilon"),
                                      (dict(d=0, k=2, h=2, epsilon=1.0), "d"), (dict(d=5, k=2.5, h=2, epsilon=1.0), "k")])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=field):
        SignDSConfig(**kw)
