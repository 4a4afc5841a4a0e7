"""A PettingZoo ``ParallelEnv`` view of one vectorised Overcooked kitchen (an :class:`OvercookedVecEnv` with one
copy): agents ``agent_0``/``agent_1``, six discrete actions each, the flattened 26-channel observation, the
team reward (sparse plus scaled shaped, :mod:`fedarena.envs.overcooked.vector`) and truncation after
``max_cycles`` steps."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from fedarena.envs.overcooked.vector import OvercookedVecEnv, layout_name
from fedarena.envs.parallel_view import VectorParallelView


class OvercookedParallelEnv(VectorParallelView):
    """``OvercookedParallelEnv("overcooked.cramped_room", max_cycles=400)``; ``reset(seed=s)`` starts from the
    state ``OvercookedVecEnv(..., 1).reset(s)`` makes."""

    def __init__(self, env_id: str = "overcooked.cramped_room", max_cycles: int = 400, **kwargs: Any) -> None:
        self.vec = OvercookedVecEnv(env_id, 1, max_cycles=max_cycles, **kwargs)
        self.metadata = dict(self.metadata, name=f"overcooked_{layout_name(env_id)}_fedarena")
        self.possible_agents = list(self.vec.agents)
        self.agents: list[str] = []
        self.render_mode = None
        self.state_space = spaces.Box(0.0, float(self.vec.observation_spaces["agent_0"].high.max()),
                                      (self.vec.state_size,), dtype=np.float32)

    def _action(self, agent: str, action: Any) -> np.ndarray:
        return np.asarray([action], dtype=np.int64)

    def _infos(self, st: Any) -> dict[str, dict]:
        return {a: {"shaped_reward": float(st.shaped_reward[0, i]), "sparse_reward": float(st.sparse_reward[0])}
                for i, a in enumerate(self.possible_agents)}


def parallel_env(env_id: str = "overcooked.cramped_room", **kwargs: Any) -> OvercookedParallelEnv:
    """The PettingZoo parallel view of the vectorised Overcooked layout ``env_id``."""
    return OvercookedParallelEnv(env_id, **kwargs)
