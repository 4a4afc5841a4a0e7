"""DP-FedAvg's mechanism: server-side clipping of client updates, Gaussian noise on their sum, RDP accounting.

McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR
2018, Algorithm 1 with the fixed-denominator estimator: each round samples every user with
probability ``q``; every update is clipped to L2 norm ``S``; the server adds ``N(0, (z S)^2 I)`` to the
sum of the clipped updates and divides by the expected number of users ``q N``. One round is then a
sampled Gaussian mechanism with noise multiplier ``z`` and sampling rate ``q`` on user-level
adjacency; R rounds compose either in RDP (:class:`fedarena.privacy.accountant.RDPAccountant`) or, tighter, by
their privacy loss distribution (:class:`fedarena.privacy.pld.PLDAccountant`); ``accountant`` picks the one
:meth:`DPFedAvgMechanism.epsilon` reports and :meth:`DPFedAvgMechanism.epsilons` gives both.

With a :class:`~fedarena.privacy.adaptive_clipping.QuantileClipper` the clip ``S`` follows a quantile of the
update norms (Andrew et al. 2021): the round also releases the noisy count of unclipped updates, and the update
noise multiplier rises to ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` so that the accountants still charge ``z``.

Noise comes from ``os.urandom`` (Box-Muller on 53-bit uniforms) unless an explicit seed is given for a
reproducible test.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.pld import PLDAccountant
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
    accountant: str = "rdp"
    """"rdp" or "pld": the accountant of :meth:`epsilon`"""
    clipper: Any = None
    """a :class:`~fedarena.privacy.adaptive_clipping.QuantileClipper` (its clip replaces ``clip_norm``), or None"""
    _ledger: dict = field(default_factory=dict, repr=False, compare=False)

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
        if self.accountant not in ("rdp", "pld"):
            raise ValueError(f"dp.accountant: must be 'rdp' or 'pld', got {self.accountant!r}")
        if self.clipper is not None and self.noise_multiplier > 0:
            self.clipper.update_noise_multiplier(self.noise_multiplier)  # checks sigma_b > z / 2

    @property
    def current_clip(self) -> float:
        """The clip of the next round (adaptive or fixed)."""
        return self.clipper.clip_norm if self.clipper is not None else self.clip_norm

    @property
    def update_noise_multiplier(self) -> float:
        """Noise multiplier of the update sum: ``z``, or ``z_Delta`` when the clip is adaptive."""
        if self.clipper is None or self.noise_multiplier == 0:
            return self.noise_multiplier
        return self.clipper.update_noise_multiplier(self.noise_multiplier)

    def noise(self, d: int, round_id: int) -> np.ndarray:
        sigma = self.update_noise_multiplier * self.current_clip
        if self.seed is None:
            return sigma * secure_standard_normal(d)
        return sigma * np.random.default_rng([self.seed, round_id]).standard_normal(d)

    def noisy_mean(self, updates: list[np.ndarray], d: int, round_id: int) -> np.ndarray:
        """``(sum_i clip(Delta_i) + N(0, (z S)^2)) / (q N)``; with an adaptive clip, ``z_Delta`` replaces ``z`` and
        the clip moves after the round."""
        clip = self.current_clip
        total = np.zeros(d, np.float64)
        norms = []
        for u in updates:
            u = np.asarray(u, np.float64)
            norms.append(float(np.linalg.norm(u)))
            total += clip_to_norm(u, clip)
        out = (total + self.noise(d, round_id)) / (self.sample_rate * self.num_clients)
        if self.clipper is not None:
            self.clipper.update(norms, round_id)
        return out

    def _accountant(self, kind: str, rounds: int):
        acc = self._ledger.get(kind)
        if acc is None or acc.steps > rounds:  # the rounds only grow in a run; a smaller count starts afresh
            acc = self._ledger[kind] = RDPAccountant() if kind == "rdp" else PLDAccountant()
        if rounds > acc.steps:
            acc.step(self.noise_multiplier, self.sample_rate, rounds - acc.steps)
        return acc

    def epsilons(self, rounds: int) -> dict[str, float]:
        """Epsilon after ``rounds`` rounds at ``delta`` from both accountants: ``{"rdp": ..., "pld": ...}``."""
        if rounds == 0 or self.noise_multiplier == 0:
            return {"rdp": 0.0 if rounds == 0 else math.inf, "pld": 0.0 if rounds == 0 else math.inf}
        return {k: self._accountant(k, rounds).epsilon(self.delta) for k in ("rdp", "pld")}

    def epsilon(self, rounds: int) -> float:
        """(epsilon, delta)-DP guarantee after ``rounds`` rounds from the configured accountant."""
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        return self._accountant(self.accountant, rounds).epsilon(self.delta)
