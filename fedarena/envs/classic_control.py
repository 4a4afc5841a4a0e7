"""Batched CartPole-v1 and Acrobot-v1: thousands of environments stepped by one array call.

The dynamics are gymnasium's, written out term by term in the same floating-point order so that a
transition (state, action) -> (next state, reward, termination) is bit-identical to
``gymnasium.make("CartPole-v1")`` / ``("Acrobot-v1")``. CartPole: Barto, Sutton & Anderson (1983),
"Neuronlike adaptive elements...", IEEE SMC 13(5), with gymnasium's Euler integration (tau = 0.02).
Acrobot: Sutton (1996), "Generalization in RL: successful examples using sparse coarse coding",
NIPS 8, and Sutton & Barto (2018) section 16.1 ("book" dynamics), integrated with one RK4 step of 0.2 s.

Every function takes an array module ``xp`` (``numpy`` or ``cupy``), so the same code steps the
environments on a GPU (the Isaac-Gym idea: keep simulation batched and on the device).
Episodes auto-reset in the same step: ``step`` returns the first observation of the next episode for
the environments that finished and the last observation of the finished episode in ``final_obs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from gymnasium.spaces import Box, Discrete

# ----------------------------------------------------------------------------------------- CartPole

CARTPOLE_GRAVITY = 9.8
CARTPOLE_MASSCART = 1.0
CARTPOLE_MASSPOLE = 0.1
CARTPOLE_TOTAL_MASS = CARTPOLE_MASSPOLE + CARTPOLE_MASSCART
CARTPOLE_LENGTH = 0.5  # half the pole's length
CARTPOLE_POLEMASS_LENGTH = CARTPOLE_MASSPOLE * CARTPOLE_LENGTH
CARTPOLE_FORCE_MAG = 10.0
CARTPOLE_TAU = 0.02
CARTPOLE_THETA_THRESHOLD = 12 * 2 * math.pi / 360
CARTPOLE_X_THRESHOLD = 2.4


def cartpole_step(state: Any, action: Any, xp: Any = np) -> tuple[Any, Any, Any]:
    """One Euler step of CartPole for a batch: ``state`` (n, 4) float64, ``action`` (n,) in {0, 1}.

    Returns ``(next_state, reward, terminated)``; the reward is 1 for every step (CartPole-v1 default).
    """
    x, x_dot, theta, theta_dot = state[:, 0], state[:, 1], state[:, 2], state[:, 3]
    force = xp.where(action == 1, CARTPOLE_FORCE_MAG, -CARTPOLE_FORCE_MAG)
    costheta = xp.cos(theta)
    sintheta = xp.sin(theta)
    temp = (force + CARTPOLE_POLEMASS_LENGTH * xp.square(theta_dot) * sintheta) / CARTPOLE_TOTAL_MASS
    thetaacc = (CARTPOLE_GRAVITY * sintheta - costheta * temp) / (
        CARTPOLE_LENGTH * (4.0 / 3.0 - CARTPOLE_MASSPOLE * xp.square(costheta) / CARTPOLE_TOTAL_MASS)
    )
    xacc = temp - CARTPOLE_POLEMASS_LENGTH * thetaacc * costheta / CARTPOLE_TOTAL_MASS
    x = x + CARTPOLE_TAU * x_dot
    x_dot = x_dot + CARTPOLE_TAU * xacc
    theta = theta + CARTPOLE_TAU * theta_dot
    theta_dot = theta_dot + CARTPOLE_TAU * thetaacc
    next_state = xp.stack([x, x_dot, theta, theta_dot], axis=1)
    terminated = (
        (x < -CARTPOLE_X_THRESHOLD)
        | (x > CARTPOLE_X_THRESHOLD)
        | (theta < -CARTPOLE_THETA_THRESHOLD)
        | (theta > CARTPOLE_THETA_THRESHOLD)
    )
    reward = xp.ones(state.shape[0], dtype=xp.float32)
    return next_state, reward, terminated


def cartpole_observation(state: Any, xp: Any = np) -> Any:
    """CartPole's observation is its state as float32."""
    return state.astype(xp.float32)


def cartpole_initial_state(rng: np.random.Generator, n: int) -> np.ndarray:
    """Initial states, each coordinate uniform on [-0.05, 0.05] (float64), as gymnasium's reset."""
    return rng.uniform(-0.05, 0.05, size=(n, 4))


CARTPOLE_OBSERVATION_HIGH = np.array(
    [CARTPOLE_X_THRESHOLD * 2, np.inf, CARTPOLE_THETA_THRESHOLD * 2, np.inf], dtype=np.float32
)

# ----------------------------------------------------------------------------------------- Acrobot

