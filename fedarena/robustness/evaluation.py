"""Robustness evaluation: a model's accuracy on adversarial examples of each attack, over a grid of budgets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedarena import engine
from fedarena.robustness.attacks import ApplyFn, PGDConfig, fgsm, input_gradient, pgd

ATTACKS = ("fgsm", "pgd")


@dataclass(frozen=True)
class RobustAccuracy:
    attack: str
    epsilon: float
    accuracy: float


def robust_accuracy_curve(apply: ApplyFn, params: Any, x: np.ndarray, y: np.ndarray, epsilons: Sequence[float],
                          *, attacks: Sequence[str] = ATTACKS, norm: str = "linf", pgd_steps: int = 20,
                          pgd_step_factor: float = 2.5, seed: int = 0) -> list[RobustAccuracy]:
    """Accuracy under each attack at each epsilon (epsilon 0 is clean accuracy).

    PGD uses ``pgd_steps`` steps of size ``pgd_step_factor * epsilon / pgd_steps`` (Madry et al.'s choice of 2.5
    epsilon / steps) and a random start from ``seed``; FGSM is L-inf only."""
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise ValueError(f"attacks: unknown attack(s) {unknown}; known: {list(ATTACKS)}")
    grad = input_gradient(apply)
    logits = engine.jit(apply)

    def acc(xa: np.ndarray) -> float:
        return float(np.mean(np.argmax(np.asarray(logits(params, xa)), axis=1) == y))

    out = []
    for eps in epsilons:
        eps = float(eps)
        for name in attacks:
            if eps == 0:
                out.append(RobustAccuracy(name, 0.0, acc(x)))
            elif name == "fgsm":
                out.append(RobustAccuracy(name, eps, acc(fgsm(grad, params, x, y, eps))))
            else:
                cfg = PGDConfig(eps, pgd_step_factor * eps / pgd_steps, pgd_steps, norm=norm)
                out.append(RobustAccuracy(name, eps, acc(pgd(grad, params, x, y, cfg, seed=seed))))
    return out
