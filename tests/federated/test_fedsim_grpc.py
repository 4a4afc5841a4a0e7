"""One strategy and stage code path: the in-process simulation and the real gRPC runtime (scheduler, two
FL-Servers, four FLClient threads on loopback) reach the same global model after 5 rounds for the same seed."""

from __future__ import annotations

import numpy as np

from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import FedAvg, FitConfig, ServerOptimizer
from fedarena.federated.task import TaskSpec

TASK = TaskSpec(dataset="synthetic", num_clients=4, hidden=(8,), trainer="engine", synthetic_features=10,
                synthetic_classes=3, synthetic_examples=300, alpha=0.5)


def _rel(a, b):
    fa = np.concatenate([np.asarray(a[k], np.float64).ravel() for k in sorted(a)])
    fb = np.concatenate([np.asarray(b[k], np.float64).ravel() for k in sorted(b)])
    return float(np.linalg.norm(fa - fb) / np.linalg.norm(fb))


def _simulate(task, seed, rounds, opt, cfg):
    ids = [f"c{i}" for i in range(len(task.clients))]
    x = np.concatenate([c[0] for c in task.clients])
    y = np.concatenate([c[1] for c in task.clients])
    offsets = np.cumsum([0] + [len(c[1]) for c in task.clients])
    train = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(ids))]
    strategy = FedAvg(FitConfig(cfg.epochs, cfg.batch_size, cfg.lr, cfg.prox_mu), opt, clients_per_round=2)
    s = Simulation(BatchedMLP(task.sizes), strategy, x, y, train, ids, task.sizes[-1], seed=seed)
    state, records = s.run(rounds, s.init_state(task.trainer.init_params(0)))
    return state, records


def test_simulation_equals_grpc_runtime_after_five_rounds(make_cluster):
    seed = 3
    cfg = RoundConfig(epochs=2, batch_size=8, lr=0.1, prox_mu=0.01)
    opt = ServerOptimizer("fedadam", lr=0.05)
    policy = RoundPolicy(rounds=5, clients_per_round=2, window_seconds=120, start_clients=4, min_fraction=1.0,
                         selection="uniform", seed=seed, round_config=cfg, server_optimizer=opt,
                         max_client_weight=1.0, norm_bound_multiple=0.0)  # the simulation's plain weighted mean
    c = make_cluster(policy, task=TASK)
    c.run_clients(4, seed=seed, wait_s=0.5)
    assert c.scheduler.phase == "done" and c.scheduler.version == 5
    state, records = _simulate(c.task, seed, 5, opt, cfg)
    runtime_selected = [sorted(r["clients"]) for r in c.scheduler.history]
    assert runtime_selected == [r.reporting for r in records]  # same clients every round
    assert len({tuple(s) for s in runtime_selected}) > 1
    rel = _rel(state.params, c.scheduler.params)
    assert rel < 1e-6, rel
    init = c.task.trainer.init_params(0)
    assert _rel(init, c.scheduler.params) > 1e-2  # the model moved