ACROBOT_DT = 0.2
ACROBOT_LINK_LENGTH_1 = 1.0
ACROBOT_LINK_MASS_1 = 1.0
ACROBOT_LINK_MASS_2 = 1.0
ACROBOT_LINK_COM_POS_1 = 0.5
ACROBOT_LINK_COM_POS_2 = 0.5
ACROBOT_LINK_MOI = 1.0
ACROBOT_MAX_VEL_1 = 4 * math.pi
ACROBOT_MAX_VEL_2 = 9 * math.pi
ACROBOT_TORQUES = (-1.0, 0.0, 1.0)
ACROBOT_OBSERVATION_HIGH = np.array([1.0, 1.0, 1.0, 1.0, ACROBOT_MAX_VEL_1, ACROBOT_MAX_VEL_2], dtype=np.float32)


def _square_as_libm_pow(x: Any, xp: Any) -> Any:
    """``x**2`` rounded as the C library's ``pow`` rounds it (gymnasium squares numpy scalars, which calls
    ``pow``; numpy arrays square by ``x*x``, which differs in the last bit for about 1 value in 1000)."""
    if xp is np:
        return np.float_power(x, np.full_like(x, 2.0))
    return x * x


def _acrobot_dsdt(s: Any, a: Any, xp: Any) -> Any:
    """Time derivative of (theta1, theta2, dtheta1, dtheta2) under torque ``a`` ("book" equations)."""
    m1 = ACROBOT_LINK_MASS_1
    m2 = ACROBOT_LINK_MASS_2
    l1 = ACROBOT_LINK_LENGTH_1
    lc1 = ACROBOT_LINK_COM_POS_1
    lc2 = ACROBOT_LINK_COM_POS_2
    I1 = ACROBOT_LINK_MOI
    I2 = ACROBOT_LINK_MOI
    g = 9.8
    pi = math.pi
    theta1, theta2, dtheta1, dtheta2 = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
    cos, sin = xp.cos, xp.sin

    def sq(v: Any) -> Any:
        return _square_as_libm_pow(v, xp)

    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + I1 + I2
    d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + I2
    phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * sq(dtheta2) * sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * sq(dtheta1) * sin(theta2) - phi2) / (
        m2 * lc2**2 + I2 - sq(d2) / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return xp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], axis=1)


def _wrap(x: Any, low: float, high: float, xp: Any) -> Any:
    diff = high - low
    while bool(xp.any(x > high)):
        x = xp.where(x > high, x - diff, x)
    while bool(xp.any(x < low)):
        x = xp.where(x < low, x + diff, x)
    return x


def acrobot_step(state: Any, action: Any, xp: Any = np) -> tuple[Any, Any, Any]:
    """One RK4 step (dt = 0.2 s) of Acrobot for a batch: ``state`` (n, 4), ``action`` (n,) in {0, 1, 2}.

    Returns ``(next_state, reward, terminated)`` with reward -1 until the tip swings above the bar, then 0.
    """
    y0 = state.astype(xp.float64)
    a = xp.asarray(ACROBOT_TORQUES, dtype=xp.float64)[action]
    dt = ACROBOT_DT - 0.0
    dt2 = dt / 2.0
    k1 = _acrobot_dsdt(y0, a, xp)
    k2 = _acrobot_dsdt(y0 + dt2 * k1, a, xp)
    k3 = _acrobot_dsdt(y0 + dt2 * k2, a, xp)
    k4 = _acrobot_dsdt(y0 + dt * k3, a, xp)
    ns = y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    theta1 = _wrap(ns[:, 0], -math.pi, math.pi, xp)
    theta2 = _wrap(ns[:, 1], -math.pi, math.pi, xp)
    dtheta1 = xp.minimum(xp.maximum(ns[:, 2], -ACROBOT_MAX_VEL_1), ACROBOT_MAX_VEL_1)
    dtheta2 = xp.minimum(xp.maximum(ns[:, 3], -ACROBOT_MAX_VEL_2), ACROBOT_MAX_VEL_2)
    next_state = xp.stack([theta1, theta2, dtheta1, dtheta2], axis=1)
    terminated = -xp.cos(theta1) - xp.cos(theta2 + theta1) > 1.0
    reward = xp.where(terminated, 0.0, -1.0).astype(xp.float32)
    return next_state, reward, terminated


def acrobot_observation(state: Any, xp: Any = np) -> Any:
    """(cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2) as float32.

    Computed in the state's own precision (float32 right after a reset, float64 afterwards), as gymnasium does.
    """
    s0, s1 = state[:, 0], state[:, 1]
    obs = xp.stack([xp.cos(s0), xp.sin(s0), xp.cos(s1), xp.sin(s1), state[:, 2], state[:, 3]], axis=1)
    return obs.astype(xp.float32)


def acrobot_initial_state(rng: np.random.Generator, n: int) -> np.ndarray:
    """Initial states uniform on [-0.1, 0.1]^4, rounded to float32 as gymnasium's reset does."""
    return rng.uniform(-0.1, 0.1, size=(n, 4)).astype(np.float32)


# ----------------------------------------------------------------------------------------- batched env


@dataclass(frozen=True)
class VecStep:
    """What one batched step returns; ``obs`` already holds the next episode's first observation where done."""

    obs: Any
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any
    """Observation reached by this step before any reset (use it to bootstrap truncated episodes)."""


