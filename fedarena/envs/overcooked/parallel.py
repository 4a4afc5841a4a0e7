"""A PettingZoo ``ParallelEnv`` view of one vectorised Overcooked kitchen (an :class:`OvercookedVecEnv` with one
copy): agents ``agent_0``/``agent_1``, six discrete actions each, the flattened 26-channel observation, the
team reward (sparse plus scaled shaped, :mod:`fedarena.envs.overcooked.vector`) and truncation after
``max_cycles`` steps."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from fedarena.envs.overcooked.vector import OvercookedVecEnv, layout_name


class OvercookedParallelEnv(ParallelEnv):
    """``OvercookedParallelEnv("overcooked.cramped_room", max_cycles=400)``; ``reset(seed=s)`` starts from the
    state ``OvercookedVecEnv(..., 1).reset(s)`` makes."""

    metadata = {"render_modes": [], "is_parallelizable": True}

    def __init__(self, env_id: str = "overcooked.cramped_room", max_cycles: int = 400, **kwargs: Any) -> None:
        self.vec = OvercookedVecEnv(env_id, 1, max_cycles=max_cycles, **kwargs)
        self.metadata = dict(self.metadata, name=f"overcooked_{layout_name(env_id)}_fedarena")
        self.possible_agents = list(self.vec.agents)
        self.agents: list[str] = []
        self.render_mode = None
        self.state_space = spaces.Box(0.0, float(self.vec.observation_spaces["agent_0"].high.max()),
                                      (self.vec.state_size,), dtype=np.float32)

    def observation_space(self, agent: str) -> spaces.Space:
        return self.vec.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.vec.action_spaces[agent]

    def _obs(self, obs: list[np.ndarray]) -> dict[str, np.ndarray]:
        return {a: o[0] for a, o in zip(self.possible_agents, obs)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs = self.vec.reset(seed)
        self.agents = list(self.possible_agents)
        return self._obs(obs), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise RuntimeError("step() after the episode ended: reset() first")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"actions: no action for {missing}")
        st = self.vec.step([np.asarray([actions[a]], dtype=np.int64) for a in self.possible_agents])
        names = self.possible_agents
        rewards = {a: float(st.reward[0, i]) for i, a in enumerate(names)}
        terms = {a: bool(st.terminated[0, i]) for i, a in enumerate(names)}
        truncs = {a: bool(st.truncated[0, i]) for i, a in enumerate(names)}
        infos = {a: {"shaped_reward": float(st.shaped_reward[0, i]), "sparse_reward": float(st.sparse_reward[0])}
                 for i, a in enumerate(names)}
        obs = self._obs(st.obs)
        self.agents = [a for a in names if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        return self.vec.state()[0]

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


def parallel_env(env_id: str = "overcooked.cramped_room", **kwargs: Any) -> OvercookedParallelEnv:
    """The PettingZoo parallel view of the vectorised Overcooked layout ``env_id``."""
    return OvercookedParallelEnv(env_id, **kwargs)
