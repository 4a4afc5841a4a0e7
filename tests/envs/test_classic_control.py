"""Batched CartPole / Acrobot against gymnasium's own environments (the oracle), transition by transition."""

import gymnasium as gym
import numpy as np
import pytest

from fedarena.envs.classic_control import (
    BatchedClassicControl,
    acrobot_observation,
    acrobot_step,
    cartpole_observation,
    cartpole_step,
)
from fedarena.envs.vector import GymnasiumVectorEnv, make_vector_env

STEP = {"CartPole-v1": cartpole_step, "Acrobot-v1": acrobot_step}
OBSERVE = {"CartPole-v1": cartpole_observation, "Acrobot-v1": acrobot_observation}


@pytest.mark.parametrize("env_id,episodes", [("CartPole-v1", 40), ("Acrobot-v1", 3)])
def test_transitions_identical_to_gymnasium(env_id, episodes):
    env = gym.make(env_id)
    rng = np.random.default_rng(1)
    count = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=100 + ep)
        state = np.asarray(env.unwrapped.state)
        np.testing.assert_array_equal(OBSERVE[env_id](state.reshape(1, 4))[0], obs)  # reset observation too
        done = False
        while not done:
            s = np.asarray(env.unwrapped.state, dtype=np.float64).reshape(1, 4)
            a = int(rng.integers(env.action_space.n))
            obs, r, term, trunc, _ = env.step(a)
            ns, rr, tt = STEP[env_id](s, np.array([a]))
            assert np.array_equal(ns[0], np.asarray(env.unwrapped.state)), (env_id, ep, count)
            assert np.array_equal(OBSERVE[env_id](ns)[0], obs)
            assert rr[0] == r and bool(tt[0]) == term
            count += 1
            done = term or trunc
    assert count > 300


def test_batched_step_matches_many_states_at_once():
    """One batched call over 64 different states equals 64 separate gymnasium steps."""
    rng = np.random.default_rng(2)
    for env_id in STEP:
        env = gym.make(env_id).unwrapped
        env.reset(seed=0)
        n = 64
        states = rng.uniform(-0.25, 0.25, size=(n, 4)) * (1 if env_id == "CartPole-v1" else 8)
        actions = rng.integers(env.action_space.n, size=n)
        ns, rr, tt = STEP[env_id](states, actions)
        for i in range(n):
            env.state = states[i].copy()
            env.steps_beyond_terminated = None  # CartPole pays 0 for steps after a termination; start fresh
            _, r, term, _, _ = env.step(int(actions[i]))
            assert np.array_equal(ns[i], np.asarray(env.state)) and rr[i] == r and bool(tt[i]) == term


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_batched_env_lockstep_with_gymnasium_including_autoreset(env_id):
    """Run the batched env and n gymnasium envs side by side; after each auto-reset copy the new state over."""
    n, steps = 6, 700 if env_id == "CartPole-v1" else 520
    venv = BatchedClassicControl(env_id, n, seed=3)
    venv.reset()
    gyms = [gym.make(env_id) for _ in range(n)]
    for i, g in enumerate(gyms):
        g.reset(seed=i)
        g.unwrapped.state = venv.state[i].copy() if env_id == "CartPole-v1" else venv.state[i].astype(np.float32)
    rng = np.random.default_rng(4)
    seen_done = 0
    for _ in range(steps):
        actions = rng.integers(venv.action_space.n, size=n)
        out = venv.step(actions)
        for i, g in enumerate(gyms):
            o, r, term, trunc, _ = g.step(int(actions[i]))
            np.testing.assert_array_equal(out.final_obs[i], o)
            assert out.reward[i] == r and out.terminated[i] == term and out.truncated[i] == trunc
            if term or trunc:
                seen_done += 1
                assert not np.array_equal(out.obs[i], o)
                g.reset()
                g.unwrapped.state = venv.state[i].copy()
            else:
                np.testing.assert_array_equal(out.obs[i], o)
    assert seen_done >= n  # every environment finished at least one episode (CartPole) or was truncated


def test_truncation_at_500_steps():
    venv = BatchedClassicControl("Acrobot-v1", 3, seed=0)
    venv.reset()
    for t in range(1, 501):
        out = venv.step(np.ones(3, dtype=np.int64))  # zero torque: never swings up
        assert not out.terminated.any()
        assert out.truncated.all() == (t == 500)


def test_bad_actions_and_ids_rejected():
    venv = BatchedClassicControl("CartPole-v1", 4, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        venv.step(np.zeros(4, dtype=np.int64))
    venv.reset()
    with pytest.raises(ValueError, match="actions: expected shape"):
        venv.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="actions: each action"):
        venv.step(np.array([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="env_id"):
        BatchedClassicControl("Pendulum-v1", 2)
    with pytest.raises(ValueError, match="env_id"):
        make_vector_env("NoSuchEnv-v0", 2)
    with pytest.raises(ValueError, match="backend"):
        make_vector_env("CartPole-v1", 2, backend="gpu")


def test_gymnasium_vector_adapter_final_obs():
    """The adapter's same-step auto-reset: final_obs is the terminal observation, obs the next episode's first."""
    venv = make_vector_env("MountainCar-v0", 2, backend="sync")
    assert isinstance(venv, GymnasiumVectorEnv)
    venv.reset(seed=0)
    for t in range(200):
        out = venv.step(np.zeros(2, dtype=np.int64))
    assert out.truncated.all()  # MountainCar-v0's time limit is 200
    assert not np.array_equal(out.final_obs, out.obs)
    assert np.all(np.abs(out.obs[:, 1]) == 0.0)  # fresh episodes start at rest
    assert np.all(out.final_obs[:, 1] != 0.0)
    venv.close()
