"""IMPALA on a parameter server (issue 20, deliverable 4): the background ParameterServerLearner against
plain IMPALA updates (sync, one worker, sharded servers: the same arithmetic), resume, threshold mode with
a slow worker, and a failing worker surfacing its error."""

from __future__ import annotations

import dataclasses
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import optim
from fedarena.engine.distributed import ParameterServerConfig, ParameterServerLearner
from fedarena.rl.impala import IMPALA, IMPALAConfig


def _trajectories(agent: IMPALA, n: int, seed: int) -> list[dict]:
    """Behaviour-policy trajectories in the actors' format (random, but with log-probs of a real policy)."""
    rng = np.random.default_rng(seed)
    c = agent.config
    out = []
    for _ in range(n):
        obs = rng.standard_normal((c.unroll_length, c.num_envs, 4)).astype(np.float32)
        action = rng.integers(0, 2, size=(c.unroll_length, c.num_envs))
        out.append({"obs": obs, "action": action, "log_prob": np.full(action.shape, np.log(0.5)),
                    "reward": rng.random(action.shape).astype(np.float32),
                    "discount": np.where(rng.random(action.shape) < 0.05, 0.0, c.gamma).astype(np.float32),
                    "last_obs": rng.standard_normal((c.num_envs, 4)).astype(np.float32), "version": 0})
    return out


def _assert_trees_close(a, b, **tol):
    for x, y in zip(engine.tree_leaves(a), engine.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def test_sync_one_worker_sharded_servers_equal_plain_impala_updates():
    env = gym.make("CartPole-v1")
    cfg = IMPALAConfig(num_envs=4, unroll_length=8, max_policy_lag=100)
    plain = IMPALA(env.observation_space, env.action_space, cfg, seed=1)
    ps = IMPALA(env.observation_space, env.action_space,
                dataclasses.replace(cfg, parameter_server="sync", ps_servers=3, learners=1), seed=1)
    try:
        _assert_trees_close(plain.learner.params, ps.learner.params, rtol=0, atol=0)
        for traj in _trajectories(plain, 6, seed=2):
            plain.update(traj)
            ps.update(traj)
        ps.learner.server.drain()
        assert ps.learner.version == plain.learner.version == 6
        _assert_trees_close(ps.learner.params, plain.learner.params, rtol=2e-5, atol=1e-6)
    finally:
        ps.close()


def test_resume_from_state_continues_like_an_uninterrupted_run():
    env = gym.make("CartPole-v1")
    cfg = IMPALAConfig(num_envs=2, unroll_length=8, max_policy_lag=100, parameter_server="sync", ps_servers=2)
    trajs = _trajectories(IMPALA(env.observation_space, env.action_space, IMPALAConfig(num_envs=2, unroll_length=8),
                                 seed=0), 6, seed=3)
    whole = IMPALA(env.observation_space, env.action_space, cfg, seed=4)
    first = IMPALA(env.observation_space, env.action_space, cfg, seed=4)
    second = IMPALA(env.observation_space, env.action_space, cfg, seed=9)  # other initial weights: overwritten
    try:
        for t in trajs:
            whole.update(t)
        whole.learner.server.drain()
        for t in trajs[:3]:
            first.update(t)
        first.learner.server.drain()
        state = (engine.tree_map(np.copy, first.learner.params), first.learner.opt_state, first.learner.version)
        second.learner.set_state(*state)
        for t in trajs[3:]:
            second.update(t)
        second.learner.server.drain()
        assert second.learner.version == whole.learner.version == 6
        _assert_trees_close(second.learner.params, whole.learner.params, rtol=1e-6, atol=1e-7)
    finally:
        for a in (whole, first, second):
            a.close()


def _least_squares(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, 5))
    w_true = rng.standard_normal(5)
    return a, a @ w_true, w_true


def test_threshold_mode_keeps_stepping_past_a_slow_worker_and_converges():
    a, b, w_true = _least_squares()
    slow = threading.Event()
    pushes = {0: 0, 1: 0}
    lock = threading.Lock()

    def grad(params, batch):
        worker = threading.current_thread().name  # ps-rank-1 / ps-rank-2 (rank 0 is the server)
        with lock:
            pushes[int(worker[-1]) - 1] += 1
        if worker.endswith("2") and slow.is_set():
            time.sleep(0.2)
        rows = batch
        g = a[rows].T @ (a[rows] @ params["w"] - b[rows]) / len(rows)
        return {"w": g.astype(np.float32)}, {"loss": float(np.mean((a @ params["w"] - b) ** 2))}

    learner = ParameterServerLearner({"w": np.zeros(5, np.float32)}, grad, optim.sgd(0.1),
                                     ParameterServerConfig(mode="threshold", threshold=0.5, staleness=0), workers=2,
                                     lock_gradients=False)  # numpy gradients: no engine calls to serialize
    try:
        slow.set()
        rng = np.random.default_rng(1)
        for _ in range(120):
            learner.update(rng.choice(64, size=16, replace=False))
        learner.drain()
        version, params = learner.weights()
        assert version >= 100  # a quorum of 1 of 2: the slow worker holds back no step
        assert pushes[0] > 2 * pushes[1]  # the fast worker did most of the work
        np.testing.assert_allclose(params["w"], w_true, atol=1e-2)
    finally:
        learner.close()


def test_a_failing_gradient_surfaces_its_error_on_the_next_update():
    def grad(params, batch):
        if batch == "bad":
            raise ValueError("bad batch")
        return {"w": np.ones(2, np.float32)}, {}

    learner = ParameterServerLearner({"w": np.zeros(2, np.float32)}, grad, optim.sgd(0.1),
                                     ParameterServerConfig(mode="async"), workers=1)
    try:
        learner.update("bad")
        with pytest.raises(RuntimeError, match="bad batch"):
            for _ in range(50):  # the error arrives asynchronously; the next updates report it
                learner.update("ok")
                time.sleep(0.05)
    finally:
        learner.close()


def test_parameter_server_fields_are_validated():
    with pytest.raises(ValueError, match="impala.parameter_server"):
        IMPALAConfig(parameter_server="gossip")
    with pytest.raises(ValueError, match="impala.ps_threshold"):
        IMPALAConfig(parameter_server="threshold", ps_threshold=0.0)
