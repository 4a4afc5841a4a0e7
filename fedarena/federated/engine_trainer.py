"""FL-Client local training on :mod:`fedarena.engine`: a ReLU MLP trained by one jitted SGD step.

The whole step -- forward pass, softmax cross-entropy, the FedProx proximal term
``mu/2 sum ||w - w_global||^2`` (Li et al., MLSys 2020, Eq. 2), reverse-mode gradient and the SGD
update -- is traced once per batch shape into one engine graph (``engine.jit`` of
``engine.value_and_grad``). Batches are drawn exactly as in
:class:`fedarena.federated.trainer.NumpyMLPTrainer` (same permutation, same order), and the same
initialisation is used, so the two trainers agree to float32 rounding (checked in the tests).
Parameters on the wire stay the flat ``{"l{i}.w", "l{i}.b"}`` dict.

:class:`BatchedModelTrainer` trains any model of the simulation's ``model`` section (the CNN, Reddi et al.'s
ResNet-GN, CNN, LSTMs and transformer of :mod:`fedarena.federated.models`, a converted torch model) for one
FL-Client: the client's minibatches are :func:`~fedarena.federated.simulation.batch_plan` of the client's
generator and the step is the model's own compiled batched step, so a client of the gRPC runtime trains exactly
as that client does in the simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import nn, ops
from fedarena.federated.trainer import Params, mlp_init


@dataclass(frozen=True)
class EngineMLPTrainer:
    sizes: tuple[int, ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def depth(self) -> int:
        return len(self.sizes) - 1

    @property
    def mlp(self) -> nn.MLP:
        return nn.MLP(list(self.sizes), activation="relu")

    def init_params(self, seed: int) -> Params:
        return mlp_init(self.sizes, seed)

    def _to_layers(self, params: Params) -> list[dict[str, np.ndarray]]:
        return [{"w": np.asarray(params[f"l{i}.w"], np.float32), "b": np.asarray(params[f"l{i}.b"], np.float32)}
                for i in range(self.depth)]

    def _from_layers(self, layers) -> Params:
        out: Params = {}
        for i, p in enumerate(layers):
            out[f"l{i}.w"] = np.asarray(p["w"], np.float32)
            out[f"l{i}.b"] = np.asarray(p["b"], np.float32)
        return out

    def _step(self):
        if "step" not in self._cache:
            mlp = self.mlp

            def loss_fn(w, anchor, x, y, mu):
                ce = ops.cross_entropy(mlp.apply(w, x), y)
                prox = 0.0
                for p, a in zip(w, anchor):
                    prox = prox + ops.sum(ops.square(p["w"] - a["w"])) + ops.sum(ops.square(p["b"] - a["b"]))
                return ce + 0.5 * mu * prox, ce

            def step(w, anchor, x, y, lr, mu):
                (_, ce), g = engine.value_and_grad(loss_fn, has_aux=True)(w, anchor, x, y, mu)
                new = engine.tree_map(lambda p, gp: p - lr * gp, w, g)
                return new, ce

            self._cache["step"] = engine.jit(step, shape_varies=True)  # the last batch of an epoch may be short
            self._cache["logits"] = engine.jit(lambda w, x: mlp.apply(w, x), shape_varies=True)
        return self._cache["step"]

    def train(self, params: Params, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int, lr: float,
              prox_mu: float, rng: np.random.Generator) -> tuple[Params, float]:
        step = self._step()
        anchor = self._to_layers(params)
        w = self._to_layers(params)
        x = np.asarray(x, np.float32)
        y = np.asarray(y, np.int64)
        lr32, mu32 = np.float32(lr), np.float32(prox_mu)
        last = 0.0
        for _ in range(epochs):
            order = rng.permutation(len(x))
            losses = []
            for s in range(0, len(x), batch_size):
                idx = order[s : s + batch_size]
                w, ce = step(w, anchor, x[idx], y[idx], lr32, mu32)
                losses.append(float(ce))
            last = float(np.mean(losses)) if losses else 0.0
        return self._from_layers(w), last

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        self._step()
        logits = np.asarray(self._cache["logits"](self._to_layers(params), np.asarray(x, np.float32)), np.float64)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(y)), y].mean()), float((logp.argmax(1) == y).mean())


@dataclass(frozen=True)
class BatchedModelTrainer:
    """The :class:`~fedarena.federated.trainer.LocalTrainer` of a simulation model
    (:class:`~fedarena.federated.simulation.BatchedModel`, built by ``ModelConfig.build``) for one client."""

    model: Any
    num_classes: int

    def init_params(self, seed: int) -> Params:
        return self.model.init_params(seed)

    def train(self, params: Params, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int, lr: float,
              prox_mu: float, rng: np.random.Generator) -> tuple[Params, float]:
        from fedarena.federated.simulation import batch_plan, make_group_plan
        from fedarena.federated.strategy import FitConfig

        cfg = FitConfig(epochs, batch_size, lr, prox_mu)
        mat, ep = batch_plan(len(x), cfg, rng)
        plan = make_group_plan([(np.arange(len(x)), mat, ep)], [len(mat)], batch_size)
        onehot = np.eye(self.num_classes, dtype=np.float32)[np.asarray(y, np.int64)]
        out, losses = self.model.train_group(params, plan, np.asarray(x, np.float32), onehot, cfg)
        return {k: np.asarray(v[0], np.float32) for k, v in out.items()}, float(losses[0])

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        from fedarena.federated.simulation import evaluate_params

        return evaluate_params(self.model, params, np.asarray(x, np.float32), np.asarray(y, np.int64))
