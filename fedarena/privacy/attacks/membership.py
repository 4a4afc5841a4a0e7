"""Membership inference: the loss-threshold attack, the shadow-model attack, and the (epsilon, delta)-DP bound on
their advantage.

Loss threshold (S. Yeom, I. Giacomelli, M. Fredrikson, S. Jha, "Privacy Risk in Machine Learning: Analyzing the
Connection to Overfitting", CSF 2018): guess "member" when an example's loss under the released model is below a
threshold. Over all thresholds this is a ROC curve of the score ``-loss``; we report its AUC and the membership
advantage ``max_t TPR(t) - FPR(t)`` (Yeom et al.'s Adv, the best threshold chosen with knowledge of both
populations, i.e. an upper estimate for an attacker who must pick the threshold blindly).

Shadow models (R. Shokri, M. Stronati, C. Song, V. Shmatikov, "Membership Inference Attacks Against Machine
Learning Models", IEEE S&P 2017): the attacker trains ``k`` shadow models the way the target was trained, each on
its own "in" set drawn from the same distribution (here disjoint from the other shadows' data and from the
target's), and keeps an equally large "out" set per shadow. Every shadow labels its in records 1 and its out
records 0; for each class ``c`` an attack model learns ``(prediction vector, label c) -> in/out`` from the shadows'
records of class ``c``. The target's records are then scored by the attack model of their label. Here an attack
model is an engine MLP (by default one hidden ReLU layer of 64 units) trained full-batch with Adam on the
*log* of the softmax vector (a monotone re-encoding of the prediction vector that keeps overconfident outputs such
as 0.9999 and 0.999999 apart); its score is the logit difference ``z_in - z_out``.

Bound. An (epsilon, delta)-DP training algorithm makes any membership test satisfy ``TPR <= e^eps FPR + delta``
and ``1 - FPR <= e^eps (1 - TPR) + delta`` (the hypothesis-testing view of DP: Wasserman and Zhou, JASA 2010;
Kairouz, Oh, Viswanath, "The Composition Theorem for Differential Privacy", ICML 2015, Theorem 2.1). Maximising
TPR - FPR over that region puts the optimum where both constraints bind, FPR = (1 - delta) / (e^eps + 1), so

    advantage <= (e^eps - 1 + 2 delta) / (e^eps + 1),

the bound Humphries et al. ("Investigating Membership Inference Attacks under Data Dependencies", CSF 2023) state
for the membership experiment with a balanced prior. Pure epsilon-DP randomized response attains it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine import ops


@dataclass(frozen=True)
class MembershipResult:
    auc: float
    advantage: float
    """max over thresholds of TPR - FPR"""
    threshold: float
    """the score threshold attaining the advantage (guess member when score >= threshold)"""
    auc_stderr: float
    """standard error of the AUC estimate (Hanley and McNeil, Radiology 1982, eq. 1)"""


def per_example_loss(apply: Callable[[Any, Any], Any]) -> Callable[[Any, np.ndarray, np.ndarray], np.ndarray]:
    """Compiled ``fn(params, x, y) -> cross-entropy of each example`` (shape (n,))."""
    return engine.jit(lambda p, x, y: ops.cross_entropy(apply(p, x), y, reduction="none"))


def membership_attack(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> MembershipResult:
    """AUC and advantage of the test "member iff score >= t" (higher score = more likely a member)."""
    from sklearn.metrics import roc_auc_score, roc_curve

    member_scores, nonmember_scores = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    if member_scores.size == 0 or nonmember_scores.size == 0:
        raise ValueError("member_scores, nonmember_scores: both populations must be non-empty")
    if not (np.all(np.isfinite(member_scores)) and np.all(np.isfinite(nonmember_scores))):
        raise ValueError("member_scores, nonmember_scores: scores must be finite")
    labels = np.r_[np.ones(member_scores.size), np.zeros(nonmember_scores.size)]
    scores = np.r_[member_scores, nonmember_scores]
    fpr, tpr, thresholds = roc_curve(labels, scores)
    best = int(np.argmax(tpr - fpr))
    auc = float(roc_auc_score(labels, scores))
    return MembershipResult(auc=auc, advantage=float(tpr[best] - fpr[best]), threshold=float(thresholds[best]),
                            auc_stderr=auc_standard_error(auc, member_scores.size, nonmember_scores.size))


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley-McNeil standard error of an AUC from ``n_pos`` positives and ``n_neg`` negatives."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (n_pos * n_neg)
    return float(math.sqrt(max(var, 0.0)))


def loss_threshold_attack(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> MembershipResult:
    """Yeom et al.'s attack on per-example losses: the score is ``-loss``."""
    return membership_attack(-np.asarray(member_losses, float), -np.asarray(nonmember_losses, float))


