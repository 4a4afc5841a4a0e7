"""n-step transitions from a vectorized environment stream, for replay-based learners (n-step DQN).

Turns per-step transitions (s_t, a_t, r_t, s_{t+1}, terminated, truncated) of ``num_envs`` parallel
environments into (s_t, a_t, R_t^(n), s_{t+m}, gamma^m or 0) with R_t^(n) = sum_{k<m} gamma^k r_{t+k},
m = min(n, steps to the episode's end): Sutton & Barto (2018), section 7.1; used in Rainbow (Hessel
et al., 2018). A terminated episode gets discount 0; a truncated one keeps gamma^m so the learner
bootstraps from the final observation.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class NStepAccumulator:
    """Keeps the last ``n`` steps of every environment and emits finished n-step transitions."""

    def __init__(self, n: int, gamma: float, num_envs: int) -> None:
        if int(n) < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        self.n, self.gamma, self.num_envs = int(n), float(gamma), int(num_envs)
        self._obs: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._pending: list[np.ndarray] = []

    def push(self, obs: np.ndarray, actions: np.ndarray, rewards: Any, next_obs: np.ndarray,
             terminated: Any, truncated: Any) -> dict[str, np.ndarray]:
        """Add one vectorized step (``next_obs`` = the observation this step reached, i.e. final_obs) and
        return the transitions completed by it as a dict of arrays with keys obs, action, reward, next_obs,
        discount (possibly empty)."""
        self._obs.append(np.asarray(obs))
        self._actions.append(np.asarray(actions))
        self._rewards.append(np.asarray(rewards, dtype=np.float64))
        self._pending.append(np.ones(self.num_envs, dtype=bool))
        terminated = np.asarray(terminated, dtype=bool)
        done = terminated | np.asarray(truncated, dtype=bool)
        length = len(self._obs)
        out: dict[str, list[np.ndarray]] = {"obs": [], "action": [], "reward": [], "next_obs": [], "discount": []}
        ret = np.zeros(self.num_envs, dtype=np.float64)
        # walk from the newest step back to the oldest: ret = r_k + gamma * ret is the return from k on
        for k in range(length - 1, -1, -1):
            ret = self._rewards[k] + self.gamma * ret
            emit = self._pending[k] & (done | (k == 0 and length == self.n))
            if emit.any():
                m = length - k
                out["obs"].append(self._obs[k][emit])
                out["action"].append(self._actions[k][emit])
                out["reward"].append(ret[emit])
                out["next_obs"].append(np.asarray(next_obs)[emit])
                out["discount"].append(np.where(terminated[emit], 0.0, self.gamma**m))
                self._pending[k] = self._pending[k] & ~emit
        if length == self.n:
            for buf in (self._obs, self._actions, self._rewards, self._pending):
                buf.pop(0)
        if not out["obs"]:
            return {}
        return {k: np.concatenate(v, axis=0) for k, v in out.items()}
