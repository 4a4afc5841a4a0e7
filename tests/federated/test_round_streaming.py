"""A simulated round without the ``(n, d)`` float64 matrices: the update divergence from running sums equals the
two-pass formula over the stacked updates, and a linear strategy's round from the running weighted sum
(``aggregate_partial``) gives the model of its ``aggregate`` over the list of updates."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated.simulation import BatchedMLP, Simulation, UpdateDivergence
from fedarena.federated.strategy import ClientUpdate, FedAvg, FitConfig, ServerOptimizer


def _two_pass(flat: np.ndarray) -> float:
    """The divergence as the simulation computed it before (the stacked matrix, its mean, the deviations)."""
    mean = flat.mean(0)
    return float(((flat - mean) ** 2).sum(1).mean() / max((mean ** 2).sum(), 1e-30))


@pytest.mark.parametrize("offset", [0.0, 3.0, 300.0])  # 300: updates far from zero, small spread (cancellation)
def test_running_divergence_equals_the_stacked_formula(offset):
    rng = np.random.default_rng(4)
    updates = [{"w": rng.normal(size=(5, 7)) + offset, "b": rng.normal(size=3) * 0.1 + offset} for _ in range(13)]
    div = UpdateDivergence()
    for u in updates:
        div.add(u)
    flat = np.stack([np.concatenate([u[k].ravel() for k in sorted(u)]) for u in updates])
    assert div.value() == pytest.approx(_two_pass(flat), rel=1e-9)
    one = UpdateDivergence()
    one.add(updates[0])
    assert np.isnan(one.value())


def test_a_linear_round_from_running_sums_is_fedavgs_aggregate():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 5)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    train = [np.arange(i * 20, i * 20 + 10 + 2 * i) for i in range(8)]  # unequal sizes: the weights matter
    ids = [f"c{i}" for i in range(8)]
    strategy = FedAvg(FitConfig(1, 4, 0.2), ServerOptimizer("fedadam", lr=0.05), clients_per_round=6)
    sim = Simulation(BatchedMLP((5, 4, 2)), strategy, x, y, train, ids, 2, seed=1)
    assert sim._sums_suffice()
    state = sim.init_state()
    new, rec = sim.round(state)
    # the oracle: the same round's uploads aggregated by FedAvg.aggregate over the list of updates
    fit = strategy.configure(1, state)
    local, deltas, losses, _ = sim._train(state.params, rec.reporting, 1, fit, None)
    ups = [ClientUpdate(c, {k: np.asarray(v, np.float64) for k, v in deltas[c].items()}, len(train[int(c[1:])]),
                        losses[c]) for c in rec.reporting]
    want = strategy.aggregate(state, ups, 8)
    for k in want.params:
        np.testing.assert_allclose(new.params[k], want.params[k], rtol=1e-6, atol=1e-7)
    flat = np.stack([np.concatenate([u.delta[k].ravel() for k in sorted(u.delta)]) for u in ups])
    assert rec.metrics["update_divergence"] == pytest.approx(_two_pass(flat), rel=1e-9)
    assert rec.metrics["train_loss"] == pytest.approx(np.mean([u.loss for u in ups]))
