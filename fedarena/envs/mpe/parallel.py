"""A PettingZoo ``ParallelEnv`` view of one vectorised MPE world (a :class:`MPEVecEnv` with one copy), with
``mpe2``'s agent names, spaces, observations, rewards, truncation and ``state()``."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from fedarena.envs.mpe.vector import MPEVecEnv, scenario_name
from fedarena.envs.parallel_view import VectorParallelView


class MPEParallelEnv(VectorParallelView):
    """``MPEParallelEnv("simple_spread_v3", max_cycles=25, continuous_actions=False, N=3)``; ``reset(seed=s)``
    starts from the state ``mpe2``'s env starts from after ``reset(seed=s)``."""

    def __init__(self, env_id: str, max_cycles: int = 25, continuous_actions: bool = False,
                 **scenario_kwargs: Any) -> None:
        self.vec = MPEVecEnv(env_id, 1, max_cycles=max_cycles, continuous_actions=continuous_actions,
                             **scenario_kwargs)
        self.metadata = dict(self.metadata, name=f"{scenario_name(env_id)}_fedarena")
        self.possible_agents = list(self.vec.agents)
        self.agents: list[str] = []
        self.render_mode = None
        self.state_space = spaces.Box(-np.float32(np.inf), np.float32(np.inf), (self.vec.state_size,), dtype=np.float32)

    @property
    def max_cycles(self) -> int:
        return self.vec.max_cycles

    @max_cycles.setter
    def max_cycles(self, value: int) -> None:
        self.vec.max_cycles = int(value)


def parallel_env(env_id: str, **kwargs: Any) -> MPEParallelEnv:
    """The PettingZoo parallel view of the vectorised scenario ``env_id``."""
    return MPEParallelEnv(env_id, **kwargs)
