"""The defences against independent computations: centered clipping's fixed point and one step by hand,
bucketing as the rule of hand-made bucket means, the adaptive norm bound and FLTrust by hand, the simulation's
defended round, and the config's one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated.attacks import AttackConfig
from fedarena.federated.defences import (Defended, DefenceConfig, RootSet, adaptive_norm_bound, bucketing,
                                         centered_clipping, fltrust)
from fedarena.federated.simulation import BatchedMLP, Simulation
from fedarena.federated.strategy import ClientUpdate, FedAvg, FitConfig

RNG = np.random.default_rng(3)
X = RNG.normal(size=(9, 4))
W = RNG.uniform(1, 5, size=9)


def test_centered_clipping_one_step_by_hand():
    center = np.array([0.5, -0.5, 0.0, 1.0])
    tau = 1.2
    steps = []
    for x in X:
        d = x - center
        n = np.sqrt(np.sum(d ** 2))
        steps.append(d if n <= tau else d * tau / n)
    want = center + np.mean(steps, axis=0)
    np.testing.assert_allclose(centered_clipping(X, W, tau=tau, center=center), want, rtol=1e-12)
    # a radius larger than every distance gives the plain (unweighted) mean in one step
    np.testing.assert_allclose(centered_clipping(X, W, tau=1e6, center=center), X.mean(0), rtol=1e-12)


def test_centered_clipping_converges_to_its_fixed_point():
    x = np.vstack([X, [[40.0, -40.0, 40.0, 40.0]]])  # one far outlier
    v = centered_clipping(x, np.ones(len(x)), tau=0.8, iterations=500)
    d = x - v
    n = np.linalg.norm(d, axis=1)
    residual = (d * np.minimum(1, 0.8 / n)[:, None]).sum(0)
    assert np.linalg.norm(residual) < 1e-8
    # the outlier moves the fixed point by at most tau / n per step; it stays near the honest cloud
    assert np.linalg.norm(v - X.mean(0)) < 1.0


def test_bucketing_is_the_rule_of_bucket_means_of_a_seeded_permutation():
    perm = np.random.default_rng([7, 2]).permutation(9)
    buckets = [perm[0:2], perm[2:4], perm[4:6], perm[6:8], perm[8:9]]
    means = np.stack([X[b].mean(0) for b in buckets])
    got = bucketing(X, W, bucket_size=2, rule="median", seed=[7, 2])
    np.testing.assert_allclose(got, np.median(means, axis=0), rtol=1e-12)
    # the inner rule is the table's, with its parameters; a bucket weighs the sum of its members' weights
    bw = np.array([W[b].sum() for b in buckets])
    np.testing.assert_allclose(bucketing(X, W, bucket_size=2, rule="mean", seed=[7, 2]), bw @ means / bw.sum(),
                               rtol=1e-12)
    np.testing.assert_allclose(bucketing(X, W, bucket_size=2, rule="centered_clipping", rule_params={"tau": 0.3},
                                         seed=[7, 2]), centered_clipping(means, bw, tau=0.3), rtol=1e-12)
    # bucket size 1 is the rule itself
    np.testing.assert_allclose(bucketing(X, W, bucket_size=1, rule="median", seed=0), np.median(X, axis=0))
    with pytest.raises(ValueError, match="^aggregation: unknown 'mode'"):
        bucketing(X, W, rule="mode")


def test_adaptive_norm_bound_by_hand():
    norms = np.linalg.norm(X, axis=1)
    bound = 1.5 * np.median(norms)
    clipped = X * np.minimum(1, bound / norms)[:, None]
    want = (W[:, None] * clipped).sum(0) / W.sum()
    np.testing.assert_allclose(adaptive_norm_bound(X, W, multiple=1.5), want, rtol=1e-12)


def test_fltrust_by_hand():
    g0 = np.array([1.0, 0.0, 0.0])
    g = np.array([[2.0, 2.0, 0.0], [0.0, 0.0, 5.0], [-1.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    # cosines with g0: 1/sqrt2, 0, -1/sqrt2, 1 -> trust 1/sqrt2, 0, 0, 1; rescaled to ||g0|| = 1
    ts = np.array([1 / np.sqrt(2), 0, 0, 1])
    rescaled = np.array([[1 / np.sqrt(2), 1 / np.sqrt(2), 0], [0, 0, 1], [-1 / np.sqrt(2), 1 / np.sqrt(2), 0],
                         [1, 0, 0]])
    want = (ts[:, None] * rescaled).sum(0) / ts.sum()
    np.testing.assert_allclose(fltrust(g, np.ones(4), reference=g0), want, rtol=1e-12)
    np.testing.assert_allclose(fltrust(-g[[0, 3]], np.ones(2), reference=g0), 0.0)  # nobody trusted
    with pytest.raises(ValueError, match="^reference: "):
        fltrust(g, np.ones(4))


def _update(cid, vec):
    return ClientUpdate(cid, {"w": vec.astype(np.float64)}, 10)


def test_defended_centers_on_the_previous_aggregate():
    inner = FedAvg(fit=FitConfig(), clients_per_round=3)
    strategy = DefenceConfig("centered_clipping", tau=0.5).build(inner)
    state = strategy.init_state({"w": np.zeros(2, np.float32)})
    r1 = [_update("a", np.array([1.0, 0.0])), _update("b", np.array([0.0, 1.0])), _update("c", np.array([9.0, 9.0]))]
    s1 = strategy.aggregate(state, r1, 3)
    v1 = centered_clipping(np.stack([u.delta["w"] for u in r1]), np.ones(3), tau=0.5)
    np.testing.assert_allclose(s1.params["w"], v1, rtol=1e-6)
    r2 = [_update("a", np.array([0.2, 0.1])), _update("b", np.array([0.1, 0.3])), _update("c", np.array([5.0, 0.0]))]
    s2 = strategy.aggregate(s1, r2, 3)
    v2 = centered_clipping(np.stack([u.delta["w"] for u in r2]), np.ones(3), tau=0.5, center=v1)
    np.testing.assert_allclose(s2.params["w"], v1 + v2, rtol=1e-6)
    assert s2.round == 3


def test_cc_bucketing_and_fltrust_run_in_the_simulation_against_an_attack():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    ids = [f"c{i}" for i in range(10)]
    train = [np.arange(i * 30, (i + 1) * 30) for i in range(10)]
    model = BatchedMLP((6, 2))
    root = RootSet(model, x[300:340], y[300:340], 2)
    plan = AttackConfig("ipm", num_attackers=2, epsilon=20.0).build(ids, 2, 0)  # reverses the plain mean
    accs = {}
    for name, cfg in [("fedavg", DefenceConfig()), ("cc", DefenceConfig("bucketing", tau=0.1)),
                      ("fltrust", DefenceConfig("fltrust", root_size=40))]:
        strategy = plan.strategy(cfg.build(FedAvg(fit=FitConfig(1, 10, 0.1), clients_per_round=10), root=root))
        sim = Simulation(model, strategy, x, y, train, ids, 2, test=(x[340:], y[340:]), eval_clients=False,
                         eval_every=20)
        _, recs = sim.run(20)
        accs[name] = recs[-1].metrics["test_acc"]
    # honest update norms here are 0.06-0.3: tau = 0.1 caps the two attackers' pull below the honest one
    assert accs["fedavg"] < 0.3 and accs["cc"] > 0.7 and accs["fltrust"] > 0.9, accs


@pytest.mark.parametrize("kw, field", [
    (dict(kind="fltrust"), "root_size"),
    (dict(kind="cc"), "kind"),
    (dict(kind="centered_clipping", tau=0.0), "tau"),
    (dict(kind="bucketing", bucket_size=0), "bucket_size"),
    (dict(kind="bucketing", bucket_rule="mode"), "bucket_rule"),
    (dict(kind="norm_bound", norm_multiple=-1.0), "norm_multiple"),
])
def test_defence_config_errors_are_one_line_naming_the_field(kw, field):
    with pytest.raises(ValueError) as e:
        DefenceConfig(**kw)
    assert str(e.value).startswith(field + ":") and "\n" not in str(e.value)


def test_fltrust_without_the_root_set_is_one_line():
    with pytest.raises(ValueError) as e:
        DefenceConfig("fltrust", root_size=40).build(FedAvg())
    assert str(e.value).startswith("root_size:") and "\n" not in str(e.value)
    assert isinstance(DefenceConfig("norm_bound").build(FedAvg()), Defended)


# ----------------------------------------------------------------------------- brute force: CC + bucketing over rounds


def _brute_cc(points, weights, center, tau, iterations, quantile):
    """Centered clipping written out element by element (lists, no numpy reductions): the radius is ``tau``, or
    the ``quantile`` of the distances from ``center`` by linear interpolation between the sorted distances; point
    ``i`` counts ``weights[i] / sum(weights)``."""
    d = len(center)
    v = [float(c) for c in center]
    dist = [sum((float(p[j]) - v[j]) ** 2 for j in range(d)) ** 0.5 for p in points]
    if quantile > 0:
        s = sorted(dist)
        pos = quantile * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        tau = s[lo] + (pos - lo) * (s[hi] - s[lo])
    for _ in range(iterations):
        step = [0.0] * d
        for k, p in enumerate(points):
            diff = [float(p[j]) - v[j] for j in range(d)]
            norm = sum(t * t for t in diff) ** 0.5
            c = 1.0 if norm <= tau else tau / norm
            for j in range(d):
                step[j] += c * diff[j] * weights[k] / sum(weights)
        v = [v[j] + step[j] for j in range(d)]
    return v


@pytest.mark.parametrize("tau, iterations, quantile, beta, weighted", [
    (0.4, 1, 0.0, 0.0, False), (0.4, 3, 0.0, 0.0, False), (0.15, 1, 0.5, 0.0, False), (0.15, 2, 0.3, 0.9, False),
    (0.4, 1, 0.0, 0.0, True), (0.15, 2, 0.5, 0.9, True)])
def test_cc_bucketing_rounds_match_a_brute_force_reimplementation(tau, iterations, quantile, beta, weighted):
    """Four rounds of the defended strategy (bucketing s = 2 of the client-id-sorted updates by the permutation
    of ``(seed, round)``, CC of the bucket means around the centre, the server's step, the next centre) against
    the same written out by hand; an attacker's far update is in every round, the clients' example counts
    differ (``weighted``: bucket means and CC weighted by them, a bucket weighing its members' sum)."""
    rng = np.random.default_rng(11)
    cfg = DefenceConfig("bucketing", tau=tau, iterations=iterations, bucket_size=2, weighted=weighted)
    strategy = cfg.build(FedAvg(fit=FitConfig(), clients_per_round=7), seed=5)
    strategy.params["rule_params"]["tau_quantile"] = quantile
    strategy.center_momentum = beta
    counts = {f"c{i}": 3 + 5 * i for i in range(7)}
    state = strategy.init_state({"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)})
    params = [0.0] * 7
    center = None
    for rnd in range(1, 5):
        ids = [f"c{i}" for i in rng.permutation(7)]  # arrival order is not the rule's order
        vecs = {cid: rng.normal(size=7) * 0.3 + 0.1 for cid in ids}
        vecs["c3"] = np.full(7, -20.0)
        ups = [ClientUpdate(c, {"a": vecs[c][:4].reshape(2, 2), "b": vecs[c][4:]}, counts[c]) for c in ids]
        state = strategy.aggregate(state, ups, 7)
        # by hand: rows in sorted id order, tensors "a" then "b" (sorted names)
        rows = [vecs[c] for c in sorted(ids)]
        perm = np.random.default_rng([5, rnd]).permutation(7)
        ws = [counts[c] for c in sorted(ids)]
        buckets = [list(perm[i: i + 2]) for i in range(0, 7, 2)]
        bw = [sum(ws[k] for k in b) for b in buckets]
        if weighted:
            means = [[sum(ws[k] * float(rows[k][j]) for k in b) / sum(ws[k] for k in b) for j in range(7)]
                     for b in buckets]
        else:
            means = [[sum(float(rows[k][j]) for k in b) / len(b) for j in range(7)] for b in buckets]
        agg = _brute_cc(means, bw if weighted else [1.0] * len(means), [0.0] * 7 if center is None else center,
                        tau, iterations, quantile)
        params = [params[j] + agg[j] for j in range(7)]
        center = agg if center is None or beta == 0 else [beta * center[j] + (1 - beta) * agg[j] for j in range(7)]
        got = np.concatenate([state.params["a"].ravel(), state.params["b"].ravel()])
        np.testing.assert_allclose(got, params, rtol=1e-5, atol=1e-6)


def test_cc_tau_quantile_bounds_the_radius_by_an_honest_distance():
    honest = RNG.normal(size=(8, 4)) * 0.1
    far = np.full((3, 4), 50.0)  # 3 of 11 Byzantine: the median distance is an honest one
    v = centered_clipping(np.vstack([honest, far]), np.ones(11), tau=1.0, center=np.zeros(4), tau_quantile=0.5)
    r = np.quantile(np.linalg.norm(np.vstack([honest, far]), axis=1), 0.5)
    assert r <= np.linalg.norm(honest, axis=1).max()
    assert np.linalg.norm(v) <= r + 1e-12  # one iteration from 0 moves by at most the radius
    with pytest.raises(ValueError, match="^tau_quantile: "):
        centered_clipping(honest, np.ones(8), tau_quantile=1.5)
