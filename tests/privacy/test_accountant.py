"""RDP accountant vs. Opacus' accountant (1e-6 relative) and vs. direct numerical integration of A_alpha;
budget monitor stops at the budget."""

import math

import numpy as np
import pytest

from fedarena.privacy.accountant import DEFAULT_ORDERS, RDPAccountant, epsilon_from_rdp, rdp_sampled_gaussian
from fedarena.privacy.budget import BudgetExhausted, BudgetMonitor, noise_multiplier_for_budget

SETTINGS = [  # (sampling rate, noise multiplier, steps, delta)
    (0.01, 1.1, 1000, 1e-5),
    (0.004, 0.8, 10_000, 1e-5),
    (0.1, 3.0, 50, 1e-6),
    (0.5, 0.5, 3, 1e-3),
    (1.0, 2.0, 10, 1e-5),
    (0.256, 1.0, 400, 1e-5),
]


@pytest.mark.parametrize("q,sigma,steps,delta", SETTINGS)
def test_matches_opacus(q, sigma, steps, delta):
    opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")
    ours = rdp_sampled_gaussian(q, sigma, steps)
    ref = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    eps, order = epsilon_from_rdp(ours, DEFAULT_ORDERS, delta)
    ref_eps, ref_order = opacus_rdp.get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=ref, delta=delta)
    assert eps == pytest.approx(float(ref_eps), rel=1e-6)
    assert order == ref_order


@pytest.mark.quick
def test_accountant_matches_opacus_accountant_over_mixed_history():
    accountants = pytest.importorskip("opacus.accountants")
    ours, theirs = RDPAccountant(), accountants.RDPAccountant()
    for sigma, q, n in [(1.0, 0.01, 300), (1.5, 0.02, 200), (0.9, 0.005, 500)]:
        ours.step(sigma, q, n)
        for _ in range(n):
            theirs.step(noise_multiplier=sigma, sample_rate=q)
    assert ours.epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("q,sigma,alpha", [(0.01, 1.1, 2.0), (0.01, 1.1, 7.5), (0.2, 0.9, 3.3), (0.05, 2.0, 1.5),
                                           (0.001, 5.0, 1.1)])
def test_matches_numerical_integration(q, sigma, alpha):
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    qm, sm = mp.mpf(q), mp.mpf(sigma)
    # A_alpha = E_{z~N(0,s^2)}[((1-q) + q exp((2z - 1) / (2 s^2)))^alpha]  (Mironov, Talwar, Zhang 2019, Sec. 3)
    a = mp.quad(lambda z: mp.npdf(z, 0, sm) * ((1 - qm) + qm * mp.exp((2 * z - 1) / (2 * sm**2))) ** alpha,
                [-mp.inf, 0, mp.inf])
    exact = float(mp.log(a) / (alpha - 1))
    assert rdp_sampled_gaussian(q, sigma, 1, [alpha])[0] == pytest.approx(exact, rel=1e-7)


@pytest.mark.quick
def test_closed_forms_and_validation():
    # q = 1: plain Gaussian mechanism, RDP = alpha / (2 sigma^2) (Mironov 2017, Prop. 7)
    np.testing.assert_allclose(rdp_sampled_gaussian(1.0, 2.0, 5, [2, 3.5]), [5 * 2 / 8, 5 * 3.5 / 8])
    assert rdp_sampled_gaussian(0.0, 1.0, 5, [2])[0] == 0.0
    assert epsilon_from_rdp(np.array([1.0]), [2.0], 1e-5, "mironov")[0] == pytest.approx(1 + math.log(1e5))
    with pytest.raises(ValueError, match="sample_rate"):
        rdp_sampled_gaussian(1.5, 1.0, 1)
    with pytest.raises(ValueError, match="noise_multiplier"):
        rdp_sampled_gaussian(0.1, -1.0, 1)
    with pytest.raises(ValueError, match="orders"):
        rdp_sampled_gaussian(0.1, 1.0, 1, [1.0])
    with pytest.raises(ValueError, match="delta"):
        epsilon_from_rdp(np.array([1.0]), [2.0], 0.0)


def test_budget_monitor_stops_at_budget():
    mon = BudgetMonitor(epsilon_budget=2.0, delta=1e-5, noise_multiplier=1.0, sample_rate=0.05)
    steps = 0
    while mon.can_step():
        mon.step()
        steps += 1
    assert steps == mon.max_steps() == len(mon.history)
    assert mon.history[-1] <= 2.0 < mon.epsilon_after(1)
    assert np.all(np.diff(mon.history) > 0)
    with pytest.raises(BudgetExhausted, match="budget"):
        mon.step()
    # the recorded epsilons are the accountant's
    acc = RDPAccountant()
    acc.step(1.0, 0.05, steps)
    assert mon.history[-1] == pytest.approx(acc.epsilon(1e-5), rel=1e-12)


def test_noise_multiplier_for_budget():
    sigma = noise_multiplier_for_budget(8.0, 1e-5, 0.02, 1000)
    eps = lambda s: epsilon_from_rdp(rdp_sampled_gaussian(0.02, s, 1000), DEFAULT_ORDERS, 1e-5)[0]
    assert eps(sigma) <= 8.0 < eps(sigma - 2e-3)
