"""Aggregation for horizontal FL: example-weighted partial aggregates and server optimizers.

* FedAvg (McMahan et al., AISTATS 2017): the global update is the example-weighted mean of the
  client deltas, ``Delta = sum_i n_i Delta_i / sum_i n_i``, applied as ``x <- x + eta * Delta``
  (``eta = 1`` is plain FedAvg).
* Partial aggregation (the MindSpore Federated distributed aggregation): each FL-Server keeps
  ``(sum_i n_i Delta_i, sum_i n_i, clients)`` for its own clients; partials add up exactly, so the
  combined mean equals the mean over all clients whichever server each client used.
* FedAdagrad / FedAdam / FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
  Algorithm 2): with the mean delta as pseudo-gradient, ``m = b1 m + (1 - b1) Delta``;
  Adagrad ``v = v + Delta^2``; Adam ``v = b2 v + (1 - b2) Delta^2``;
  Yogi ``v = v - (1 - b2) Delta^2 sign(v - Delta^2)``; ``x <- x + eta m / (sqrt(v) + tau)``,
  with ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (the paper requires ``v_{-1} >= tau^2``; no bias correction).

Parameters are ``dict[str, np.ndarray]``; accumulation is in float64, stored models keep their dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Params = dict[str, np.ndarray]


@dataclass
class PartialAggregate:
    """Running ``sum n_i Delta_i``, ``sum n_i`` and the contributing client ids of one server and round."""

    sums: Params = field(default_factory=dict)
    weight: float = 0.0
    clients: list[str] = field(default_factory=list)
    loss_sum: float = 0.0

    def add(self, client_id: str, delta: Params, num_examples: float, loss: float = 0.0) -> None:
        if num_examples <= 0:
            raise ValueError(f"num_examples: must be positive, got {num_examples}")
        for name, d in delta.items():
            acc = self.sums.get(name)
            contrib = np.asarray(d, dtype=np.float64) * float(num_examples)
            self.sums[name] = contrib if acc is None else acc + contrib
        self.weight += float(num_examples)
        self.clients.append(client_id)
        self.loss_sum += float(loss) * float(num_examples)

    def merge(self, other: "PartialAggregate") -> None:
        dup = set(self.clients) & set(other.clients)
        if dup:
            raise ValueError(f"clients: {sorted(dup)} appear in two partial aggregates")
        for name, s in other.sums.items():
            self.sums[name] = s.copy() if name not in self.sums else self.sums[name] + s
        self.weight += other.weight
        self.clients.extend(other.clients)
        self.loss_sum += other.loss_sum

    def mean_delta(self) -> Params:
        if self.weight <= 0:
            raise ValueError("weight: no client contributed to this aggregate")
        return {name: s / self.weight for name, s in self.sums.items()}


ServerOptimizerName = Literal["fedavg", "fedadagrad", "fedadam", "fedyogi"]


@dataclass(frozen=True)
class ServerOptimizer:
    """Server update rule applied to the aggregated mean delta (see module docstring)."""

    name: ServerOptimizerName = "fedavg"
    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.name not in ("fedavg", "fedadagrad", "fedadam", "fedyogi"):
            raise ValueError(f"server_optimizer: unknown '{self.name}' (fedavg, fedadagrad, fedadam, fedyogi)")
        if not self.lr > 0:
            raise ValueError(f"server_lr: must be > 0, got {self.lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1/beta2: must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if not self.tau > 0:
            raise ValueError(f"tau: must be > 0, got {self.tau}")

    def init(self, params: Params) -> dict[str, Params]:
        if self.name == "fedavg":
            return {}
        return {
            "m": {k: np.zeros(v.shape, np.float64) for k, v in params.items()},
            "v": {k: np.full(v.shape, self.tau**2, np.float64) for k, v in params.items()},
        }

    def step(self, params: Params, delta: Params, state: dict[str, Params]) -> tuple[Params, dict[str, Params]]:
        """Return ``(new_params, new_state)``; inputs are not modified."""
        if set(delta) != set(params):
            raise ValueError(f"delta: names {sorted(delta)} differ from the model's {sorted(params)}")
        if self.name == "fedavg":
            new = {k: (params[k].astype(np.float64) + self.lr * delta[k]).astype(params[k].dtype) for k in params}
            return new, {}
        m_new, v_new, new = {}, {}, {}
        for k, x in params.items():
            d = np.asarray(delta[k], np.float64)
            m = self.beta1 * state["m"][k] + (1.0 - self.beta1) * d
            v_old = state["v"][k]
            d2 = d * d
            if self.name == "fedadagrad":
                v = v_old + d2
            elif self.name == "fedadam":
                v = self.beta2 * v_old + (1.0 - self.beta2) * d2
            else:  # fedyogi
                v = v_old - (1.0 - self.beta2) * d2 * np.sign(v_old - d2)
            m_new[k], v_new[k] = m, v
            new[k] = (x.astype(np.float64) + self.lr * m / (np.sqrt(v) + self.tau)).astype(x.dtype)
        return new, {"m": m_new, "v": v_new}
