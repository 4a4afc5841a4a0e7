"""Multi-agent RL and game theory: policies, best responses, exploitability, meta-solvers, fictitious play,
PSRO and CFR. Importing this package loads only numpy-based modules (no Ray, no scipy until an LP is solved)."""

from fedarena.marl.best_response import best_response, expected_returns
from fedarena.marl.exploitability import exploitability, nash_conv
from fedarena.marl.policy import PolicyError, TabularPolicy, as_policy, policy_from_array, uniform_policy

__all__ = ["exploitability", "nash_conv", "best_response", "expected_returns", "PolicyError", "TabularPolicy",
           "as_policy", "policy_from_array", "uniform_policy"]
