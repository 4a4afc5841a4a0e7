"""Training engine classifiers, optionally adversarially: PGD adversarial training (Madry et al., ICLR 2018).

Madry et al. train on the inner maximisation's solution: every minibatch is replaced by its PGD adversarial
examples against the current parameters (random start inside the epsilon ball), and the optimizer steps on the
cross-entropy of those. ``attack=None`` trains on the clean minibatch (standard training).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine import ops
from fedarena.robustness.attacks import ApplyFn, PGDConfig, input_gradient, pgd


def train_classifier(apply: ApplyFn, params: Any, optimizer: Any, x: np.ndarray, y: np.ndarray, *, epochs: int,
                     batch_size: int, seed: int, attack: PGDConfig | None = None,
                     on_step: Callable[[int, float], None] | None = None) -> Any:
    """Minibatch training of ``apply`` on (x, y) for ``epochs`` epochs; PGD adversarial training when ``attack``.

    Shuffling and the PGD random starts come from ``seed``. ``on_step(step, loss)`` sees each step's batch loss
    (on the adversarial batch under adversarial training). Returns the trained parameters."""
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size: must be >= 1, got {epochs} and {batch_size}")

    def loss_fn(p, xb, yb):
        return ops.cross_entropy(apply(p, xb), yb)

    value_grad = engine.jit(engine.value_and_grad(loss_fn))
    update = engine.jit(lambda g, s, p: optimizer.update(g, s, p))
    attack_grad = input_gradient(apply) if attack is not None else None
    state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    step = 0
    for _ in range(int(epochs)):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            xb, yb = x[idx], y[idx]
            if attack is not None:
                xb = pgd(attack_grad, params, xb, yb, attack, seed=rng)
            loss, grads = value_grad(params, xb, yb)
            params, state = update(grads, state, params)
            step += 1
            if on_step is not None:
                on_step(step, float(loss))
    return params


def accuracy(apply: ApplyFn, params: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``apply(params, x)`` on labels ``y``."""
    return float(np.mean(np.argmax(np.asarray(apply(params, x)), axis=1) == y))
