"""Return and advantage estimators over time-major trajectories: n-step returns, GAE(lambda), V-trace.

All arrays are time-major, shape (T, ...) (usually (T, num_envs)). ``discounts[t]`` is the discount
applied after step t: ``gamma`` inside an episode, 0 where the episode terminated at step t. A truncated
episode is handled by the caller adding ``gamma * V(final observation)`` to its last reward and then
using discount 0, so every estimator sees complete-or-bootstrapped segments.

GAE: Schulman, Moritz, Levine, Jordan & Abbeel (2016), "High-dimensional continuous control using
generalized advantage estimation", ICLR, eq. (16). V-trace: Espeholt et al. (2018), "IMPALA", ICML,
section 4.1, eq. (1) and the recursion v_s = V(x_s) + delta_s V + gamma c_s (v_{s+1} - V(x_{s+1})).
n-step returns: Sutton & Barto (2018), section 7.1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _check_time_major(name: str, x: np.ndarray, like: np.ndarray) -> None:
    if x.shape != like.shape:
        raise ValueError(f"{name}: shape {x.shape} differs from rewards' {like.shape}")


def discounted_returns(rewards: np.ndarray, discounts: np.ndarray, bootstrap_value: np.ndarray) -> np.ndarray:
    """G_t = r_t + discounts_t * G_{t+1}, with G_T = ``bootstrap_value`` (the full-trajectory n-step return)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    discounts = np.asarray(discounts, dtype=np.float64)
    _check_time_major("discounts", discounts, rewards)
    out = np.empty_like(rewards)
    g = np.asarray(bootstrap_value, dtype=np.float64)
    for t in range(rewards.shape[0] - 1, -1, -1):
        g = rewards[t] + discounts[t] * g
        out[t] = g
    return out


def gae(rewards: np.ndarray, values: np.ndarray, bootstrap_value: np.ndarray, discounts: np.ndarray,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation; returns ``(advantages, value_targets = advantages + values)``.

    delta_t = r_t + discounts_t V(s_{t+1}) - V(s_t);  A_t = delta_t + lam discounts_t A_{t+1}; V(s_T) =
    ``bootstrap_value``. ``discounts`` already carries gamma (and 0 at episode ends).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    discounts = np.asarray(discounts, dtype=np.float64)
    _check_time_major("values", values, rewards)
    _check_time_major("discounts", discounts, rewards)
    next_values = np.concatenate([values[1:], np.asarray(bootstrap_value, dtype=np.float64)[None]], axis=0)
    deltas = rewards + discounts * next_values - values
    adv = np.empty_like(rewards)
    a = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in range(rewards.shape[0] - 1, -1, -1):
        a = deltas[t] + lam * discounts[t] * a
        adv[t] = a
    return adv, adv + values


@dataclass(frozen=True)
class VTraceReturns:
    vs: np.ndarray
    """V-trace value targets v_s."""
    pg_advantages: np.ndarray
    """rho_s (r_s + discount_s v_{s+1} - V(x_s)), the policy-gradient advantages."""
    clipped_rhos: np.ndarray


def vtrace(log_rhos: np.ndarray, discounts: np.ndarray, rewards: np.ndarray, values: np.ndarray,
           bootstrap_value: np.ndarray, clip_rho_threshold: float = 1.0, clip_c_threshold: float = 1.0,
           clip_pg_rho_threshold: float = 1.0) -> VTraceReturns:
    """V-trace targets from behaviour-policy trajectories.

    ``log_rhos`` = log pi(a_t|x_t) - log mu(a_t|x_t) (target over behaviour); rho_t = min(rho_bar, e^log_rho),
    c_t = min(c_bar, e^log_rho). With rho_bar = c_bar = 1 and on-policy data (log_rhos = 0) the targets
    equal the discounted n-step returns bootstrapped from ``bootstrap_value``.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    discounts = np.asarray(discounts, dtype=np.float64)
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    for name, x in (("values", values), ("discounts", discounts), ("log_rhos", log_rhos)):
        _check_time_major(name, x, rewards)
    rhos = np.exp(log_rhos)
    clipped_rhos = np.minimum(clip_rho_threshold, rhos)
    cs = np.minimum(clip_c_threshold, rhos)
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    next_values = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_v = np.empty_like(rewards)
    acc = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in range(rewards.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    next_vs = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_rhos = np.minimum(clip_pg_rho_threshold, rhos)
    pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, clipped_rhos=clipped_rhos)
