"""Robustness evaluation: a model's accuracy on adversarial examples of each attack, over a grid of budgets.

L-inf attacks (``fgsm``, ``pgd``) are evaluated on L-inf budgets; L2 attacks (``pgd_l2``, ``cw``) on L2 budgets.
Carlini-Wagner L2 is a minimum-distance attack with no budget of its own: an example counts as broken at budget
``epsilon`` when CW found an adversarial example within L2 distance ``epsilon`` of it (or the clean input is
already misclassified), so one CW run gives the whole curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedarena import engine
from fedarena.robustness.attacks import ApplyFn, PGDConfig, fgsm, input_gradient, pgd
from fedarena.robustness.carlini_wagner import CWConfig, CWResult, carlini_wagner_l2

LINF_ATTACKS = ("fgsm", "pgd")
L2_ATTACKS = ("pgd_l2", "cw")
ATTACKS = LINF_ATTACKS + L2_ATTACKS


@dataclass(frozen=True)
class RobustAccuracy:
    attack: str
    epsilon: float
    accuracy: float


def cw_accuracy(result: CWResult, correct: np.ndarray, epsilon: float) -> float:
    """Accuracy at L2 budget ``epsilon`` under CW: correct clean inputs with no CW example within ``epsilon``."""
    broken = result.success & (result.l2 <= epsilon)
    return float(np.mean(np.asarray(correct, bool) & ~broken))


def robust_accuracy_curve(apply: ApplyFn, params: Any, x: np.ndarray, y: np.ndarray, epsilons: Sequence[float],
                          *, attacks: Sequence[str] = LINF_ATTACKS, l2_epsilons: Sequence[float] = (),
                          pgd_steps: int = 20, pgd_step_factor: float = 2.5, cw_config: CWConfig = CWConfig(),
                          cw_result: CWResult | None = None, seed: int = 0) -> list[RobustAccuracy]:
    """Accuracy under each attack at each budget (budget 0 is clean accuracy): L-inf attacks at ``epsilons``, L2
    attacks at ``l2_epsilons``.

    PGD uses ``pgd_steps`` steps of size ``pgd_step_factor * epsilon / pgd_steps`` (Madry et al.'s choice of 2.5
    epsilon / steps) and a random start from ``seed``; FGSM is L-inf only; CW runs once with ``cw_config``
    unless its result on ``(x, y)`` is given as ``cw_result``."""
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise ValueError(f"attacks: unknown attack(s) {unknown}; known: {list(ATTACKS)}")
    grad = input_gradient(apply)
    logits = engine.jit(apply)

    def correct(xa: np.ndarray) -> np.ndarray:
        return np.argmax(np.asarray(logits(params, xa)), axis=1) == y

    clean = correct(x)
    cw = cw_result
    if cw is None and "cw" in attacks:
        cw = carlini_wagner_l2(apply, params, x, y, cw_config)
    out = []
    for name in attacks:
        for eps in (l2_epsilons if name in L2_ATTACKS else epsilons):
            eps = float(eps)
            if eps == 0:
                acc = float(np.mean(clean))
            elif name == "fgsm":
                acc = float(np.mean(correct(fgsm(grad, params, x, y, eps))))
            elif name == "cw":
                acc = cw_accuracy(cw, clean, eps)
            else:
                cfg = PGDConfig(eps, pgd_step_factor * eps / pgd_steps, pgd_steps,
                                norm="l2" if name == "pgd_l2" else "linf")
                acc = float(np.mean(correct(pgd(grad, params, x, y, cfg, seed=seed))))
            out.append(RobustAccuracy(name, eps, acc))
    return out
