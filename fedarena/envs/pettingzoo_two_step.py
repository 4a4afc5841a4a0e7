"""The two-step cooperative matrix game of Rashid et al. (2018, "QMIX", sec. 6.1) as a PettingZoo
parallel environment.

Two agents, two actions each, one shared reward. In the first state only agent 0's action matters: action
0 leads to state 2A, action 1 to state 2B (reward 0). In 2A every joint action pays 7; in 2B the payoff is
``[[0, 1], [1, 8]]`` (row: agent 0, column: agent 1), and the game ends. The optimal return is 8
(agent 0 picks 2B, then both pick action 1); a purely additive joint value (VDN) cannot represent 2B's
payoffs well enough to prefer it and settles at 7, while QMIX's monotonic mixing can.
Observations and the global state are the one-hot state (1, 2A, 2B).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

PAYOFF_2A = np.full((2, 2), 7.0)
PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])
OPTIMAL_RETURN = 8.0


class TwoStepGame(ParallelEnv):
    metadata = {"render_modes": [], "name": "two_step_v0"}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        box = spaces.Box(0.0, 1.0, (3,), dtype=np.float32)
        self.observation_spaces = {a: box for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}
        self._s = 0

    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    def state(self) -> np.ndarray:
        v = np.zeros(3, dtype=np.float32)
        v[self._s] = 1.0
        return v

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: self.state() for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        self._s = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        for a in self.agents:
            if a not in actions or not self.action_spaces[a].contains(int(actions[a])):
                raise ValueError(f"actions['{a}']: expected 0 or 1, got {actions.get(a)!r}")
        a0, a1 = int(actions["agent_0"]), int(actions["agent_1"])
        if self._s == 0:
            self._s = 1 + a0
            reward, done = 0.0, False
        else:
            reward = float((PAYOFF_2A if self._s == 1 else PAYOFF_2B)[a0, a1])
            done = True
        obs = self._obs()
        rewards = {a: reward for a in self.agents}
        terms = {a: done for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def parallel_env(**kwargs: Any) -> TwoStepGame:
    return TwoStepGame(**kwargs)
