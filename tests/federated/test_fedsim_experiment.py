"""The fedsim experiment kind end to end (run folder, metrics, report, resume) and its bad-input errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute, read_metrics

SMALL = {"kind": "fedsim", "rounds": 4,
         "data": {"dataset": "breast_cancer", "num_clients": 12, "partition": "dirichlet", "alpha": 1.0},
         "model": {"hidden": []}, "clients": {"per_round": 5, "lr": 0.05}, "upload": {"codec": "quantize"},
         "download": {"codec": "quantize"}, "evaluation": {"personalize_epochs": 1}, "privacy": {"seed": 5},
         "checkpoint": {"every": 1, "keep": 2}}


def test_fedsim_run_writes_metrics_report_and_resumes_identically(tmp_path):
    summary = execute(SMALL, out=tmp_path / "a", quiet=True)
    rows = read_metrics(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["selected"] == 5 and r["reporting"] == 5
        assert 0 <= r["client_acc_worst"] <= r["client_acc_p10"] <= r["client_acc_mean"] <= 1
        assert r["bytes_up"] == 5 * (8 + 31 * 2)  # 8-bit levels of 62 parameters + lo/scale, per client
    assert summary["test_acc"] == pytest.approx(rows[-1]["test_acc"])
    assert 0 <= summary["personalized_acc_after"] <= 1
    for png in ("fedsim.png", "label_histogram.png", "personalization.png"):
        assert (tmp_path / "a" / "report" / png).stat().st_size > 1000
    # stop after round 2, resume: the same metrics as the uninterrupted run
    execute(dict(SMALL, rounds=2), out=tmp_path / "b", quiet=True, report=False)
    execute(None, overrides=["rounds=4"], resume=tmp_path / "b", quiet=True, report=False)
    again = read_metrics(tmp_path / "b")
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["test_loss"] for r in again], [r["test_loss"] for r in rows], rtol=1e-12)


def test_fedsim_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="clients.per_round"):
        execute(SMALL, overrides=["clients.per_round=13"], out=tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match="data.num_clients"):
        execute(SMALL, overrides=["data.num_clients=500", "data.partition=iid"], out=tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="data.path"):
        execute(SMALL, overrides=["data.dataset=leaf", f"data.path={tmp_path / 'nope'}"], out=tmp_path / "c",
                quiet=True)
    with pytest.raises(ConfigError, match="strategy.aggregation"):
        execute(SMALL, overrides=["strategy.aggregation=mean"], out=tmp_path / "d", quiet=True)


def test_cli_bad_input_one_line_exit_2(tmp_path, capsys):
    from fedarena.platform.cli import main

    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "u.json").write_text('{"users": ["a"], "user_data": ')
    cases = [
        ("clients.per_round", ["clients.per_round=200"]),
        ("data.path", ["data.dataset=leaf", f"data.path={tmp_path / 'corrupt'}"]),
        ("data.path", ["data.dataset=mnist", f"data.path={tmp_path / 'missing'}"]),
        ("data.num_clients", ["data.num_clients=1000", "clients.per_round=10", "data.partition=iid",
                              "data.dataset=breast_cancer", "data.test_fraction=0.9"]),
        ("aggregation", ["aggregation=krum"]),  # the old flat layout: names the new path
    ]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kind: fedsim\nrounds: 1\n")
    for i, (field, sets) in enumerate(cases):
        args = ["run", str(cfg), "--out", str(tmp_path / str(i)), "--quiet"]
        for s_ in sets:
            args += ["--set", s_]
        assert main(args) == 2, field
        err = capsys.readouterr().err
        errors = [ln for ln in err.strip().splitlines() if ln.startswith("fedarena: error:")]
        assert len(errors) == 1 and f" {field}:" in errors[0], (field, err)
        assert "Traceback" not in err
    # and the real process exit status
    p = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "run", str(cfg), "--set", "data.dataset=leaf",
                        "--set", f"data.path={tmp_path / 'corrupt'}", "--out", str(tmp_path / "proc")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "data.path:" in p.stderr and "Traceback" not in p.stderr


def test_fedsim_secagg_and_dp_fedavg_rounds(tmp_path):
    base = dict(SMALL, rounds=2, upload={"codec": "dense"}, download={"codec": "dense"}, evaluation={})
    execute(dict(base, privacy={"seed": 5, "secagg": {"enabled": True, "dropout": 0.2}}), out=tmp_path / "s", quiet=True,
            report=False)
    rows = read_metrics(tmp_path / "s")
    assert all(3 <= r["secagg_survivors"] <= 5 and r["secagg_aborted"] == 0 for r in rows)
    execute(dict(base, clients={"per_round": 0, "lr": 0.05},
                 privacy={"seed": 5, "dp": {"noise_multiplier": 1.0, "sample_rate": 0.5, "clip_norm": 0.5}}),
            out=tmp_path / "d", quiet=True, report=False)
    rows = read_metrics(tmp_path / "d")
    from fedarena.privacy.dp_fedavg import DPFedAvgMechanism

    want = DPFedAvgMechanism(0.5, 1.0, 0.5, 12).epsilon(2)
    assert rows[-1]["dp_epsilon"] == pytest.approx(want) and rows[0]["dp_epsilon"] < rows[-1]["dp_epsilon"]
