"""Actor pools: local, worker processes and Ray give trajectories of the right shape; a killed actor is
restarted and its rollout is delivered anyway."""

import os
import signal

import numpy as np
import pytest

from fedarena.rl.execution import ActorSpec, build_agent, config_dict, make_actor_pool
from fedarena.rl.ppo import PPOConfig

CFG = PPOConfig(num_envs=2, num_steps=6, num_minibatches=1, hidden=(8,))
SPEC = ActorSpec("ppo", "CartPole-v1", 2, 6, seed=0, config=config_dict(CFG))


def _weights():
    from fedarena.envs.vector import make_vector_env

    env = make_vector_env("CartPole-v1", 1)
    return build_agent("ppo", env.observation_space, env.action_space, SPEC.config, 0).weights()


def _check(traj):
    assert traj["obs"].shape == (6, 2, 4) and traj["reward"].shape == (6, 2)
    assert np.all(np.isfinite(traj["log_prob"])) and traj["env_steps"] == 12


def test_local_pool_and_bad_mode():
    pool = make_actor_pool("local", SPEC, 2)
    w = _weights()
    pool.submit(1, w)
    pool.submit(0, w)
    got = [pool.next(), pool.next()]
    assert [i for i, _ in got] == [1, 0]
    for _, traj in got:
        _check(traj)
    with pytest.raises(ValueError, match="execution"):
        make_actor_pool("threads", SPEC, 1)
    with pytest.raises(ValueError, match="algorithm"):
        build_agent("a2c", None, None, {}, 0)


def test_process_pool_restarts_a_killed_worker():
    pool = make_actor_pool("multiprocess", SPEC, 2)
    try:
        w = _weights()
        pool.submit(0, w)
        pool.submit(1, w)
        first = dict([pool.next(), pool.next()])
        assert set(first) == {0, 1}
        os.kill(pool.procs[0].pid, signal.SIGKILL)
        pool.procs[0].join(timeout=10)
        pool.submit(0, w)
        pool.submit(1, w)
        second = dict([pool.next(), pool.next()])
        assert set(second) == {0, 1} and pool.restarts >= 1
        for traj in list(first.values()) + list(second.values()):
            _check(traj)
    finally:
        pool.close()


def test_ray_pool_inference_server_and_restart_of_a_killed_actor(ray_session):
    """Two Ray actors served by a Ray-hosted InferenceServer; then actor 0's process is SIGKILLed and the
    pool still delivers both rollouts, actor 0 now running in a new process."""
    spec = ActorSpec("impala", "CartPole-v1", 2, 5, seed=1, config={"num_envs": 2, "unroll_length": 5, "hidden": [8]})
    from fedarena.envs.vector import make_vector_env

    env = make_vector_env("CartPole-v1", 1)
    w = build_agent("impala", env.observation_space, env.action_space, spec.config, 1).weights()
    pool = make_actor_pool("ray", spec, 2, inference_server=True, initial=w, max_batch=4, deadline_s=0.01)
    try:
        pool.submit(0, w)
        pool.submit(1, w)
        got = dict([pool.next(), pool.next()])
        assert set(got) == {0, 1}
        for traj in got.values():
            assert traj["obs"].shape == (5, 2, 4) and traj["env_steps"] == 10
        stats = pool.inference_stats()
        assert stats["rows"] == 2 * 2 * (5 + 1)  # every actor step plus the bootstrap evaluation went through it
        pid = pool.actor_pid(0)
        os.kill(pid, signal.SIGKILL)
        pool.submit(0, w)
        pool.submit(1, w)
        got = dict([pool.next(), pool.next()])
        assert set(got) == {0, 1} and got[0]["obs"].shape == (5, 2, 4)
        assert pool.restarts == 1 and pool.actor_pid(0) != pid  # actor 0 was restarted in a new process
    finally:
        pool.close()
