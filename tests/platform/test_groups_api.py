"""Seed groups (--seeds / seeds:) and the Python API (fedarena.run / fedarena.load_run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fedarena
from fedarena.platform.cli import main
from fedarena.platform.groups import band

ROOT = Path(__file__).resolve().parents[2]
TINY_PPO = ["--set", "total_steps=256", "--set", "ppo.num_envs=4", "--set", "ppo.num_steps=32", "--set",
            "ppo.update_epochs=1", "--set", "ppo.hidden=[8]", "--set", "eval.every=128", "--set", "eval.episodes=2"]
TIMING = ("time_to_target_s", "env_steps_per_second", "startup_s", "solver_seconds_per_iteration")


def test_ppo_cartpole_with_three_seeds_writes_three_runs_and_a_band_report(tmp_path, capsys):
    out = tmp_path / "group"
    assert main(["run", str(ROOT / "experiments/ppo_cartpole.yaml"), "--seeds", "0", "1", "2", *TINY_PPO,
                 "--out", str(out), "--quiet"]) == 0
    info = json.loads((out / "group.json").read_text())
    assert info["state"] == "completed" and info["seeds"] == [0, 1, 2]
    statuses = [json.loads((out / f"seed-{s}" / "status.json").read_text()) for s in (0, 1, 2)]
    assert [st["state"] for st in statuses] == ["completed"] * 3 and [st["seed"] for st in statuses] == [0, 1, 2]
    assert (out / "report" / "seeds.png").stat().st_size > 10_000
    html = (out / "report" / "index.html").read_text()
    assert html.count("<tr><td><a href=\"../seed-") == 3  # a table row per seed
    group = fedarena.load_run(out)
    finals = [st["summary"]["final_eval_return"] for st in statuses]
    assert group.summary["final_eval_return/mean"] == pytest.approx(np.mean(finals))
    assert group.summary["final_eval_return/min"] == min(finals) and sorted(group.runs) == [0, 1, 2]
    reached = [st["summary"]["steps_to_target"] for st in statuses if st["summary"]["reached_target"]]
    assert group.summary["reached_target/count"] == len(reached) and group.summary["reached_target/seeds"] == 3
    assert group.summary.get("steps_to_target/mean") == (np.mean(reached) if reached else None)
    assert json.loads((out / "summary.json").read_text())["report"] == "report/index.html"
    assert "seeds reached the target" in capsys.readouterr().out
    # seeds differ, so the runs differ
    assert len({json.dumps(r.rows[-1]["loss"]) for r in group.runs.values()}) == 3


def test_seeds_in_the_config_and_from_python_for_another_kind(tmp_path):
    res = fedarena.run(ROOT / "experiments/prisoners_dilemma.yaml", {"iterations": 30, "seeds": [3, 4]},
                       out=tmp_path / "g", report=False)
    assert sorted(res.runs) == [3, 4] and res.state == "completed"
    assert all(r.config["seed"] == s and r.config["seeds"] == [] for s, r in res.runs.items())
    assert res.summary["completed_seeds"] == 2 and res.report is None
    assert all(r.final_checkpoint.name == "ckpt-000000030.fdck" for r in res.runs.values())


def test_band_is_mean_min_max_with_held_last_values():
    a = (np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    b = (np.array([0.0, 5.0]), np.array([2.0, 4.0]))  # stopped early at x = 5
    out = band([a, b], points=3)  # grid 0, 5, 10
    np.testing.assert_allclose(out["grid"], [0, 5, 10])
    np.testing.assert_allclose(out["mean"], [1.0, 4.5, 7.0])
    np.testing.assert_allclose(out["low"], [0.0, 4.0, 4.0])
    np.testing.assert_allclose(out["high"], [2.0, 5.0, 10.0])


@pytest.mark.parametrize("config,overrides", [
    ("experiments/quickstart.yaml", {"iterations": 200}),
    ("experiments/ppo_cartpole.yaml", {"total_steps": 256, "ppo.hidden": [8], "eval.every": 128, "eval.episodes": 2}),
])
def test_python_api_returns_the_cli_summary(tmp_path, capsys, config, overrides):
    sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    assert main(["run", str(ROOT / config), *sets, "--out", str(tmp_path / "cli"), "--quiet", "--no-report"]) == 0
    cli = json.loads((tmp_path / "cli" / "status.json").read_text())["summary"]
    res = fedarena.run(ROOT / config, overrides, out=tmp_path / "api", report=False)
    strip = lambda s: {k: v for k, v in s.items() if k not in TIMING}  # noqa: E731
    assert strip(res.summary) == strip(cli) and res.state == "completed"
    assert res.rows[-1]["step"] == res.config.get("iterations", res.rows[-1]["step"])
    assert res.final_checkpoint is not None and res.final_checkpoint.name.endswith(f"{res.rows[-1]['step']:09d}.fdck")
    again = fedarena.load_run(res.run_dir)
    assert again.summary == res.summary and len(again.rows) == len(res.rows)
    if "ppo" in config:
        assert set(res.policies) == {"best", "final"}
