"""A vectorised MPE scenario behind the interface of :class:`fedarena.envs.pettingzoo_batch.ParallelEnvBatch`
(stacked ``(n, agents, ...)`` arrays, legal-action masks, global state, automatic resets), so the
cooperative learners (QMIX, VDN, IPPO) run on it unchanged. Needs agents of one observation size with
discrete actions of one count (simple, simple_spread, simple_reference); scenarios with heterogeneous agents
are for :class:`~fedarena.envs.mpe.vector.MPEVecEnv` users such as MAPPO's per-group learners."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena.envs.mpe.vector import MPEVecEnv
from fedarena.envs.pettingzoo_batch import ParallelBatchStep


class HeterogeneousAgentsError(ValueError):
    """Agents of one scenario differ in observation size or action count where a stacked batch needs them equal."""

    user_error = True


class MPEBatch:
    """``num_envs`` copies of the MPE scenario ``env_id`` (discrete actions), stepped as arrays.

    ``reset()`` starts every copy from ``numpy.random.default_rng(seed)`` (``seed`` may be reassigned between
    resets, as the cooperative runner does per round); later episodes continue that generator. All copies
    end their episodes together after ``max_cycles`` steps and are reset in the same step.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, max_cycles: int = 25, **scenario_kwargs: Any) -> None:
        self.vec = MPEVecEnv(env_id, num_envs, max_cycles=max_cycles, seed=seed, **scenario_kwargs)
        sizes, acts = set(self.vec.observation_sizes), set(self.vec.action_sizes)
        if len(sizes) != 1 or len(acts) != 1:
            detail = ", ".join(f"{a}: {d} obs / {k} actions" for a, d, k in
                               zip(self.vec.agents, self.vec.observation_sizes, self.vec.action_sizes))
            raise HeterogeneousAgentsError(
                f"env_id: '{env_id}' has agents of different observation sizes or action counts ({detail}); "
                "one shared network cannot take them all: use algorithm mappo, which shares a network per group")
        self.agents = list(self.vec.agents)
        self.num_envs, self.num_agents = num_envs, self.vec.num_agents
        self.obs_size, self.num_actions = sizes.pop(), acts.pop()
        self.state_size = self.vec.state_size
        self.seed = seed
        self._mask = np.ones((num_envs, self.num_agents, self.num_actions), dtype=bool)
        self._returns = np.zeros((num_envs, self.num_agents))
        self._obs: np.ndarray | None = None

    def reset(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._obs = np.stack(self.vec.reset(self.seed), axis=1)
        self._returns[:] = 0.0
        return self._obs.copy(), self._mask.copy(), self._obs.reshape(self.num_envs, -1)

    def step(self, actions: np.ndarray) -> ParallelBatchStep:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.num_agents):
            raise ValueError(f"actions: expected shape {(self.num_envs, self.num_agents)}, got {actions.shape}")
        st = self.vec.step([actions[:, k] for k in range(self.num_agents)])
        obs = np.stack(st.obs, axis=1)
        n, M = self.num_envs, self.num_agents
        self._returns += st.reward
        done = st.terminated | st.truncated
        end = done.all(axis=1)
        final_obs = np.zeros_like(obs)
        final_state = np.zeros((n, self.state_size), dtype=np.float32)
        ep_ret = np.full((n, M), np.nan)
        ep_len = np.zeros(n, dtype=np.int64)
        if end.any():  # every copy ends together (module docstring)
            final_obs[end] = obs[end]
            final_state[end] = obs[end].reshape(int(end.sum()), -1)
            ep_ret[end] = self._returns[end]
            ep_len[end] = self.vec.steps
            self._returns[end] = 0.0
            obs = np.stack(self.vec.reset(), axis=1)
        self._obs = obs
        alive = np.ones((n, M), dtype=bool)
        return ParallelBatchStep(obs, self._mask.copy(), obs.reshape(n, -1), st.reward, st.terminated, st.truncated,
                                 alive, end, final_obs, final_state, ep_ret, ep_len)

    def close(self) -> None:
        pass
