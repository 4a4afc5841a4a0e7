"""Privacy loss distribution (PLD) accountant for the Poisson-subsampled Gaussian mechanism (DP-SGD, DP-FedAvg).

The method:

* PLD and composition: the privacy loss ``L = log(P(x) / Q(x))`` with ``x ~ P`` of a mechanism on a pair of
  neighbouring data sets; composing mechanisms convolves their PLDs, and ``delta(eps) = E_P[(1 - e^(eps - L))_+]``
  plus the mass at ``L = +inf`` (hockey-stick divergence). S. Meiser, E. Mohammadi, "Tight on Budget? Tight Bounds
  for r-Fold Approximate Differential Privacy", CCS 2018; A. Koskela, J. Jaelkoe, A. Honkela, "Computing Tight
  Differential Privacy Guarantees Using FFT", AISTATS 2020 (composition by FFT on a uniform grid).
* Discretisation: "connect the dots" (V. Doroshenko, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi, "Connect the
  Dots: Tighter Discrete Approximations of Privacy Loss Distributions", PETS 2022). On the grid
  ``eps_i = i h`` the discrete PLD is the one whose hockey-stick curve equals the true ``delta(eps_i)`` at every
  grid point and is linear in ``e^eps`` between them; ``delta`` is convex in ``e^eps``, so the chord lies above it
  and the discrete PLD is pessimistic (it dominates the mechanism). The mass beyond the top grid point goes to
  ``+inf`` (again pessimistic). Masses follow from the slopes ``S_i = (delta_i - delta_(i+1)) / (t_(i+1) - t_i)``,
  ``t_i = e^(eps_i)``: ``omega_i = t_i (S_(i-1) - S_i)`` with ``S_(-1) = (1 - delta_0) / t_0`` (the chord from
  ``delta(-inf) = 1``) and ``S_n = 0``, ``omega_inf = delta_n``.
* Subsampled Gaussian, add-or-remove-one adjacency with Poisson rate ``q`` and noise multiplier ``sigma``
  (sensitivity 1): "remove" compares ``P = (1 - q) N(0, s^2) + q N(1, s^2)`` with ``Q = N(0, s^2)``, "add" compares
  ``Q`` with ``P``; the loss is monotone in ``x``, so ``delta(eps)`` is a closed form in Gaussian tails at the
  threshold ``x*(eps)``. The guarantee is the larger of the two directions (as in Google's ``dp-accounting``,
  "Privacy loss distributions" technical report, 2020, which the tests use as the oracle).
* Self-composition by repeated squaring with FFT convolutions (scipy), truncating each result to the part
  between tails of mass ``tail_mass``: the upper tail moves to ``+inf`` and the lower tail onto the lowest kept
  grid point, both pessimistic.

Epsilon at a ``delta`` solves ``delta(eps) = delta`` exactly on the piece of the discrete curve that contains it
(``delta(eps) = A_k - e^eps B_k`` between grid points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import signal, special

DEFAULT_INTERVAL = 1e-4
"""grid spacing h of the privacy loss (nats)"""
DEFAULT_TAIL_MASS = 1e-15
"""probability mass cut from each tail of a distribution (pessimistically: upper tail to +inf)"""


def _validate(q: float, sigma: float) -> None:
    if not (0.0 <= q <= 1.0) or not math.isfinite(q):
        raise ValueError(f"sample_rate: must lie in [0, 1], got {q!r}")
    if not (sigma > 0.0) or not math.isfinite(sigma):
        raise ValueError(f"noise_multiplier: must be a finite number > 0, got {sigma!r}")


@dataclass(frozen=True)
class PLD:
    """A discrete privacy loss distribution: mass ``pmf[j]`` at loss ``(offset + j) * interval`` and ``inf_mass``
    at ``+inf``."""

    offset: int
    pmf: np.ndarray
    inf_mass: float
    interval: float

    def compose(self, other: PLD, tail_mass: float = DEFAULT_TAIL_MASS) -> PLD:
        """The PLD of running both mechanisms (convolution of the finite parts)."""
        if not math.isclose(self.interval, other.interval, rel_tol=1e-12):
            raise ValueError(f"interval: cannot compose PLDs on grids {self.interval} and {other.interval}")
        pmf = np.maximum(signal.fftconvolve(self.pmf, other.pmf), 0.0)  # FFT round-off can go slightly negative
        inf = 1.0 - (1.0 - self.inf_mass) * (1.0 - other.inf_mass)
        return _truncate(self.offset + other.offset, pmf, inf, self.interval, tail_mass)

    def self_compose(self, count: int, tail_mass: float = DEFAULT_TAIL_MASS) -> PLD:
        """``count``-fold composition with itself by repeated squaring."""
        if count < 1:
            raise ValueError(f"steps: must be >= 1, got {count}")
        result: PLD | None = None
        base = self
        while True:
            if count & 1:
                result = base if result is None else result.compose(base, tail_mass)
            count >>= 1
            if not count:
                return result  # type: ignore[return-value]
            base = base.compose(base, tail_mass)

    def _suffix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Losses ``eps_k`` and, for eps in ``[eps_k, eps_(k+1))``, ``delta(eps) = A_k - e^eps B_k``."""
        losses = (self.offset + np.arange(self.pmf.size)) * self.interval
        # A_k = inf + sum_(i > k) w_i ; B_k = sum_(i > k) w_i e^(-eps_i)
        a = self.inf_mass + np.concatenate([np.cumsum(self.pmf[::-1])[::-1][1:], [0.0]])
        wb = self.pmf * np.exp(-losses)
        b = np.concatenate([np.cumsum(wb[::-1])[::-1][1:], [0.0]])
        return losses, a, b

    def delta(self, epsilon: float) -> float:
        """Hockey-stick divergence ``delta(eps)`` of the discrete PLD."""
        losses = (self.offset + np.arange(self.pmf.size)) * self.interval
        above = losses > epsilon
        return float(self.inf_mass + np.sum(self.pmf[above] * -np.expm1(epsilon - losses[above])))

    def epsilon(self, delta: float) -> float:
        """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` (``inf`` when the mass at ``+inf`` exceeds it)."""
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta: must lie strictly between 0 and 1, got {delta!r}")
        if self.inf_mass > delta:
            return math.inf
        losses, a, b = self._suffix()
        at = a - np.exp(losses) * b  # delta at each grid point (non-increasing; the last one is inf_mass)
        k = int(np.argmax(at <= delta))  # first grid point with delta(eps_k) <= delta
        if k == 0:  # below the lowest loss: delta(eps) = inf_mass + sum_i w_i - e^eps sum_i w_i e^(-eps_i)
            a0 = self.inf_mass + float(self.pmf.sum())
            b0 = float(np.sum(self.pmf * np.exp(-losses)))
            eps = float(np.log((a0 - delta) / b0)) if a0 > delta and b0 > 0 else float(losses[0])
        else:  # delta(eps) = a_j - e^eps b_j on [eps_j, eps_k]
            j = k - 1
            eps = float(np.log((a[j] - delta) / b[j])) if b[j] > 0 else float(losses[k])
        return max(0.0, min(eps, float(losses[k])))