@dataclass(frozen=True)
class ShadowAttackConfig:
    """Per-class attack models: MLP widths, full-batch Adam steps and learning rate, and the log-probability floor."""

    hidden: tuple[int, ...] = (64,)
    steps: int = 300
    lr: float = 0.01
    log_floor: float = -30.0

    def __post_init__(self) -> None:
        if self.steps < 1 or not self.lr > 0 or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"steps, lr, hidden: need steps >= 1, lr > 0, widths >= 1; got {self.steps}, "
                             f"{self.lr}, {list(self.hidden)}")


def attack_features(log_probs: np.ndarray, floor: float = -30.0) -> np.ndarray:
    """The attack models' input: the log-softmax vector, clipped below at ``floor`` (float64)."""
    return np.maximum(np.asarray(log_probs, dtype=np.float64), floor)


def train_attack_models(features: np.ndarray, labels: np.ndarray, membership: np.ndarray, num_classes: int,
                        config: ShadowAttackConfig = ShadowAttackConfig(), seed: int = 0) -> list[Any]:
    """Shokri et al.'s per-class attack models from the shadow models' records.

    ``features[i]`` is the (transformed) prediction vector of record ``i`` under the shadow model that saw or did not
    see it, ``labels[i]`` its class, ``membership[i]`` 1 if it was in that shadow's training set. Returns one
    parameter pytree per class; every class needs records of both kinds."""
    from fedarena.engine import nn, optim

    features, labels = np.asarray(features, np.float64), np.asarray(labels)
    membership = np.asarray(membership).astype(np.int64)
    if features.ndim != 2 or len(features) != len(labels) or len(labels) != len(membership):
        raise ValueError(f"features, labels, membership: need (n, d), (n,), (n,); got {features.shape}, "
                         f"{labels.shape}, {membership.shape}")
    mlp = nn.MLP([features.shape[1], *[int(h) for h in config.hidden], 2], activation="relu")
    opt = optim.adam(config.lr)
    value_grad = engine.jit(engine.value_and_grad(lambda p, x, y: ops.cross_entropy(mlp.apply(p, x), y)))
    update = engine.jit(lambda g, s, p: opt.update(g, s, p))
    models = []
    for c in range(int(num_classes)):
        rows = labels == c
        if not (np.any(membership[rows] == 1) and np.any(membership[rows] == 0)):
            raise ValueError(f"membership: class {c} needs shadow records both in and out of training")
        x, y = features[rows], membership[rows]
        params = mlp.init(np.random.default_rng([seed, c]), dtype=np.float64)
        state = opt.init(params)
        for _ in range(int(config.steps)):
            _, grads = value_grad(params, x, y)
            params, state = update(grads, state, params)
        models.append(params)
    return models


def attack_model_scores(models: list[Any], features: np.ndarray, labels: np.ndarray,
                        hidden: tuple[int, ...] = (64,)) -> np.ndarray:
    """Membership score of each record from the attack model of its class: ``z_in - z_out`` (higher = member)."""
    from fedarena.engine import nn

    features, labels = np.asarray(features, np.float64), np.asarray(labels)
    mlp = nn.MLP([features.shape[1], *[int(h) for h in hidden], 2], activation="relu")
    logits = engine.jit(mlp.apply)
    scores = np.empty(len(labels))
    for c in np.unique(labels):
        rows = labels == c
        z = np.asarray(logits(models[int(c)], features[rows]))
        scores[rows] = z[:, 1] - z[:, 0]
    return scores


def dp_advantage_bound(epsilon: float, delta: float) -> float:
    """Largest membership advantage (TPR - FPR) any test can have against an (epsilon, delta)-DP algorithm."""
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"epsilon, delta: need epsilon >= 0 and delta in [0, 1], got {epsilon!r}, {delta!r}")
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))
