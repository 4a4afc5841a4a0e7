"""The nfsp kind in a seed group: ``learner_seeds: null`` trains the run's own ``seed`` (and stays null in the
resolved config the group hands to every seed), plain metric names the group report shares, and
``target_exploitability`` turned into the ``reached_target`` flag the group counts."""

from __future__ import annotations

import pytest

from fedarena.marl.learning_experiments import NFSPExperimentConfig
from fedarena.platform import config as cfgmod

TINY = {"num_games": 32, "hidden": [16], "replay_capacity": 2000, "reservoir_capacity": 2000,
        "min_buffer_size_to_learn": 100, "batch_size": 32, "learn_every": 16}


def test_null_learner_seeds_train_the_run_seed_and_stay_null_when_resolved():
    cfg = cfgmod.build(NFSPExperimentConfig, {"kind": "nfsp", "seed": 7, "learner_seeds": None})
    assert cfg.seed_list == [7]
    assert cfgmod.to_dict(cfg)["learner_seeds"] is None
    assert cfgmod.build(NFSPExperimentConfig, {"kind": "nfsp", "seed": 7}).seed_list == [0, 1, 2]
    with pytest.raises(Exception, match="target_exploitability"):
        cfgmod.build(NFSPExperimentConfig, {"kind": "nfsp", "target_exploitability": 0})


def test_one_learner_run_reports_plain_metrics_and_the_target_flag(tmp_path):
    from fedarena.platform.runs import execute, read_metrics

    out = execute({"kind": "nfsp", "game": "kuhn_poker", "seed": 4, "learner_seeds": None, "episodes": 300,
                   "eval_every": 150, "target_exploitability": 0.3, "nfsp": TINY},
                  out=tmp_path / "run", quiet=True, report=False)
    assert out["seeds"] == [4] and (tmp_path / "run" / "policy_seed4.json").exists()
    assert out["exploitability"] == out["seed4/exploitability"]
    assert out["reached_target"] is (out["exploitability"] <= 0.3)
    rows = [r for r in read_metrics(tmp_path / "run") if "exploitability" in r]
    assert [r["episodes"] for r in rows][0] == 0 and rows[-1]["exploitability"] == out["exploitability"]