@dataclass(frozen=True)
class _Dynamics:
    env_id: str
    step: Callable[..., tuple[Any, Any, Any]]
    observation: Callable[..., Any]
    initial_state: Callable[[np.random.Generator, int], np.ndarray]
    observation_high: np.ndarray
    num_actions: int
    max_episode_steps: int


_DYNAMICS = {
    "CartPole-v1": _Dynamics(
        "CartPole-v1", cartpole_step, cartpole_observation, cartpole_initial_state, CARTPOLE_OBSERVATION_HIGH, 2, 500
    ),
    "Acrobot-v1": _Dynamics(
        "Acrobot-v1", acrobot_step, acrobot_observation, acrobot_initial_state, ACROBOT_OBSERVATION_HIGH, 3, 500
    ),
}

BATCHED_ENV_IDS = tuple(_DYNAMICS)


class BatchedClassicControl:
    """``num_envs`` copies of one classic-control task, stepped together, with same-step auto-reset.

    ``xp`` selects the array module (``numpy`` or ``cupy``); initial states are drawn on the host from a
    seeded ``numpy.random.Generator`` and moved to the device.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, xp: Any = np,
                 max_episode_steps: int | None = None) -> None:
        if env_id not in _DYNAMICS:
            raise ValueError(f"env_id: no batched implementation of '{env_id}'; available: {', '.join(_DYNAMICS)}")
        if int(num_envs) < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self._dyn = _DYNAMICS[env_id]
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.xp = xp
        self.max_episode_steps = int(max_episode_steps or self._dyn.max_episode_steps)
        high = self._dyn.observation_high
        self.observation_space = Box(low=-high, high=high, dtype=np.float32)
        self.action_space = Discrete(self._dyn.num_actions)
        self._rng = np.random.default_rng(seed)
        self._state: Any = None
        self._obs: Any = None
        self._elapsed: Any = None

    def _initial(self, n: int) -> tuple[Any, Any]:
        """Fresh states (float64) and their observations (computed in the sampled precision)."""
        s = self.xp.asarray(self._dyn.initial_state(self._rng, n))
        return s.astype(self.xp.float64), self._dyn.observation(s, self.xp)

    def reset(self, seed: int | None = None) -> Any:
        """Start every environment afresh; ``seed`` re-seeds the generator of initial states."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state, self._obs = self._initial(self.num_envs)
        self._elapsed = self.xp.zeros(self.num_envs, dtype=self.xp.int64)
        return self._obs

    @property
    def state(self) -> Any:
        """The physical state, shape (num_envs, 4), float64."""
        return self._state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue these environments exactly (generator, states, observations, episode
        step counts; host arrays), for checkpoints."""
        host = (lambda x: x.get() if hasattr(x, "get") else np.asarray(x))
        return {"rng": self._rng.bit_generator.state, "state": host(self._state), "obs": host(self._obs),
                "elapsed": host(self._elapsed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in state["rng"].items()}
        self._state = self.xp.asarray(np.asarray(state["state"], dtype=np.float64))
        self._obs = self.xp.asarray(np.asarray(state["obs"], dtype=np.asarray(state["obs"]).dtype))
        self._elapsed = self.xp.asarray(np.asarray(state["elapsed"], dtype=np.int64))

    def step(self, actions: Any) -> VecStep:
        """Apply ``actions`` (num_envs,) and auto-reset the environments whose episode ended."""
        xp = self.xp
        if self._state is None:
            raise RuntimeError("step: call reset() before step()")
        actions = xp.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions: expected shape ({self.num_envs},), got {tuple(actions.shape)}")
        if actions.size and (int(actions.min()) < 0 or int(actions.max()) >= self._dyn.num_actions):
            raise ValueError(f"actions: each action must be in [0, {self._dyn.num_actions}), got "
                             f"min {int(actions.min())} max {int(actions.max())}")
        state, reward, terminated = self._dyn.step(self._state, actions, xp)
        self._elapsed = self._elapsed + 1
        truncated = self._elapsed >= self.max_episode_steps
        final_obs = self._dyn.observation(state, xp)
        done = terminated | truncated
        obs = final_obs
        if bool(done.any()):
            idx = xp.nonzero(done)[0]
            fresh_state, fresh_obs = self._initial(int(idx.shape[0]))
            state = state.copy()
            state[idx] = fresh_state
            obs = final_obs.copy()
            obs[idx] = fresh_obs
            self._elapsed[idx] = 0
        self._state, self._obs = state, obs
        return VecStep(obs=obs, reward=reward, terminated=terminated, truncated=truncated, final_obs=final_obs)


def make_batched(env_id: str, num_envs: int, seed: int | None = None, xp: Any = np) -> BatchedClassicControl:
    """A batched classic-control environment (``"CartPole-v1"`` or ``"Acrobot-v1"``)."""
    return BatchedClassicControl(env_id, num_envs, seed=seed, xp=xp)
