"""The loss-threshold membership attack against brute force, and the DP advantage bound against randomized response."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedarena.engine import nn
from fedarena.privacy.attacks.membership import (dp_advantage_bound, loss_threshold_attack, membership_attack,
                                                 per_example_loss)


def test_auc_and_advantage_equal_brute_force():
    rng = np.random.default_rng(0)
    members = rng.normal(0.5, 1.0, 60).round(1)  # rounding makes ties
    others = rng.normal(0.0, 1.0, 70).round(1)
    res = membership_attack(members, others)
    pairs = (members[:, None] > others[None, :]).mean() + 0.5 * (members[:, None] == others[None, :]).mean()
    assert res.auc == pytest.approx(pairs, abs=1e-12)
    adv = max((members >= t).mean() - (others >= t).mean() for t in np.r_[members, others, np.inf])
    assert res.advantage == pytest.approx(adv, abs=1e-12)
    assert (members >= res.threshold).mean() - (others >= res.threshold).mean() == pytest.approx(adv)
    # loss-threshold: lower loss means member
    assert loss_threshold_attack(-members, -others) == res


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_randomized_response_attains_the_bound(eps):
    """Pure eps-DP randomized response of the membership bit: the best test's advantage is (e^eps-1)/(e^eps+1)."""
    rng = np.random.default_rng(1)
    keep = math.exp(eps) / (1 + math.exp(eps))
    n = 200_000
    members = (rng.random(n) < keep).astype(float)  # reports 1 with prob keep when the bit is 1
    others = (rng.random(n) >= keep).astype(float)
    res = membership_attack(members, others)
    assert res.advantage == pytest.approx(dp_advantage_bound(eps, 0.0), abs=0.01)
    assert res.advantage <= dp_advantage_bound(eps, 0.0) + 0.01


def test_bound_closed_form_and_edges():
    # the optimum of the hypothesis-testing region, by a brute-force grid over FPR
    eps, delta = 1.3, 0.02
    fpr = np.linspace(0, 1, 200_001)
    tpr = np.minimum.reduce([np.ones_like(fpr), math.exp(eps) * fpr + delta,
                             1 - (1 - fpr - delta) / math.exp(eps)])
    assert dp_advantage_bound(eps, delta) == pytest.approx(np.max(tpr - fpr), abs=1e-5)
    assert dp_advantage_bound(0.0, 0.0) == 0.0
    assert dp_advantage_bound(math.inf, 1e-5) == 1.0
    with pytest.raises(ValueError, match="epsilon"):
        dp_advantage_bound(-1.0, 0.0)
    with pytest.raises(ValueError, match="non-empty"):
        membership_attack(np.array([]), np.array([1.0]))


def test_per_example_loss_equals_torch():
    model = nn.MLP([5, 7, 3], activation="tanh")
    params = model.init(0, dtype=np.float64)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(9, 5)), rng.integers(0, 3, 9)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    with torch.no_grad():
        for layer, p in zip([net[0], net[2]], params):
            layer.weight.copy_(torch.from_numpy(p["w"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p["b"]))
        ref = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y), reduction="none")
    np.testing.assert_allclose(per_example_loss(model.apply)(params, x, y), ref.numpy(), atol=1e-12)


def test_auc_standard_error_matches_the_spread_of_simulated_aucs():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    aucs, errs = [], []
    for _ in range(300):
        m, o = rng.normal(0.4, 1, 80), rng.normal(0.0, 1, 120)
        res = membership_attack(m, o)
        aucs.append(roc_auc_score(np.r_[np.ones(80), np.zeros(120)], np.r_[m, o]))
        errs.append(res.auc_stderr)
    assert np.mean(errs) == pytest.approx(np.std(aucs), rel=0.15)


def test_shadow_attack_models_reach_the_bayes_auc_per_class():
    """Members of class 0 are shifted by +mu, of class 1 by -mu (non-members centred): the per-class attack models
    reach the Bayes-optimal AUC Phi(mu / sqrt 2) of one unit-variance Gaussian shift; one pooled model cannot."""
    from scipy.stats import norm

    from fedarena.privacy.attacks.membership import ShadowAttackConfig, attack_model_scores, train_attack_models

    rng = np.random.default_rng(4)
    mu, d = 1.5, 3

    def records(n):
        labels = np.repeat([0, 1], 2 * n)
        member = np.tile(np.repeat([1, 0], n), 2)
        x = rng.normal(size=(4 * n, d))
        x[:, 0] += mu * member * np.where(labels == 0, 1.0, -1.0)
        return x, labels, member

    cfg = ShadowAttackConfig(hidden=(16,), steps=300, lr=0.02)
    x, labels, member = records(300)
    models = train_attack_models(x, labels, member, 2, cfg, seed=0)
    xt, lt, mt = records(1000)
    scores = attack_model_scores(models, xt, lt, cfg.hidden)
    res = membership_attack(scores[mt == 1], scores[mt == 0])
    bayes = norm.cdf(mu / math.sqrt(2))
    assert res.auc == pytest.approx(bayes, abs=0.03)
    pooled = train_attack_models(x, np.zeros_like(labels), member, 1, ShadowAttackConfig(hidden=(1,), steps=300), 0)
    pooled_scores = attack_model_scores(pooled, xt, np.zeros_like(lt), (1,))
    assert membership_attack(pooled_scores[mt == 1], pooled_scores[mt == 0]).auc < bayes - 0.15
    with pytest.raises(ValueError, match="class 1"):
        train_attack_models(x, labels, np.where(labels == 1, 1, member), 2, cfg)
