"""Stop signals: SIGTERM (``kill``, SLURM, Kubernetes) ends a run ``interrupted`` with a checkpoint and one line on
stderr, and ``--resume`` then ends exactly where the uninterrupted run ends (a second, straight run is the oracle)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedarena.platform import checkpoint as ckpt
from fedarena.platform.runs import execute, read_metrics

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("wall_time", "env_steps_per_second", "train_time", "episodes_per_second", "solver_time")


def _without_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in read_metrics(run_dir)]


def _sigterm_after_first_checkpoint(out: Path, config: str, overrides: list[str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "fedarena", "run", config, "--out", str(out), "--quiet", "--no-report"]
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ckpt.list_checkpoints(out / "checkpoints"):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("config,overrides", [
    ("experiments/ppo_cartpole.yaml", ["total_steps=3072", "checkpoint.every=2"]),
    ("experiments/kuhn_nfsp.yaml", ["episodes=3000", "eval_every=500", "learner_seeds=[0,1]", "checkpoint.every=1",
                                    "nfsp.num_games=32", "nfsp.hidden=[16]", "nfsp.replay_capacity=2000",
                                    "nfsp.reservoir_capacity=2000", "nfsp.min_buffer_size_to_learn=100",
                                    "nfsp.batch_size=32", "nfsp.learn_every=16"]),
], ids=["ppo_cartpole", "kuhn_nfsp"])
def test_sigterm_ends_interrupted_and_resume_equals_the_uninterrupted_run(tmp_path, config, overrides):
    stopped = tmp_path / "stopped"
    done = _sigterm_after_first_checkpoint(stopped, config, overrides)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr.strip().splitlines() == ["fedarena: interrupted"]
    status = json.loads((stopped / "status.json").read_text())
    assert status["state"] == "interrupted" and status["error"] == "interrupted by SIGTERM"
    # it stopped at a step boundary, after writing that step's checkpoint, before the budget was spent
    last = ckpt.list_checkpoints(stopped / "checkpoints")[-1][0]
    assert status["last_checkpoint_step"] == status["last_step"] == last
    assert [r["step"] for r in read_metrics(stopped)][-1] == last

    resumed = execute(None, [], resume=stopped, quiet=True, report=False)
    straight = execute(ROOT / config, overrides, out=tmp_path / "straight", quiet=True, report=False)
    assert _without_timing(stopped) == _without_timing(tmp_path / "straight")
    keys = [k for k in straight if not k.endswith(TIMING) and not k.endswith(("_s", "run_dir"))]
    assert {k: resumed[k] for k in keys} == {k: straight[k] for k in keys}
    assert json.loads((stopped / "status.json").read_text())["state"] == "completed"


TINY_NFSP = {"num_games": 32, "hidden": [16], "replay_capacity": 2000, "reservoir_capacity": 2000,
             "min_buffer_size_to_learn": 100, "batch_size": 32, "learn_every": 16}


@pytest.mark.parametrize("cfg,smaller", [
    ({"kind": "xfp", "game": "kuhn_poker", "iterations": 6, "eval_every": 2}, "iterations=2"),
    ({"kind": "cfr", "game": "kuhn_poker", "iterations": 6, "eval_every": 2}, "iterations=2"),
    ({"kind": "psro", "game": "kuhn_poker", "iterations": 6, "meta_solvers": ["nash"]}, "iterations=2"),
    ({"kind": "matrix_dynamics", "game": "prisoners_dilemma", "iterations": 6}, "iterations=2"),
    ({"kind": "nfsp", "game": "kuhn_poker", "episodes": 600, "eval_every": 100, "learner_seeds": [0],
      "nfsp": TINY_NFSP}, "episodes=200"),
], ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_resume_with_a_budget_below_the_checkpoint_stops_there(tmp_path, cfg, smaller):
    first = execute({**cfg, "checkpoint": {"every": 3}}, out=tmp_path / "a", quiet=True, report=False)
    rows = read_metrics(tmp_path / "a")
    again = execute(None, [smaller], resume=tmp_path / "a", quiet=True, report=False)
    # nothing ran and nothing was undone: the summary of the checkpoint's state, the same rows
    timing = ("time", "seconds", "per_second", "run_dir")
    assert {k: v for k, v in again.items() if not any(t in k for t in timing)} == \
        {k: v for k, v in first.items() if not any(t in k for t in timing)}
    assert read_metrics(tmp_path / "a") == rows
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "completed"


class _FakeRun:
    last_step = 4
    stop_requested = None


def test_without_a_run_the_first_signal_raises_at_once():
    from fedarena.platform.loop import RunInterrupted, stop_signals

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted, match="interrupted by SIGTERM"):
        with stop_signals(None):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(500):  # the handler runs at the next bytecode; bounded wait
                time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_a_run_that_reaches_no_checkpoint_offer_is_stopped_after_the_grace():
    from fedarena.platform.loop import RunInterrupted, stop_signals

    run = _FakeRun()
    with pytest.raises(RunInterrupted) as stopped:
        with stop_signals(run, grace=0.2):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(3000):  # a step that never offers a checkpoint; bounded
                time.sleep(0.01)
    assert run.stop_requested == "SIGINT"  # the first signal only asked the run to stop ...
    assert not stopped.value.graceful and stopped.value.step == 4  # ... the grace timer stopped it where it was


def test_a_signal_at_a_checkpoint_offer_writes_that_step_then_stops(tmp_path):
    from fedarena.platform.experiment import ExperimentConfig
    from fedarena.platform.loop import RunInterrupted
    from fedarena.platform.runs import Run

    run = Run(tmp_path, ExperimentConfig(kind="x"), quiet=True)
    run.log(1, a=1.0)
    run.checkpoint(1, lambda: {"w": [1.0]})  # checkpoint.every = 100: kept pending, not written
    assert not ckpt.list_checkpoints(tmp_path / "checkpoints")
    run.stop_requested = "SIGTERM"
    run.log(2, a=2.0)
    with pytest.raises(RunInterrupted) as stopped:
        run.checkpoint(2, lambda: {"w": [2.0]})
    assert stopped.value.graceful and stopped.value.step == 2
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [2]
    run.close()


def test_a_run_stopped_before_its_first_checkpoint_starts_over_on_resume(tmp_path):
    cfg = {"kind": "xfp", "game": "kuhn_poker", "iterations": 4, "checkpoint": {"every": 2}}
    reference = execute(cfg, out=tmp_path / "ref", quiet=True, report=False)
    stopped = tmp_path / "stopped"
    execute(cfg, out=stopped, quiet=True, report=False)
    for _, path in ckpt.list_checkpoints(stopped / "checkpoints"):  # as if stopped right after its first row
        path.unlink()
    rows = read_metrics(stopped)
    (stopped / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (stopped / "status.json").write_text(json.dumps({"state": "interrupted"}))
    resumed = execute(None, [], resume=stopped, quiet=True, report=False)
    assert resumed["exploitability"] == reference["exploitability"]
    assert _without_timing(stopped) == _without_timing(tmp_path / "ref")
    assert "stopped before its first checkpoint; starting it over" in (stopped / "run.log").read_text()


def test_sigterm_to_a_seed_group_stops_every_seed_interrupted(tmp_path):
    group = tmp_path / "group"
    args = [sys.executable, "-m", "fedarena", "run", "experiments/kuhn_xfp.yaml", "--seeds", "0", "1", "--parallel", "2",
            "--set", "iterations=1000000", "--set", "eval_every=1000", "--set", "checkpoint.every=20",
            "--out", str(group), "--quiet", "--no-report"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not all(ckpt.list_checkpoints(group / f"seed-{s}" / "checkpoints") for s in (0, 1)):
            assert proc.poll() is None, "the group ended before both seeds checkpointed"
            assert time.monotonic() < deadline, "no checkpoints within 300 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM and stderr.strip().splitlines() == ["fedarena: interrupted"]
    assert json.loads((group / "group.json").read_text())["state"] == "interrupted"
    for s in (0, 1):
        status = json.loads((group / f"seed-{s}" / "status.json").read_text())
        newest = ckpt.list_checkpoints(group / f"seed-{s}" / "checkpoints")[-1][0]
        assert status["state"] == "interrupted" and status["last_checkpoint_step"] == newest
    # resumed with a budget below the checkpoints: every seed completes where it stopped
    execute(None, ["iterations=1"], resume=group, quiet=True, report=False)
    assert json.loads((group / "group.json").read_text())["state"] == "completed"
