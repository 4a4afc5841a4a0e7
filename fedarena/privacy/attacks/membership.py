"""Membership inference: the loss-threshold attack and the (epsilon, delta)-DP bound on its advantage.

Attack (S. Yeom, I. Giacomelli, M. Fredrikson, S. Jha, "Privacy Risk in Machine Learning: Analyzing the
Connection to Overfitting", CSF 2018): guess "member" when an example's loss under the released model is below a
threshold. Over all thresholds this is a ROC curve of the score ``-loss``; we report its AUC and the membership
advantage ``max_t TPR(t) - FPR(t)`` (Yeom et al.'s Adv, the best threshold chosen with knowledge of both
populations, i.e. an upper estimate for an attacker who must pick the threshold blindly).

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


def dp_advantage_bound(epsilon: float, delta: float) -> float:
    """Largest membership advantage (TPR - FPR) any test can have against an (epsilon, delta)-DP algorithm."""
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"epsilon, delta: need epsilon >= 0 and delta in [0, 1], got {epsilon!r}, {delta!r}")
    if math.isinf(epsilon):
        return 1.0
    return min(1.0, (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1))
