"""Aggregation: FedAvg against a brute-force weighted mean; server optimizers against Reddi et al. (2021) Alg. 2."""

import math

import numpy as np
import pytest

from fedarena.federated.strategy import PartialAggregate, ServerOptimizer


def _deltas(rng, n):
    return [{"w": rng.standard_normal((3, 2)).astype(np.float32), "b": rng.standard_normal(2).astype(np.float32)}
            for _ in range(n)]


def test_partial_aggregates_combine_to_the_global_weighted_mean():
    rng = np.random.default_rng(0)
    deltas = _deltas(rng, 7)
    counts = [5, 1, 30, 12, 7, 2, 9]
    # brute force: the example-weighted mean over all clients
    expect = {k: sum(c * d[k].astype(np.float64) for c, d in zip(counts, deltas)) / sum(counts) for k in ("w", "b")}
    # split the clients over three servers arbitrarily, aggregate partially, then combine
    parts = [PartialAggregate() for _ in range(3)]
    for i, (d, c) in enumerate(zip(deltas, counts)):
        parts[[0, 2, 1, 1, 0, 2, 2][i]].add(f"c{i}", d, c, loss=float(i))
    total = PartialAggregate()
    for p in parts:
        total.merge(p)
    got = total.mean_delta()
    for k in expect:
        np.testing.assert_allclose(got[k], expect[k], rtol=1e-12)
    assert sorted(total.clients) == sorted(f"c{i}" for i in range(7))
    assert total.loss_sum / total.weight == pytest.approx(sum(i * c for i, c in enumerate(counts)) / sum(counts))


def test_partials_refuse_double_counting_and_empty_means():
    a, b = PartialAggregate(), PartialAggregate()
    a.add("c1", {"w": np.ones(2)}, 3)
    b.add("c1", {"w": np.ones(2)}, 3)
    with pytest.raises(ValueError, match=r"clients: \['c1'\] appear in two"):
        a.merge(b)
    with pytest.raises(ValueError, match="no client contributed"):
        PartialAggregate().mean_delta()
    with pytest.raises(ValueError, match="num_examples"):
        a.add("c2", {"w": np.ones(2)}, 0)


def test_fedavg_step_applies_server_lr():
    x = {"w": np.array([1.0, 2.0], np.float32)}
    new, state = ServerOptimizer("fedavg", lr=0.5).step(x, {"w": np.array([2.0, -4.0])}, {})
    np.testing.assert_array_equal(new["w"], np.array([2.0, 0.0], np.float32))
    assert new["w"].dtype == np.float32 and state == {}


@pytest.mark.parametrize("name", ["fedadagrad", "fedadam", "fedyogi"])
def test_adaptive_server_optimizers_follow_algorithm_2(name):
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    opt = ServerOptimizer(name, lr=eta, beta1=b1, beta2=b2, tau=tau)
    rng = np.random.default_rng(3)
    x = {"w": rng.standard_normal(4).astype(np.float64)}
    state = opt.init(x)
    # independent scalar re-statement of the paper's update, element by element
    xs = [float(v) for v in x["w"]]
    ms = [0.0] * 4
    vs = [tau**2] * 4
    for _ in range(3):
        d = rng.standard_normal(4)
        x, state = opt.step(x, {"w": d}, state)
        for j in range(4):
            ms[j] = b1 * ms[j] + (1 - b1) * d[j]
            if name == "fedadagrad":
                vs[j] = vs[j] + d[j] ** 2
            elif name == "fedadam":
                vs[j] = b2 * vs[j] + (1 - b2) * d[j] ** 2
            else:
                s = int(float(vs[j]) > float(d[j]) ** 2) - int(float(vs[j]) < float(d[j]) ** 2)
                vs[j] = vs[j] - (1 - b2) * d[j] ** 2 * s
            xs[j] = xs[j] + eta * ms[j] / (math.sqrt(vs[j]) + tau)
        np.testing.assert_allclose(x["w"], xs, rtol=1e-12)


def test_server_optimizer_config_errors_name_the_field():
    with pytest.raises(ValueError, match="server_optimizer: unknown 'sgd'"):
        ServerOptimizer("sgd")
    with pytest.raises(ValueError, match="server_lr"):
        ServerOptimizer("fedavg", lr=0)
    with pytest.raises(ValueError, match="tau"):
        ServerOptimizer("fedadam", tau=0)
    with pytest.raises(ValueError, match="delta: names"):
        ServerOptimizer().step({"w": np.zeros(1)}, {"v": np.zeros(1)}, {})
