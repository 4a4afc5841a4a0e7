"""Strategies against independent oracles (Flower's aggregation functions, closed forms, the numpy trainer)
and the batched (vmapped) local training against per-client training."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated import strategy as st
from fedarena.federated.simulation import BatchedMLP, Simulation, batch_plan, make_group_plan
from fedarena.federated.trainer import NumpyMLPTrainer


def _updates(n=9, seed=0, shapes=((3, 4), (4,))):
    rng = np.random.default_rng(seed)
    return [st.ClientUpdate(f"c{i}", {f"t{j}": rng.standard_normal(s) for j, s in enumerate(shapes)}, 10)
            for i in range(n)]


def _flower(updates):
    return [([u.delta[k] for k in sorted(u.delta)], u.num_examples) for u in updates]


def _state(updates):
    return st.RoundState(1, {k: np.zeros(v.shape, np.float64) for k, v in updates[0].delta.items()})


@pytest.mark.parametrize("rule,kw,oracle", [
    ("median", {}, lambda agg, r: agg.aggregate_median(r)),
    ("trimmed_mean", {"trim_fraction": 0.2}, lambda agg, r: agg.aggregate_trimmed_avg(r, 0.2)),
    ("krum", {"num_byzantine": 2}, lambda agg, r: agg.aggregate_krum(r, 2, 0)),
    ("krum", {"num_byzantine": 2, "krum_keep": 3}, lambda agg, r: agg.aggregate_krum(r, 2, 3)),
])
def test_robust_rules_match_flower(rule, kw, oracle):
    ups = _updates()
    ups[0] = st.ClientUpdate("c0", {k: v * 50 for k, v in ups[0].delta.items()}, 10)  # an outlier
    s = st.RobustAggregate(rule=rule, **kw).aggregate(_state(ups), ups, 9)
    want = oracle(pytest.importorskip("flwr.server.strategy.aggregate"), _flower(ups))
    for k, w in zip(sorted(s.params), want):
        np.testing.assert_allclose(s.params[k], w, rtol=1e-12, atol=1e-12)


@pytest.mark.quick
def test_fedavg_weighted_mean_and_example_count_bound():
    ups = [st.ClientUpdate("a", {"w": np.array([1.0, 0.0])}, 10), st.ClientUpdate("b", {"w": np.array([0.0, 1.0])}, 990)]
    st0 = st.RoundState(1, {"w": np.zeros(2)})
    np.testing.assert_allclose(st.FedAvg().aggregate(st0, ups, 2).params["w"], [0.01, 0.99])
    bounded = st.FedAvg(max_weight=10).aggregate(st0, ups, 2)
    np.testing.assert_allclose(bounded.params["w"], [0.5, 0.5])
    assert bounded.round == 2


def test_select_clients_is_the_schedulers_rule_and_validates_k():
    cands = [f"c{i}" for i in range(20)]
    want = sorted(np.random.default_rng([4, 7]).choice(sorted(cands), size=5, replace=False).tolist())
    assert st.select_clients(cands, 5, 4, 7) == want
    assert st.select_clients(cands, 0, 4, 7) == sorted(cands)
    with pytest.raises(ValueError, match="clients_per_round"):
        st.select_clients(cands, 21, 0, 1)


@pytest.mark.quick
def test_scaffold_server_update_closed_form():
    ups = [st.ClientUpdate("a", {"w": np.array([2.0])}, 5, control_delta={"w": np.array([1.0])}),
           st.ClientUpdate("b", {"w": np.array([4.0])}, 50, control_delta={"w": np.array([3.0])})]
    s0 = st.Scaffold(server_lr=0.5).init_state({"w": np.array([1.0])})
    s1 = st.Scaffold(server_lr=0.5).aggregate(s0, ups, 10)
    np.testing.assert_allclose(s1.params["w"], [1.0 + 0.5 * 3.0])  # x + eta_g mean(Delta y), unweighted
    np.testing.assert_allclose(s1.control["w"], [(1.0 + 3.0) / 10])  # c + |S|/N mean(Delta c) = sum / N


def test_client_accuracy_summary():
    s = st.client_accuracy_summary(np.arange(11) / 10)
    assert s == {"client_acc_mean": 0.5, "client_acc_p10": pytest.approx(0.1), "client_acc_worst": 0.0}


def _data(sizes, d=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, k, n)
    off = np.cumsum([0, *sizes])
    return x, y, [np.arange(off[i], off[i + 1]) for i in range(len(sizes))]


@pytest.mark.quick
@pytest.mark.parametrize("mu,caps", [(0.0, None), (0.5, [1, 100, 3, 2, 100])])
def test_batched_training_equals_per_client_numpy_training(mu, caps):
    """Clients of 3..23 examples (padding and masks, grouping), FedProx, and capped steps (partial work)."""
    sizes = [3, 23, 11, 7, 17]
    x, y, idx = _data(sizes)
    model = BatchedMLP((5, 6, 3))
    ref = NumpyMLPTrainer((5, 6, 3))
    params = ref.init_params(1)
    cfg = st.FitConfig(epochs=2, batch_size=4, lr=0.2, prox_mu=mu)
    plans, allowed, want = [], [], []
    for i, p in enumerate(idx):
        batches, epochs = batch_plan(len(p), cfg, np.random.default_rng([9, i]))
        plans.append((p, batches, epochs))
        cap = len(batches) if caps is None else min(caps[i], len(batches))
        allowed.append(cap)
        # oracle: the numpy trainer on exactly the first `cap` batches
        w = {k: v.copy() for k, v in params.items()}
        for b in batches[:cap]:
            b = b[b >= 0]
            _, g = ref.loss_and_grad(w, x[p][b], y[p][b])
            w = {k: (w[k] - cfg.lr * (g[k] + mu * (w[k] - params[k]))).astype(np.float32) for k in w}
        want.append(w)
    onehot = np.eye(3, dtype=np.float32)[y]
    got, _ = model.train_group(params, make_group_plan(plans, allowed, cfg.batch_size), x, onehot, cfg)
    assert all(v.shape[0] == len(sizes) for v in got.values())
    for i, w in enumerate(want):
        for k in w:
            np.testing.assert_allclose(got[k][i], w[k], rtol=2e-5, atol=2e-6)


def test_batch_plan_matches_engine_trainer_order_and_local_steps():
    cfg = st.FitConfig(epochs=2, batch_size=4)
    b, e = batch_plan(10, cfg, np.random.default_rng(0))
    rng = np.random.default_rng(0)
    want = []
    for _ in range(2):
        o = rng.permutation(10)
        want += [o[s: s + 4] for s in range(0, 10, 4)]
    assert len(b) == 6 and all(np.array_equal(p[p >= 0], q) for p, q in zip(b, want)) and list(e) == [0, 0, 0, 1, 1, 1]
    b, e = batch_plan(10, st.FitConfig(local_steps=7, batch_size=4), np.random.default_rng(0))
    assert len(b) == 7 and list(e) == [0, 0, 0, 1, 1, 1, 2]


def test_simulation_rejects_bad_client_setups():
    x, y, idx = _data([3, 4])
    with pytest.raises(ValueError, match="clients_per_round"):
        Simulation(BatchedMLP((5, 3)), st.FedAvg(clients_per_round=3), x, y, idx, ["a", "b"], 3)
    with pytest.raises(ValueError, match="partition: client b"):
        Simulation(BatchedMLP((5, 3)), st.FedAvg(), x, y, [idx[0], np.zeros(0, int)], ["a", "b"], 3)


def test_scaffold_in_simulation_keeps_c_the_mean_of_client_controls_and_corrects_local_steps():
    x, y, idx = _data([12, 9, 15, 7, 11, 10], d=5, k=3, seed=2)
    ids = [f"c{i}" for i in range(6)]
    fit = st.FitConfig(1, 4, 0.1)
    s = Simulation(BatchedMLP((5, 3)), st.Scaffold(fit, clients_per_round=3), x, y, idx, ids, 3, seed=4)
    state, recs = s.run(4)
    # c starts at 0 and moves by sum(Delta c_i) / N, so it always equals the mean of all N client controls
    for k in state.control:
        mean = sum(s.client_control.get(c, {k: np.zeros_like(state.control[k])})[k] for c in ids) / len(ids)
        np.testing.assert_allclose(state.control[k], mean, atol=1e-12)
    assert any(np.abs(v).max() > 0 for v in state.control.values())
    # one corrected local step against numpy: w - lr (grad + c - c_i)
    ref = NumpyMLPTrainer((5, 3))
    c = {k: np.full(v.shape, 0.3) for k, v in state.params.items()}
    ci = {k: np.full(v.shape, -0.1) for k, v in state.params.items()}
    mat, ep = batch_plan(len(idx[0]), st.FitConfig(local_steps=1, batch_size=4), np.random.default_rng(0))
    plan = make_group_plan([(idx[0], mat, ep)], [1], 4)
    got, _ = s.model.train_group(state.params, plan, x, np.eye(3, dtype=np.float32)[y], fit,
                                 [{k: c[k] - ci[k] for k in c}])
    _, g = ref.loss_and_grad({k: v.astype(np.float32) for k, v in state.params.items()}, x[idx[0][mat[0]]],
                             y[idx[0][mat[0]]])
    for k in g:
        np.testing.assert_allclose(got[k][0], state.params[k] - 0.1 * (g[k] + 0.4), rtol=1e-5, atol=1e-6)
