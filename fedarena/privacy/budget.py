"""Privacy-budget monitoring for iterative DP training (the MindArmour-style budget monitor).

The monitor owns an accountant for a fixed (noise multiplier, sampling rate), RDP
(:mod:`fedarena.privacy.accountant`) or the tighter privacy loss distribution (:mod:`fedarena.privacy.pld`), and
answers, before each step, whether taking it would push epsilon (at the configured delta) past the
budget; training stops there. It records epsilon after every step. :func:`noise_multiplier_for_budget` finds the
smallest noise multiplier whose epsilon after a planned number of steps stays within a budget (bisection on the
accountant, which is monotone in sigma).
"""

from __future__ import annotations

import math

import numpy as np

from fedarena.privacy.accountant import DEFAULT_ORDERS, epsilon_from_rdp, rdp_sampled_gaussian
from fedarena.privacy.pld import PLDAccountant

ACCOUNTANTS = ("rdp", "pld")


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant: must be 'rdp' or 'pld', got {accountant!r}")


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    acc = PLDAccountant()
    acc.step(sigma, q, steps)
    return acc.epsilon(delta)


class BudgetExhausted(RuntimeError):
    """Taking another step would spend more than the privacy budget."""


class BudgetMonitor:
    """Tracks epsilon of DP-SGD (sampled Gaussian steps) against ``epsilon_budget`` at ``delta``."""

    def __init__(self, epsilon_budget: float, delta: float, noise_multiplier: float, sample_rate: float,
                 orders=DEFAULT_ORDERS, accountant: str = "rdp"):
        if not (math.isfinite(epsilon_budget) and epsilon_budget > 0):
            raise ValueError(f"epsilon_budget: must be a finite number > 0, got {epsilon_budget!r}")
        if not (0 < delta < 1):
            raise ValueError(f"delta: must lie strictly between 0 and 1, got {delta!r}")
        _check_accountant(accountant)
        self.epsilon_budget = float(epsilon_budget)
        self.delta = float(delta)
        self.accountant = accountant
        self.noise_multiplier, self.sample_rate = float(noise_multiplier), float(sample_rate)
        self._pld = PLDAccountant() if accountant == "pld" else None
        self._pld_next: PLDAccountant | None = None  # the PLD of one more step (the next can_step asks for it)
        self.orders = tuple(orders)
        self._per_step = rdp_sampled_gaussian(sample_rate, noise_multiplier, 1, self.orders)
        self._rdp = np.zeros(len(self.orders))
        self.steps = 0
        self.history: list[float] = []  # epsilon after each step

    def restore(self, steps: int, history: list[float] | None = None) -> None:
        """Set the monitor to ``steps`` steps already taken (after resuming from a checkpoint)."""
        if steps < 0:
            raise ValueError(f"steps: must be >= 0, got {steps}")
        self.steps = int(steps)
        self._rdp = self.steps * self._per_step
        if self._pld is not None:
            self._pld, self._pld_next = PLDAccountant(), None
            self._pld.step(self.noise_multiplier, self.sample_rate, self.steps)
        self.history = list(history) if history is not None else []

    def _pld_after(self, extra_steps: int) -> PLDAccountant:
        if extra_steps == 0:
            return self._pld
        if extra_steps == 1 and self._pld_next is not None and self._pld_next.steps == self.steps + 1:
            return self._pld_next
        acc = self._pld.copy()
        acc.step(self.noise_multiplier, self.sample_rate, extra_steps)
        if extra_steps == 1:
            self._pld_next = acc
        return acc

    def epsilon_after(self, extra_steps: int = 0) -> float:
        if self.steps + extra_steps == 0:
            return 0.0
        if self._pld is not None:
            return self._pld_after(extra_steps).epsilon(self.delta)
        return epsilon_from_rdp(self._rdp + extra_steps * self._per_step, self.orders, self.delta)[0]

    @property
    def epsilon(self) -> float:
        return self.epsilon_after(0)

    def can_step(self) -> bool:
        """True when one more step keeps epsilon within the budget."""
        return self.epsilon_after(1) <= self.epsilon_budget

    def step(self) -> float:
        """Account one step and return the new epsilon; raises :class:`BudgetExhausted` instead of overspending."""
        if not self.can_step():
            raise BudgetExhausted(f"step {self.steps + 1} would reach epsilon {self.epsilon_after(1):.4f} > budget "
                                  f"{self.epsilon_budget} at delta={self.delta}")
        self._rdp = self._rdp + self._per_step
        if self._pld is not None:
            self._pld = self._pld_after(1)
        self.steps += 1
        eps = self.epsilon
        self.history.append(eps)
        return eps

    def max_steps(self) -> int:
        """Number of steps the budget allows in total (from step 0)."""

        def eps(steps: int) -> float:
            if self._pld is not None:
                return _pld_epsilon(self.noise_multiplier, self.sample_rate, steps, self.delta)
            return epsilon_from_rdp(steps * self._per_step, self.orders, self.delta)[0]

        lo, hi = 0, 1
        while eps(hi) <= self.epsilon_budget:
            lo, hi = hi, hi * 2
            if hi > 1 << (20 if self._pld is not None else 40):  # PLD composition costs grow with the steps
                return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if eps(mid) <= self.epsilon_budget:
                lo = mid
            else:
                hi = mid
        return lo


def noise_multiplier_for_budget(epsilon_budget: float, delta: float, sample_rate: float, steps: int,
                                orders=DEFAULT_ORDERS, tol: float = 1e-3, accountant: str = "rdp") -> float:
    """Smallest noise multiplier (to ``tol``) with epsilon after ``steps`` steps <= ``epsilon_budget`` by
    ``accountant`` ("rdp" or "pld")."""
    if steps < 1:
        raise ValueError(f"steps: must be >= 1, got {steps}")
    _check_accountant(accountant)

    def eps(sigma: float) -> float:
        if accountant == "pld":
            return _pld_epsilon(sigma, sample_rate, steps, delta)
        return epsilon_from_rdp(rdp_sampled_gaussian(sample_rate, sigma, steps, orders), orders, delta)[0]

    lo, hi = 0.0, 1.0
    while eps(hi) > epsilon_budget:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"epsilon_budget: {epsilon_budget} is unreachable for {steps} steps at q={sample_rate}")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if eps(mid) > epsilon_budget:
            lo = mid
        else:
            hi = mid
    return hi
