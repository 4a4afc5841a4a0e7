"""On-policy rollout storage for PPO-style learners: (T, num_envs) arrays, GAE(lambda), shuffled minibatches.

The buffer is filled step by step by an actor, closed with the value of the state after the last step,
and then yields advantages and value targets by :func:`fedarena.rl.returns.gae` (Schulman et al., 2016)
and flattened minibatches for several epochs of updates (Schulman et al., 2017, "PPO", Alg. 1).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from fedarena.rl.returns import gae


class RolloutBuffer:
    """Preallocated on-policy storage for ``horizon`` steps of ``num_envs`` environments."""

    def __init__(self, horizon: int, num_envs: int) -> None:
        if horizon < 1 or num_envs < 1:
            raise ValueError(f"horizon, num_envs: must be >= 1, got {horizon}, {num_envs}")
        self.horizon, self.num_envs = int(horizon), int(num_envs)
        self.data: dict[str, np.ndarray] = {}
        self.t = 0

    @property
    def full(self) -> bool:
        return self.t == self.horizon

    def add(self, **step: Any) -> None:
        """Store one step: arrays with leading size ``num_envs`` (e.g. obs, action, log_prob, value, reward,
        discount). ``discount`` is gamma inside an episode and 0 at episode ends (see fedarena.rl.returns)."""
        if self.full:
            raise ValueError("add: the rollout is full; call reset() after consuming it")
        for k, v in step.items():
            v = np.asarray(v)
            if v.shape[:1] != (self.num_envs,):
                raise ValueError(f"{k}: expected leading size {self.num_envs}, got shape {v.shape}")
            if k not in self.data:
                self.data[k] = np.zeros((self.horizon,) + v.shape, dtype=v.dtype)
            self.data[k][self.t] = v
        self.t += 1

    def reset(self) -> None:
        self.t = 0

    def compute_advantages(self, bootstrap_value: np.ndarray, lam: float) -> None:
        """Fill ``advantage`` and ``value_target`` from reward, value, discount and V(s_T)."""
        if not self.full:
            raise ValueError(f"compute_advantages: rollout has {self.t} of {self.horizon} steps")
        adv, targets = gae(self.data["reward"], self.data["value"], bootstrap_value, self.data["discount"], lam)
        self.data["advantage"] = adv.astype(np.float32)
        self.data["value_target"] = targets.astype(np.float32)

    def flat(self) -> dict[str, np.ndarray]:
        """Every field with time and env axes merged: shape (horizon * num_envs, ...)."""
        return {k: v.reshape((-1,) + v.shape[2:]) for k, v in self.data.items()}

    def minibatches(self, batch_size: int, rng: np.random.Generator) -> Iterator[dict[str, np.ndarray]]:
        """One epoch: a random permutation of all steps cut into minibatches of ``batch_size``."""
        flat = self.flat()
        n = self.horizon * self.num_envs
        perm = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            yield {k: v[idx] for k, v in flat.items()}
