"""``cooperative_marl`` checkpoint/resume: a run stopped after 2 rounds and resumed to 4 equals an uninterrupted
4-round run (metric rows and final networks, optimizer states, replay buffers and RNGs), for QMIX, VDN and
IPPO together on a short simple_spread; without the replay buffer in the checkpoint the resumed run differs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedarena.platform import checkpoint as ckpt
from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute

CFG = {"kind": "cooperative_marl", "env_id": "mpe2.simple_spread_v3", "max_cycles": 5, "seed": 3,
       "algorithms": ["qmix", "vdn", "ippo"], "learner_seeds": [0], "num_envs": 2,
       "env_steps": 40, "steps_per_round": 10, "eval_every": 2, "eval_episodes": 2,
       "checkpoint": {"every": 10, "keep": 10},
       "value_decomposition": {"hidden": [16], "mixing_embed": 8, "hypernet_hidden": 8, "batch_size": 8,
                               "buffer_size": 64, "learning_starts": 8, "target_update_every": 3,
                               "epsilon_anneal_steps": 30},
       "ppo": {"num_steps": 5, "num_minibatches": 1, "update_epochs": 2, "hidden": [16], "anneal_lr": False}}


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(("wall_time", "cpu_time")) and k not in ("time", "elapsed")}
            for r in rows]


def _leaves(tree, path=""):
    if isinstance(tree, dict):
        for k in sorted(tree):
            if k not in ("wall", "cpu"):
                yield from _leaves(tree[k], f"{path}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{path}/{i}")
    else:
        yield path, tree


def _assert_same_state(a, b):
    la, lb = dict(_leaves(a)), dict(_leaves(b))
    assert la.keys() == lb.keys()
    for k in la:
        np.testing.assert_array_equal(np.asarray(la[k]), np.asarray(lb[k]), err_msg=k)


def _final_state(run_dir):
    step, state = ckpt.load_newest_valid(run_dir / "checkpoints")
    return step, state["experiment"]


def test_resume_after_two_rounds_equals_the_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    execute(CFG, out=full, quiet=True, report=False)
    part = tmp_path / "part"
    execute(CFG, ["env_steps=20"], out=part, quiet=True, report=False)
    assert [r["step"] for r in _rows(part)] == [10, 20]
    execute(None, ["env_steps=40"], resume=part, quiet=True, report=False)
    assert [r["step"] for r in _rows(part)] == [10, 20, 30, 40]
    assert _rows(part) == _rows(full)
    (s1, a), (s2, b) = _final_state(full), _final_state(part)
    assert s1 == s2 == 40
    _assert_same_state(a, b)
    # the state really moved: QMIX updated, its buffer filled, IPPO's version counted 4 rollouts
    qmix, ippo = a["learners"][0]["impl"], a["learners"][2]["impl"]
    assert qmix["learner"]["updates"] == 40 // 2 - 8 // 2 + 1 and qmix["buffer"]["size"] == 40
    assert ippo["learners"][0]["version"] == 4 and ippo["env_steps"] == 40


def test_resume_without_the_replay_buffer_refills_it_and_diverges(tmp_path):
    cfg = dict(CFG, algorithms=["qmix"], checkpoint_replay=False)
    full = tmp_path / "full"
    execute(cfg, out=full, quiet=True, report=False)
    part = tmp_path / "part"
    execute(cfg, ["env_steps=20"], out=part, quiet=True, report=False)
    _, saved = _final_state(part)
    assert "buffer" not in saved["learners"][0]["impl"]
    execute(None, ["env_steps=40"], resume=part, quiet=True, report=False)
    _, a = _final_state(full)
    _, b = _final_state(part)
    assert b["learners"][0]["impl"]["env_steps"] == 40
    assert not np.array_equal(np.asarray(a["learners"][0]["impl"]["learner"]["params"]["agent"][0]["w"]),
                              np.asarray(b["learners"][0]["impl"]["learner"]["params"]["agent"][0]["w"]))


def test_rounds_that_do_not_line_up_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="steps_per_round"):
        execute(dict(CFG, steps_per_round=15), out=tmp_path / "bad", quiet=True, report=False)


def test_learners_spread_over_worker_processes_give_the_same_run(tmp_path):
    cfg = dict(CFG, env_steps=20, eval_every=1, algorithms=["qmix", "ippo"])
    execute(cfg, out=tmp_path / "one", quiet=True, report=False)
    execute(dict(cfg, workers=2), ["env_steps=10"], out=tmp_path / "two", quiet=True, report=False)
    execute(None, ["env_steps=20"], resume=tmp_path / "two", quiet=True, report=False)  # resumed across workers
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")
    _assert_same_state(_final_state(tmp_path / "one")[1], _final_state(tmp_path / "two")[1])


def test_resume_across_worker_processes_from_an_older_checkpoint(tmp_path):
    """Two worker processes; ``checkpoint.every`` counts environment steps; the newest checkpoint removed (as if
    stopped after the previous one), --resume replays the same rows; a smaller budget runs no round."""
    cfg = dict(CFG, algorithms=["vdn", "ippo"], workers=2, checkpoint={"every": 20, "keep": 10})
    run = tmp_path / "run"
    first = execute(cfg, out=run, quiet=True, report=False)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-000000020.fdck", "ckpt-000000040.fdck"]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [10, 20, 30, 40]
    (run / "checkpoints" / "ckpt-000000040.fdck").unlink()
    again = execute(None, ["eval_every=2"], resume=run, quiet=True, report=False)  # same value: a real resume
    assert "resumed from checkpoint at step 20" in (run / "run.log").read_text()
    assert _rows(run) == rows
    for a in ("vdn", "ippo"):
        assert again[f"{a}/greedy_return_per_seed"] == first[f"{a}/greedy_return_per_seed"]
        assert again[f"{a}/episodes"] == first[f"{a}/episodes"]
    smaller = execute(None, ["env_steps=20"], resume=run, quiet=True, report=False)
    assert smaller["env_steps_per_learner"] == 40 and _rows(run) == rows
    assert smaller["vdn/greedy_return_per_seed"] == first["vdn/greedy_return_per_seed"]


def test_resume_with_n_step_targets_equals_the_uninterrupted_run(tmp_path):
    # a run with n-step targets checkpoints (its window and open counts serialise) and resumes to the same
    # metrics and state (oracle: the uninterrupted run; its rounds end with the episodes, so the mid-episode
    # window is tested in test_value_decomposition_targets)
    cfg = dict(CFG, algorithms=["qmix"], value_decomposition=dict(CFG["value_decomposition"], n_step=3))
    full, part = tmp_path / "full", tmp_path / "part"
    execute(cfg, out=full, quiet=True, report=False)
    execute(cfg, ["env_steps=20"], out=part, quiet=True, report=False)
    execute(None, ["env_steps=40"], resume=part, quiet=True, report=False)
    assert _rows(part) == _rows(full)
    (s1, a), (s2, b) = _final_state(full), _final_state(part)
    assert s1 == s2 == 40
    _assert_same_state(a, b)
    assert a["learners"][0]["impl"]["buffer"]["size"] == 40
