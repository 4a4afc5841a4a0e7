"""LDP mechanisms: calibration checked against the exact Gaussian privacy profile (Balle & Wang 2018, Thm 8),
empirical noise scales, clipping, and parameter validation."""

import math

import numpy as np
import pytest
from scipy import stats

from fedarena.privacy.ldp import (
    GaussianMechanism,
    LaplaceMechanism,
    analytic_gaussian_sigma,
    clip_l1,
    clip_l2,
    gaussian_delta,
)


@pytest.mark.parametrize("eps,delta,sens", [(0.1, 1e-5, 1.0), (1.0, 1e-5, 1.0), (1.0, 0.3, 2.0),
                                            (4.0, 1e-6, 0.5), (20.0, 1e-8, 1.0), (0.01, 0.45, 1.0)])
@pytest.mark.quick
def test_analytic_sigma_meets_exact_profile_and_is_smallest(eps, delta, sens):
    sigma = analytic_gaussian_sigma(eps, delta, sens)
    # independent oracle: the exact (eps, delta) curve of the Gaussian mechanism
    assert gaussian_delta(sigma, eps, sens) == pytest.approx(delta, rel=1e-6)
    # 0.1% less noise breaks the guarantee, so sigma is the tightest one
    assert gaussian_delta(sigma * 0.999, eps, sens) > delta
    assert gaussian_delta(sigma * 1.001, eps, sens) < delta


def test_analytic_beats_classical_bound():
    eps, delta = 0.5, 1e-5
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps
    sigma = analytic_gaussian_sigma(eps, delta)
    assert sigma < classical
    # published order of magnitude (Balle & Wang 2018, Fig. 1): analytic sigma for eps=1, delta=1e-5 is about 3.73
    assert analytic_gaussian_sigma(1.0, 1e-5) == pytest.approx(3.73, abs=0.01)


def test_clipping():
    x = np.array([3.0, 4.0])
    np.testing.assert_allclose(clip_l2(x, 1.0), [0.6, 0.8])
    np.testing.assert_allclose(clip_l2(x, 10.0), x)
    np.testing.assert_allclose(clip_l1(x, 1.4), [0.6, 0.8])
    np.testing.assert_allclose(clip_l2(np.zeros(3), 1.0), 0.0)


def test_gaussian_empirical_scale_matches_calibration():
    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip_norm=0.5)
    x = np.zeros(200_000)
    noise = mech(x, np.random.default_rng(0))
    assert mech.sigma == pytest.approx(analytic_gaussian_sigma(2.0, 1e-5, 1.0))
    # std of 200k normals has relative std error 1/sqrt(2n) ~ 0.16%
    assert np.std(noise) == pytest.approx(mech.sigma, rel=0.01)
    assert stats.kstest(noise / mech.sigma, "norm").pvalue > 1e-3
    # the update itself is clipped before noise: the mean recovers the clipped update
    big = np.full(4, 10.0)
    outs = np.stack([mech(big, s) for s in range(2000)])
    np.testing.assert_allclose(outs.mean(0), clip_l2(big, 0.5), atol=5 * mech.sigma / math.sqrt(2000))


@pytest.mark.quick
def test_laplace_empirical_scale_matches_calibration():
    mech = LaplaceMechanism(epsilon=0.5, clip_norm=1.0)
    assert mech.scale == pytest.approx(4.0)
    noise = mech(np.zeros(200_000), 1)
    assert np.mean(np.abs(noise)) == pytest.approx(4.0, rel=0.01)  # E|L| = b
    assert stats.kstest(noise, "laplace", args=(0, 4.0)).pvalue > 1e-3


@pytest.mark.parametrize("kwargs,field", [
    (dict(epsilon=0.0, delta=1e-5, clip_norm=1.0), "epsilon"),
    (dict(epsilon=-1.0, delta=1e-5, clip_norm=1.0), "epsilon"),
    (dict(epsilon=float("nan"), delta=1e-5, clip_norm=1.0), "epsilon"),
    (dict(epsilon=float("inf"), delta=1e-5, clip_norm=1.0), "epsilon"),
    (dict(epsilon=1.0, delta=0.0, clip_norm=1.0), "delta"),
    (dict(epsilon=1.0, delta=1.0, clip_norm=1.0), "delta"),
    (dict(epsilon=1.0, delta="x", clip_norm=1.0), "delta"),
    (dict(epsilon=1.0, delta=1e-5, clip_norm=0.0), "clip_norm"),
    (dict(epsilon=1.0, delta=1e-5, clip_norm=-2.0), "clip_norm"),
])
def test_gaussian_rejects_invalid_parameters(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GaussianMechanism(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(epsilon=0.0, clip_norm=1.0), "epsilon"),
    (dict(epsilon=1.0, clip_norm=float("inf")), "clip_norm"),
    (dict(epsilon=None, clip_norm=1.0), "epsilon"),
])
def test_laplace_rejects_invalid_parameters(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LaplaceMechanism(**kwargs)
    with pytest.raises(ValueError, match="sensitivity"):
        analytic_gaussian_sigma(1.0, 1e-5, sensitivity=0.0)
