"""Experiment trackers (``loggers:``): MLflow and W&B receive the run's rows at their steps, its config and report."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import fedarena
from fedarena.platform import loggers
from fedarena.platform.cli import main
from fedarena.platform.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parents[2]
QUICK = {"iterations": 30, "checkpoint.every": 10}  # matrix_dynamics: one row per iteration, numbers and lists


def _numbers(rows: list[dict], name: str) -> list[tuple[int, float]]:
    return [(r["step"], float(r[name])) for r in rows if isinstance(r.get(name), (int, float))]


def _same_points(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_mlflow_run_holds_metrics_at_their_steps_config_as_params_and_the_report(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = fedarena.run(ROOT / "experiments/quickstart.yaml", {**QUICK, "loggers": ["mlflow"]}, out=tmp_path / "run")
    uri = f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}"  # the default store: inside the run folder
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # search_runs reads it
    found = mlflow.search_runs(experiment_names=["matrix_dynamics"], output_format="list")
    assert len(found) == 1 and found[0].info.status == "FINISHED" and found[0].info.run_name == "run"
    run = found[0]
    numeric = sorted({k for r in res.rows for k, v in r.items() if k != "step" and isinstance(v, (int, float))})
    assert numeric and set(run.data.metrics) >= set(numeric)
    client = mlflow.tracking.MlflowClient(uri)
    for name in numeric[:3]:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        _same_points(history, _numbers(res.rows, name))
    assert run.data.params["iterations"] == "30" and run.data.params["game"] == res.config["game"]
    assert json.loads(run.data.params["algorithms"]) == res.config["algorithms"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "status.json", "report"} <= artifacts
    assert (tmp_path / "run" / "mlartifacts").is_dir() and not (tmp_path / "tensorboard").exists()


def test_mlflow_tracking_uri_from_the_environment(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # a store the user names keeps MLflow's own artefact root, ./mlruns
    fedarena.run(ROOT / "experiments/quickstart.yaml", {**QUICK, "loggers": ["tensorboard", "mlflow"],
                                                        "tracking.experiment": "study"}, out=tmp_path / "r",
                 report=False)
    assert not (tmp_path / "r" / "mlflow.db").exists() and any((tmp_path / "r" / "tensorboard").iterdir())
    found = mlflow.search_runs(experiment_names=["study"], output_format="list")
    assert [r.info.run_name for r in found] == ["r"] and found[0].data.params["iterations"] == "30"
    assert (tmp_path / "mlruns").is_dir()


def _wandb_records(path: Path):
    """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB-log framing in 32 KiB
    blocks (crc32 4 | length 2 | type 1: full / first / middle / last), each record a wandb_internal Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer too short for a header
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # full, last
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_writes_a_syncable_run_with_the_rows_and_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    res = fedarena.run(ROOT / "experiments/quickstart.yaml", {**QUICK, "loggers": ["wandb"]}, out=tmp_path / "run",
                       report=False)
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict[str, object] = {}
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for k, v in items.items():
                if not k.startswith("_"):
                    history.setdefault(k, []).append((items["_step"], v))
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    name = next(k for k in history if k != "wall_time")
    _same_points(history[name], _numbers(res.rows, name))
    assert config["iterations"] == 30 and config["game"] == res.config["game"]


def test_unknown_logger_is_a_one_line_error_with_a_did_you_mean(tmp_path, capsys):
    rc = main(["run", str(ROOT / "experiments/quickstart.yaml"), "--set", "loggers=[tensorboard, mlflw]",
               "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "loggers[1]: expected one of 'tensorboard', 'mlflow', 'wandb'" in err and "did you mean 'mlflow'?" in err


def test_a_missing_tracker_package_names_the_pip_extra(tmp_path, monkeypatch):
    real = loggers.importlib.util.find_spec
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name))
    with pytest.raises(MissingDependencyError, match=r"loggers: 'wandb' needs the wandb package: "
                                                     r"pip install 'fedarena\[wandb\]'"):
        loggers.build_loggers(["tensorboard", "wandb"], tmp_path)
    assert not (tmp_path / "tensorboard").exists()  # checked before any tracker starts


def test_flatten_gives_dotted_keys():
    assert loggers.flatten({"a": 1, "ppo": {"lr": 0.1, "hidden": [8, 8]}, "empty": {}}) == {
        "a": 1, "ppo.lr": 0.1, "ppo.hidden": [8, 8], "empty": {}}


def test_a_resumed_run_continues_its_mlflow_run(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from types import SimpleNamespace

    options = SimpleNamespace(mlflow_uri=f"sqlite:///{tmp_path / 'store.db'}", experiment=None)
    first = loggers.MLflowLogger(tmp_path, options, None, "resumable")
    first.log_metrics(1, {"loss": 1.0})
    first.close("interrupted")
    again = loggers.MLflowLogger(tmp_path, options, 1, "resumable")  # resumed from the checkpoint of step 1
    again.log_metrics(2, {"loss": 0.5})
    again.close("completed")
    client = mlflow.tracking.MlflowClient(options.mlflow_uri)
    assert again.run_id == first.run_id and client.get_run(first.run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "loss")] == [(1, 1.0), (2, 0.5)]
    fresh = loggers.MLflowLogger(tmp_path, options, None, "resumable")  # not resuming: a new MLflow run
    assert fresh.run_id != first.run_id
