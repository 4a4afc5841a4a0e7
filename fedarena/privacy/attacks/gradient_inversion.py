"""Gradient inversion: reconstructing a client's training example from the gradient (or one-step update) it sends.

Deep leakage from gradients (L. Zhu, Z. Liu, S. Han, NeurIPS 2019): find a dummy input ``x'`` whose gradient
``grad_theta L(f_theta(x'), y)`` matches the observed one, by minimising the squared distance between the two
gradients with L-BFGS. Label: the improved DLG of B. Zhao, K. R. Mopuri, H. Bilen ("iDLG", arXiv 2001.02610, 2020)
reads it off the gradient instead of optimising a dummy label: for softmax cross-entropy on one example the
gradient of the last layer's bias is ``softmax(z) - onehot(y)``, negative exactly at the true class (their
argument is made on the last weight layer; the bias is the same quantity times the constant input 1).

Distance: DLG's squared Euclidean distance (``distance="l2"``), or one minus the cosine similarity of the two
gradients (``distance="cosine"``, the objective of J. Geiping, H. Bauermeister, H. Droege, M. Moeller, "Inverting
Gradients", NeurIPS 2020), which ignores the gradient's scale: the attack for updates whose magnitudes were
replaced (SignDS uploads only a sign and a set of dimensions).

Here L-BFGS is scipy's L-BFGS-B with the box [0, 1] (the input domain) and the gradient of the matching
objective comes from the engine's nested reverse-mode autodiff (the objective differentiates a gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine import ops


DISTANCES = ("l2", "cosine")


def infer_label(last_bias_gradient: np.ndarray) -> int:
    """iDLG label inference from the last layer's bias gradient of a single-example cross-entropy loss."""
    g = np.asarray(last_bias_gradient, dtype=float).reshape(-1)
    if g.size < 2 or not np.all(np.isfinite(g)):
        raise ValueError(f"last_bias_gradient: need a finite vector of >= 2 class entries, got shape {g.shape}")
    return int(np.argmin(g))


@dataclass(frozen=True)
class Reconstruction:
    x: np.ndarray
    label: int
    matching_loss: float
    iterations: int


def reconstruct(apply: Callable[[Any, Any], Any], params: Any, target_gradient: Any, input_shape: tuple,
                label: int, *, max_iterations: int = 300, seed: int = 0, distance: str = "l2") -> Reconstruction:
    """DLG with a known (e.g. iDLG-inferred) label: ``argmin_x' ||grad L(x', label) - target||^2`` over [0, 1]
    (``distance="cosine"``: ``argmin_x' 1 - cos(grad L(x', label), target)``).

    ``target_gradient`` has the pytree structure of ``params``; ``input_shape`` is one example's shape (the batch
    axis of size 1 is added). The start is uniform noise from ``seed``."""
    from scipy.optimize import minimize

    if distance not in DISTANCES:
        raise ValueError(f"distance: must be one of {DISTANCES}, got {distance!r}")
    y = np.array([int(label)])
    targets = [np.asarray(t, dtype=np.float64) for t in engine.tree_leaves(target_gradient)]
    params64 = engine.tree_map(lambda a: np.asarray(a, dtype=np.float64), params)
    if len(targets) != len(engine.tree_leaves(params64)):
        raise ValueError("target_gradient: must have the structure of params")

    def loss(p, x):
        return ops.cross_entropy(apply(p, x), y)

    param_grad = engine.grad(loss)

    target_norm = float(np.sqrt(sum(float(np.sum(t * t)) for t in targets)))
    if distance == "cosine" and not target_norm > 0:
        raise ValueError("target_gradient: the cosine distance needs a non-zero target")

    def matching(x, p):
        leaves = engine.tree_leaves(param_grad(p, x))
        if distance == "l2":
            total = ops.sum(ops.square(ops.subtract(leaves[0], targets[0])))
            for a, b in zip(leaves[1:], targets[1:]):
                total = ops.add(total, ops.sum(ops.square(ops.subtract(a, b))))
            return total
        inner = ops.sum(ops.multiply(leaves[0], targets[0]))
        sq = ops.sum(ops.square(leaves[0]))
        for a, b in zip(leaves[1:], targets[1:]):
            inner = ops.add(inner, ops.sum(ops.multiply(a, b)))
            sq = ops.add(sq, ops.sum(ops.square(a)))
        return ops.subtract(1.0, ops.divide(inner, ops.multiply(ops.sqrt(ops.add(sq, 1e-30)), target_norm)))

    # not jitted: the engine's jit currently rejects this nested-gradient graph (reported in issue 23's notes)
    value_grad = engine.value_and_grad(matching)
    shape = (1, *input_shape)

    def fun(flat):
        v, g = value_grad(flat.reshape(shape), params64)
        return float(v), np.asarray(g, dtype=np.float64).reshape(-1)

    x0 = np.random.default_rng(seed).random(int(np.prod(shape)))
    res = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * x0.size,
                   options={"maxiter": int(max_iterations), "ftol": 0.0, "gtol": 1e-12})
    return Reconstruction(x=res.x.reshape(input_shape), label=int(label), matching_loss=float(res.fun),
                          iterations=int(res.nit))
