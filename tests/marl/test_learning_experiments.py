"""The nfsp and psro_rl experiment kinds end to end through the platform: summaries, reports, resume, errors."""

import subprocess
import sys

import pytest

from fedarena.platform.runs import execute, read_metrics

TINY_NFSP = {"num_games": 32, "hidden": [16], "replay_capacity": 2000, "reservoir_capacity": 2000,
             "min_buffer_size_to_learn": 100, "batch_size": 32, "learn_every": 16}


def test_nfsp_kind_resume_matches_uninterrupted(tmp_path):
    cfg = {"kind": "nfsp", "game": "kuhn_poker", "episodes": 600, "eval_every": 200, "learner_seeds": [0, 1],
           "checkpoint": {"every": 2}, "nfsp": TINY_NFSP}
    straight = execute(cfg, out=tmp_path / "a", quiet=True)
    assert set(straight) >= {"exploitability_mean", "exploitability_min", "exploitability_max"}
    assert straight["exploitability_min"] <= straight["exploitability_mean"] <= straight["exploitability_max"]
    rows = read_metrics(tmp_path / "a")
    assert any("seed1/exploitability" in r for r in rows) and any("seed0/train_time" in r for r in rows)
    assert (tmp_path / "a" / "report" / "exploitability.png").exists()
    # a run stopped after 400 episodes of seed 0 and resumed ends where the straight run ends
    execute({**cfg, "episodes": 400, "learner_seeds": [0]}, out=tmp_path / "b", quiet=True, report=False)
    resumed = execute(resume=tmp_path / "b", overrides=["episodes=600", "learner_seeds=[0,1]"], quiet=True, report=False)
    assert resumed["seed0/exploitability"] == pytest.approx(straight["seed0/exploitability"], abs=1e-12)
    assert resumed["seed1/exploitability"] == pytest.approx(straight["seed1/exploitability"], abs=1e-12)


def test_psro_rl_kind_runs_beside_exact_psro(tmp_path):
    cfg = {"kind": "psro_rl", "game": "kuhn_poker", "iterations": 1, "dqn": {"episodes": 1000},
           "checkpoint": {"every": 1}}
    out = execute(cfg, out=tmp_path / "p", quiet=True)
    rows = read_metrics(tmp_path / "p")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[-1]["rl/training_episodes"] >= 2 * 1000
    assert out["exact/exploitability"] == pytest.approx(rows[-1]["exact/exploitability"])
    assert (tmp_path / "p" / "report" / "exploitability.png").exists()


@pytest.mark.parametrize("overrides,message", [
    (["game=prisoners_dilemma"], "game: 'prisoners_dilemma' has no information-state tensor"),
    (["game=leduc_poker", "oracle=ppo"], "ppo has no action masks"),
])
def test_bad_configs_are_one_line_errors_with_exit_status_2(tmp_path, overrides, message):
    args = [sys.executable, "-m", "fedarena", "run", "experiments/kuhn_psro_rl.yaml", "--out", str(tmp_path / "x")]
    for o in overrides:
        args += ["--set", o]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr
