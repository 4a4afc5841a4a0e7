"""Execution settings of the simulation: chunked client stacking (``max_stacked_clients``), math-library threads
(``threads``, checked against threadpoolctl's own report) and the Ray backend's work-balanced assignment, each
against the unchunked in-process run as the oracle, bit for bit (the model here is small enough that the
engine's size-dependent rewrites of sums, which can change the rounding of larger stacks, do not apply), and
LPT against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.ray_backend import lpt_assign


def _problem(n_clients=14, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [4 + (i * 7) % 19 for i in range(n_clients)]
    x = rng.standard_normal((sum(sizes), 6)).astype(np.float32)
    y = rng.integers(0, 3, sum(sizes))
    off = np.cumsum([0, *sizes])
    train = [np.arange(off[i], off[i + 1]) for i in range(n_clients)]
    return x, y, train, [f"c{i}" for i in range(n_clients)]


def _simulate(strategy, rounds=3, **kw):
    x, y, train, ids = _problem()
    s = sim.Simulation(sim.BatchedMLP((6, 5, 3)), strategy, x, y, train, ids, 3, seed=1, **kw)
    state, records = s.run(rounds)
    return state, records, s


@pytest.mark.parametrize("strategy", [st.FedAvg(st.FitConfig(2, 4, 0.1), clients_per_round=10),
                                      st.fedprox(0.1, st.FitConfig(1, 3, 0.1), clients_per_round=10),
                                      st.Scaffold(st.FitConfig(1, 4, 0.1), clients_per_round=10)],
                         ids=["fedavg", "fedprox", "scaffold"])
def test_chunked_stacking_equals_one_stack(strategy):
    ref, ref_rec, _ = _simulate(strategy)
    for chunk in (1, 3, 4):
        got, rec, _ = _simulate(strategy, max_stacked_clients=chunk)
        for k in ref.params:
            np.testing.assert_array_equal(got.params[k], ref.params[k])
        assert [r.metrics["train_loss"] for r in rec] == [r.metrics["train_loss"] for r in ref_rec]


def test_chunk_bounds_the_stack_size(monkeypatch):
    seen = []
    orig = sim.BatchedModel.train_group

    def spy(self, params, plan, *a, **kw):
        seen.append(plan.index.shape[0])
        return orig(self, params, plan, *a, **kw)

    monkeypatch.setattr(sim.BatchedModel, "train_group", spy)
    _simulate(st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=10), rounds=1, max_stacked_clients=3)
    assert seen and max(seen) == 3 and sum(seen) >= 10
    seen.clear()
    _simulate(st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=10), rounds=1)
    assert max(seen) > 3


def test_threads_limit_the_math_library_during_training(monkeypatch):
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("no BLAS library seen by threadpoolctl")
    seen = []
    orig = sim.BatchedModel.train_group

    def spy(self, *a, **kw):
        seen.append({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
        return orig(self, *a, **kw)

    monkeypatch.setattr(sim.BatchedModel, "train_group", spy)
    before = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    a, _, _ = _simulate(st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=10), rounds=1, threads=1)
    assert seen and all(s == {1} for s in seen)
    assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == before  # restored
    with pytest.raises(ValueError, match="threads"):
        _simulate(st.FedAvg(st.FitConfig(1, 4, 0.1)), threads=-1)
    with pytest.raises(ValueError, match="max_stacked_clients"):
        _simulate(st.FedAvg(st.FitConfig(1, 4, 0.1)), max_stacked_clients=-2)


def _makespan(work, assign, m):
    load = [0.0] * m
    for w, a in zip(work, assign):
        load[a] += w
    return max(load)


def test_lpt_within_graham_bound_of_brute_force():
    from itertools import product

    rng = np.random.default_rng(3)
    for _ in range(20):
        work = rng.integers(1, 20, 7).tolist()
        m = 3
        best = min(_makespan(work, a, m) for a in product(range(m), repeat=len(work)))
        got = _makespan(work, lpt_assign(work, m), m)
        assert best <= got <= (4 / 3 - 1 / (3 * m)) * best + 1e-9
    # equal work: every worker gets a share, and the first job goes to the round's start worker
    assert sorted(lpt_assign([5] * 4, 2)) == [0, 0, 1, 1]
    assert lpt_assign([5] * 4, 2, start=1)[0] == 1
    assert lpt_assign([5] * 4, 2, home=[1, 1, 0, 0]) == [1, 0, 0, 1]


def test_ray_backend_spreads_the_round_and_equals_in_process(ray_session):
    strategy = st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=10)
    ref, _, _ = _simulate(strategy)
    got, _, s = _simulate(strategy, backend="ray", ray_workers=2, max_stacked_clients=4, ray_groups_per_task=0)
    try:
        for k in ref.params:
            np.testing.assert_array_equal(got.params[k], ref.params[k])
        r = s._remote
        # every shard holds exactly its home clients' examples, put once
        shard_sizes = [sum(len(t) for i, t in enumerate(s.train) if r.home[i] == w) for w in range(2)]
        assert sum(shard_sizes) == len(s.x) and min(shard_sizes) > 0
        # a round with equal step counts is split evenly over both actors
        owner = r.assign(list(range(10)), [3] * 10, rnd=1)
        assert sorted(owner.count(w) for w in range(2)) == [5, 5]
    finally:
        s._remote.close()
