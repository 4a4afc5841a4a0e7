"""Data-parallel learner: N replicas on shards equal one learner on the whole batch; replicas stay identical."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops, optim
from fedarena.engine.collectives import run_threads
from fedarena.engine.distributed import DataParallelLearner, GradientBuckets, ReplicaStep, data_parallel_step
from fedarena.rl.ppo import PPO, PPOConfig


def _ppo_minibatches(ppo, n, size, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        obs = rng.standard_normal((size, 4)).astype(np.float32)
        action = rng.integers(0, 2, size=size)
        (logits,), value = ppo.forward(ppo.learner.params, obs)
        logits = np.asarray(logits, np.float64)
        log_prob = logits[np.arange(size), action] - np.log(np.exp(logits).sum(1))
        adv = rng.standard_normal(size).astype(np.float32)
        out.append({"obs": obs, "action": ppo.dist.encode(action), "log_prob": log_prob.astype(np.float32),
                    "value": np.asarray(value, np.float32), "advantage": (adv - adv.mean()) / adv.std(),
                    "value_target": (np.asarray(value) + rng.standard_normal(size)).astype(np.float32)})
    return out


@pytest.mark.parametrize("transport", ["threads", "shm"])
def test_two_learner_ppo_equals_one_learner_on_the_concatenated_batch(transport):
    env = gym.make("CartPole-v1")
    cfg = PPOConfig(num_envs=4, num_steps=16, num_minibatches=1, learning_rate=1e-3, anneal_lr=False)
    one = PPO(env.observation_space, env.action_space, cfg, seed=3)
    two = PPO(env.observation_space, env.action_space, dataclasses.replace(cfg, learners=2,
                                                                           learner_transport=transport), seed=3)
    try:
        assert isinstance(two._step, DataParallelLearner)
        p1, s1 = one.learner.params, one.learner.opt_state
        p2, s2 = two.learner.params, two.learner.opt_state
        for mb in _ppo_minibatches(one, 4, 64, seed=0):
            p1, s1, aux1 = one._step(p1, s1, mb)
            p2, s2, aux2 = two._step(p2, s2, mb)
            assert aux2["loss"] == pytest.approx(float(aux1["loss"]), rel=1e-5, abs=1e-6)
            assert aux2["grad_norm"] == pytest.approx(float(aux1["grad_norm"]), rel=1e-4)
        moved = 0.0
        for a, b, c in zip(engine.tree_leaves(p1), engine.tree_leaves(p2), engine.tree_leaves(one.learner.params)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6)  # float32 round-off of the split mean
            moved = max(moved, float(np.abs(np.asarray(a) - np.asarray(c)).max()))
        assert moved > 1e-3  # the steps really changed the parameters
        digests = two._step.replica_digests()
        assert digests.shape == (2, 32) and np.array_equal(digests[0], digests[1])  # identical replicas
    finally:
        if isinstance(two._step, DataParallelLearner):
            two._step.close()


def _mse(params, batch):
    pred = ops.matmul(ops.tanh(ops.matmul(batch["x"], params["w1"])), params["w2"]) + params["b"]
    loss = ops.mean(ops.square(pred - batch["y"]))
    return loss, {"mse": loss}


def _regression_replica(bucket_check=False):
    rng = np.random.default_rng(0)
    params = {"w1": (rng.standard_normal((3, 8)) * 0.5).astype(np.float32),
              "w2": (rng.standard_normal((8, 1)) * 0.5).astype(np.float32), "b": np.zeros(1, np.float32)}
    opt = optim.sgd(0.1, momentum=0.9)

    def grad(p, b):
        (_, aux), g = engine.value_and_grad(_mse, has_aux=True)(p, b)
        return g, aux

    def apply(p, s, g):
        p, s = opt.update(g, s, p)
        return p, s, {}

    return ReplicaStep(engine.jit(grad), engine.jit(apply), params, opt.init(params))


@pytest.mark.parametrize("overlap", [False, True])
def test_spmd_step_with_small_buckets_matches_full_batch_gradient(overlap):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    batch = {"x": x, "y": np.sin(x.sum(1, keepdims=True)).astype(np.float32)}
    ref = _regression_replica()
    p, s = ref.params, ref.opt_state
    for _ in range(3):
        g, _ = ref.grad(p, batch)
        p, s, _ = ref.apply(p, s, g)

    def rank(comm):
        rep = _regression_replica()
        q, t = rep.params, rep.opt_state
        shard = {k: v[comm.rank * 20:(comm.rank + 1) * 20] for k, v in batch.items()}
        for _ in range(3):  # 40-byte buckets: one all-reduce per leaf or less
            q, t, aux = data_parallel_step(comm, rep, q, t, shard, bucket_bytes=40, overlap=overlap)
        return q, aux

    results = run_threads(3, rank)
    for q, aux in results:
        for k in p:
            np.testing.assert_allclose(q[k], p[k], rtol=1e-5, atol=1e-6)
            assert np.asarray(q[k]).tobytes() == np.asarray(results[0][0][k]).tobytes()


def test_buckets_group_reverse_leaves_by_dtype_and_size():
    leaves = [np.zeros(10, np.float32), np.zeros(3, np.float64), np.zeros(4, np.float64), np.zeros(100, np.float32)]
    b = GradientBuckets(leaves, bucket_bytes=64)
    assert b.buckets == [[3], [2, 1], [0]]


def test_batch_that_does_not_split_is_named():
    dp = DataParallelLearner(_regression_replica, 2, "threads")
    try:
        with pytest.raises(ValueError, match="batch.x"):
            dp(dp._rank0.params, dp._rank0.opt_state, {"x": np.zeros((5, 3), np.float32),
                                                       "y": np.zeros((5, 1), np.float32)})
    finally:
        dp.close()
    with pytest.raises(ValueError, match="ppo.learners"):
        PPOConfig(num_envs=3, num_steps=3, num_minibatches=1, learners=2)


def test_two_learner_impala_step_equals_one_learner():
    from fedarena.rl.impala import IMPALA, IMPALAConfig

    env = gym.make("CartPole-v1")
    cfg = IMPALAConfig(num_envs=4, unroll_length=8)
    one = IMPALA(env.observation_space, env.action_space, cfg, seed=1)
    two = IMPALA(env.observation_space, env.action_space, dataclasses.replace(cfg, learners=2), seed=1)
    rng = np.random.default_rng(2)
    batch = {"obs": rng.standard_normal((32, 4)).astype(np.float32),
             "action": two.dist.encode(rng.integers(0, 2, 32)), "vs": rng.standard_normal(32).astype(np.float32),
             "pg_advantage": rng.standard_normal(32).astype(np.float32)}
    try:
        p1, _, aux1 = one._step(one.learner.params, one.learner.opt_state, batch)
        p2, _, aux2 = two._step(two.learner.params, two.learner.opt_state, batch)
        assert aux2["loss"] == pytest.approx(float(aux1["loss"]), rel=1e-5, abs=1e-6)
        for a, b in zip(engine.tree_leaves(p1), engine.tree_leaves(p2)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    finally:
        two._step.close()


def _fragile_replica():
    rep = _regression_replica()

    def grad(p, b):
        if np.any(b["x"] > 100):
            raise ValueError("bad shard")
        return rep.grad(p, b)

    return ReplicaStep(grad, rep.apply, rep.params, rep.opt_state)


def test_a_failing_replica_stops_rank_0_with_its_error_not_a_timeout():
    from fedarena.engine.collectives import PeerFailure

    dp = DataParallelLearner(_fragile_replica, 2, "threads", timeout=60)
    x = np.zeros((4, 3), np.float32)
    x[2:] = 1000.0  # rank 1's shard
    with pytest.raises(PeerFailure, match="replica 1 failed: ValueError: bad shard"):
        dp(dp._rank0.params, dp._rank0.opt_state, {"x": x, "y": np.zeros((4, 1), np.float32)})
    with pytest.raises(RuntimeError, match="closed"):
        dp(dp._rank0.params, dp._rank0.opt_state, {"x": x, "y": np.zeros((4, 1), np.float32)})
