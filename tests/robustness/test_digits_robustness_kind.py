"""The digits_robustness kind end to end at a tiny size: PGD adversarial training beats standard training under PGD,
CW's curve comes from its minimum distances, and the feature-squeezing detector is calibrated and reported."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.platform.runs import execute, read_metrics


def test_adversarial_training_cw_and_feature_squeezing(tmp_path):
    cfg = {"kind": "digits_robustness", "seed": 0, "hidden": [64], "epochs": 3, "batch_size": 64,
           "train_epsilon": 0.2, "train_steps": 3, "eval_epsilons": [0.0, 0.2], "l2_epsilons": [0.0, 1.0, 3.0],
           "eval_pgd_steps": 5, "cw_steps": 20, "cw_search_steps": 2,
           "squeezers": ["bit_depth_2", "median_2x2"], "joint_squeezers": ["bit_depth_2", "bit_depth_3"]}
    summary = execute(cfg, out=tmp_path / "run", quiet=True, report=True)
    assert summary["standard_pgd_eps0.2"] < 0.2 < summary["standard_clean_accuracy"]
    assert summary["pgd_gain_at_train_epsilon"] == pytest.approx(
        summary["adversarial_pgd_eps0.2"] - summary["standard_pgd_eps0.2"])
    assert summary["pgd_gain_at_train_epsilon"] > 0.1
    for model in ("standard", "adversarial"):  # PGD from a random start is at least as strong as FGSM here
        assert summary[f"{model}_pgd_eps0.2"] <= summary[f"{model}_fgsm_eps0.2"] + 0.02
        cw = [summary[f"{model}_cw_eps{e:g}"] for e in (0.0, 1.0, 3.0)]
        assert cw[0] == summary[f"{model}_clean_accuracy"] and cw[0] >= cw[1] >= cw[2]
        assert summary[f"{model}_cw_success_rate"] > 0.6 and cw[2] <= 1 - summary[f"{model}_cw_success_rate"] + 1e-9
    rows = read_metrics(tmp_path / "run")
    curves = [r for r in rows if "eval_epsilons" in r]
    assert len(curves) == 2 and curves[0]["eval_epsilons"] == [0.0, 0.2] and curves[0]["l2_epsilons"] == [0.0, 1.0, 3.0]
    assert curves[1]["adversarial_pgd_accuracy"] == [summary["adversarial_pgd_eps0"], summary["adversarial_pgd_eps0.2"]]
    assert curves[1]["adversarial_cw_accuracy"] == [summary[f"adversarial_cw_eps{e:g}"] for e in (0.0, 1.0, 3.0)]
    # the detector: its threshold sits where the clean evaluation scores say, and it detects FGSM well above its FPR
    (det,) = [r for r in rows if r.get("detector")]
    assert det["detector_names"] == ["bit_depth_2", "median_2x2", "joint"]
    fpr = summary["detector_joint_false_positive_rate"]
    assert fpr == pytest.approx(np.mean(np.asarray(det["joint_clean_scores"]) > summary["detector_joint_threshold"]))
    assert fpr < 0.2 and summary["detector_joint_detection_fgsm"] > 2 * fpr
    assert summary["detector_joint_detection_cw"] == pytest.approx(
        np.mean(np.asarray(det["joint_cw_scores"]) > summary["detector_joint_threshold"]))
    assert summary["detector_bit_depth_2_clean_accuracy"] > summary["detector_median_2x2_clean_accuracy"]
    for png in ("accuracy_vs_epsilon.png", "feature_squeezing.png"):
        assert (tmp_path / "run" / "report" / png).exists()


def test_bad_config_is_named(tmp_path):
    from fedarena.platform.errors import ConfigError

    with pytest.raises(ConfigError, match="attacks"):
        execute({"kind": "digits_robustness", "attacks": ["deepfool"]}, out=tmp_path / "r", quiet=True)
    with pytest.raises(ConfigError, match="squeezers"):
        execute({"kind": "digits_robustness", "squeezers": ["median_2x3"]}, out=tmp_path / "r2", quiet=True)


def test_the_cnn_model_trains_and_adversarial_training_helps(tmp_path):
    cfg = {"kind": "digits_robustness", "seed": 0, "model": "cnn", "channels": [4, 8], "epochs": 3,
           "batch_size": 64, "lr": 0.01, "train_epsilon": 0.2, "train_steps": 3, "eval_epsilons": [0.0, 0.2],
           "l2_epsilons": [0.0, 1.0], "eval_pgd_steps": 5, "attacks": ["fgsm", "pgd"], "cw_steps": 5,
           "cw_search_steps": 1,
           "squeezers": ["bit_depth_2"], "joint_squeezers": ["bit_depth_2"]}
    summary = execute(cfg, out=tmp_path / "cnn", quiet=True, report=False)
    assert summary["standard_clean_accuracy"] > 0.7
    assert summary["adversarial_pgd_eps0.2"] > summary["standard_pgd_eps0.2"]
    with pytest.raises(Exception, match="model"):
        execute(dict(cfg, model="resnet"), out=tmp_path / "bad", quiet=True)
