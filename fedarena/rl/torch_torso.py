"""A PyTorch feature extractor as the torso of PPO's actor and critic (``ppo.torso: torch:module.path:factory``).

``factory(observation_shape)`` builds an ``nn.Module`` mapping a batch of observations (the adapter's
per-example shape: ``(size,)`` for vectors, ``(C, H, W)`` for images) to ``(batch, features)``;
:func:`fedarena.engine.from_torch` converts it (in eval mode) into an engine function over a flat
``state_dict``-named parameter dict, and :class:`fedarena.rl.networks.ActorCritic` puts its policy and
value heads on top, as on its own MLP / Nature-CNN torsos. Each :meth:`TorchTorso.init` builds a fresh
module under ``torch.manual_seed`` drawn from the given generator (torch's own initialisation; the
global torch RNG is restored), so the actor's and the critic's torsos start from different weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedarena.engine.interop import from_torch, load_torch_factory

Params = dict[str, Any]


class TorchTorso:
    """The torso interface of :class:`fedarena.rl.networks.Torso` (``init``, ``apply``, ``out_size``,
    ``input_shape``, ``kind``) over a converted torch module."""

    kind = "torch"

    def __init__(self, spec: str, input_shape: tuple[int, ...]) -> None:
        self.spec, self.input_shape = spec, tuple(int(s) for s in input_shape)
        self.factory = load_torch_factory(spec)
        self.fn, params = self._convert(0)
        out = self.fn(params, np.zeros((2, *self.input_shape), np.float32))
        if np.ndim(out) != 2 or np.shape(out)[0] != 2:
            raise ValueError(f"{spec} maps (batch, {', '.join(map(str, self.input_shape))}) observations to "
                             f"shape {np.shape(out)[1:]} per example; a torso gives (batch, features)")
        self.out_size = int(np.shape(out)[1])

    def _convert(self, seed: int) -> tuple[Any, Params]:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self.factory(self.input_shape)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"{self.spec} returned {type(module).__name__}, not a torch.nn.Module")
        fn, params = from_torch(module.float().eval(), torch.zeros((2, *self.input_shape)))
        return fn, {k: np.asarray(v, np.float32) for k, v in params.items()}

    def init(self, rng: np.random.Generator) -> Params:
        return self._convert(int(rng.integers(2**31)))[1]

    def apply(self, params: Params, x: Any) -> Any:
        return self.fn(params, x)
