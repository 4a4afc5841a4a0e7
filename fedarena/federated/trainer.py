"""Local training of an FL-Client behind a small interface, with a numpy MLP reference trainer.

:class:`LocalTrainer` is what a client needs: initial parameters, E epochs of minibatch SGD of size B
from the global model (with the FedProx proximal term ``mu/2 ||w - w_global||^2``, Li et al.,
MLSys 2020, Eq. 2), and evaluation. :class:`NumpyMLPTrainer` implements it with hand-written
backpropagation (ReLU hidden layers, softmax cross-entropy); the engine-backed trainer lives in
:mod:`fedarena.federated.engine_trainer` and is checked against this one.
Parameters are ``{"l{i}.w": (in, out) float32, "l{i}.b": (out,) float32}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

Params = dict[str, np.ndarray]


class LocalTrainer(Protocol):
    def init_params(self, seed: int) -> Params: ...

    def train(self, params: Params, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int, lr: float,
              prox_mu: float, rng: np.random.Generator) -> tuple[Params, float]:
        """Return the locally trained parameters and the mean training loss over the last epoch."""
        ...

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Return (mean cross-entropy loss, accuracy)."""
        ...


def mlp_init(sizes: tuple[int, ...], seed: int) -> Params:
    """He-uniform weights, zero biases, for layer sizes ``(in, h1, ..., out)``."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lim = np.sqrt(6.0 / a)
        params[f"l{i}.w"] = rng.uniform(-lim, lim, size=(a, b)).astype(np.float32)
        params[f"l{i}.b"] = np.zeros(b, np.float32)
    return params


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class NumpyMLPTrainer:
    """Reference MLP trainer (numpy forward/backward)."""

    sizes: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.sizes) - 1

    def init_params(self, seed: int) -> Params:
        return mlp_init(self.sizes, seed)

    def logits(self, params: Params, x: np.ndarray) -> np.ndarray:
        h = x
        for i in range(self.depth):
            h = h @ params[f"l{i}.w"] + params[f"l{i}.b"]
            if i < self.depth - 1:
                h = np.maximum(h, 0.0)
        return h

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        acts = [x]
        h = x
        for i in range(self.depth):
            h = h @ params[f"l{i}.w"] + params[f"l{i}.b"]
            if i < self.depth - 1:
                h = np.maximum(h, 0.0)
            acts.append(h)
        logp = _log_softmax(acts[-1])
        n = x.shape[0]
        loss = float(-logp[np.arange(n), y].mean())
        g = np.exp(logp)
        g[np.arange(n), y] -= 1.0
        g /= n
        grads: Params = {}
        for i in reversed(range(self.depth)):
            grads[f"l{i}.w"] = acts[i].T @ g
            grads[f"l{i}.b"] = g.sum(axis=0)
            if i > 0:
                g = (g @ params[f"l{i}.w"].T) * (acts[i] > 0)
        return loss, grads

    def train(self, params: Params, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int, lr: float,
              prox_mu: float, rng: np.random.Generator) -> tuple[Params, float]:
        w = {k: v.copy() for k, v in params.items()}
        anchor = params
        last = 0.0
        for _ in range(epochs):
            order = rng.permutation(len(x))
            losses = []
            for s in range(0, len(x), batch_size):
                idx = order[s : s + batch_size]
                loss, grads = self.loss_and_grad(w, x[idx], y[idx])
                for k in w:
                    g = grads[k] + prox_mu * (w[k] - anchor[k]) if prox_mu else grads[k]
                    w[k] = (w[k] - lr * g).astype(np.float32)
                losses.append(loss)
            last = float(np.mean(losses)) if losses else 0.0
        return w, last

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        logp = _log_softmax(self.logits(params, x))
        return float(-logp[np.arange(len(y)), y].mean()), float((logp.argmax(1) == y).mean())
