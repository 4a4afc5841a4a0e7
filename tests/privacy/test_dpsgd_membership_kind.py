"""The dpsgd_membership kind at a tiny size: calibrated epsilons, the bound beside the attack, a consistent summary."""

from __future__ import annotations

import math

import pytest

from fedarena.platform.runs import execute, read_metrics
from fedarena.privacy.accountant import RDPAccountant


def test_membership_kind_reports_attack_and_bound(tmp_path):
    cfg = {"kind": "dpsgd_membership", "seed": 0, "epsilons": [1.0], "members": 60, "epochs": 2,
           "batch_size": 20, "hidden": [32], "insecure_seeded_noise": True}
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        summary = execute(cfg, out=tmp_path / "run", quiet=True, report=True)
    acc = RDPAccountant()
    acc.step(summary["eps1_noise_multiplier"], summary["sample_rate"], summary["steps"])
    assert summary["eps1_epsilon_spent"] == pytest.approx(acc.epsilon(1e-5)) and 0.95 < acc.epsilon(1e-5) <= 1.0
    assert summary["eps1_advantage_bound"] == pytest.approx((math.e - 1 + 2e-5) / (math.e + 1), rel=1e-3)
    assert summary["nonprivate_noise_multiplier"] == 0 and summary["nonprivate_advantage_bound"] == 1.0
    for tag in ("nonprivate", "eps1"):
        assert 0 <= summary[f"{tag}_advantage"] <= 1 and 0 <= summary[f"{tag}_auc"] <= 1
    (row,) = [r for r in read_metrics(tmp_path / "run") if "auc" in r]
    assert [math.isinf(e) for e in row["epsilon"]] == [True, False]
    assert row["auc"] == [summary["nonprivate_auc"], summary["eps1_auc"]]
    assert (tmp_path / "run" / "report" / "membership_vs_epsilon.png").exists()


def test_bad_config_is_named(tmp_path):
    from fedarena.platform.errors import ConfigError

    with pytest.raises(ConfigError, match="epsilons"):
        execute({"kind": "dpsgd_membership", "epsilons": [0.0]}, out=tmp_path / "r", quiet=True)
