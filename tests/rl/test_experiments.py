"""The ppo / dqn experiment kinds: run folders, metrics, and resuming from the last checkpoint."""

import json

import numpy as np
import pytest

from fedarena.platform.runs import execute

PPO = {"kind": "ppo", "env_id": "CartPole-v1", "seed": 1, "total_steps": 256, "target_return": None,
       "checkpoint": {"every": 1, "keep": 2},
       "ppo": {"num_envs": 4, "num_steps": 32, "num_minibatches": 2, "update_epochs": 1, "hidden": [16]}}
DQN = {"kind": "dqn", "env_id": "CartPole-v1", "seed": 2, "total_steps": 400, "target_return": None,
       "steps_per_iteration": 200, "checkpoint": {"every": 1, "keep": 2},
       "dqn": {"num_envs": 2, "buffer_size": 1000, "batch_size": 16, "learning_starts": 100, "hidden": [16],
               "train_frequency": 8}}


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_ppo_run_then_resume_continues_counters_and_weights(tmp_path):
    out = tmp_path / "ppo"
    first = execute(PPO, out=out, quiet=True, report=False)
    assert first["env_steps"] == 256
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["policy_version"] == 2
    from fedarena.platform import checkpoint as ckpt

    step, saved = ckpt.load_newest_valid(out / "checkpoints")
    assert step == 2
    second = execute(None, ["total_steps=512"], resume=out, quiet=True, report=False)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["env_steps"] for r in rows] == [128, 256, 384, 512]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert second["env_steps"] == 512
    # the resumed learner started from the checkpointed weights and Adam state (count = 2 updates x 2 minibatches)
    step4, state4 = ckpt.load_newest_valid(out / "checkpoints")
    assert step4 == 4
    assert float(saved["experiment"]["learner"]["opt_state"]["count"]) == 4.0
    assert float(state4["experiment"]["learner"]["opt_state"]["count"]) == 8.0


def test_dqn_resume_restores_the_replay_buffer(tmp_path):
    out = tmp_path / "dqn"
    execute(DQN, out=out, quiet=True, report=False)
    before = _rows(out)
    assert before[-1]["env_steps"] == 400
    execute(None, ["total_steps=600"], resume=out, quiet=True, report=False)
    rows = _rows(out)
    assert [r["env_steps"] for r in rows] == [200, 400, 600]
    # the buffer held the first run's transitions after resuming: it keeps growing instead of starting empty
    assert rows[-1]["replay_size"] > before[-1]["replay_size"] >= 390


def test_bad_execution_mode_is_a_config_error(tmp_path):
    from fedarena.platform.config import ConfigError

    with pytest.raises(ConfigError, match="execution"):
        execute(dict(PPO, execution="gpu"), out=tmp_path / "bad", quiet=True, report=False)
    with pytest.raises(ConfigError, match="dqn.gamma"):
        execute(dict(DQN, dqn=dict(DQN["dqn"], gamma=2.0)), out=tmp_path / "bad2", quiet=True, report=False)


@pytest.mark.parametrize("env_id,squash", [("Pendulum-v1", True), ("Pendulum-v1", False), ("MountainCar-v0", False)])
def test_ppo_runs_on_other_gymnasium_spaces(tmp_path, env_id, squash):
    """Box actions (squashed or clipped Gaussian) and another Discrete env through gymnasium's vector env."""
    cfg = dict(PPO, env_id=env_id, total_steps=128, env_backend="sync", checkpoint={"every": 0, "keep": 1},
               ppo=dict(PPO["ppo"], squash=squash))
    summary = execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    assert summary["env_steps"] == 128
    rows = _rows(tmp_path / "run")
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_negative_targets_stop_runs():
    from fedarena.rl.experiments import _Tracker

    t = _Tracker(window=3, target=-100.0)
    t.add([-500.0, -90.0, -80.0], env_steps=10, wall=1.0)
    assert not t.done  # mean -223
    t.add([-95.0], env_steps=20, wall=2.0)
    assert t.done and t.reached_at == (20, 2.0)
    never = _Tracker(window=1, target=None)
    never.add([1e9], env_steps=1, wall=0.1)
    assert not never.done


def test_impala_on_ray_with_remote_learner_resumes(tmp_path, ray_session):
    """Actors and learner as Ray actors; a resumed run continues the learner's weight versions."""
    cfg = {"kind": "impala", "env_id": "CartPole-v1", "seed": 3, "total_steps": 128, "target_return": None,
           "execution": "ray", "num_actors": 2, "checkpoint": {"every": 1, "keep": 2},
           "impala": {"num_envs": 4, "unroll_length": 16, "hidden": [16]}}
    out = tmp_path / "impala"
    execute(cfg, out=out, quiet=True, report=False)
    execute(None, ["total_steps=256"], resume=out, quiet=True, report=False)
    rows = _rows(out)
    assert [r["env_steps"] for r in rows] == [64, 128, 192, 256]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_impala_on_a_parameter_server_checkpoints_its_shards_and_resumes(tmp_path):
    """Issue 20: the parameter-server IMPALA learner's checkpoint holds every server shard's Adam state, and
    a resumed run continues from it (versions never go back)."""
    from fedarena.platform import checkpoint as ckpt

    cfg = {"kind": "impala", "env_id": "CartPole-v1", "seed": 3, "total_steps": 192, "target_return": None,
           "execution": "local", "num_actors": 1, "checkpoint": {"every": 1, "keep": 2},
           "impala": {"num_envs": 4, "unroll_length": 16, "hidden": [16], "parameter_server": "sync",
                      "ps_servers": 2, "learners": 1}}
    out = tmp_path / "impala_ps"
    execute(cfg, out=out, quiet=True, report=False)
    _, saved = ckpt.load_newest_valid(out / "checkpoints")
    shards = saved["experiment"]["learner"]["opt_state"]
    assert len(shards) == 2
    counts = [float(sh["count"]) for sh in shards]  # the shards step on the same pushes, each on its own thread,
    saved_count = min(counts)                          # so a checkpoint may catch one a step ahead of the other
    assert saved_count >= 1 and max(counts) - saved_count <= 1
    assert saved_count - 1 <= float(saved["experiment"]["learner"]["version"]) <= max(counts)
    execute(None, ["total_steps=384"], resume=out, quiet=True, report=False)
    rows = _rows(out)
    assert [r["env_steps"] for r in rows] == [64 * i for i in range(1, 7)]
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions)
    losses = [r["loss"] for r in rows if "loss" in r]  # a row logged before any worker's gradient has none
    assert len(losses) >= 3 and np.all(np.isfinite(losses))
    _, final = ckpt.load_newest_valid(out / "checkpoints")
    assert float(final["experiment"]["learner"]["opt_state"][0]["count"]) > saved_count
