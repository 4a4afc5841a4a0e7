"""Multi-agent RL and game theory: policies, best responses, exploitability, meta-solvers, fictitious play,
PSRO and CFR. Importing this package loads only numpy/scipy-based modules (no Ray)."""

from fedarena.marl.exploitability import exploitability, nash_conv

__all__ = ["exploitability", "nash_conv"]
