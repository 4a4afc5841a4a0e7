"""DLG + iDLG: the label read off the gradient, the digit recovered from one update, and not from LDP/SecAgg ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.platform.runs import execute, read_metrics
from fedarena.privacy.attacks.gradient_inversion import infer_label, reconstruct


def test_idlg_label_is_the_true_class_and_the_bias_gradient_is_softmax_minus_onehot():
    model = nn.MLP([6, 8, 5], activation="sigmoid")
    rng = np.random.default_rng(0)
    grad = engine.grad(lambda p, x, y: ops.cross_entropy(model.apply(p, x), y))
    for seed in range(10):
        params = model.init(seed, dtype=np.float64)
        x, y = rng.random((1, 6)), rng.integers(0, 5, 1)
        g = grad(params, x, y)
        probs = torch.softmax(torch.from_numpy(np.asarray(model.apply(params, x))), dim=1).numpy()[0]
        np.testing.assert_allclose(g[-1]["b"], probs - np.eye(5)[y[0]], atol=1e-12)
        assert infer_label(g[-1]["b"]) == y[0]
    with pytest.raises(ValueError, match="last_bias_gradient"):
        infer_label(np.array([np.nan, 1.0]))


def test_dlg_recovers_the_example_from_its_gradient():
    model = nn.MLP([16, 12, 4], activation="sigmoid")
    params = model.init(1, dtype=np.float64)
    x = np.random.default_rng(2).random((1, 16))
    g = engine.grad(lambda p, a, b: ops.cross_entropy(model.apply(p, a), b))(params, x, np.array([2]))
    r = reconstruct(model.apply, params, g, (16,), infer_label(g[-1]["b"]), max_iterations=200, seed=3)
    assert r.label == 2
    assert np.mean((r.x - x[0]) ** 2) < 1e-8
    # the matching objective is really minimised: a wrong label leaves a large residual
    wrong = reconstruct(model.apply, params, g, (16,), 0, max_iterations=100, seed=3)
    assert wrong.matching_loss > 1e3 * max(r.matching_loss, 1e-30)


def test_cosine_dlg_recovers_the_example_from_a_rescaled_gradient():
    """The scale-free objective (Geiping et al. 2020) used against SignDS: it does invert an update of unknown scale."""
    model = nn.MLP([16, 12, 4], activation="sigmoid")
    params = model.init(1, dtype=np.float64)
    x = np.random.default_rng(2).random((1, 16))
    g = engine.grad(lambda p, a, b: ops.cross_entropy(model.apply(p, a), b))(params, x, np.array([2]))
    scaled = engine.tree_map(lambda a: 37.0 * np.asarray(a), g)
    r = reconstruct(model.apply, params, scaled, (16,), 2, max_iterations=300, seed=3, distance="cosine")
    assert np.mean((r.x - x[0]) ** 2) < 1e-6 and r.matching_loss < 1e-8
    # the plain L2 objective is fooled by the scale
    l2 = reconstruct(model.apply, params, scaled, (16,), 2, max_iterations=100, seed=3)
    assert np.mean((l2.x - x[0]) ** 2) > 1e-3
    with pytest.raises(ValueError, match="distance"):
        reconstruct(model.apply, params, g, (16,), 2, distance="l1")


def test_kind_plain_recovered_ldp_signds_and_secagg_not(tmp_path):
    cfg = {"kind": "fl_gradient_inversion", "seed": 0, "targets": 1, "hidden": [16], "ldp_epsilons": [8.0],
           "signds_epsilons": [8.0], "signds_k": 100, "signds_h": 10,
           "secagg_clients": 3, "max_iterations": 150, "insecure_seeded_noise": True}
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        summary = execute(cfg, out=tmp_path / "run", quiet=True, report=True)
    assert summary["plain_recovered"] == 1 and summary["plain_mean_mse"] < 1e-6
    assert summary["ldp_eps8_recovered"] == 0 and summary["secagg_recovered"] == 0
    assert summary["signds_eps8_recovered"] == 0 and summary["signds_eps8_mean_mse"] > 5 * summary["mse_threshold"]
    assert summary["secagg_mean_mse"] > 5 * summary["mse_threshold"]
    (row,) = [r for r in read_metrics(tmp_path / "run") if "plain_mse" in r]
    assert row["secagg_mse"] == [summary["secagg_target0_mse"]] and summary["plain_target0_label_correct"] == 1
    assert (tmp_path / "run" / "report" / "reconstructions.png").exists()
