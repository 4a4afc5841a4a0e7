"""Every rule of the aggregation table (:data:`fedarena.federated.rules.AGGREGATION_RULES`, the built-in rules and
the defences registered beside them) runs in the simulation and in the gRPC runtime (``RoundPolicy``) on a tiny
task and gives the same global model in both after 3 rounds; this module registers nothing. The oracle is the
other runtime: the gRPC runtime trains on real clients over loopback gRPC and aggregates in its scheduler, the
simulation trains batched in-process and aggregates in :class:`~fedarena.federated.strategy.RobustAggregate`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated import rules
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import FitConfig, RobustAggregate, ServerOptimizer
from fedarena.federated.task import TaskSpec

SEED, CLIENTS, PER_ROUND, ROUNDS = 5, 5, 5, 3
TASK = TaskSpec(dataset="synthetic", num_clients=CLIENTS, hidden=(4,), trainer="engine", synthetic_features=6,
                synthetic_classes=3, synthetic_examples=200, alpha=0.5)
CFG = RoundConfig(epochs=1, batch_size=8, lr=0.2)
FIT = FitConfig(CFG.epochs, CFG.batch_size, CFG.lr)
DIM = 6 * 4 + 4 + 4 * 3 + 3
BUILT_IN = sorted(rules.AGGREGATION_RULES)  # at import: no test module has registered a rule yet


def _params(rule: str) -> dict:
    """Parameters a rule needs to run without server state: FLTrust's reference is a fixed direction here (the
    simulation's :class:`~fedarena.federated.defences.Defended` recomputes it from the root set each round)."""
    if rule == "fltrust":
        return {"reference": np.random.default_rng(1).normal(size=DIM)}
    return {}


def _flat(p):
    return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in sorted(p)])


def test_the_table_holds_the_defences():
    assert {"mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "centered_clipping",
            "bucketing", "norm_bound", "fltrust"} <= set(BUILT_IN)
    with pytest.raises(ValueError, match="^reference: FLTrust needs"):
        rules.aggregation_rule("fltrust")
    with pytest.raises(ValueError, match="^rule: bucketing's inner rule"):
        rules.aggregation_rule("bucketing", rule="bucketing")


@pytest.mark.parametrize("rule", BUILT_IN)
def test_every_table_rule_runs_in_the_simulation_and_the_grpc_runtime(rule, make_cluster):
    params = _params(rule)
    policy = RoundPolicy(rounds=ROUNDS, clients_per_round=PER_ROUND, window_seconds=120, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=CFG,
                         server_optimizer=ServerOptimizer(), aggregation=rule, rule_params=params,
                         max_client_weight=1.0, norm_bound_multiple=0.0)
    c = make_cluster(policy, task=TASK)
    c.run_clients(CLIENTS, seed=SEED, wait_s=0.5)
    assert c.scheduler.version == ROUNDS, c.scheduler.history[-1]
    task, runtime = c.task, c.scheduler.params
    x = np.concatenate([k[0] for k in task.clients])
    y = np.concatenate([k[1] for k in task.clients])
    off = np.cumsum([0] + [len(k[1]) for k in task.clients])
    train = [np.arange(off[i], off[i + 1]) for i in range(CLIENTS)]
    strategy = RobustAggregate(FIT, ServerOptimizer(), clients_per_round=PER_ROUND, rule=rule, rule_params=params)
    sim = Simulation(BatchedMLP(task.sizes), strategy, x, y, train, [f"c{i}" for i in range(CLIENTS)],
                     task.sizes[-1], seed=SEED)
    state, _ = sim.run(ROUNDS, sim.init_state(task.trainer.init_params(0)))
    a, b, init = _flat(state.params), _flat(runtime), _flat(task.trainer.init_params(0))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-6
    assert np.linalg.norm(b - init) > 1e-3 * np.linalg.norm(b)  # the rule moved the model
