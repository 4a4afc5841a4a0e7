"""Running observation and reward normalization, kept by the learner (the VecNormalize scheme of
Stable-Baselines3 and of CleanRL's ``ppo_continuous_action``; Huang et al., 2022, "The 37 implementation
details of PPO", details 5-7 of the continuous-action list).

Observations: a running mean and variance over every observation seen (Chan, Golub & LeVeque, 1979, parallel
variance update); the network sees ``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)``. The statistics travel
inside the parameters (``params["obs_norm"]``, float32, excluded from gradients), so actors, checkpoints and
exported policies all normalize with the same numbers; the learner refreshes them after each update from the
rollout it just learned from (so a rollout is always scored with the statistics that produced it).
Rewards: divided by the running standard deviation of the discounted return ``R_t = gamma R_{t-1} + r_t`` (reset
at episode ends) and clipped; the truncation bootstrap ``gamma V(s_T)`` is already in value units and is added
after scaling.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

EPS = 1e-8


class RunningMeanStd:
    """Mean and variance of a stream of arrays of shape ``shape`` (float64), merged batch by batch."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4  # as SB3: the prior (mean 0, var 1) weighs almost nothing

    def update(self, batch: np.ndarray) -> None:
        batch = np.asarray(batch, dtype=np.float64).reshape((-1,) + self.mean.shape)
        n = batch.shape[0]
        if n == 0:
            return
        b_mean, b_var = batch.mean(axis=0), batch.var(axis=0)
        delta = b_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / total
        self.var = m2 / total
        self.count = total

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": float(self.count)}

    def load(self, state: Mapping[str, Any]) -> None:
        mean, var = np.asarray(state["mean"], np.float64), np.asarray(state["var"], np.float64)
        if mean.shape != self.mean.shape or var.shape != self.var.shape:
            raise ValueError(f"normalization state: expected shape {self.mean.shape}, got {mean.shape}")
        self.mean, self.var, self.count = mean, var, float(state["count"])


def obs_norm_params(rms: RunningMeanStd) -> dict[str, np.ndarray]:
    """The float32 copy of the statistics that rides in the network parameters."""
    return {"mean": rms.mean.astype(np.float32), "var": rms.var.astype(np.float32)}


def normalize(params: Mapping[str, Any], x: Any, clip: float) -> Any:
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` in engine ops, with no gradient into the statistics."""
    from fedarena.engine import ops

    mean = ops.stop_gradient(params["mean"])
    inv_std = ops.stop_gradient(1.0 / ops.sqrt(params["var"] + EPS))
    return ops.clip((x - mean) * inv_std, -clip, clip)


def normalize_np(params: Mapping[str, Any], x: np.ndarray, clip: float) -> np.ndarray:
    """The numpy twin of :func:`normalize` (used by tests and exported-policy users)."""
    return np.clip((x - params["mean"]) / np.sqrt(params["var"] + EPS), -clip, clip)


class RewardScaler:
    """Scales rewards by the running std of the discounted return of each environment column."""

    def __init__(self, num_envs: int, gamma: float, clip: float) -> None:
        self.gamma, self.clip = float(gamma), float(clip)
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.rms = RunningMeanStd(())

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """``reward``, ``done``: time-major (T, num_envs); returns the scaled rewards (float64)."""
        reward = np.asarray(reward, dtype=np.float64)
        if reward.shape[1] != self.returns.shape[0]:
            raise ValueError(f"reward: expected {self.returns.shape[0]} environment columns, got {reward.shape[1]}")
        seen = np.empty_like(reward)
        for t in range(reward.shape[0]):
            self.returns = self.returns * self.gamma + reward[t]
            seen[t] = self.returns
            self.returns = np.where(done[t], 0.0, self.returns)
        self.rms.update(seen.reshape(-1))
        return np.clip(reward / np.sqrt(self.rms.var + EPS), -self.clip, self.clip)

    def state(self) -> dict[str, Any]:
        return {"returns": self.returns.copy(), "rms": self.rms.state()}

    def load(self, state: Mapping[str, Any]) -> None:
        self.returns = np.asarray(state["returns"], dtype=np.float64).copy()
        self.rms.load(state["rms"])
