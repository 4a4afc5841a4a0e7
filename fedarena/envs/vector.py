"""Vectorized environments behind one interface: fedarena's batched numpy envs or any gymnasium env id.

``make_vector_env(env_id, num_envs)`` returns an object with ``reset(seed) -> obs`` and
``step(actions) -> VecStep`` (same-step auto-reset, ``final_obs`` for bootstrapping truncated episodes),
``num_envs``, ``observation_space`` and ``action_space`` (single-environment gymnasium spaces).
It uses the batched implementation from :mod:`fedarena.envs.classic_control` when one exists and
otherwise wraps ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv`` (Towers et al., 2024, "Gymnasium").
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from fedarena.envs.classic_control import BATCHED_ENV_IDS, BatchedClassicControl, VecStep

VECTOR_BACKENDS = ("auto", "batched", "sync", "async")


class VectorEnv(Protocol):
    """What the RL workers need from a vectorized environment."""

    num_envs: int
    observation_space: Any
    action_space: Any

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> VecStep: ...


class GymnasiumVectorEnv:
    """A gymnasium vector env (sync or async) with same-step auto-reset, presented as a :class:`VectorEnv`."""

    def __init__(self, env_id: str, num_envs: int, asynchronous: bool = False, **env_kwargs: Any) -> None:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        if int(num_envs) < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        try:
            gym.spec(env_id)
        except gym.error.Error as exc:
            raise ValueError(f"env_id: gymnasium does not know '{env_id}' ({exc})") from None
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self._vec = gym.make_vec(
            env_id,
            num_envs=self.num_envs,
            vectorization_mode="async" if asynchronous else "sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **env_kwargs,
        )
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space

    def reset(self, seed: int | None = None) -> Any:
        obs, _ = self._vec.reset(seed=seed)
        return obs

    def step(self, actions: Any) -> VecStep:
        obs, reward, terminated, truncated, info = self._vec.step(np.asarray(actions))
        final_obs = obs
        if "final_obs" in info:
            mask = info["_final_obs"]
            final_obs = _copy_tree(obs)
            for i in np.nonzero(mask)[0]:
                _assign_tree(final_obs, i, info["final_obs"][i])
        return VecStep(obs=obs, reward=np.asarray(reward, dtype=np.float32), terminated=np.asarray(terminated),
                       truncated=np.asarray(truncated), final_obs=final_obs)

    def close(self) -> None:
        self._vec.close()


def _copy_tree(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _copy_tree(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_copy_tree(v) for v in x)
    return np.array(x, copy=True)


def _assign_tree(batch: Any, i: int, value: Any) -> None:
    if isinstance(batch, dict):
        for k in batch:
            _assign_tree(batch[k], i, value[k])
    elif isinstance(batch, tuple):
        for b, v in zip(batch, value):
            _assign_tree(b, i, v)
    else:
        batch[i] = value


def make_vector_env(env_id: str, num_envs: int, seed: int | None = None, backend: str = "auto",
                    xp: Any = np) -> VectorEnv:
    """A vectorized ``env_id``: ``backend`` is ``batched`` (fedarena's array code), ``sync`` or ``async``
    (gymnasium's vector envs) or ``auto`` (batched when available, else sync). Call ``reset(seed)`` next."""
    if backend not in VECTOR_BACKENDS:
        raise ValueError(f"backend: expected one of {VECTOR_BACKENDS}, got '{backend}'")
    if backend == "batched" or (backend == "auto" and env_id in BATCHED_ENV_IDS):
        return BatchedClassicControl(env_id, num_envs, seed=seed, xp=xp)
    return GymnasiumVectorEnv(env_id, num_envs, asynchronous=backend == "async")
