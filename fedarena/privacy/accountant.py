"""Renyi-DP accountant for the sampled Gaussian mechanism, with conversion to (epsilon, delta).

* RDP and composition: I. Mironov, "Renyi Differential Privacy", CSF 2017 (RDP of order alpha adds up over
  steps).
* Sampled Gaussian mechanism (Poisson sampling rate q, noise multiplier sigma): I. Mironov, K. Talwar, L. Zhang,
  "Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019, Section 3.3: RDP(alpha) = log(A_alpha) /
  (alpha - 1) with ``A_alpha = E_{z ~ N(0, s^2)}[((1 - q) + q N(1, s^2)(z) / N(0, s^2)(z))^alpha]``; for integer alpha
  the binomial expansion ``sum_i C(alpha, i) q^i (1 - q)^(alpha - i) exp((i^2 - i) / (2 s^2))``, for fractional
  alpha the two convergent series split at ``z0 = s^2 log(1/q - 1) + 1/2``.
* Conversion: ``eps = rdp - (log delta + log alpha) / (alpha - 1) + log((alpha - 1) / alpha)``, minimised over the
  orders (B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato, "Hypothesis Testing Interpretations and Renyi
  Differential Privacy", AISTATS 2020, Theorem 21); ``conversion="mironov"`` gives the classic
  ``rdp + log(1/delta) / (alpha - 1)`` (Mironov 2017, Proposition 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special

DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""Orders 1.1, 1.2, ..., 10.9 and 12..63 (the grid used by common DP-SGD libraries)."""


def _validate(q: float, sigma: float) -> None:
    if not (0.0 <= q <= 1.0) or not math.isfinite(q):
        raise ValueError(f"sample_rate: must lie in [0, 1], got {q!r}")
    if not (sigma >= 0.0) or not math.isfinite(sigma):
        raise ValueError(f"noise_multiplier: must be a finite number >= 0, got {sigma!r}")


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    i = np.arange(alpha + 1, dtype=np.float64)
    terms = (special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
             + i * math.log(q) + (alpha - i) * math.log1p(-q) + (i * i - i) / (2 * sigma**2))
    return float(special.logsumexp(terms))


def _log_erfc_half(x: np.ndarray) -> np.ndarray:
    """log(erfc(x) / 2) = log Phi(-sqrt(2) x), accurate for large x."""
    return special.log_ndtr(-x * math.sqrt(2.0))


def _log_a_frac(q: float, sigma: float, alpha: float, tail: float = -30.0) -> float:
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    pos: list[np.ndarray] = []
    neg: list[np.ndarray] = []
    start, chunk = 0, 64
    while True:
        i = np.arange(start, start + chunk, dtype=np.float64)
        j = alpha - i
        # generalized binomial C(alpha, i) = Gamma(alpha + 1) / (Gamma(i + 1) Gamma(alpha - i + 1)), with sign
        log_abs = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(j + 1)
        sign = special.gammasgn(j + 1)
        s0 = (log_abs + i * math.log(q) + j * math.log1p(-q) + (i * i - i) / (2 * sigma**2)
              + _log_erfc_half((i - z0) / (math.sqrt(2) * sigma)))
        s1 = (log_abs + j * math.log(q) + i * math.log1p(-q) + (j * j - j) / (2 * sigma**2)
              + _log_erfc_half((z0 - j) / (math.sqrt(2) * sigma)))
        both = np.logaddexp(s0, s1)
        pos.append(both[sign > 0])
        neg.append(both[sign < 0])
        small = np.maximum(s0, s1) < tail
        if small.any() and i[np.argmax(small)] > alpha:
            break
        start += chunk
        if start > 10_000:
            raise ArithmeticError(f"RDP series did not converge for q={q}, sigma={sigma}, alpha={alpha}")
    p = special.logsumexp(np.concatenate(pos))
    n = special.logsumexp(np.concatenate(neg)) if sum(a.size for a in neg) else -np.inf
    if n == -np.inf:
        return float(p)
    return float(p + math.log(-math.expm1(n - p)))


def rdp_sampled_gaussian(sample_rate: float, noise_multiplier: float, steps: int,
                         orders=DEFAULT_ORDERS) -> np.ndarray:
    """RDP of ``steps`` compositions of the sampled Gaussian mechanism at each order (array like ``orders``)."""
    q, sigma = float(sample_rate), float(noise_multiplier)
    _validate(q, sigma)
    if steps < 0:
        raise ValueError(f"steps: must be >= 0, got {steps}")
    out = []
    for a in np.atleast_1d(np.asarray(orders, dtype=np.float64)):
        if a <= 1:
            raise ValueError(f"orders: RDP orders must be > 1, got {a}")
        if q == 0:
            r = 0.0
        elif sigma == 0:
            r = math.inf
        elif q == 1.0:
            r = a / (2 * sigma**2)
        elif float(a).is_integer():
            r = _log_a_int(q, sigma, int(a)) / (a - 1)
        else:
            r = _log_a_frac(q, sigma, float(a)) / (a - 1)
        out.append(r * steps)
    return np.asarray(out)


def epsilon_from_rdp(rdp: np.ndarray, orders, delta: float, conversion: str = "balle2020") -> tuple[float, float]:
    """Smallest epsilon over the orders for the given delta; returns ``(epsilon, best_order)``."""
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta: must lie strictly between 0 and 1, got {delta!r}")
    a = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    r = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if a.shape != r.shape:
        raise ValueError(f"orders: {a.size} orders for {r.size} RDP values")
    if conversion == "balle2020":
        eps = r - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    elif conversion == "mironov":
        eps = r + math.log(1 / delta) / (a - 1)
    else:
        raise ValueError(f"conversion: unknown '{conversion}' (use 'balle2020' or 'mironov')")
    eps = np.where(np.isnan(eps), np.inf, eps)
    k = int(np.argmin(eps))
    return max(0.0, float(eps[k])), float(a[k])


@dataclass
class RDPAccountant:
    """Accumulates RDP over DP-SGD steps (each step a sampled Gaussian mechanism)."""

    orders: tuple[float, ...] = DEFAULT_ORDERS
    rdp: np.ndarray = field(default=None)  # type: ignore[assignment]
    steps: int = 0

    def __post_init__(self) -> None:
        if self.rdp is None:
            self.rdp = np.zeros(len(self.orders))

    def step_rdp(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> np.ndarray:
        return rdp_sampled_gaussian(sample_rate, noise_multiplier, steps, self.orders)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        self.rdp = self.rdp + self.step_rdp(noise_multiplier, sample_rate, steps)
        self.steps += steps

    def epsilon(self, delta: float) -> float:
        if self.steps == 0:
            return 0.0
        return epsilon_from_rdp(self.rdp, self.orders, delta)[0]
