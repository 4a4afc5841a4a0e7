"""Exported policies outside fedarena: named parameters, an equivalent PyTorch module, and ONNX.

``params.npz`` names each array by its place in the network's parameter tree (``pi/torso/l0/w``: the policy
network's first hidden layer's weight, an (inputs, outputs) matrix applied as ``x @ w + b``; ``pi/head/b``;
``obs_norm/mean``; DQN: ``torso/l0/w``, ``q/w`` or ``value/w`` + ``advantage/w``; CNN torsos ``torso/c0/w`` with
PyTorch's (out, in, kh, kw) layout). The file keeps the format of :func:`fedarena.engine.save_params` (its
``__meta__`` entry describes the tree), so :func:`fedarena.engine.load_params` reads it, and files written before
the names (leaves ``p0``, ``p1``, ...) still load.

:func:`to_torch` rebuilds the greedy policy of :mod:`fedarena.rl.evaluation` as a ``torch.nn.Module`` from those
arrays: input the network's float32 input (``Policy.prepare(obs)``: the observation adapter's flattening / one-hot /
image scaling), output the environment action (argmax of the logits or Q-values; the Gaussian mean clipped to the
action box, or tanh-squashed onto it, as the policy acts). :func:`to_onnx` exports that module with a dynamic
batch axis (``obs`` -> ``action``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.engine.serialization import FORMAT, VERSION
from fedarena.platform.errors import MissingDependencyError
from fedarena.rl.distributions import Categorical, DiagGaussian, MultiCategorical
from fedarena.rl.networks import NATURE_CNN, ActorCritic, QNetwork, Torso


def named_parameters(params: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """The leaves of a parameter tree by path: ``{"pi/torso/l0/w": array, ...}`` (sorted keys)."""
    out: dict[str, np.ndarray] = {}
    if isinstance(params, dict):
        for k in sorted(params):
            out.update(named_parameters(params[k], f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(params, (list, tuple)):
        for i, v in enumerate(params):
            out.update(named_parameters(v, f"{prefix}/{i}" if prefix else str(i)))
    elif params is not None:
        out[prefix] = np.asarray(params)
    return out


def _tree(params: Any, prefix: str, meta: dict[str, Any]) -> Any:
    if isinstance(params, dict):
        return {"dict": {k: _tree(params[k], f"{prefix}/{k}" if prefix else str(k), meta) for k in sorted(params)}}
    if isinstance(params, (list, tuple)):
        kind = "list" if isinstance(params, list) else "tuple"
        return {kind: [_tree(v, f"{prefix}/{i}" if prefix else str(i), meta) for i, v in enumerate(params)]}
    if params is None:
        return None
    arr = np.asarray(params)
    meta[prefix] = {"path": prefix, "shape": list(arr.shape), "dtype": arr.dtype.str}
    return {"leaf": prefix}


def save_named_params(path: str | Path, params: Any) -> None:
    """Write ``params`` in the engine's parameter-file format with each array stored under its tree path."""
    meta_leaves: dict[str, Any] = {}
    tree = _tree(params, "", meta_leaves)
    arrays = {k: np.ascontiguousarray(v) for k, v in named_parameters(params).items()}
    meta = {"format": FORMAT, "version": VERSION, "tree": tree, "leaves": meta_leaves, "metadata": {}}
    blob = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, __meta__=blob, **arrays)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ PyTorch


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("to_torch: needs PyTorch: pip install 'fedarena[torch]'") from None
    return torch


def _linear(torch: Any, p: dict[str, Any]) -> Any:
    w = np.asarray(p["w"], dtype=np.float32)
    layer = torch.nn.Linear(w.shape[0], w.shape[1])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w.T.copy()))
        layer.bias.copy_(torch.from_numpy(np.asarray(p["b"], dtype=np.float32).reshape(-1)))
    return layer


