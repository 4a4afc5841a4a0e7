"""Malicious clients of the gRPC runtime: an attacker sees only its own data and update. A sign-flipping and a
backdooring coalition (real FLClients over loopback gRPC) give the global model of the simulation with the same
coalition planted by :class:`~fedarena.federated.attacks.Attacked` (the oracle: these attacks use no honest update,
so what the coalition sees in the simulation does not change them); the attacks built on the honest updates are
refused by the ``fedavg_grpc`` config in one line."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedarena.federated.attacks import client_attack
from fedarena.federated.config import AttackConfig
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import FedAvg, FitConfig, ServerOptimizer
from fedarena.federated.task import TaskSpec

SEED, CLIENTS, ROUNDS = 2, 5, 3
TASK = TaskSpec(dataset="synthetic", num_clients=CLIENTS, hidden=(6,), trainer="engine", synthetic_features=64,
                synthetic_classes=3, synthetic_examples=250, alpha=0.5)
CFG = RoundConfig(epochs=1, batch_size=8, lr=0.1)
TASK_CLASSES = 3


def _flat(p):
    return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in sorted(p)])


@pytest.mark.parametrize("attack", [AttackConfig("sign_flip", num_attackers=2, scale=3.0),
                                    AttackConfig("backdoor", num_attackers=2, target=1, boost=2.5)])
def test_malicious_grpc_clients_give_the_simulations_attacked_model(attack, make_cluster):
    policy = RoundPolicy(rounds=ROUNDS, clients_per_round=CLIENTS, window_seconds=120, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=CFG,
                         server_optimizer=ServerOptimizer(), max_client_weight=1.0, norm_bound_multiple=0.0)
    c = make_cluster(policy, task=TASK)
    members = attack.coalition(CLIENTS, SEED)
    spec = {"kind": attack.kind, "params": attack.attack_params(), "clients": members, "num_updates": CLIENTS,
            "server_lr": 1.0, "seed": SEED}
    from fedarena.federated.client import ClientOptions, FLClient

    clients = []
    for i in range(CLIENTS):
        a, x, y = client_attack(spec, i, TASK_CLASSES, *c.task.clients[i])
        assert (a is not None) == (i in members)
        clients.append(FLClient(f"c{i}", c.token(f"c{i}"), c.address, (x, y), c.task.trainer, ClientOptions(seed=SEED),
                                attack=a))
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for cl in clients:
        cl.close()
    assert c.scheduler.version == ROUNDS, c.scheduler.history[-1]
    # the oracle: the simulation with the coalition planted by the same config
    x = np.concatenate([k[0] for k in c.task.clients])
    y = np.concatenate([k[1] for k in c.task.clients])
    off = np.cumsum([0] + [len(k[1]) for k in c.task.clients])
    train = [np.arange(off[i], off[i + 1]) for i in range(CLIENTS)]
    ids = [f"c{i}" for i in range(CLIENTS)]
    plan = attack.build(ids, TASK_CLASSES, SEED)
    assert plan.attacker_ids == {f"c{i}" for i in members}
    px, py, ptrain = plan.data(x, y, train, ids)
    strategy = plan.strategy(FedAvg(FitConfig(CFG.epochs, CFG.batch_size, CFG.lr), clients_per_round=CLIENTS))
    sim = Simulation(BatchedMLP(c.task.sizes), strategy, px, py, ptrain, ids, TASK_CLASSES, seed=SEED)
    state, _ = sim.run(ROUNDS, sim.init_state(c.task.trainer.init_params(0)))
    a, b = _flat(state.params), _flat(c.scheduler.params)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-6
    honest = Simulation(BatchedMLP(c.task.sizes), FedAvg(FitConfig(CFG.epochs, CFG.batch_size, CFG.lr),
                                                         clients_per_round=CLIENTS), x, y, train, ids,
                        TASK_CLASSES, seed=SEED)
    clean, _ = honest.run(ROUNDS, honest.init_state(c.task.trainer.init_params(0)))
    assert np.linalg.norm(_flat(clean.params) - b) > 1e-2 * np.linalg.norm(b)  # the attack changed the model



@pytest.mark.parametrize("kind", ["alie", "ipm", "min_max", "min_sum"])
def test_attacks_on_the_honest_updates_are_refused_by_the_grpc_kind(kind):
    from fedarena.federated.grpc_experiment import FedAvgGrpcConfig

    with pytest.raises(ValueError) as e:
        FedAvgGrpcConfig(kind="fedavg_grpc", attack=AttackConfig(kind, num_attackers=2))
    msg = str(e.value)
    assert msg.startswith(f"attack.kind: {kind} is computed from the round's honest updates") and "\n" not in msg
