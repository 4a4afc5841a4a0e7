"""Width-scaled sub-models of a ReLU MLP and their aggregation: HeteroFL (Diao et al. 2021) and FedRolex (Alam et
al. 2022).

A client whose device cannot train the global model trains a sub-model of width ``r``: every hidden layer of
``h`` units keeps ``floor(r h)`` of them (the input and the output layer keep all theirs). Which units:

* ``heterofl`` -- the leading ones, ``0 .. floor(r h) - 1``, the same every round (HeteroFL's static sub-models);
* ``fedrolex`` -- a window rolling over the layer, ``(s + j) mod h`` for ``j < floor(r h)`` with ``s = (t - 1) mod
  h`` in round ``t``: the window advances one unit a round, so every unit is trained by the narrow clients in turn.

A sub-model's weight ``l{i}.w`` is the global ``w[rows, cols]`` (rows: the kept units of layer ``i``'s input,
cols: of its output) and its bias ``b[cols]``. The server averages each coordinate over the clients whose
sub-model holds it (``sum_i Delta_i[c] / #{i : c in S_i}``, unweighted: the per-parameter averaging both papers
describe) and leaves a coordinate no client held unchanged. HeteroFL's "scaler" divides a sub-model's hidden
outputs by its width relative to the global model's, ``r / r_global``, so that the next layer's sums over fewer
units keep the global model's scale (a run whose global model is itself narrow, every client at one width,
scales nothing). The MLP has no normalization layer (HeteroFL's static batch norm has nothing to do here), so
the scaler applies whenever a sub-model runs, in training and when a narrow level is evaluated; the global
width is the plain model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from fedarena.engine import ops
from fedarena.federated.simulation import BatchedMLP
from fedarena.federated.strategy import Params

Submodel = Literal["heterofl", "fedrolex"]


def level_sizes(sizes: Sequence[int], rate: float, field: str = "devices.width_levels") -> tuple[int, ...]:
    """The layer sizes of width ``rate``: ``floor(rate h)`` units per hidden layer. A rate that leaves a layer
    with no unit is a ValueError naming ``field`` and the smallest rate the model allows."""
    sizes = tuple(int(s) for s in sizes)
    out = [sizes[0]]
    for j, h in enumerate(sizes[1:-1]):
        k = math.floor(rate * h + 1e-9)
        if k < 1:
            smallest = 1 / min(sizes[1:-1])
            raise ValueError(f"{field}: width {rate:g} leaves hidden layer {j} ({h} units) with 0 units; the "
                             f"smallest width this model allows is 1/{min(sizes[1:-1])} = {smallest:g}")
        out.append(k)
    return (*out, sizes[-1])


def submodel_index(sizes: Sequence[int], rate: float, kind: Submodel, rnd: int) -> list[np.ndarray]:
    """The kept units of every layer (input and output: all of them), for round ``rnd`` (module docstring)."""
    sub = level_sizes(sizes, rate)
    index = [np.arange(sizes[0])]
    for h, k in zip(sizes[1:-1], sub[1:-1]):
        start = (rnd - 1) % h if kind == "fedrolex" and k < h else 0  # a full-width window is the layer in order
        index.append((start + np.arange(k)) % h)
    index.append(np.arange(sizes[-1]))
    return index


def extract(params: Params, index: Sequence[np.ndarray]) -> Params:
    """The sub-model of ``params`` (``{"l{i}.w", "l{i}.b"}``) on the kept units ``index``."""
    out: Params = {}
    for i in range(len(index) - 1):
        out[f"l{i}.w"] = np.asarray(params[f"l{i}.w"])[np.ix_(index[i], index[i + 1])]
        out[f"l{i}.b"] = np.asarray(params[f"l{i}.b"])[index[i + 1]]
    return out


@dataclass
class CoordinateMean:
    """The per-coordinate mean of sub-model updates over the clients that hold each coordinate (module docstring),
    accumulated update by update in float64."""

    like: Params

    def __post_init__(self) -> None:
        self.sums = {k: np.zeros(np.shape(v), np.float64) for k, v in self.like.items()}
        self.counts = {k: np.zeros(np.shape(v), np.float64) for k, v in self.like.items()}
        self.clients = 0

    def add(self, delta: Params, index: Sequence[np.ndarray]) -> None:
        for i in range(len(index) - 1):
            rows, cols = np.ix_(index[i], index[i + 1])
            self.sums[f"l{i}.w"][rows, cols] += np.asarray(delta[f"l{i}.w"], np.float64)
            self.counts[f"l{i}.w"][rows, cols] += 1.0
            self.sums[f"l{i}.b"][index[i + 1]] += np.asarray(delta[f"l{i}.b"], np.float64)
            self.counts[f"l{i}.b"][index[i + 1]] += 1.0
        self.clients += 1

    def mean(self) -> Params:
        """The mean update (0 where no client held the coordinate)."""
        return {k: np.divide(s, self.counts[k], out=np.zeros_like(s), where=self.counts[k] > 0)
                for k, s in self.sums.items()}


class ScaledMLP(BatchedMLP):
    """The MLP ``sizes`` of a sub-model whose hidden outputs are divided by ``rate``, its width relative to the
    global model's (HeteroFL's scaler; ``scaler=False`` or ``rate = 1``: the plain MLP). Same parameters as
    :class:`BatchedMLP`."""

    def __init__(self, sizes: Sequence[int], rate: float, scaler: bool = True) -> None:
        self.scale = self.hidden_scale = 1.0 / rate if scaler else 1.0  # logits: BatchedMLP's, scaled
        super().__init__(sizes)
        self.spec = ("scaled_mlp", self.sizes, float(rate), bool(scaler))

    def forward(self, tree, x):
        h = x
        for i, layer in enumerate(tree):
            h = ops.matmul(h, layer["w"]) + layer["b"]
            if i < self.depth - 1:
                h = ops.maximum(h, 0.0)
                if self.scale != 1.0:
                    h = h * np.float32(self.scale)
        return h


@dataclass(frozen=True)
class WidthLevels:
    """The widths a client may train, widest first (``rates[0]`` is the global model's width), which units a
    sub-model keeps (``kind``) and whether its hidden outputs are scaled by ``1 / rate`` (``scaler``)."""

    rates: tuple[float, ...]
    kind: Submodel = "heterofl"
    scaler: bool = True

    def __post_init__(self) -> None:
        if not self.rates or any(not 0 < r <= 1 for r in self.rates):
            raise ValueError(f"devices.width_levels: every width must lie in (0, 1], got {list(self.rates)}")
        if list(self.rates) != sorted(set(self.rates), reverse=True):
            raise ValueError(f"devices.width_levels: distinct widths, widest first, got {list(self.rates)}")
        if self.kind not in ("heterofl", "fedrolex"):
            raise ValueError(f"devices.submodel: heterofl or fedrolex, got {self.kind!r}")
