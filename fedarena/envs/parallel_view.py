"""A PettingZoo ``ParallelEnv`` view of one copy of a vectorised multi-agent environment (batch axis first, one
copy): the part every such view shares (spaces, reset, step bookkeeping, ``state()``). A subclass sets
``self.vec`` (with ``agents``, ``observation_spaces``, ``action_spaces``, ``reset(seed)``, ``step(actions)`` and
``state()``), ``possible_agents``, ``metadata`` and ``state_space``, and may override :meth:`_action` and
:meth:`_infos`."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class VectorParallelView(ParallelEnv):
    metadata = {"render_modes": [], "is_parallelizable": True}
    vec: Any

    def observation_space(self, agent: str) -> spaces.Space:
        return self.vec.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.vec.action_spaces[agent]

    def _obs(self, obs: list[np.ndarray]) -> dict[str, np.ndarray]:
        return {a: o[0] for a, o in zip(self.possible_agents, obs)}

    def _action(self, agent: str, action: Any) -> np.ndarray:
        """``action`` as the vectorised env's batch of one."""
        return np.asarray(action)[None]

    def _infos(self, step: Any) -> dict[str, dict]:
        return {a: {} for a in self.possible_agents}

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
        st = self.vec.step([self._action(a, actions[a]) for a in self.possible_agents])
        names = self.possible_agents
        rewards = {a: float(st.reward[0, i]) for i, a in enumerate(names)}
        terms = {a: bool(st.terminated[0, i]) for i, a in enumerate(names)}
        truncs = {a: bool(st.truncated[0, i]) for i, a in enumerate(names)}
        obs = self._obs(st.obs)
        infos = self._infos(st)
        self.agents = [a for a in names if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        return self.vec.state()[0]

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass
