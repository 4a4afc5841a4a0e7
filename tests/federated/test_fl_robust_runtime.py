"""Robust aggregation in the gRPC runtime, chosen by name (``strategy.aggregation`` in a fedavg_grpc config): the rules
against independent oracles (numpy's median, scipy's trimmed mean, Krum by brute force) and the wiring from the
config to the scheduler."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedarena.federated.grpc_experiment import FedAvgGrpcConfig, _spec
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.strategy import robust_rule
from fedarena.platform.config import ConfigError, build


def _deltas(n=7, seed=0):
    rng = np.random.default_rng(seed)
    return [{"b": rng.normal(size=3), "w": rng.normal(size=(2, 3))} for _ in range(n)]


def _stacked(deltas, k):
    return np.stack([d[k] for d in deltas])


def test_median_and_trimmed_mean_equal_numpy_and_scipy():
    deltas = _deltas()
    weights = [1.0, 5.0, 2.0, 9.0, 1.0, 1.0, 3.0]  # unweighted rules: the weights must not matter
    med = robust_rule("median")(deltas, weights)
    trim = robust_rule("trimmed_mean", trim_fraction=0.3)(deltas, weights)
    for k in ("b", "w"):
        np.testing.assert_allclose(med[k], np.median(_stacked(deltas, k), axis=0), rtol=1e-12)
        np.testing.assert_allclose(trim[k], stats.trim_mean(_stacked(deltas, k), 0.3, axis=0), rtol=1e-12)
        assert med[k].shape == deltas[0][k].shape


def test_krum_picks_the_update_closest_to_its_neighbours_by_brute_force():
    deltas = _deltas(n=8, seed=3)
    deltas[5] = {k: v + 50.0 for k, v in deltas[5].items()}  # an outlier Krum must never pick
    f = 2
    flat = [np.concatenate([d["b"].ravel(), d["w"].ravel()]) for d in deltas]
    m = len(flat) - f - 2
    scores = []
    for i, x in enumerate(flat):
        dist = sorted(float(np.sum((x - y) ** 2)) for j, y in enumerate(flat) if j != i)
        scores.append(sum(dist[:m]))
    best = int(np.argmin(scores))
    got = robust_rule("krum", krum_byzantine=f)(deltas, [1.0] * len(deltas))
    assert best != 5
    for k in ("b", "w"):
        np.testing.assert_allclose(got[k], deltas[best][k], rtol=1e-12)


def test_the_config_names_the_rule_and_the_deployment_ships_it():
    spec = _spec(build(FedAvgGrpcConfig, {"data": {"dataset": "synthetic", "num_clients": 6},
                                          "strategy": {"aggregation": "trimmed_mean", "trim_fraction": 0.25}}))
    assert (spec.policy.aggregation, spec.policy.trim_fraction) == ("trimmed_mean", 0.25)
    # the deployment ships the policy as JSON to the scheduler process
    from fedarena.federated.deployment import spec_from_json

    assert spec_from_json(spec.to_json()).policy.aggregation == "trimmed_mean"


def test_a_scheduler_given_a_robust_policy_aggregates_with_it(make_cluster):
    policy = RoundPolicy(rounds=1, window_seconds=30, start_clients=4, aggregation="median",
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    c = make_cluster(policy)
    assert c.scheduler.aggregator is not None
    assert c.scheduler._plan()["collect_updates"]  # the servers are told to forward every individual delta
    deltas = _deltas(n=5, seed=9)
    got = c.scheduler.aggregator(deltas, [1.0] * 5)
    np.testing.assert_allclose(got["w"], np.median(_stacked(deltas, "w"), axis=0))


@pytest.mark.parametrize("fields, field", [
    ({"strategy": {"aggregation": "median"}, "privacy": {"secagg": {"enabled": True}}}, "strategy.aggregation"),
    ({"strategy": {"aggregation": "trimmed_mean", "trim_fraction": 0.6}}, "strategy.trim_fraction"),
    ({"strategy": {"aggregation": "krum", "krum_byzantine": -1}}, "strategy.krum_byzantine"),
])
def test_bad_robust_settings_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=field):
        build(FedAvgGrpcConfig, {"data": {"dataset": "synthetic", "num_clients": 6}, **fields})