def _torso(torch: Any, torso: Torso, p: dict[str, Any]) -> Any:
    nn = torch.nn
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}
    layers: list[Any] = []
    if torso.kind == "mlp":
        for i in range(len(torso.hidden)):
            layers += [_linear(torch, p[f"l{i}"]), act[torso.activation]()]
        return nn.Sequential(*layers)
    for i, (out_c, k, s) in enumerate(NATURE_CNN):
        w = np.asarray(p[f"c{i}"]["w"], dtype=np.float32)
        conv = nn.Conv2d(w.shape[1], out_c, k, stride=s)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(w.copy()))
            conv.bias.copy_(torch.from_numpy(np.asarray(p[f"c{i}"]["b"], dtype=np.float32).reshape(-1)))
        layers += [conv, nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(), _linear(torch, p["fc"]), nn.ReLU())


def to_torch(network: Any, dist: Any, params: Any) -> Any:
    """A ``torch.nn.Module`` computing the greedy action of ``network`` (an :class:`ActorCritic` with its action
    distribution ``dist``, or a :class:`QNetwork`) at ``params``. ``module(x)`` takes the network input (float32,
    batch first) and returns the environment action; ``module.scores(x)`` the logits / Gaussian mean / Q-values."""
    torch = _torch()
    nn = torch.nn

    class GreedyModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = isinstance(network, QNetwork)
            tree = params if self.q else params["pi"]
            self.torso = _torso(torch, network.torso, tree["torso"])
            self.dueling = self.q and network.dueling
            if self.dueling:
                self.value, self.advantage = _linear(torch, tree["value"]), _linear(torch, tree["advantage"])
            else:
                self.head = _linear(torch, tree["q" if self.q else "head"])
            self.normalize = (not self.q) and network.normalize_obs
            if self.normalize:
                from fedarena.rl.normalization import EPS

                stats = params["obs_norm"]
                self.register_buffer("obs_mean", torch.from_numpy(np.asarray(stats["mean"], dtype=np.float32)))
                self.register_buffer("obs_inv_std", torch.from_numpy(
                    (1.0 / np.sqrt(np.asarray(stats["var"], dtype=np.float32) + np.float32(EPS))).astype(np.float32)))
                self.obs_clip = float(network.obs_clip)
            edges = np.concatenate([[0], np.cumsum(dist.nvec)]) if isinstance(dist, MultiCategorical) else None
            self.splits = None if edges is None else [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
            self.gaussian = isinstance(dist, DiagGaussian)
            if self.gaussian:
                self.squash = bool(dist.squash)
                self.register_buffer("low", torch.tensor(dist.low, dtype=torch.float32))
                self.register_buffer("high", torch.tensor(dist.high, dtype=torch.float32))

        def scores(self, x: Any) -> Any:
            if self.normalize:
                x = torch.clamp((x - self.obs_mean) * self.obs_inv_std, -self.obs_clip, self.obs_clip)
            h = self.torso(x)
            if self.dueling:
                a = self.advantage(h)
                return self.value(h) + a - a.mean(dim=-1, keepdim=True)
            return self.head(h)

        def forward(self, x: Any) -> Any:
            out = self.scores(x)
            if self.gaussian:
                if self.squash:
                    return self.low + (torch.tanh(out) + 1.0) * 0.5 * (self.high - self.low)
                return torch.minimum(torch.maximum(out, self.low), self.high)
            if self.splits is not None:
                return torch.stack([torch.argmax(out[:, a:b], dim=-1) for a, b in self.splits], dim=-1)
            return torch.argmax(out, dim=-1)

    if not isinstance(network, (ActorCritic, QNetwork)) or not (
            isinstance(network, QNetwork) or isinstance(dist, (Categorical, MultiCategorical, DiagGaussian))):
        raise TypeError(f"to_torch: no PyTorch rebuild for {type(network).__name__} with {type(dist).__name__}")
    return GreedyModule().eval()


def to_onnx(module: Any, input_shape: tuple[int, ...], path: str | Path) -> Path:
    """Export a :func:`to_torch` module to ONNX (input ``obs``: (batch, *input_shape) float32; output ``action``)."""
    torch = _torch()
    try:
        import onnx  # noqa: F401  (torch.onnx needs it)
    except ImportError:
        raise MissingDependencyError("to_onnx: needs onnx: pip install 'fedarena[onnx]'") from None
    path = Path(path)
    example = torch.zeros((2, *input_shape), dtype=torch.float32)
    torch.onnx.export(module, (example,), str(path), input_names=["obs"], output_names=["action"],
                      dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    return path