def _truncate(offset: int, pmf: np.ndarray, inf_mass: float, interval: float, tail_mass: float) -> PLD:
    lo_cum = np.cumsum(pmf)
    hi_cum = np.cumsum(pmf[::-1])[::-1]
    lo = int(np.searchsorted(lo_cum, tail_mass, side="right"))  # pmf[:lo] has mass <= tail_mass
    hi = int(pmf.size - np.searchsorted(hi_cum[::-1], tail_mass, side="right"))  # pmf[hi:] likewise
    lo = min(lo, pmf.size - 1)
    hi = max(hi, lo + 1)
    kept = pmf[lo:hi].copy()
    kept[0] += lo_cum[lo - 1] if lo > 0 else 0.0
    inf_mass = inf_mass + (hi_cum[hi] if hi < pmf.size else 0.0)
    return PLD(offset + lo, kept, float(min(inf_mass, 1.0)), interval)


def _log_mix(x: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """``log((1 - q) + q exp((2x - 1) / (2 sigma^2)))``: log of P/Q for the remove direction."""
    z = (2 * x - 1) / (2 * sigma**2)
    if q >= 1.0:
        return z
    return np.logaddexp(math.log1p(-q), math.log(q) + z)


def _hockey_stick(eps: np.ndarray, q: float, sigma: float, direction: str) -> np.ndarray:
    """Exact ``delta(eps)`` of one subsampled Gaussian step in ``direction`` ("remove" or "add")."""
    eps = np.asarray(eps, np.float64)
    sf = special.ndtr  # standard normal CDF Phi
    if direction == "remove":
        # L(x) > eps  <=>  x > x*;  delta = P(x > x*) - e^eps Q(x > x*)
        arg = (np.exp(eps) - (1.0 - q)) / q if q > 0 else np.full_like(eps, np.inf)
        ok = arg > 0
        xs = np.where(ok, sigma**2 * np.log(np.where(ok, arg, 1.0)) + 0.5, -np.inf)
        p = (1 - q) * sf(-xs / sigma) + q * sf(-(xs - 1) / sigma)
        out = p - np.exp(eps) * sf(-xs / sigma)
        out = np.where(ok, out, -np.expm1(eps))  # every x has L > eps: delta = 1 - e^eps
    elif direction == "add":
        # P = N(0, s^2), Q = the mixture; L(x) = -log_mix(x) > eps  <=>  x < x*;  delta = P(x < x*) - e^eps Q(x < x*)
        arg = (np.exp(-eps) - (1.0 - q)) / q
        ok = arg > 0
        xs = np.where(ok, sigma**2 * np.log(np.where(ok, arg, 1.0)) + 0.5, -np.inf)
        p = sf(xs / sigma)
        qm = (1 - q) * sf(xs / sigma) + q * sf((xs - 1) / sigma)
        out = np.where(ok, p - np.exp(eps) * qm, 0.0)
    else:
        raise ValueError(f"direction: must be 'remove' or 'add', got {direction!r}")
    return np.maximum(out, 0.0)


def subsampled_gaussian_pld(sample_rate: float, noise_multiplier: float, direction: str,
                            interval: float = DEFAULT_INTERVAL, tail_mass: float = DEFAULT_TAIL_MASS) -> PLD:
    """Pessimistic connect-the-dots PLD of one Poisson-subsampled Gaussian step (sensitivity 1)."""
    q, sigma = float(sample_rate), float(noise_multiplier)
    _validate(q, sigma)
    if not interval > 0:
        raise ValueError(f"interval: must be > 0, got {interval!r}")
    if q == 0.0:
        return PLD(0, np.ones(1), 0.0, interval)
    # loss range: the loss at the x-quantiles that leave tail_mass of either Gaussian outside
    zt = -special.ndtri(tail_mass)
    ends = _log_mix(np.array([-sigma * zt, 1 + sigma * zt]), q, sigma)
    if direction == "add":
        ends = -ends
    lo_i, hi_i = int(math.floor(ends.min() / interval)), int(math.ceil(ends.max() / interval))
    eps = np.arange(lo_i, hi_i + 1) * interval
    d = _hockey_stick(eps, q, sigma, direction)
    t = np.exp(eps)
    slopes = (d[:-1] - d[1:]) / np.diff(t)  # S_0..S_(n-1)
    s_prev = np.concatenate([[(1.0 - d[0]) / t[0]], slopes])  # S_(i-1) for i = 0..n
    s_next = np.concatenate([slopes, [0.0]])  # S_i for i = 0..n
    pmf = np.maximum(t * (s_prev - s_next), 0.0)
    return _truncate(lo_i, pmf, float(d[-1]), interval, tail_mass)


@dataclass
class PLDAccountant:
    """Composes Poisson-subsampled Gaussian steps in both directions of add-or-remove-one adjacency; epsilon and
    delta are the worse of the two. Steps are composed when epsilon or delta is asked for: those with the same
    (noise multiplier, sampling rate) together by repeated squaring, onto the cached composition of earlier steps."""

    interval: float = DEFAULT_INTERVAL
    tail_mass: float = DEFAULT_TAIL_MASS
    events: dict[tuple[float, float], int] = field(default_factory=dict)
    steps: int = 0
    _cache: dict = field(default_factory=dict, repr=False)
    _single: dict = field(default_factory=dict, repr=False)
    """one-step PLDs by (noise multiplier, sampling rate, direction), shared with copies"""

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        _validate(float(sample_rate), float(noise_multiplier))
        if steps < 0:
            raise ValueError(f"steps: must be >= 0, got {steps}")
        if steps:
            key = (float(noise_multiplier), float(sample_rate))
            self.events[key] = self.events.get(key, 0) + steps
            self.steps += steps

    def pld(self, direction: str) -> PLD:
        """The composed PLD of every step so far in ``direction``; steps added since the last call are composed
        onto the cached result."""
        if direction not in ("remove", "add"):
            raise ValueError(f"direction: must be 'remove' or 'add', got {direction!r}")
        out, done = self._cache.get(direction, (PLD(0, np.ones(1), 0.0, self.interval), {}))
        for (sigma, q), n in sorted(self.events.items()):
            new = n - done.get((sigma, q), 0)
            if new > 0:
                one = self._single.get((sigma, q, direction))
                if one is None:
                    one = self._single[(sigma, q, direction)] = subsampled_gaussian_pld(
                        q, sigma, direction, self.interval, self.tail_mass)
                out = out.compose(one.self_compose(new, self.tail_mass), self.tail_mass)
        self._cache[direction] = (out, dict(self.events))
        return out

    def copy(self) -> PLDAccountant:
        """An accountant with the same steps that shares the (immutable) composed PLDs computed so far."""
        return PLDAccountant(self.interval, self.tail_mass, dict(self.events), self.steps, dict(self._cache),
                             self._single)

    def epsilon(self, delta: float) -> float:
        if self.steps == 0:
            return 0.0
        return max(self.pld("remove").epsilon(delta), self.pld("add").epsilon(delta))

    def delta(self, epsilon: float) -> float:
        if not epsilon >= 0:
            raise ValueError(f"epsilon: must be >= 0, got {epsilon!r}")
        if self.steps == 0:
            return 0.0
        return max(self.pld("remove").delta(epsilon), self.pld("add").delta(epsilon))
