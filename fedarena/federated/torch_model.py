"""A PyTorch model as the model of the federated simulation (``fedsim``'s ``model.arch: torch:module.path:factory``).

``factory(num_features, num_classes)`` builds an ``nn.Module`` mapping a batch of flat feature vectors to
class logits; :func:`fedarena.engine.from_torch` converts it (in eval mode: batch norm uses its running
statistics, dropout is off) into an engine function over a flat ``state_dict``-named parameter dict,
which is what the simulation's strategies, codecs and stages already handle. Local training is the
simulation's batched local SGD (:class:`fedarena.federated.simulation.BatchedModel`: its objective and
update, FedProx term and SCAFFOLD correction included) with the converted function as the forward pass,
all selected clients in one ``engine.jit(engine.vmap(step))``. Batch-norm statistics travel in
the parameters with a zero gradient, so clients leave them unchanged. ``init_params(seed)`` builds the
module under ``torch.manual_seed(seed)`` (torch's own initialisation, the global torch RNG restored).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena.engine.interop import from_torch, load_torch_factory
from fedarena.federated.simulation import BatchedModel
from fedarena.federated.strategy import Params


class BatchedTorchModel(BatchedModel):
    """Local SGD of many clients' copies of one converted torch model (the simulation's batched local SGD with
    the converted function as ``forward``; its parameters are already the flat ``state_dict``-named dict)."""

    def __init__(self, spec: str, num_features: int, num_classes: int) -> None:
        self.factory_spec, self.num_features, self.num_classes = spec, int(num_features), int(num_classes)
        self.spec = ("torch", spec, self.num_features, self.num_classes)  # not rebuilt on Ray (vmap backend only)
        self.factory = load_torch_factory(spec)
        self.fn, init = self._convert(0)
        self.shapes = {k: v.shape for k, v in init.items()}
        self._compile()

    def forward(self, tree: Any, x: Any) -> Any:
        return self.fn(tree, x)

    def _tree(self, params: Params) -> Params:
        return {k: np.asarray(params[k], np.float32) for k in self.shapes}

    def _flat(self, tree: Any) -> Params:
        return dict(tree)

    def _convert(self, seed: int) -> tuple[Any, Params]:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self.factory(self.num_features, self.num_classes)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"model: {self.factory_spec} returned {type(module).__name__}, not a torch.nn.Module")
        module = module.float().eval()
        fn, params = from_torch(module, torch.zeros(2, self.num_features))
        out = fn(params, np.zeros((2, self.num_features), np.float32))
        if np.shape(out) != (2, self.num_classes):
            raise ValueError(f"model: {self.factory_spec} maps (batch, {self.num_features}) features to {np.shape(out)[1:]}, "
                             f"expected ({self.num_classes},) class logits")
        return fn, {k: np.asarray(v, np.float32) for k, v in params.items()}

    def init_params(self, seed: int) -> Params:
        return self._convert(seed)[1]
