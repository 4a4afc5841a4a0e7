"""Asynchronous federated learning on the engine's parameter server (issue 20): the global model lives on
:class:`fedarena.engine.distributed.ParameterServerLearner` and ``concurrency`` simulated clients train at
once, each from the model version it pulled.

Each worker takes the next client id, trains it locally with :meth:`Simulation._train` (the same vmapped
local training and batch plans as synchronous rounds) and pushes the negated model delta as its gradient; the
server applies ``params <- params + server_lr * mean(deltas)`` once it holds a quorum of them:

- ``sync``: every in-flight client (synchronous FedAvg with unweighted means: one server step per
  ``concurrency`` clients, all trained from the same version);
- ``threshold``: ``buffer`` of them (FedBuff, Nguyen et al., "Federated learning with buffered asynchronous
  aggregation", AISTATS 2022); a delta trained on a model more than ``staleness`` versions old is dropped;
- ``async``: each delta on arrival (FedAsync-style, Xie et al. 2019, without the staleness weighting: a
  delta beyond the staleness bound is dropped instead).

Clients are drawn uniformly at random (seeded by the simulation's seed). Heterogeneity of the simulation
(stragglers, availability, adversaries) and upload stages are round-based and do not apply here; that is
stated rather than emulated.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedarena.engine import optim
from fedarena.engine.distributed import ParameterServerConfig, ParameterServerLearner
from fedarena.federated.simulation import Simulation, evaluate_params

MODES = ("sync", "threshold", "async")


@dataclass(frozen=True)
class AsyncFLConfig:
    """``concurrency`` clients train at once; ``buffer`` deltas make a step in threshold mode."""

    mode: str = "threshold"
    concurrency: int = 10
    buffer: int = 5
    staleness: int = 4
    server_lr: float = 1.0
    steps: int = 100
    eval_every: int = 10

    def __post_init__(self) -> None:
        checks = {"mode": self.mode in MODES, "concurrency": self.concurrency >= 1,
                  "buffer": 1 <= self.buffer <= self.concurrency, "staleness": self.staleness >= 0,
                  "server_lr": self.server_lr > 0, "steps": self.steps >= 1, "eval_every": self.eval_every >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"async_fl.{name}: invalid value {getattr(self, name)!r}")

    def server(self) -> ParameterServerConfig:
        return ParameterServerConfig(mode=self.mode, servers=1, threshold=self.buffer / self.concurrency,
                                     staleness=self.staleness)


def run_async(sim: Simulation, cfg: AsyncFLConfig, params: dict[str, np.ndarray] | None = None,
              clients: Callable[[int], str] | None = None,
              on_eval: Callable[[int, dict[str, float]], None] | None = None) -> tuple[dict, list[dict[str, float]]]:
    """Run until the server has made ``cfg.steps`` steps; returns the final model and one metrics row per
    evaluation (every ``eval_every`` versions, on ``sim.test`` when it is set). ``clients(i)`` names the
    ``i``-th client to dispatch (default: uniform at random); its batch plan is seeded by its wave
    ``i // concurrency + 1`` (in sync mode, the round it trains in)."""
    start = dict(params) if params is not None else sim.model.init_params(sim.seed)
    rng = np.random.default_rng([sim.seed, 17])
    pick = clients or (lambda i: sim.client_ids[int(rng.integers(len(sim.client_ids)))])
    losses: deque[float] = deque(maxlen=50)  # the last 50 clients' training losses, for the metrics rows

    def gradient(p: dict[str, np.ndarray], job: tuple[str, int]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        cid, wave = job
        fit = sim.strategy.configure(wave, None)
        _, deltas, loss, _ = sim._train(p, [cid], wave, fit, None, stragglers=False)
        if cid not in deltas:  # no local step was possible: push a zero delta
            return {k: np.zeros_like(v) for k, v in p.items()}, {}
        losses.append(loss[cid])
        return {k: -v for k, v in deltas[cid].items()}, {"train_loss": loss[cid]}

    server = ParameterServerLearner(start, gradient, optim.sgd(cfg.server_lr), cfg.server(), cfg.concurrency)
    rows: list[dict[str, float]] = []
    evaluated = 0
    try:
        i = 0
        while server.version < cfg.steps:
            server.update((pick(i), i // cfg.concurrency + 1))
            i += 1
            version, current = server.weights()
            if version >= evaluated + cfg.eval_every and version < cfg.steps:
                evaluated = version - version % cfg.eval_every
                rows.append(_evaluate(sim, current, version, i, losses))
                if on_eval:
                    on_eval(version, rows[-1])
        # clients still in flight when the last step was taken are discarded (in sync mode they could never
        # make a step of their own)
        version, current = server.weights()
        rows.append(_evaluate(sim, current, version, i, losses))
        if on_eval:
            on_eval(version, rows[-1])
    finally:
        server.close()
    return {k: np.asarray(v) for k, v in current.items()}, rows


def _evaluate(sim: Simulation, params: Any, version: int, dispatched: int, losses: deque[float]) -> dict[str, float]:
    row = {"version": float(version), "clients_dispatched": float(dispatched),
           "train_loss": float(np.mean(losses)) if losses else float("nan")}
    if sim.test is not None:
        loss, acc = evaluate_params(sim.model, params, *sim.test)
        row.update(test_loss=loss, test_acc=acc)
    return row
