"""The Python API: what ``import fedarena`` offers, the README's example run as written, Result.metric's x axis."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import fedarena

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_offers_the_documented_calls():
    for name in ("run", "load_run", "evaluate", "load_policy", "sweep", "Result"):
        assert name in dir(fedarena) and getattr(fedarena, name) is not None
    from fedarena.platform.api import Result

    assert fedarena.Result is Result


def _readme_block(section: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_the_readme_python_api_example_runs_and_its_steps_are_environment_steps(tmp_path, monkeypatch, capsys):
    (tmp_path / "experiments").symlink_to(ROOT / "experiments")
    monkeypatch.chdir(tmp_path)  # the example's relative paths; its run folder goes to tmp_path/runs
    scope: dict = {}
    exec(compile(_readme_block("Python API"), "README.md", "exec"), scope)
    result, curve, by_iteration = scope["result"], scope["curve"], scope["by_iteration"]
    assert result.run_dir.parent == Path("runs") and result.state == "completed"
    rows = [r for r in result.rows if "eval_return" in r]
    assert curve == [(r["env_steps"], r["eval_return"]) for r in rows]
    assert by_iteration == [(r["step"], r["eval_return"]) for r in rows]
    assert [x for x, _ in curve] == [256, 512]  # eval.every = 256 environment steps, total_steps = 512
    assert [x for x, _ in by_iteration] == [2, 4]  # 4 envs x 32 steps = 128 environment steps per iteration
    replay = scope["replay"]
    assert replay["episodes"] == 5 and np.isfinite(replay["mean_return"])
    assert scope["actions"].shape == (1,) and scope["actions"][0] in (0, 1)
    assert "True" in capsys.readouterr().out


def test_evaluate_from_python_matches_the_runs_last_evaluation(tmp_path):
    res = fedarena.run(ROOT / "experiments/ppo_cartpole.yaml", {"total_steps": 256, "ppo.num_envs": 4,
                                                               "ppo.num_steps": 32, "eval.every": 128,
                                                               "eval.episodes": 3}, out=tmp_path / "r", report=False)
    out = fedarena.evaluate(res.run_dir)
    assert out["mean_return"] == res.metric("eval_return")[-1][1] == out["run_eval_return"]
    assert fedarena.load_policy(res, "best").manifest["step"] <= fedarena.load_policy(res).manifest["step"]
    with pytest.raises(fedarena.platform.errors.ConfigError, match="episodes: must be >= 1"):
        fedarena.evaluate(res, episodes=0)


def test_metric_of_a_non_rl_kind_is_against_its_step(tmp_path):
    res = fedarena.run(ROOT / "experiments/prisoners_dilemma.yaml", {"iterations": 5}, out=tmp_path / "r",
                       report=False)
    assert res.x_axis == "step"
    key = next(k for k in res.rows[0] if k not in ("step", "wall_time"))
    assert res.metric(key) == [(r["step"], r[key]) for r in res.rows]
