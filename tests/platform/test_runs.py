"""Run folders, checkpoints and resume: a SIGKILLed run resumes to exactly the uninterrupted run's metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedarena.platform import checkpoint as ckpt
from fedarena.platform.cli import main
from fedarena.platform.runs import RunError, execute, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _metrics_without_time(run_dir):
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in read_metrics(run_dir)]


def test_run_folder_layout(tmp_path):
    out = tmp_path / "run"
    summary = execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=20", "checkpoint.every=5", "checkpoint.keep=2"],
                      out=out, quiet=True)
    assert summary["run_dir"] == str(out)
    for name in ("config.yaml", "metrics.jsonl", "metrics.csv", "run.log", "status.json", "report/index.html",
                 "report/exploitability.png", "report/strategies.png", "report/metrics.png"):
        assert (out / name).exists(), name
    assert [s for s, _ in ckpt.list_checkpoints(out / "checkpoints")] == [15, 20]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(21))
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "fictitious_play/p0_average[1]" in header and "step" in header
    assert len((out / "metrics.csv").read_text().splitlines()) == 22
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    html = (out / "report/index.html").read_text()
    assert "exploitability.png" in html and "fictitious_play/exploitability_average" in html
    latest = html.split("<h2>Latest metrics</h2>", 1)[1].split("</table>", 1)[0]
    assert "<th>selfplay/exploitability_current</th><td>0</td>" in latest  # step 20: both defect
    # both dynamics settle on mutual defection
    assert rows[-1]["fictitious_play/p0_current"] == [0, 1] and rows[-1]["selfplay/p1_current"] == [0, 1]
    assert summary["fictitious_play/exploitability_current"] == 0.0


def test_default_run_dir_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary = execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=3"], quiet=True, report=False)
    name = Path(summary["run_dir"]).name
    assert Path(summary["run_dir"]).parent == Path("runs")
    kind, label, stamp, short = name.split("-")
    assert (kind, label) == ("matrix_dynamics", "pd") and stamp.endswith("Z") and len(short) == 6


def test_out_dir_with_a_run_is_refused(tmp_path):
    out = tmp_path / "run"
    execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=3"], out=out, quiet=True, report=False)
    with pytest.raises(RunError, match="already holds a run; use --resume"):
        execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=3"], out=out, quiet=True)


def _kill_mid_run(out: Path, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "fedarena", "run", "experiments/quickstart.yaml", "--out", str(out), "--quiet",
           "--no-report", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(ckpt.list_checkpoints(out / "checkpoints")) >= 2:
                break
            assert proc.poll() is None, "the run finished before it could be killed"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    args = ["--set", "iterations=6000", "--set", "checkpoint.every=500", "--set", "algorithms=[fictitious_play]"]
    killed = tmp_path / "killed"
    _kill_mid_run(killed, args)
    status = json.loads((killed / "status.json").read_text())
    assert status["state"] == "running"
    last_ckpt = ckpt.list_checkpoints(killed / "checkpoints")[-1][0]
    assert last_ckpt < 6000

    assert main(["run", "--resume", str(killed), "--quiet", "--no-report"]) == 0
    reference = tmp_path / "reference"
    overrides = [a for a in args if a != "--set"]
    execute(ROOT / "experiments/quickstart.yaml", overrides, out=reference, quiet=True, report=False)

    resumed_rows = _metrics_without_time(killed)
    assert [r["step"] for r in resumed_rows] == list(range(6001))  # no duplicated or missing iteration
    assert resumed_rows == _metrics_without_time(reference)
    assert json.loads((killed / "status.json").read_text())["state"] == "completed"
    assert "resumed from checkpoint" in (killed / "run.log").read_text()


def test_truncated_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog):
    out = tmp_path / "run"
    overrides = ["iterations=40", "checkpoint.every=10", "checkpoint.keep=5", "algorithms=[fictitious_play]"]
    execute(ROOT / "experiments/quickstart.yaml", overrides, out=out, quiet=True, report=False)
    reference = _metrics_without_time(out)
    # simulate a crash: the newest checkpoint (step 40) is truncated and the run is marked as still running
    newest = ckpt.checkpoint_path(out / "checkpoints", 40)
    newest.write_bytes(newest.read_bytes()[:200])
    status = json.loads((out / "status.json").read_text())
    (out / "status.json").write_text(json.dumps({**status, "state": "running"}))

    execute(None, [], resume=out, quiet=True, report=False)
    log = (out / "run.log").read_text()
    assert "skipping bad checkpoint" in log and "checksum mismatch" in log
    assert "resumed from checkpoint at step 30" in log
    assert _metrics_without_time(out) == reference


def test_resume_without_any_valid_checkpoint_refuses_to_start_over(tmp_path):
    out = tmp_path / "run"
    execute(ROOT / "experiments/quickstart.yaml", ["iterations=20", "checkpoint.every=10", "algorithms=[selfplay]"],
            out=out, quiet=True, report=False)
    for _, path in ckpt.list_checkpoints(out / "checkpoints"):
        path.write_bytes(b"garbage")
    (out / "status.json").write_text(json.dumps({"state": "running"}))
    with pytest.raises(RunError, match="no valid checkpoint to resume from"):
        execute(None, [], resume=out, quiet=True)
    assert len(read_metrics(out)) == 21  # nothing already stored is lost


def test_resume_of_a_completed_run_is_a_no_op(tmp_path, capsys):
    out = tmp_path / "run"
    execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=5"], out=out, quiet=True, report=False)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert "had already completed" in capsys.readouterr().out


@pytest.mark.quick
def test_resume_with_a_different_config_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=5"], out=out, quiet=True, report=False)
    code = main(["run", "experiments/quickstart.yaml", "--resume", str(out)])
    assert code == 2 and "differs from the run's saved config" in capsys.readouterr().err


def test_report_command_recreates_plots(tmp_path, capsys):
    out = tmp_path / "run"
    execute(ROOT / "experiments/prisoners_dilemma.yaml", ["iterations=10"], out=out, quiet=True)
    for png in (out / "report").glob("*.png"):
        png.unlink()
    assert main(["report", str(out)]) == 0
    assert "index.html" in capsys.readouterr().out
    assert {p.name for p in (out / "report").glob("*.png")} == {"exploitability.png", "strategies.png", "metrics.png"}


@pytest.mark.quick
def test_checkpoint_format_round_trip_and_rejections(tmp_path):
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "nested": {"ids": [np.int64(3), 4.5, None, "x"]},
             "t": (1, np.zeros(2, dtype=bool)), "big": 2**100}
    path = ckpt.save(tmp_path, 7, state, keep=2)
    step, back = ckpt.load(path)
    assert step == 7 and back["w"].dtype == np.float32 and np.array_equal(back["w"], state["w"])
    assert back["nested"]["ids"] == [3, 4.5, None, "x"] and back["big"] == 2**100
    assert isinstance(back["t"], tuple) and back["t"][1].dtype == bool
    blob = path.read_bytes()
    path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        ckpt.load(path)
    path.write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(ckpt.CheckpointError, match="bad magic"):
        ckpt.load(path)
    with pytest.raises(TypeError, match="object array"):
        ckpt.save(tmp_path, 8, {"o": np.array([object()])}, keep=2)


def test_progress_logs_plain_lines_when_not_a_tty():
    import io
    import logging

    from fedarena.platform.progress import Progress

    stream = io.StringIO()
    logger = logging.getLogger("fedarena.test.progress")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with Progress(10, desc="work", logger=logger, interval=0.0, stream=io.StringIO()) as bar:
            for _ in range(10):
                bar.update(1, loss=0.5)
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and lines[-1].startswith("work 10/10 (100%)") and "loss=0.5" in lines[-1]


def test_resume_of_a_kind_without_checkpoints_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("kind: fl_gradient_inversion\n")
    (out / "status.json").write_text(json.dumps({"state": "interrupted"}))
    assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedarena: error: --resume {out}: experiment kind 'fl_gradient_inversion' keeps no checkpoint "
                   "to continue from; start a new run"]
    assert not (out / "metrics.jsonl").exists()  # nothing ran
