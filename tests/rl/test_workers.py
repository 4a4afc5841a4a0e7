"""Actor trajectories (truncation bootstrap, version stamps), InferenceServer batching, the wire codec."""

import threading

import numpy as np
import pytest

from fedarena.envs.classic_control import BatchedClassicControl
from fedarena.rl import wire
from fedarena.rl.distributions import Categorical
from fedarena.rl.spaces import observation_adapter
from fedarena.rl.workers import Actor, InferenceServer, Weights


class _ConstantPolicy:
    version = 7

    def __call__(self, x):
        return {"action": np.zeros(x.shape[0], dtype=np.int64), "value": np.full(x.shape[0], 10.0),
                "log_prob": np.full(x.shape[0], -0.5)}


def test_actor_bootstraps_truncated_episodes_and_stamps_versions():
    env = BatchedClassicControl("CartPole-v1", 3, seed=0, max_episode_steps=4)
    actor = Actor(env, observation_adapter(env.observation_space), Categorical(2), _ConstantPolicy(), gamma=0.9, seed=0)
    traj = actor.rollout(8)
    assert traj["obs"].shape == (8, 3, 4) and traj["reward"].shape == (8, 3)
    # always pushing left does not topple the pole within 4 steps: every episode is truncated at step 4
    np.testing.assert_allclose(traj["reward"][[3, 7]], 1.0 + 0.9 * 10.0)
    np.testing.assert_allclose(traj["reward"][[0, 1, 2, 4, 5, 6]], 1.0)
    np.testing.assert_allclose(traj["discount"][[3, 7]], 0.0)
    np.testing.assert_allclose(traj["discount"][[0, 1, 2, 4, 5, 6]], 0.9)
    assert traj["episode_returns"].tolist() == [4.0] * 6  # raw env reward, no bootstrap
    assert traj["version"] == 7 and traj["env_steps"] == 24
    np.testing.assert_allclose(traj["bootstrap_value"], 10.0)
    assert traj["last_obs"].shape == (3, 4)


def _sum_forward(params, x):
    """Logits favouring action 1 strongly; value = sum of the row (lets each caller check its own rows)."""
    logits = np.tile(np.array([[0.0, 50.0]], dtype=np.float32), (x.shape[0], 1)) * params["scale"]
    return (logits,), x.sum(axis=1)


def _concurrent(server, rows_per_request):
    results = [None] * len(rows_per_request)

    def go(i, n):
        results[i] = server.infer(np.full((n, 2), float(i)))

    threads = [threading.Thread(target=go, args=(i, n)) for i, n in enumerate(rows_per_request)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_inference_server_fills_a_batch_by_size():
    # the deadline is far away: only reaching max_batch can release these requests
    server = InferenceServer(_sum_forward, Categorical(2), Weights(3, {"scale": np.float32(1.0)}), max_batch=4,
                             deadline_s=600.0, seed=0)
    results = _concurrent(server, [1, 1, 1, 1])
    server.stop()
    assert server.batches_served == 1 and server.rows_served == 4
    for i, r in enumerate(results):
        assert r["value"].tolist() == [2.0 * i] and r["action"].tolist() == [1]
    assert server.client().version == 3


def test_inference_server_releases_a_partial_batch_at_the_deadline():
    server = InferenceServer(_sum_forward, Categorical(2), Weights(0, {"scale": np.float32(1.0)}), max_batch=1000,
                             deadline_s=0.005, seed=0)
    out = server.infer(np.ones((3, 2)))
    assert out["value"].tolist() == [2.0, 2.0, 2.0]
    assert server.batches_served == 1 and server.rows_served == 3
    server.stop()


def test_inference_server_never_exceeds_max_batch_and_survives_errors():
    server = InferenceServer(_sum_forward, Categorical(2), Weights(0, {"scale": np.float32(1.0)}), max_batch=5,
                             deadline_s=0.005, seed=0)
    results = _concurrent(server, [3, 3, 3, 2])
    assert [r["value"].shape[0] for r in results] == [3, 3, 3, 2]
    assert server.rows_served == 11 and server.batches_served >= 3  # 11 rows in batches of <= 5 whole requests
    server.set_weights(Weights(1, {}))  # forward now fails (no 'scale'): the caller gets the error
    with pytest.raises(RuntimeError, match="forward pass failed"):
        server.infer(np.ones((1, 2)))
    server.set_weights(Weights(2, {"scale": np.float32(1.0)}))
    assert server.infer(np.ones((1, 2)))["value"].tolist() == [2.0]
    server.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        server.infer(np.ones((1, 2)))


def test_wire_roundtrip_and_hostile_messages():
    msg = {"version": 3, "params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(2)},
           "flags": np.array([True, False]), "list": [np.int64(4), 1.5, "x", None]}
    back = wire.decode(wire.encode(msg))
    np.testing.assert_array_equal(back["params"]["w"], msg["params"]["w"])
    assert back["params"]["w"].dtype == np.float32 and back["flags"].dtype == bool
    assert back["list"][0] == 4 and back["list"][1:] == [1.5, "x", None]
    import msgpack

    bad_dtype = msgpack.packb({"a": {"__nd__": ["|O", [1], b"\x00" * 8]}}, use_bin_type=True)
    with pytest.raises(wire.WireError, match="message.a: dtype object"):
        wire.decode(bad_dtype)
    short = msgpack.packb({"a": {"__nd__": ["<f4", [4], b"\x00" * 8]}}, use_bin_type=True)
    with pytest.raises(wire.WireError, match="do not fit shape"):
        wire.decode(short)
    with pytest.raises(wire.WireError, match="not valid msgpack"):
        wire.decode(b"\xc1\xc1garbage")
    with pytest.raises(wire.WireError, match="not sendable"):
        wire.encode({"f": object()})
