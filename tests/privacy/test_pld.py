"""PLD accountant (fedarena.privacy.pld) against Google's dp-accounting PLD, the closed form of composed
Gaussians, and the RDP accountant's bound."""

import math

import numpy as np
import pytest
from scipy import special

from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.pld import PLDAccountant, _hockey_stick, subsampled_gaussian_pld

# (sample rate q, noise multiplier sigma, steps, delta)
POINTS = [(0.01, 1.0, 1000, 1e-5), (0.1, 2.0, 100, 1e-6), (1.0, 5.0, 10, 1e-5), (0.05, 0.8, 200, 1e-5),
          (0.004, 1.1, 3000, 1e-5)]


def _oracle(q, sigma, steps):
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc


@pytest.mark.parametrize("q,sigma,steps,delta", POINTS)
def test_epsilon_and_delta_match_dp_accounting(q, sigma, steps, delta):
    ours = PLDAccountant()
    ours.step(sigma, q, steps)
    oracle = _oracle(q, sigma, steps)
    eps = ours.epsilon(delta)
    assert eps == pytest.approx(oracle.get_epsilon(delta), rel=1e-3)
    assert ours.delta(eps) == pytest.approx(oracle.get_delta(eps), rel=1e-3)
    assert ours.delta(eps) == pytest.approx(delta, rel=1e-6)  # epsilon and delta invert each other
    # PLD is tighter than RDP (both are upper bounds on the same mechanism)
    rdp = RDPAccountant()
    rdp.step(sigma, q, steps)
    assert eps < rdp.epsilon(delta)


def _gaussian_delta(eps, mu):
    """Exact delta(eps) of the Gaussian mechanism with mu = sensitivity / std (Balle & Wang 2018, Theorem 8)."""
    return special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(-eps / mu - mu / 2)


@pytest.mark.parametrize("sigma,steps", [(2.0, 1), (4.0, 16), (10.0, 50)])
def test_unsampled_composition_equals_closed_form(sigma, steps):
    # q = 1: steps Gaussian mechanisms compose to one with mu = sqrt(steps) / sigma
    acc = PLDAccountant()
    acc.step(sigma, 1.0, steps)
    mu = math.sqrt(steps) / sigma
    for eps in (0.1, 0.5, 1.0, 2.0):
        exact = _gaussian_delta(eps, mu)
        got = acc.delta(eps)
        assert got >= exact * (1 - 1e-9)  # pessimistic
        assert got == pytest.approx(exact, rel=1e-3)


def test_single_step_is_pessimistic_between_grid_points():
    q, sigma = 0.05, 0.9
    for direction in ("remove", "add"):
        pld = subsampled_gaussian_pld(q, sigma, direction, interval=1e-2)
        eps = np.linspace(0.0, 2.0, 97) + 1e-3  # off the grid
        exact = _hockey_stick(eps, q, sigma, direction)
        got = np.array([pld.delta(e) for e in eps])
        assert np.all(got >= exact - 1e-12)
        assert np.max(got - exact) > 0  # a coarse grid is strictly looser somewhere
        # total probability is one
        assert pld.pmf.sum() + pld.inf_mass == pytest.approx(1.0, abs=1e-9)


def test_heterogeneous_steps_compose():
    # two groups of steps: their composition lies between the two groups' doubled counts
    a = PLDAccountant()
    a.step(1.0, 0.02, 100)
    a.step(2.0, 0.02, 100)
    lo, hi = PLDAccountant(), PLDAccountant()
    lo.step(2.0, 0.02, 200)
    hi.step(1.0, 0.02, 200)
    assert lo.epsilon(1e-5) < a.epsilon(1e-5) < hi.epsilon(1e-5)


def test_bad_input():
    acc = PLDAccountant()
    assert acc.epsilon(1e-5) == 0.0
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(1.0, 1.5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.step(0.0, 0.1)
    acc.step(1.0, 0.1, 10)
    with pytest.raises(ValueError, match="delta"):
        acc.epsilon(0.0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.delta(-1.0)


def test_budget_monitor_with_pld_stops_at_budget():
    from fedarena.privacy.budget import BudgetMonitor, noise_multiplier_for_budget

    sigma, q, budget = 1.0, 0.05, 1.5
    mon = BudgetMonitor(budget, 1e-5, sigma, q, accountant="pld")
    while mon.can_step():
        mon.step()
    fresh = PLDAccountant()
    fresh.step(sigma, q, mon.steps)
    assert mon.epsilon == pytest.approx(fresh.epsilon(1e-5), rel=1e-6) and mon.epsilon <= budget
    fresh.step(sigma, q)
    assert fresh.epsilon(1e-5) > budget  # one more step would overspend
    assert mon.max_steps() == mon.steps
    rdp = BudgetMonitor(budget, 1e-5, sigma, q)
    assert rdp.max_steps() < mon.steps  # the tighter accountant allows more steps
    # the calibrated noise multiplier spends the budget by PLD, and less noise would not
    s = noise_multiplier_for_budget(budget, 1e-5, q, mon.steps, accountant="pld", tol=1e-3)
    at, below = PLDAccountant(), PLDAccountant()
    at.step(s, q, mon.steps)
    below.step(s - 2e-3, q, mon.steps)
    assert at.epsilon(1e-5) <= budget < below.epsilon(1e-5)
    with pytest.raises(ValueError, match="accountant"):
        BudgetMonitor(budget, 1e-5, sigma, q, accountant="moments")


def test_dpsgd_digits_reports_both_epsilons_with_pld_budget(tmp_path):
    from fedarena.platform.runs import execute

    cfg = {"kind": "dpsgd_digits", "seed": 1, "epsilon_budget": 1.0, "noise_multiplier": 1.5, "epochs": 1,
           "batch_size": 64, "eval_every": 50, "accountant": "pld", "insecure_seeded_noise": True}
    summary = execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    ours = PLDAccountant()
    ours.step(1.5, summary["sample_rate"], summary["steps"])
    assert summary["epsilon"] == pytest.approx(summary["epsilon_pld"]) == pytest.approx(ours.epsilon(1e-5))
    assert summary["epsilon_pld"] <= 1.0 < summary["epsilon_rdp"]  # RDP would have stopped earlier
    assert summary["stopped_by_budget"]


@pytest.mark.parametrize("offset", [-30, 5, 40])
def test_epsilon_inverts_delta_on_small_distributions(offset):
    # brute force: bisection on the hockey-stick sum of a random discrete PLD (some of it at +inf)
    from scipy import optimize

    from fedarena.privacy.pld import PLD

    rng = np.random.default_rng(offset + 100)
    w = rng.random(12)
    pld = PLD(offset, 0.999 * w / w.sum(), 0.001, 0.05)
    for delta in (0.002, 0.05, 0.3):
        def gap(eps):
            losses = (offset + np.arange(12)) * 0.05
            return pld.inf_mass + np.sum(pld.pmf * np.maximum(0.0, 1 - np.exp(eps - losses))) - delta
        want = max(0.0, optimize.brentq(gap, -10, 10, xtol=1e-14)) if gap(0.0) > 0 else 0.0
        assert pld.epsilon(delta) == pytest.approx(want, abs=1e-9)
    assert pld.epsilon(0.0005) == math.inf  # less than the mass at +inf
