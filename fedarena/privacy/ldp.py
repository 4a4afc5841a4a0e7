"""Local differential privacy for client updates: L2/L1 clipping, the Gaussian mechanism calibrated by the
analytic Gaussian mechanism, and the Laplace mechanism.

The client uploads ``W_p = W + G`` where ``W`` is its clipped update and ``G`` is noise (FL chapter, LDP).

* Analytic Gaussian mechanism: B. Balle and Y.-X. Wang, "Improving the Gaussian Mechanism for Differential
  Privacy: Analytical Calibration and Optimal Denoising", ICML 2018, Theorem 8 and Algorithm 1. The smallest
  sigma such that N(0, sigma^2) noise on a function of L2 sensitivity ``Delta`` is (epsilon, delta)-DP, for every
  epsilon > 0 (the classical ``sqrt(2 ln(1.25/delta)) Delta / epsilon`` needs epsilon < 1 and is loose).
* Laplace mechanism: C. Dwork, F. McSherry, K. Nissim, A. Smith, TCC 2006; scale ``Delta_1 / epsilon``.

Sensitivity in the local model: any two client inputs are neighbours, so after clipping to norm ``C`` the
sensitivity is ``2 C`` (the diameter of the ball). The mechanisms below take the clip norm and use ``2 C``;
:func:`analytic_gaussian_sigma` takes the sensitivity directly for other uses (e.g. central DP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from fedarena.privacy.secure_random import random_source

__all__ = [
    "clip_l2",
    "clip_l1",
    "analytic_gaussian_sigma",
    "gaussian_delta",
    "GaussianMechanism",
    "LaplaceMechanism",
]


def _check_positive_finite(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return v


def _check_delta(delta: float) -> float:
    try:
        v = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"delta: must be a number, got {delta!r}") from None
    if not (0.0 < v < 1.0):
        raise ValueError(f"delta: must lie strictly between 0 and 1, got {delta!r}")
    return v


def clip_l2(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale ``x`` so that its L2 norm is at most ``clip_norm`` (``x * min(1, C / ||x||_2)``)."""
    c = _check_positive_finite("clip_norm", clip_norm)
    x = np.asarray(x, dtype=np.float64)
    norm = float(np.linalg.norm(x.ravel()))
    return x * min(1.0, c / norm) if norm > 0 else x.copy()


