"""Adapters from gymnasium spaces to network inputs, torsos and output distributions.

Observation adapter: Box with 3 axes (an image, HWC or CHW) -> float CHW scaled to [0, 1] for a CNN
torso; any other Box, Discrete (one-hot), MultiBinary, MultiDiscrete (one-hot per component) and Dict /
Tuple spaces (each part flattened, concatenated in sorted key order) -> one float32 vector for an MLP.
Action adapter: Discrete -> categorical, MultiDiscrete -> independent categoricals, Box -> diagonal
Gaussian, squashed by tanh or clipped. This is the "adapter" layer of RLzoo (Ding et al., 2020,
"Efficient Reinforcement Learning Development with RLzoo"), so any gymnasium env id works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from fedarena.rl.distributions import Categorical, DiagGaussian, Distribution, MultiCategorical


@dataclass(frozen=True)
class ObservationAdapter:
    """Turns a batch of observations of ``space`` into the float32 array a network consumes."""

    space: Any
    torso: str
    """``"mlp"`` (input shape (B, size)) or ``"cnn"`` (input shape (B, C, H, W))."""
    shape: tuple[int, ...]
    """Per-example input shape: (size,) for the MLP torso, (C, H, W) for the CNN torso."""

    def __call__(self, obs: Any) -> np.ndarray:
        if self.torso == "cnn":
            return _image(self.space, obs)
        return _flatten(self.space, obs)


def _is_image(space: Any) -> bool:
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def _image(space: spaces.Box, obs: Any) -> np.ndarray:
    x = np.asarray(obs)
    if x.ndim != 4:
        raise ValueError(f"obs: expected a batch of images with 4 axes, got shape {x.shape}")
    if space.shape[-1] in (1, 3, 4) and space.shape[0] not in (1, 3, 4):
        x = np.transpose(x, (0, 3, 1, 2))  # HWC -> CHW
    x = x.astype(np.float32)
    if space.dtype == np.uint8:
        x = x / 255.0
    return x


def _flat_size(space: Any) -> int:
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, spaces.Dict):
        return sum(_flat_size(space.spaces[k]) for k in sorted(space.spaces))
    if isinstance(space, spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    raise TypeError(f"observation_space: no adapter for {type(space).__name__}")


def _flatten(space: Any, obs: Any) -> np.ndarray:
    if isinstance(space, spaces.Dict):
        return np.concatenate([_flatten(space.spaces[k], obs[k]) for k in sorted(space.spaces)], axis=-1)
    if isinstance(space, spaces.Tuple):
        return np.concatenate([_flatten(s, o) for s, o in zip(space.spaces, obs)], axis=-1)
    x = np.asarray(obs)
    if isinstance(space, spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[x.astype(np.int64) - int(space.start)]
    if isinstance(space, spaces.MultiDiscrete):
        flat = x.reshape(x.shape[0], -1).astype(np.int64)
        nvec = np.asarray(space.nvec).reshape(-1)
        return np.concatenate([np.eye(n, dtype=np.float32)[flat[:, i]] for i, n in enumerate(nvec)], axis=-1)
    return x.reshape(x.shape[0], -1).astype(np.float32)


def observation_adapter(space: Any) -> ObservationAdapter:
    """The adapter for ``space`` (see the module docstring for the mapping)."""
    if _is_image(space):
        h, w, c = space.shape if space.shape[-1] in (1, 3, 4) and space.shape[0] not in (1, 3, 4) else (
            space.shape[1], space.shape[2], space.shape[0])
        return ObservationAdapter(space, "cnn", (int(c), int(h), int(w)))
    return ObservationAdapter(space, "mlp", (_flat_size(space),))


def action_distribution(space: Any, squash: bool = False) -> Distribution:
    """The policy's output distribution for ``space``; ``squash`` picks tanh-squashing for Box actions."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"action_space: Discrete spaces must start at 0, got start={space.start}")
        return Categorical(int(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        if np.asarray(space.nvec).ndim != 1:
            raise ValueError(f"action_space: MultiDiscrete needs a 1-d nvec, got shape {np.shape(space.nvec)}")
        return MultiCategorical(tuple(int(n) for n in space.nvec))
    if isinstance(space, spaces.Box):
        if len(space.shape) != 1:
            raise ValueError(f"action_space: Box actions must be 1-d, got shape {space.shape}")
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        if squash and not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError("action_space: a squashed Gaussian needs finite Box bounds")
        return DiagGaussian(int(space.shape[0]), tuple(low.tolist()), tuple(high.tolist()), squash=squash)
    raise TypeError(f"action_space: no distribution for {type(space).__name__}")


def env_action(dist: Distribution, raw: np.ndarray) -> np.ndarray:
    """Map a sampled raw action to what the environment's ``step`` takes."""
    if isinstance(dist, DiagGaussian):
        return dist.to_env(raw)
    return np.asarray(raw, dtype=np.int64)
