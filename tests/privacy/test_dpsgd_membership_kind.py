"""The dpsgd_membership kind at a tiny size: calibrated epsilons, both attacks and the bound, statistics over trials."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedarena.platform.runs import execute, read_metrics
from fedarena.privacy.accountant import RDPAccountant
from fedarena.privacy.attacks.membership_experiment import disjoint_splits


def test_membership_kind_reports_attacks_bound_and_trial_statistics(tmp_path):
    cfg = {"kind": "dpsgd_membership", "seed": 0, "epsilons": [2.0, 1.0], "members": 30, "shadows": 1, "trials": 2,
           "epochs": 2, "batch_size": 10, "hidden": [16], "attack_steps": 20, "insecure_seeded_noise": True}
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        summary = execute(cfg, out=tmp_path / "run", quiet=True, report=True)
    acc = RDPAccountant()
    acc.step(summary["eps1_noise_multiplier"], summary["sample_rate"], summary["steps"])
    assert summary["eps1_epsilon_spent"] == pytest.approx(acc.epsilon(1e-5)) and 0.95 < acc.epsilon(1e-5) <= 1.0
    assert summary["eps1_advantage_bound"] == pytest.approx((math.e - 1 + 2e-5) / (math.e + 1), rel=1e-3)
    assert summary["nonprivate_noise_multiplier"] == 0 and summary["nonprivate_advantage_bound"] == 1.0
    rows = read_metrics(tmp_path / "run")
    trials = [r for r in rows if "trial" in r]
    assert [r["trial"] for r in trials] == [0, 1]
    for attack in ("loss", "shadow"):
        for i, tag in enumerate(("nonprivate", "eps2", "eps1")):
            for metric in ("auc", "advantage"):
                per_trial = [r[f"{attack}_{metric}"][i] for r in trials]
                assert 0 <= min(per_trial) and max(per_trial) <= 1
                assert summary[f"{tag}_{attack}_{metric}"] == pytest.approx(np.mean(per_trial))
                se = np.std(per_trial, ddof=1) / math.sqrt(2)
                assert summary[f"{tag}_{attack}_{metric}_stderr"] == pytest.approx(se)
        drop = [r[f"{attack}_auc"][0] - r[f"{attack}_auc"][2] for r in trials]
        assert summary[f"{attack}_auc_drop_nonprivate_to_eps1"] == pytest.approx(np.mean(drop))
        slopes = [r[f"{attack}_auc"][1] - r[f"{attack}_auc"][2] for r in trials]  # two points: the slope per doubling
        assert summary[f"{attack}_auc_slope_per_doubling"] == pytest.approx(np.mean(slopes))
    (table,) = [r for r in rows if r.get("summary_table")]
    assert [math.isinf(e) for e in table["epsilon"]] == [True, False, False]
    assert table["loss_auc"] == [summary["nonprivate_loss_auc"], summary["eps2_loss_auc"], summary["eps1_loss_auc"]]
    assert (tmp_path / "run" / "report" / "membership_vs_epsilon.png").exists()


def test_disjoint_splits_are_disjoint_stratified_and_seeded():
    y = np.repeat(np.arange(10), 50)
    parts = disjoint_splits(y, 100, 4, [0, 1])
    assert all(len(p) == 100 for p in parts) and len(np.unique(np.concatenate(parts))) == 400
    assert all(np.array_equal(np.bincount(y[p], minlength=10), np.full(10, 10)) for p in parts)
    again = disjoint_splits(y, 100, 4, [0, 1])
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not np.array_equal(disjoint_splits(y, 100, 4, [0, 2])[0], parts[0])


def test_bad_config_is_named(tmp_path):
    from fedarena.platform.errors import ConfigError

    with pytest.raises(ConfigError, match="epsilons"):
        execute({"kind": "dpsgd_membership", "epsilons": [0.0]}, out=tmp_path / "r", quiet=True)
    with pytest.raises(ConfigError, match="members"):
        execute({"kind": "dpsgd_membership", "members": 300, "shadows": 4}, out=tmp_path / "r2", quiet=True)
