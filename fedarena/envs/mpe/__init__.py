"""Vectorised Multi-Agent Particle Environments (``mpe2``'s nine scenarios as numpy arrays over many copies)
and a PettingZoo parallel view of one copy."""

from fedarena.envs.mpe.core import WorldSpec, WorldState
from fedarena.envs.mpe.parallel import MPEParallelEnv, parallel_env
from fedarena.envs.mpe.scenarios import SCENARIOS, Scenario
from fedarena.envs.mpe.vector import MPEStep, MPEVecEnv, UnknownScenarioError, make_scenario, scenario_name

__all__ = ["MPEParallelEnv", "MPEStep", "MPEVecEnv", "SCENARIOS", "Scenario", "UnknownScenarioError",
           "WorldSpec", "WorldState", "make_scenario", "parallel_env", "scenario_name"]
