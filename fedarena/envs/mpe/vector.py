"""``num_envs`` copies of one MPE scenario stepped as arrays (batch axis first), with ``mpe2``'s action
spaces, float32 observations, rewards (``local_ratio`` blend) and truncation after ``max_cycles`` steps.

All copies start together and run ``max_cycles`` steps, so they truncate together (``mpe2``'s scenarios never
terminate early with their default options); the caller resets. This is the array form of the environment
JaxMARL (Rutherford et al., 2024) runs on accelerators, kept in numpy.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

from fedarena.envs.mpe.core import WorldState, decode_actions, world_step
from fedarena.envs.mpe.scenarios import SCENARIOS, Scenario


class UnknownScenarioError(ValueError):
    """An MPE scenario name that is not one of :data:`SCENARIOS`."""


def scenario_name(env_id: str) -> str:
    """``"mpe2.simple_spread_v3"``, ``"simple_spread_v3"`` or ``"simple_spread"`` -> ``"simple_spread"``."""
    name = env_id.split(".", 1)[1] if env_id.startswith("mpe2.") else env_id
    base, _, version = name.rpartition("_v")
    if base and version.isdigit():
        name = base
    if name not in SCENARIOS:
        close = difflib.get_close_matches(name, list(SCENARIOS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownScenarioError(f"unknown MPE scenario '{env_id}'{hint} Known: {', '.join(SCENARIOS)}")
    return name


def make_scenario(env_id: str, **kwargs: Any) -> Scenario:
    """The scenario named ``env_id`` (see :func:`scenario_name`) built with its own options (``N``, ...)."""
    try:
        return SCENARIOS[scenario_name(env_id)](**kwargs)
    except TypeError as e:
        raise ValueError(f"{env_id}: {e}") from None


@dataclass(frozen=True)
class MPEStep:
    obs: list[np.ndarray]     # per agent (n, obs_size_i) float32
    reward: np.ndarray        # (n, A) float64
    terminated: np.ndarray    # (n, A) bool
    truncated: np.ndarray     # (n, A) bool


class MPEVecEnv:
    """``num_envs`` copies of the MPE scenario ``env_id`` (options of the scenario in ``scenario_kwargs``).

    ``reset(seed)`` draws every copy's initial state from ``numpy.random.default_rng(seed)`` (with
    ``num_envs=1``, the state ``mpe2``'s ``reset(seed=seed)`` makes); ``reset()`` continues the env's own
    generator. Actions are per agent: ``(n,)`` integers (discrete) or ``(n, size)`` floats (continuous).
    """

    def __init__(self, env_id: str, num_envs: int, max_cycles: int = 25, continuous_actions: bool = False,
                 seed: int | None = None, **scenario_kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        if max_cycles < 1:
            raise ValueError(f"max_cycles: must be >= 1, got {max_cycles}")
        self.scenario = make_scenario(env_id, **scenario_kwargs)
        self.spec = self.scenario.spec
        self.num_envs, self.max_cycles, self.continuous = num_envs, max_cycles, continuous_actions
        self.agents: tuple[str, ...] = self.scenario.agents
        self.num_agents = len(self.agents)
        self.rng = np.random.default_rng(seed)
        self.ws = self.scenario.reset(np.random.default_rng(0), 1)  # for the sizes only
        self.steps = 0
        sizes = [o.shape[1] for o in self.scenario.observations(self.ws)]
        self.observation_sizes = sizes
        self.action_sizes = [self.spec.action_size(i, continuous_actions) for i in range(self.num_agents)]
        self.observation_spaces = {a: spaces.Box(-np.float32(np.inf), np.float32(np.inf), (d,), dtype=np.float32)
                                   for a, d in zip(self.agents, sizes)}
        self.action_spaces = {a: spaces.Box(0.0, 1.0, (k,), dtype=np.float32) if continuous_actions else
                              spaces.Discrete(k) for a, k in zip(self.agents, self.action_sizes)}
        self.state_size = sum(sizes)
        self.ws = self.scenario.reset(self.rng, num_envs)

    def reset(self, seed: int | None = None) -> list[np.ndarray]:
        """Fresh episodes in every copy; per-agent observations."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.ws = self.scenario.reset(self.rng, self.num_envs)
        self.steps = 0
        return self.observations()

    def set_state(self, ws: WorldState, steps: int = 0) -> list[np.ndarray]:
        """Put the copies in state ``ws`` (copied), ``steps`` steps into their episodes."""
        if ws.agent_pos.shape != (self.num_envs, self.num_agents, 2):
            raise ValueError(f"ws: agent_pos must be {(self.num_envs, self.num_agents, 2)}, got {ws.agent_pos.shape}")
        self.ws, self.steps = ws.copy(), steps
        return self.observations()

    def observations(self) -> list[np.ndarray]:
        return [o.astype(np.float32) for o in self.scenario.observations(self.ws)]

    def state(self, obs: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """``(n, state_size)`` float32: every agent's observation concatenated (``mpe2``'s ``state()``)."""
        return np.concatenate(list(self.observations() if obs is None else obs), axis=1)

    def step(self, actions: Sequence[np.ndarray]) -> MPEStep:
        if len(actions) != self.num_agents:
            raise ValueError(f"actions: expected one array per agent ({self.num_agents}), got {len(actions)}")
        acts = []
        for i, a in enumerate(actions):
            a = np.asarray(a)
            want = (self.num_envs, self.action_sizes[i]) if self.continuous else (self.num_envs,)
            if a.shape != want:
                raise ValueError(f"actions[{i}] ({self.agents[i]}): expected shape {want}, got {a.shape}")
            if not self.continuous and (a.min() < 0 or a.max() >= self.action_sizes[i]):
                raise ValueError(f"actions[{i}] ({self.agents[i]}): actions must be in 0..{self.action_sizes[i] - 1}")
            acts.append(a)
        u, c = decode_actions(self.spec, acts, self.continuous)
        world_step(self.spec, self.ws, u, c)
        self.steps += 1
        reward = self.scenario.rewards(self.ws)
        lr = self.scenario.local_ratio
        if lr is not None:
            reward = self.scenario.global_reward(self.ws)[:, None] * (1 - lr) + reward * lr
        n, A = self.num_envs, self.num_agents
        trunc = np.full((n, A), self.steps >= self.max_cycles)
        return MPEStep(self.observations(), reward, np.zeros((n, A), dtype=bool), trunc)
