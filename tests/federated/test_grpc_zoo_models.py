"""The gRPC runtime trains the models of fedsim's ``model`` section, not only its MLP: a real scheduler, two
FL-Servers and FLClient threads on loopback, whose clients build Reddi et al.'s EMNIST CNN (``cnn_emnist``) from
the task's model fields, reach the same global model after a round as the in-process simulation of the same
clients (rtol 1e-5); and the fedavg_grpc config carries the section."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated.config import ModelConfig
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.simulation import Simulation
from fedarena.federated.strategy import FedAvg, FitConfig, ServerOptimizer
from fedarena.federated.task import TaskSpec

SEED, CLIENTS = 5, 3
MODELS = {
    "cnn_emnist": {"arch": "cnn_emnist", "widths": [2, 3], "units": 5},
}


def _flat(p):
    return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in sorted(p)])


@pytest.mark.parametrize("name", list(MODELS))
def test_one_round_of_a_non_mlp_model_equals_the_simulation(make_cluster, name):
    task = TaskSpec(dataset="synthetic", num_clients=CLIENTS, synthetic_features=64, synthetic_classes=3,
                    synthetic_examples=120, alpha=0.5, seed=SEED, model=MODELS[name])
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.2, prox_mu=0.01)
    opt = ServerOptimizer("fedadam", lr=0.05)
    policy = RoundPolicy(rounds=1, clients_per_round=CLIENTS, window_seconds=300, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=cfg, server_optimizer=opt,
                         max_client_weight=1.0, norm_bound_multiple=0.0)
    c = make_cluster(policy, task=task)
    c.run_clients(CLIENTS, seed=SEED, wait_s=0.5)
    assert c.scheduler.version == 1, c.scheduler.history[-1]

    # the simulation of the same clients, its model built from the same fields independently of the runtime
    model = ModelConfig(**MODELS[name]).build(64, 3)
    x = np.concatenate([cl[0] for cl in c.task.clients])
    y = np.concatenate([cl[1] for cl in c.task.clients])
    off = np.cumsum([0] + [len(cl[1]) for cl in c.task.clients])
    train = [np.arange(off[i], off[i + 1]) for i in range(CLIENTS)]
    strategy = FedAvg(FitConfig(cfg.epochs, cfg.batch_size, cfg.lr, cfg.prox_mu), opt, clients_per_round=CLIENTS)
    init = model.init_params(0)
    s = Simulation(model, strategy, x, y, train, [f"c{i}" for i in range(CLIENTS)], 3, seed=SEED)
    state, _ = s.run(1, s.init_state(init))
    assert sorted(c.scheduler.params) == sorted(state.params)
    got, want = _flat(c.scheduler.params), _flat(state.params)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.abs(want - _flat(init)).max() > 1e-3  # the round moved the model


def test_fedavg_grpc_config_carries_the_model_section():
    from fedarena.federated.config import TaskModelConfig
    from fedarena.federated.grpc_experiment import FedAvgGrpcConfig, _spec

    cfg = FedAvgGrpcConfig(model=TaskModelConfig(arch="cnn_emnist", widths=[2, 3], units=5))
    spec = _spec(cfg)
    assert spec.task.model["arch"] == "cnn_emnist" and spec.task.model["widths"] == [2, 3]
    assert _spec(FedAvgGrpcConfig()).task.model == {}  # the MLP, as before
    with pytest.raises(ValueError, match="trainer"):
        TaskModelConfig(arch="cnn_emnist", trainer="numpy")
