"""DP-FedAvg's mechanism: server-side clipping of client updates, Gaussian noise on their sum, RDP accounting.

McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR
2018, Algorithm 1 with the fixed-denominator estimator: each round samples every user with
probability ``q``; every update is clipped to L2 norm ``S``; the server adds ``N(0, (z S)^2 I)`` to the
sum of the clipped updates and divides by the expected number of users ``q N``. One round is then a
sampled Gaussian mechanism with noise multiplier ``z`` and sampling rate ``q`` on user-level
adjacency; R rounds compose in RDP (:class:`fedarena.privacy.accountant.RDPAccountant`).

Noise comes from ``os.urandom`` (Box-Muller on 53-bit uniforms) unless an explicit seed is given for a
reproducible test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.secure_random import SecureRandom


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` standard normal draws from the operating system's CSPRNG (:class:`SecureRandom`)."""
    return SecureRandom().standard_normal(n)


def clip_to_norm(v: np.ndarray, clip_norm: float) -> np.ndarray:
    """``v * min(1, S / ||v||)``."""
    norm = float(np.linalg.norm(v))
    return v if norm <= clip_norm else v * (clip_norm / norm)


@dataclass(frozen=True)
class DPFedAvgMechanism:
    """Clip, sum, noise, divide by ``q N`` (see module docstring)."""

    clip_norm: float
    noise_multiplier: float
    sample_rate: float
    num_clients: int
    delta: float = 1e-5
    seed: int | None = None
    """explicit seed for reproducible tests; None draws the noise from os.urandom"""

    def __post_init__(self) -> None:
        if not self.clip_norm > 0:
            raise ValueError(f"dp.clip_norm: must be > 0, got {self.clip_norm}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"dp.noise_multiplier: must be >= 0, got {self.noise_multiplier}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"dp.sample_rate: must lie in (0, 1], got {self.sample_rate}")
        if self.num_clients < 1:
            raise ValueError(f"dp.num_clients: must be >= 1, got {self.num_clients}")
        if not 0 < self.delta < 1:
            raise ValueError(f"dp.delta: must lie in (0, 1), got {self.delta}")

    def noise(self, d: int, round_id: int) -> np.ndarray:
        sigma = self.noise_multiplier * self.clip_norm
        if self.seed is None:
            return sigma * secure_standard_normal(d)
        return sigma * np.random.default_rng([self.seed, round_id]).standard_normal(d)

    def noisy_mean(self, updates: list[np.ndarray], d: int, round_id: int) -> np.ndarray:
        """``(sum_i clip(Delta_i) + N(0, (z S)^2)) / (q N)``."""
        total = np.zeros(d, np.float64)
        for u in updates:
            total += clip_to_norm(np.asarray(u, np.float64), self.clip_norm)
        return (total + self.noise(d, round_id)) / (self.sample_rate * self.num_clients)

    def epsilon(self, rounds: int) -> float:
        """(epsilon, delta)-DP guarantee after ``rounds`` rounds (RDP of the sampled Gaussian mechanism)."""
        if rounds == 0:
            return 0.0
        acc = RDPAccountant()
        acc.step(self.noise_multiplier, self.sample_rate, rounds)
        return acc.epsilon(self.delta)
