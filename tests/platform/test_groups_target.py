"""Seed groups of a kind with a target: "k of n seeds reached the target" and statistics over those k seeds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import fedarena
from fedarena.platform.groups import group_summary, render_group


def _summary(reached: bool, steps: int, seconds: float, final: float) -> dict:
    return {"reached_target": reached, "steps_to_target": steps if reached else -1,
            "time_to_target_s": seconds if reached else -1.0, "final_eval_return": final, "env_steps": 20480}


STATUSES = {
    0: {"state": "completed", "summary": _summary(True, 10240, 12.5, 500.0)},
    1: {"state": "completed", "summary": _summary(False, 0, 0.0, 210.0)},
    2: {"state": "completed", "summary": _summary(False, 0, 0.0, 330.0)},
}


def test_one_of_three_seeds_reaching_the_target_reports_one_of_three_and_that_seeds_value():
    out = group_summary(STATUSES)
    assert out["reached_target/count"] == 1 and out["reached_target/seeds"] == 3
    assert out["steps_to_target/mean"] == 10240.0 and out["steps_to_target/std"] == 0.0
    assert out["steps_to_target/min"] == out["steps_to_target/max"] == 10240.0
    assert out["time_to_target_s/mean"] == 12.5
    # numbers every seed has are still over all three
    assert out["final_eval_return/mean"] == pytest.approx(np.mean([500.0, 210.0, 330.0]))
    assert out["final_eval_return/std"] == pytest.approx(np.std([500.0, 210.0, 330.0]))


def test_no_seed_reaching_the_target_gives_no_steps_to_target_statistics():
    none = {s: {"state": "completed", "summary": _summary(False, 0, 0.0, 100.0 + s)} for s in range(3)}
    out = group_summary(none)
    assert out["reached_target/count"] == 0 and out["reached_target/seeds"] == 3
    assert not any(k.startswith(("steps_to_target/", "time_to_target_s/")) for k in out)
    assert out["final_eval_return/mean"] == pytest.approx(101.0)


def test_two_of_three_and_a_failed_seed():
    statuses = {0: {"state": "completed", "summary": _summary(True, 1000, 1.0, 1.0)},
                1: {"state": "completed", "summary": _summary(True, 3000, 3.0, 1.0)},
                2: {"state": "failed", "error": "boom"}}
    out = group_summary(statuses)
    assert (out["reached_target/count"], out["reached_target/seeds"], out["failed_seeds"]) == (2, 2, 1)
    assert out["steps_to_target/mean"] == 2000.0 and out["steps_to_target/std"] == 1000.0


def test_kinds_without_a_target_are_summarised_over_all_seeds():
    statuses = {s: {"state": "completed", "summary": {"exploitability": float(s)}} for s in range(4)}
    out = group_summary(statuses)
    assert "reached_target/count" not in out and out["exploitability/mean"] == 1.5


def _group(tmp_path: Path, statuses: dict) -> Path:
    group = tmp_path / "g"
    for s, st in statuses.items():
        (group / f"seed-{s}").mkdir(parents=True)
        (group / f"seed-{s}" / "status.json").write_text(json.dumps(st))
        (group / f"seed-{s}" / "config.yaml").write_text(f"kind: ppo\nseed: {s}\n")
        rows = [{"step": i, "env_steps": 1000 * i, "wall_time": 0.1 * i, "eval_return": 10.0 * i + s} for i in range(1, 4)]
        (group / f"seed-{s}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (group / "config.yaml").write_text("kind: ppo\nseeds: [%s]\n" % ", ".join(str(s) for s in statuses))
    (group / "group.json").write_text(json.dumps({"kind": "ppo", "seeds": list(statuses), "state": "completed"}))
    return group


PPO_LIKE = SimpleNamespace(x_axis="env_steps", group_metrics=("eval_return",))  # what render_group reads of a kind


def test_group_report_and_summary_json_say_one_of_three(tmp_path):
    group = _group(tmp_path, STATUSES)
    index = render_group(group, experiment=PPO_LIKE)
    html = index.read_text()
    assert "1 of 3 seeds; numbers *_to_target* are over that seed only" in html
    assert "<tr><th>steps_to_target/mean</th><td>10240</td></tr>" in html
    listed = json.loads((group / "summary.json").read_text())
    assert listed["report"] == "report/index.html" and (group / listed["report"]).exists()
    assert listed["summary"]["reached_target/count"] == 1 and listed["summary"]["steps_to_target/mean"] == 10240.0
    assert fedarena.load_run(group).summary == listed["summary"]


def test_a_group_of_one_seed_says_seed_not_seeds(tmp_path):
    group = _group(tmp_path, {0: STATUSES[0]})
    html = render_group(group, experiment=PPO_LIKE).read_text()
    assert "1 of 1 seed;" in html and "1 seeds" not in html
