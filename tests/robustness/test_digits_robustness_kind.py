"""The digits_robustness kind end to end at a tiny size: PGD adversarial training beats standard training under PGD."""

from __future__ import annotations

import pytest

from fedarena.platform.runs import execute, read_metrics


def test_adversarial_training_raises_pgd_accuracy(tmp_path):
    cfg = {"kind": "digits_robustness", "seed": 0, "hidden": [64], "epochs": 3, "batch_size": 64,
           "train_epsilon": 0.2, "train_steps": 3, "eval_epsilons": [0.0, 0.2], "eval_pgd_steps": 5}
    summary = execute(cfg, out=tmp_path / "run", quiet=True, report=True)
    assert summary["standard_pgd_eps0.2"] < 0.2 < summary["standard_clean_accuracy"]
    assert summary["pgd_gain_at_train_epsilon"] == pytest.approx(
        summary["adversarial_pgd_eps0.2"] - summary["standard_pgd_eps0.2"])
    assert summary["pgd_gain_at_train_epsilon"] > 0.1
    for model in ("standard", "adversarial"):  # PGD from a random start is at least as strong as FGSM here
        assert summary[f"{model}_pgd_eps0.2"] <= summary[f"{model}_fgsm_eps0.2"] + 0.02
    rows = [r for r in read_metrics(tmp_path / "run") if "eval_epsilons" in r]
    assert len(rows) == 2 and rows[0]["eval_epsilons"] == [0.0, 0.2]
    assert rows[1]["adversarial_pgd_accuracy"] == [summary["adversarial_pgd_eps0"], summary["adversarial_pgd_eps0.2"]]
    assert (tmp_path / "run" / "report" / "accuracy_vs_epsilon.png").exists()


def test_bad_config_is_named(tmp_path):
    from fedarena.platform.errors import ConfigError

    with pytest.raises(ConfigError, match="attacks"):
        execute({"kind": "digits_robustness", "attacks": ["deepfool"]}, out=tmp_path / "r", quiet=True)
