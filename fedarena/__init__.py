"""fedarena: multi-agent reinforcement learning and federated learning on its own engine.

Subpackages (imports point down only, see docs/architecture.md):
``platform`` (config, CLI, run folders), ``engine`` (graph IR, autodiff, backends),
``envs`` (games and environments), ``rl``, ``marl``, ``privacy``, ``federated``.
"""

__version__ = "0.1.0"
