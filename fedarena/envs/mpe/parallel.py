"""A PettingZoo ``ParallelEnv`` view of one vectorised MPE world (a :class:`MPEVecEnv` with one copy), with
``mpe2``'s agent names, spaces, observations, rewards, truncation and ``state()``."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from fedarena.envs.mpe.vector import MPEVecEnv, scenario_name


class MPEParallelEnv(ParallelEnv):
    """``MPEParallelEnv("simple_spread_v3", max_cycles=25, continuous_actions=False, N=3)``; ``reset(seed=s)``
    starts from the state ``mpe2``'s env starts from after ``reset(seed=s)``."""

    metadata = {"render_modes": [], "is_parallelizable": True}

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
        batch = [np.asarray(actions[a])[None] for a in self.possible_agents]
        st = self.vec.step(batch)
        names = self.possible_agents
        rewards = {a: float(st.reward[0, i]) for i, a in enumerate(names)}
        terms = {a: bool(st.terminated[0, i]) for i, a in enumerate(names)}
        truncs = {a: bool(st.truncated[0, i]) for i, a in enumerate(names)}
        obs = self._obs(st.obs)
        infos = {a: {} for a in names}
        self.agents = [a for a in names if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        return self.vec.state()[0]

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


def parallel_env(env_id: str, **kwargs: Any) -> MPEParallelEnv:
    """The PettingZoo parallel view of the vectorised scenario ``env_id``."""
    return MPEParallelEnv(env_id, **kwargs)
