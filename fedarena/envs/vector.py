"""Vectorized environments behind one interface: fedarena's batched numpy envs or any gymnasium env id.

``make_vector_env(env_id, num_envs)`` returns an object with ``reset(seed) -> obs`` and
``step(actions) -> VecStep`` (same-step auto-reset, ``final_obs`` for bootstrapping truncated episodes),
``num_envs``, ``observation_space`` and ``action_space`` (single-environment gymnasium spaces).
It uses the batched implementation from :mod:`fedarena.envs.classic_control` when one exists and
otherwise wraps ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv`` (Towers et al., 2024, "Gymnasium")
over environments built by :mod:`fedarena.envs.gym_envs` (gymnasium ids, ``module:EnvId``, entry points,
``env_kwargs`` and per-environment wrappers).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from fedarena.envs.classic_control import BATCHED_ENV_IDS, BatchedClassicControl, VecStep
from fedarena.envs.gym_envs import EnvSpecError, EnvStepError, EnvWrappers, check_env_id, env_factory

__all__ = ["VectorEnv", "GymnasiumVectorEnv", "make_vector_env", "check_vector_env", "EnvSpecError",
           "EnvStepError", "EnvWrappers", "VECTOR_BACKENDS"]

VECTOR_BACKENDS = ("auto", "batched", "sync", "async")


class VectorEnv(Protocol):
    """What the RL workers need from a vectorized environment."""

    num_envs: int
    observation_space: Any
    action_space: Any

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> VecStep: ...


class GymnasiumVectorEnv:
    """A gymnasium vector env (sync or async) with same-step auto-reset, presented as a :class:`VectorEnv`.

    ``env_id`` is any form :func:`fedarena.envs.gym_envs.check_env_id` accepts; each copy is built by
    :func:`fedarena.envs.gym_envs.make_env` with ``env_kwargs`` and ``wrappers``. An exception raised by the
    environment in ``reset`` / ``step`` becomes :class:`EnvStepError` (one line, a user error).
    """

    def __init__(self, env_id: str, num_envs: int, asynchronous: bool = False, wrappers: EnvWrappers | None = None,
                 render_mode: str | None = None, **env_kwargs: Any) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        if int(num_envs) < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        check_env_id(env_id)
        self.env_id = env_id
        self.num_envs = int(num_envs)
        fns = [env_factory(env_id, env_kwargs, wrappers, render_mode) for _ in range(self.num_envs)]
        if asynchronous:
            self._vec = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            try:
                self._vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
            except EnvSpecError:
                raise
            except Exception as e:  # e.g. copies whose spaces differ
                raise EnvSpecError(f"env_id '{env_id}': building {self.num_envs} copies raised "
                                   f"{type(e).__name__}: {' '.join(str(e).split())}") from None
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space

    def _failed(self, where: str, exc: Exception) -> EnvStepError:
        return EnvStepError(f"environment '{self.env_id}' raised {type(exc).__name__} in {where}: "
                            f"{' '.join(str(exc).split())}")

    def reset(self, seed: int | None = None) -> Any:
        try:
            obs, _ = self._vec.reset(seed=seed)
        except Exception as e:
            raise self._failed("reset()", e) from e
        return obs

    def step(self, actions: Any) -> VecStep:
        try:
            obs, reward, terminated, truncated, info = self._vec.step(np.asarray(actions))
        except Exception as e:
            raise self._failed("step()", e) from e
        final_obs = obs
        if "final_obs" in info:
            mask = info["_final_obs"]
            final_obs = _copy_tree(obs)
            for i in np.nonzero(mask)[0]:
                _assign_tree(final_obs, i, info["final_obs"][i])
        return VecStep(obs=obs, reward=np.asarray(reward, dtype=np.float32), terminated=np.asarray(terminated),
                       truncated=np.asarray(truncated), final_obs=final_obs)

    def render(self) -> Any:
        """Frames of every copy (with ``render_mode='rgb_array'``)."""
        return self._vec.render()

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
                    xp: Any = np, env_kwargs: Mapping[str, Any] | None = None,
                    wrappers: EnvWrappers | None = None) -> VectorEnv:
    """A vectorized ``env_id``: ``backend`` is ``batched`` (fedarena's array code), ``sync`` or ``async``
    (gymnasium's vector envs) or ``auto`` (batched when available and no ``env_kwargs`` / wrappers are asked
    for, else sync). Call ``reset(seed)`` next."""
    if backend not in VECTOR_BACKENDS:
        raise ValueError(f"backend: expected one of {VECTOR_BACKENDS}, got '{backend}'")
    plain = not env_kwargs and (wrappers is None or not wrappers.any)
    if backend == "batched" and not plain:
        raise EnvSpecError("env_backend: 'batched' environments take no env_kwargs or wrappers; use 'auto' or 'sync'")
    if backend == "batched" or (backend == "auto" and env_id in BATCHED_ENV_IDS and plain):
        return BatchedClassicControl(env_id, num_envs, seed=seed, xp=xp)
    return GymnasiumVectorEnv(env_id, num_envs, asynchronous=backend == "async", wrappers=wrappers,
                              **dict(env_kwargs or {}))


def check_vector_env(env_id: str, backend: str = "auto") -> None:
    """Validate ``env_id`` for :func:`make_vector_env` without building it (imports only)."""
    if backend == "batched" and env_id not in BATCHED_ENV_IDS:
        raise EnvSpecError(f"env_backend 'batched': no batched implementation of '{env_id}'; available: "
                           f"{', '.join(BATCHED_ENV_IDS)}")
    if env_id in BATCHED_ENV_IDS:
        return
    check_env_id(env_id)
