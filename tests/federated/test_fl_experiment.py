"""The fedavg_grpc experiment kind end to end: processes, run folder, metrics, report, config errors."""

import json

import pytest

from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute, read_metrics


def test_fedavg_grpc_run_writes_metrics_and_report(tmp_path):
    cfg = {"kind": "fedavg_grpc", "rounds": 3, "data": {"dataset": "synthetic", "num_clients": 3},
           "model": {"hidden": [8], "trainer": "engine"},
           "clients": {"epochs": 1, "window_seconds": 30.0, "prox_mu": 0.01}, "upload": {"encoding": "q8"},
           "strategy": {"server_optimizer": {"name": "fedyogi", "lr": 0.05}}, "checkpoint": {"every": 1, "keep": 2}}
    summary = execute(cfg, out=tmp_path / "run", quiet=True)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["reporting"] == 3 and r["selected"] == 3 and r["aggregated"] == 1
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and 0.0 <= r["test_acc"] <= 1.0
    assert [r["model_version"] for r in rows] == [1, 2, 3]
    assert summary["model_version"] == 3 and summary["rounds_aggregated"] == 3
    assert summary["test_acc"] == pytest.approx(rows[-1]["test_acc"])
    report = tmp_path / "run" / "report"
    assert (report / "federated.png").exists() and (report / "index.html").exists()
    state = json.loads((tmp_path / "run" / "status.json").read_text())
    assert state["state"] == "completed"
    assert not list((tmp_path / "run" / "deployment").glob("*.tmp*"))


def test_fedavg_grpc_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="strategy.server_optimizer.name"):
        execute({"kind": "fedavg_grpc", "strategy": {"server_optimizer": {"name": "sgd"}}}, out=tmp_path / "a",
                quiet=True)
    with pytest.raises(ConfigError, match="clients.min_fraction"):
        execute({"kind": "fedavg_grpc", "clients": {"min_fraction": 1.5}}, out=tmp_path / "b", quiet=True)


def test_fedavg_grpc_resume_continues_from_the_last_round(tmp_path):
    cfg = {"kind": "fedavg_grpc", "rounds": 2, "data": {"dataset": "synthetic", "num_clients": 2},
           "model": {"hidden": [8], "trainer": "numpy"}, "clients": {"epochs": 1, "window_seconds": 30.0},
           "checkpoint": {"every": 1, "keep": 2}}
    execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    from fedarena.federated.protocol import model_bytes
    from fedarena.federated.scheduler import load_state

    before = load_state(tmp_path / "run" / "deployment" / "scheduler_state.fl")
    summary = execute(None, overrides=["rounds=4"], resume=tmp_path / "run", quiet=True, report=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["model_version"] for r in rows] == [1, 2, 3, 4] and summary["model_version"] == 4
    after = load_state(tmp_path / "run" / "deployment" / "scheduler_state.fl")
    assert [h["test_acc"] for h in after["history"][:2]] == [h["test_acc"] for h in before["history"]]
    assert model_bytes(before["params"]) != model_bytes(after["params"])  # it trained on from round 3
    assert summary["rounds_aggregated"] + summary["rounds_abandoned"] == 4 and summary["last_round"] == 4
    assert summary["test_acc"] == after["history"][-1]["test_acc"]
    # a budget the checkpoint already meets: no round runs, no process starts, the summary is the run's
    log = tmp_path / "run" / "deployment" / "logs" / "scheduler.log"
    size = log.stat().st_size
    again = execute(None, overrides=["rounds=3"], resume=tmp_path / "run", quiet=True, report=False)
    assert again == summary and read_metrics(tmp_path / "run") == rows and log.stat().st_size == size


def test_shipped_mtls_config_trains_over_mutual_tls(tmp_path):
    over = ["data.dataset=synthetic", "data.num_clients=2", "execution.num_servers=1", "model.hidden=[8]",
            "model.trainer=numpy", "rounds=1", "clients.epochs=1", "clients.window_seconds=30.0"]
    summary = execute("experiments/fedavg_grpc_mtls.yaml", overrides=over, out=tmp_path / "run", quiet=True,
                      report=False)
    assert summary["rounds_aggregated"] == 1 and summary["model_version"] == 1
    dep = tmp_path / "run" / "deployment"
    spec = json.loads((dep / "deployment.json").read_text())
    assert spec["tls"]["mutual"] is True and spec["tls"]["root_cert"].endswith("tls/ca.pem")
    assert (dep / "tls" / "node.key").stat().st_mode & 0o777 == 0o600


def _pid_of(folder, role):
    """The pid of this run's ``role`` node process (its command line names the run's own deployment folder)."""
    import os

    want = ["-m", "fedarena.federated.node", str(folder), role]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = open(f"/proc/{entry}/cmdline", "rb").read().decode().split("\0")
            except OSError:
                continue
            if args[1:5] == want:
                return int(entry)
    return None


def _run_and_kill_scheduler(tmp_path, restart, rounds):
    """Start a fedavg_grpc run, SIGKILL its scheduler once one round is stored; ``rounds`` well above 1 so the run
    cannot finish before the kill on a fast machine."""
    import os
    import signal
    import threading
    import time

    cfg = {"kind": "fedavg_grpc", "rounds": rounds, "data": {"dataset": "synthetic", "num_clients": 2},
           "model": {"hidden": [8], "trainer": "numpy"}, "clients": {"epochs": 1, "window_seconds": 60.0},
           "execution": {"num_servers": 1, "timeout_s": 120.0, "restart": restart},
           "checkpoint": {"every": 1, "keep": 2}}
    out: dict = {}

    def go():
        try:
            out["summary"] = execute(cfg, out=tmp_path / "run", quiet=True, report=False)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
        out["ended"] = time.monotonic()

    th = threading.Thread(target=go, daemon=True)
    th.start()
    dep = tmp_path / "run" / "deployment"
    end = time.monotonic() + 120
    while time.monotonic() < end and not (dep / "scheduler_state.fl").exists():  # one round is stored
        time.sleep(0.1)
    pid = _pid_of(dep, "scheduler")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    th.join(180)
    assert not th.is_alive()
    return out, out["ended"] - killed


def test_a_killed_scheduler_fails_the_run_at_once_naming_it(tmp_path):
    from fedarena.platform.errors import RunError, is_user_error

    out, took = _run_and_kill_scheduler(tmp_path, restart=False, rounds=1000)
    err = out.get("error")
    assert isinstance(err, RunError) and is_user_error(err)
    assert str(err).startswith("scheduler: process exited (killed by SIGKILL)")
    assert f"fedarena run --resume {tmp_path / 'run'}" in str(err)
    assert took < 60  # long before timeout_s = 120 (the old behaviour waited for it)
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
def test_a_killed_scheduler_is_restarted_from_its_state_file_with_restart_true(tmp_path):
    out, _ = _run_and_kill_scheduler(tmp_path, restart=True, rounds=12)
    assert "error" not in out, out.get("error")
    assert out["summary"]["rounds_aggregated"] == 12 and out["summary"]["model_version"] == 12
    assert "scheduler killed by SIGKILL; restarted" in (tmp_path / "run" / "deployment" / "logs" /
                                                        "supervisor.log").read_text()
