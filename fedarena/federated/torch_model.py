"""A PyTorch model as the model of the federated simulation (``fedsim``'s ``model: torch:module.path:factory``).

``factory(num_features, num_classes)`` builds an ``nn.Module`` mapping a batch of flat feature vectors to
class logits; :func:`fedarena.engine.from_torch` converts it (in eval mode: batch norm uses its running
statistics, dropout is off) into an engine function over a flat ``state_dict``-named parameter dict,
which is what the simulation's strategies, codecs and stages already handle. Local training is the
simulation's batched local SGD (:class:`fedarena.federated.simulation.BatchedMLP`'s objective and
update, FedProx term and SCAFFOLD correction included) with the converted function in place of the
MLP, all selected clients in one ``engine.jit(engine.vmap(step))``. Batch-norm statistics travel in
the parameters with a zero gradient, so clients leave them unchanged. ``init_params(seed)`` builds the
module under ``torch.manual_seed(seed)`` (torch's own initialisation, the global torch RNG restored).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.interop import from_torch, load_torch_factory
from fedarena.federated.strategy import FitConfig, Params


class BatchedTorchModel:
    """Local SGD of many clients' copies of one converted torch model (the interface of ``BatchedMLP``)."""

    def __init__(self, spec: str, num_features: int, num_classes: int) -> None:
        self.spec, self.num_features, self.num_classes = spec, int(num_features), int(num_classes)
        self.factory = load_torch_factory(spec)
        self.fn, init = self._convert(0)
        self.shapes = {k: v.shape for k, v in init.items()}
        fn = self.fn

        def loss_fn(w, x, y, m):
            logits = fn(w, x)
            ce = ops.logsumexp(logits, axis=1) - ops.sum(logits * y, axis=1)
            return ops.sum(ce * m) / ops.maximum(ops.sum(m), 1.0)

        def step(w, anchor, corr, x, y, m, valid, lr, mu):
            ce, g = engine.value_and_grad(loss_fn)(w, x, y, m)
            new = engine.tree_map(lambda p, gp, a, c: p - (lr * valid) * (gp + mu * (p - a) + c), w, g, anchor, corr)
            return new, ce

        def step_plain(w, x, y, m, valid, lr):
            ce, g = engine.value_and_grad(loss_fn)(w, x, y, m)
            return engine.tree_map(lambda p, gp: p - (lr * valid) * gp, w, g), ce

        self._step = engine.jit(engine.vmap(step, in_axes=(0, None, 0, 0, 0, 0, 0, None, None)))
        self._step_plain = engine.jit(engine.vmap(step_plain, in_axes=(0, 0, 0, 0, 0, None)))
        self._logits = engine.jit(fn)

    def _convert(self, seed: int) -> tuple[Any, Params]:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self.factory(self.num_features, self.num_classes)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"model: {self.spec} returned {type(module).__name__}, not a torch.nn.Module")
        module = module.float().eval()
        fn, params = from_torch(module, torch.zeros(2, self.num_features))
        out = fn(params, np.zeros((2, self.num_features), np.float32))
        if np.shape(out) != (2, self.num_classes):
            raise ValueError(f"model: {self.spec} maps (batch, {self.num_features}) features to {np.shape(out)[1:]}, "
                             f"expected ({self.num_classes},) class logits")
        return fn, {k: np.asarray(v, np.float32) for k, v in params.items()}

    def init_params(self, seed: int) -> Params:
        return self._convert(seed)[1]

    def train_group(self, params: Params, plan: Any, x: np.ndarray, y_onehot: np.ndarray, cfg: FitConfig,
                    corrections: list[Params] | None = None) -> tuple[Params, np.ndarray]:
        """Train the clients of ``plan`` from ``params``; their parameters stacked along a leading client
        axis (``plan.clients`` rows) and their last-epoch mean losses (as ``BatchedMLP.train_group``)."""
        G, S = plan.valid.shape
        anchor = {k: np.asarray(params[k], np.float32) for k in self.shapes}
        w = {k: np.repeat(v[None], G, axis=0) for k, v in anchor.items()}
        lr, mu = np.float32(cfg.lr), np.float32(cfg.prox_mu)
        plain = corrections is None and cfg.prox_mu == 0
        if not plain:
            corr = {k: np.zeros((G, *v.shape), np.float32) for k, v in anchor.items()}
            for i, c in enumerate(corrections or []):
                for k in corr:
                    corr[k][i] = c[k]
        loss_sum = np.zeros(G)
        for s in range(S):
            idx = plan.index[:, s]
            xb, yb, mb, vb = x[idx], y_onehot[idx], plan.mask[:, s], plan.valid[:, s]
            if plain:
                w, ce = self._step_plain(w, xb, yb, mb, vb, lr)
            else:
                w, ce = self._step(w, anchor, corr, xb, yb, mb, vb, lr, mu)
            loss_sum += np.asarray(ce, np.float64) * plan.last_epoch[:, s]
        losses = loss_sum / np.maximum(plan.last_epoch.sum(1), 1.0)
        return {k: np.asarray(v)[: plan.clients] for k, v in w.items()}, losses[: plan.clients]

    def logits(self, params: Params, x: np.ndarray) -> np.ndarray:
        """Forward pass for evaluation (float32, returned as float64)."""
        p = {k: np.asarray(params[k], np.float32) for k in self.shapes}
        return np.asarray(self._logits(p, np.asarray(x, np.float32)), np.float64)