def clip_l1(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale ``x`` so that its L1 norm is at most ``clip_norm``."""
    c = _check_positive_finite("clip_norm", clip_norm)
    x = np.asarray(x, dtype=np.float64)
    norm = float(np.abs(x).sum())
    return x * min(1.0, c / norm) if norm > 0 else x.copy()


def _log_exp_eps_phi(eps: float, x: float) -> float:
    """log(e^eps * Phi(x)), stable for large eps and very negative x."""
    return eps + float(special.log_ndtr(x))


def _diff(a_log: float, b_log: float) -> float:
    """exp(a_log) - exp(b_log) computed without overflow."""
    if a_log == -math.inf:
        return -math.exp(b_log)
    return math.exp(a_log) * -math.expm1(b_log - a_log) if b_log < a_log else -math.exp(b_log) * -math.expm1(a_log - b_log)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact privacy profile of the Gaussian mechanism (Balle & Wang 2018, Theorem 8):
    ``delta(eps) = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)`` for noise std ``s``, sensitivity ``D``."""
    s = _check_positive_finite("sigma", sigma)
    eps = float(epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon!r}")
    d = _check_positive_finite("sensitivity", sensitivity)
    a = d / (2 * s)
    b = eps * s / d
    return max(0.0, _diff(float(special.log_ndtr(a - b)), _log_exp_eps_phi(eps, -a - b)))


def _grow_bracket(f, hi: float = 1.0) -> float:
    while f(hi) < 0:
        hi *= 2.0
        if hi > 1e300:
            raise ArithmeticError("analytic Gaussian calibration: no bracket found")
    return hi


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0, tol: float = 1e-12) -> float:
    """Smallest noise std sigma such that the Gaussian mechanism with L2 sensitivity ``sensitivity`` is
    (epsilon, delta)-DP (Balle & Wang 2018, Algorithm 1)."""
    eps = _check_positive_finite("epsilon", epsilon)
    dlt = _check_delta(delta)
    sens = _check_positive_finite("sensitivity", sensitivity)

    # delta_0 = Phi(0) - e^eps Phi(-sqrt(2 eps)): the profile at sigma where the two cases meet.
    delta0 = _diff(math.log(0.5), _log_exp_eps_phi(eps, -math.sqrt(2 * eps)))
    if dlt == delta0:
        alpha = 1.0
    elif dlt > delta0:
        # B+(v) = Phi(sqrt(eps v)) - e^eps Phi(-sqrt(eps (v + 2))), increasing in v; v* = sup{v : B+(v) <= delta}
        def f(v: float) -> float:
            return _diff(float(special.log_ndtr(math.sqrt(eps * v))), _log_exp_eps_phi(eps, -math.sqrt(eps * (v + 2)))) - dlt

        hi = _grow_bracket(f)
        v = optimize.brentq(f, 0.0, hi, xtol=tol, rtol=4 * np.finfo(float).eps, maxiter=500)
        alpha = math.sqrt(1 + v / 2) - math.sqrt(v / 2)
    else:
        # B-(u) = Phi(-sqrt(eps u)) - e^eps Phi(-sqrt(eps (u + 2))), decreasing in u; u* = inf{u : B-(u) <= delta}
        def g(u: float) -> float:
            return dlt - _diff(float(special.log_ndtr(-math.sqrt(eps * u))), _log_exp_eps_phi(eps, -math.sqrt(eps * (u + 2))))

        hi = _grow_bracket(g)
        u = optimize.brentq(g, 0.0, hi, xtol=tol, rtol=4 * np.finfo(float).eps, maxiter=500)
        alpha = math.sqrt(1 + u / 2) + math.sqrt(u / 2)
    return alpha * sens / math.sqrt(2 * eps)


@dataclass(frozen=True)
class GaussianMechanism:
    """Clip the update to L2 norm ``clip_norm``, add N(0, sigma^2 I) with sigma from the analytic Gaussian
    mechanism for (epsilon, delta) and L2 sensitivity ``2 * clip_norm`` (local model)."""

    epsilon: float
    delta: float
    clip_norm: float

    def __post_init__(self) -> None:
        _check_positive_finite("epsilon", self.epsilon)
        _check_delta(self.delta)
        _check_positive_finite("clip_norm", self.clip_norm)

    @property
    def sensitivity(self) -> float:
        return 2.0 * float(self.clip_norm)

    @property
    def sigma(self) -> float:
        return analytic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)

    def __call__(self, update: np.ndarray, rng: np.random.Generator | int | None) -> np.ndarray:
        """Return ``clip_l2(update) + G``; ``rng`` None draws from the OS CSPRNG, a Generator or seed is for tests
        (:func:`fedarena.privacy.secure_random.random_source`)."""
        rng = random_source(rng)
        w = clip_l2(update, self.clip_norm)
        return w + rng.normal(0.0, self.sigma, size=w.shape)


@dataclass(frozen=True)
class LaplaceMechanism:
    """Clip the update to L1 norm ``clip_norm``, add i.i.d. Laplace(0, b) noise with ``b = 2 clip_norm / epsilon``
    (L1 sensitivity ``2 * clip_norm`` in the local model); epsilon-DP."""

    epsilon: float
    clip_norm: float

    def __post_init__(self) -> None:
        _check_positive_finite("epsilon", self.epsilon)
        _check_positive_finite("clip_norm", self.clip_norm)

    @property
    def sensitivity(self) -> float:
        return 2.0 * float(self.clip_norm)

    @property
    def scale(self) -> float:
        return self.sensitivity / float(self.epsilon)

    def __call__(self, update: np.ndarray, rng: np.random.Generator | int | None) -> np.ndarray:
        rng = random_source(rng)
        w = clip_l1(update, self.clip_norm)
        return w + rng.laplace(0.0, self.scale, size=w.shape)
