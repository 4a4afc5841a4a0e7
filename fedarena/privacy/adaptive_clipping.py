"""Adaptive clipping of DP-FedAvg's client updates to a target quantile of their norms.

G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021 (Algorithm 1 and Section 3):

* each sampled client reports, beside its clipped update, the bit ``b_i = 1[||Delta_i|| <= C]``; the server
  releases the noisy sum of the centred bits ``sum_i (b_i - 1/2) + N(0, sigma_b^2)`` (sensitivity 1/2) and
  estimates the unclipped fraction with the fixed denominator ``m`` (the expected number of clients ``q N``):
  ``b_bar = noisy_sum / m + 1/2``, an unbiased estimate under Poisson sampling;
* the clip follows the geometric update ``C <- C exp(-eta_C (b_bar - gamma))``, which moves ``C`` towards the
  ``gamma``-quantile of the update norms;
* privacy: the update sum (sensitivity ``C``, noise ``z_Delta C``) and the bit sum (sensitivity 1/2, noise
  ``sigma_b``) together are one Gaussian query of noise multiplier ``z`` when
  ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` (the per-client contribution, scaled by each noise, has L2 norm
  at most ``sqrt(z_Delta^-2 + (2 sigma_b)^-2) = 1 / z``). The accountant charges ``z``; the updates get the
  larger ``z_Delta``.

The paper's defaults are ``gamma = 0.5``, ``eta_C = 0.2`` and ``sigma_b = m / 20``. Noise comes from the OS CSPRNG
(:class:`fedarena.privacy.secure_random.SecureRandom`) unless a seed is given for a reproducible test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedarena.privacy.secure_random import SecureRandom


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the update noise multiplier that, with the bit sum's noise
    ``sigma_b``, makes the round a Gaussian mechanism of multiplier ``z`` (Andrew et al. 2021, Section 3.1)."""
    z, sb = float(noise_multiplier), float(count_stddev)
    if not (z > 0 and math.isfinite(z)):
        raise ValueError(f"noise_multiplier: must be a finite number > 0, got {noise_multiplier!r}")
    if not 2 * sb > z:
        raise ValueError(f"clip_count_stddev: must exceed noise_multiplier / 2 = {z / 2:g} so that the update noise "
                         f"stays finite, got {count_stddev!r}")
    return (z ** -2 - (2 * sb) ** -2) ** -0.5


@dataclass
class QuantileClipper:
    """The clip ``C`` of DP-FedAvg, adapted after every round towards the ``target_quantile`` of the update norms."""

    initial_clip: float
    expected_clients: float
    """m = q N, the fixed denominator of the unclipped-fraction estimate"""
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float = 0.0
    """sigma_b, the noise on the sum of the centred bits; 0 = expected_clients / 20 (the paper's choice)"""
    seed: int | None = None
    """explicit seed for reproducible tests; None draws the noise from os.urandom"""
    clip_norm: float = field(init=False)
    last_estimate: float = field(init=False, default=math.nan)
    """b_bar of the latest update (noisy unclipped fraction)"""

    def __post_init__(self) -> None:
        if not (self.initial_clip > 0 and math.isfinite(self.initial_clip)):
            raise ValueError(f"clip_norm: must be a finite number > 0, got {self.initial_clip!r}")
        if not self.expected_clients > 0:
            raise ValueError(f"expected_clients: must be > 0, got {self.expected_clients!r}")
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"target_quantile: must lie in (0, 1), got {self.target_quantile!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"clip_learning_rate: must be a finite number > 0, got {self.learning_rate!r}")
        if not self.count_stddev >= 0:
            raise ValueError(f"clip_count_stddev: must be >= 0, got {self.count_stddev!r}")
        if self.count_stddev == 0:
            self.count_stddev = self.expected_clients / 20.0
        self.clip_norm = float(self.initial_clip)

    def update_noise_multiplier(self, noise_multiplier: float) -> float:
        return update_noise_multiplier(noise_multiplier, self.count_stddev)

    def _noise(self, round_id: int) -> float:
        if self.seed is None:
            return float(self.count_stddev * SecureRandom().standard_normal(1)[0])
        return float(self.count_stddev * np.random.default_rng([self.seed, round_id, 29]).standard_normal())

    def update(self, norms, round_id: int) -> float:
        """Account the round's update norms (taken against the current clip) and return the next clip."""
        norms = np.asarray(norms, np.float64)
        noisy = float(np.sum((norms <= self.clip_norm) - 0.5)) + self._noise(round_id)
        self.last_estimate = noisy / self.expected_clients + 0.5
        self.clip_norm = float(self.clip_norm * math.exp(-self.learning_rate * (self.last_estimate
                                                                               - self.target_quantile)))
        return self.clip_norm

    def state(self) -> dict:
        return {"clip_norm": self.clip_norm, "last_estimate": self.last_estimate}

    def restore(self, state: dict) -> None:
        self.clip_norm = float(state["clip_norm"])
        self.last_estimate = float(state["last_estimate"])
