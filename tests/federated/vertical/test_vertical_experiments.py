"""The vfl_lr and vfl_splitnn experiment kinds: run folders, reports, and resume == uninterrupted."""

import json

import pytest

from fedarena.platform.runs import execute, read_metrics

FAST_LR = ["key_bits=1024", "psi_key_bits=1024", "psi_workers=1", "allow_insecure_keys=true", "pool_size=0", "max_rows=100", "batch_size=32", "coordinator=false"]


def test_vfl_lr_runs_reports_and_resumes_identically(tmp_path):
    full = execute("experiments/vfl_breast_cancer.yaml", overrides=FAST_LR + ["epochs=2"], out=tmp_path / "full",
                   quiet=True, report=False)
    rows = read_metrics(tmp_path / "full")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["bytes"] > 0 and r["crypto_s"] > 0 and 0.5 < r["test_auc"] <= 1.0 and r["loss"] < 0.7
    assert full["aligned"] == 455 and full["train_rows"] + full["test_rows"] == 100
    from fedarena.federated.vertical.experiment import plots_lr

    (tmp_path / "rep").mkdir()
    assert [p.endswith("vfl_lr.png") for p in plots_lr(rows, None, tmp_path / "rep")] == [True]
    # stop after one epoch, resume to two: the same numbers (fresh keys, masks cancel exactly)
    execute("experiments/vfl_breast_cancer.yaml", overrides=FAST_LR + ["epochs=1"], out=tmp_path / "part", quiet=True, report=False)
    resumed = execute(resume=tmp_path / "part", overrides=["epochs=2"], quiet=True, report=False)
    rows2 = read_metrics(tmp_path / "part")
    assert [r["step"] for r in rows2] == [1, 2]
    assert rows2[1]["loss"] == pytest.approx(rows[1]["loss"], abs=1e-12)
    assert resumed["test_auc"] == pytest.approx(full["test_auc"], abs=1e-12)
    # a budget the checkpoint already meets: no epoch runs, the summary is the checkpointed run's
    again = execute(resume=tmp_path / "part", overrides=["epochs=1"], quiet=True, report=False)
    assert read_metrics(tmp_path / "part") == rows2
    assert again["test_auc"] == resumed["test_auc"] and again["central_auc"] == resumed["central_auc"]


def test_vfl_splitnn_runs(tmp_path):
    s = execute("experiments/vfl_digits_splitnn.yaml", overrides=["key_bits=1024", "psi_key_bits=1024", "psi_workers=1", "allow_insecure_keys=true",
                "max_rows=60", "epochs=1", "batch_size=32"], out=tmp_path / "nn", quiet=True, report=False)
    rows = read_metrics(tmp_path / "nn")
    assert len(rows) == 1 and rows[0]["bytes"] > 0 and 0.0 <= rows[0]["test_accuracy"] <= 1.0
    assert s["aligned"] == round(0.9 * 1797)
    assert json.loads((tmp_path / "nn" / "status.json").read_text())["state"] == "completed"


def test_bad_config_names_the_field():
    with pytest.raises(Exception, match="shared_fraction"):
        execute("experiments/vfl_breast_cancer.yaml", overrides=["shared_fraction=1.5"], quiet=True)
