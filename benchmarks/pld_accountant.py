"""fedarena's PLD accountant (:mod:`fedarena.privacy.pld`) beside Google's ``dp-accounting`` PLD (the oracle of
tests/privacy/test_pld.py) and fedarena's RDP accountant, on the five (q, sigma, steps, delta) points of the test
and on DP-FedAvg's per-round use (one epsilon after every round of 100).

Prints one JSON line per point: both PLD epsilons and their relative difference, RDP's epsilon, the delta each PLD
gives back at fedarena's epsilon, and the wall time of each accountant (grid 1e-4 for both), then the per-round
line. Needs ``pip install dp-accounting`` (the ``dev`` extra).

    python benchmarks/pld_accountant.py
"""

from __future__ import annotations

import json
import time

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.dp_fedavg import DPFedAvgMechanism
from fedarena.privacy.pld import PLDAccountant

POINTS = [(0.01, 1.0, 1000, 1e-5), (0.1, 2.0, 100, 1e-6), (1.0, 5.0, 10, 1e-5), (0.05, 0.8, 200, 1e-5),
          (0.004, 1.1, 3000, 1e-5)]


def main() -> None:
    for q, sigma, steps, delta in POINTS:
        t = time.perf_counter()
        ours = PLDAccountant()
        ours.step(sigma, q, steps)
        eps = ours.epsilon(delta)
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
        eps_ref = ref.get_epsilon(delta)
        t_ref = time.perf_counter() - t
        rdp = RDPAccountant()
        rdp.step(sigma, q, steps)
        print(json.dumps({"q": q, "sigma": sigma, "steps": steps, "delta": delta, "epsilon_pld": eps,
                          "epsilon_dp_accounting": eps_ref, "relative_difference": abs(eps - eps_ref) / eps_ref,
                          "epsilon_rdp": rdp.epsilon(delta), "delta_back": ours.delta(eps),
                          "delta_back_dp_accounting": ref.get_delta(eps), "seconds": round(t_ours, 3),
                          "seconds_dp_accounting": round(t_ref, 3), "speed_ratio": round(t_ref / t_ours, 2)}))
    for z in (0.5, 1.0, 2.0, 4.0):  # the DP-FedAvg sweep's mechanisms: epsilon after every one of 100 rounds
        mech = DPFedAvgMechanism(0.3, z, 0.1, 1000)
        t = time.perf_counter()
        for r in range(1, 101):
            eps = mech.epsilons(r)
        print(json.dumps({"dp_fedavg_z": z, "rounds": 100, "epsilon_rdp": eps["rdp"], "epsilon_pld": eps["pld"],
                          "pld_over_rdp": eps["pld"] / eps["rdp"],
                          "seconds_per_round_both": round((time.perf_counter() - t) / 100, 4)}))


if __name__ == "__main__":
    main()
