"""One poisoning client against the runtime's default mean, over real loopback gRPC.

The attack: a selected client registers the largest example count the servers allow and uploads a delta with a
norm just under the servers' fixed ``max_update_norm``. With the plain example-weighted mean it moved the model by
about a thousand honest steps; the default bounded mean (each weight capped at ``max_client_weight`` of the round's
total by water-filling, each delta clipped to ``norm_bound_multiple`` times the round's median norm) bounds it.
The oracles are closed forms: the water level ``L = c W_rest / (1 - c)`` for one capped client, and a bisection on
the cap's defining equation for :func:`cap_weights`.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.server import ServerOptions
from fedarena.federated.strategy import bounded_mean, cap_weights
from fedarena.federated.transport import RemoteError

HONEST = [f"h{i}" for i in range(7)]
MAX_NORM, MAX_EXAMPLES = 50.0, 1000


def _wait(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not reached")


def _body(c, cid, task, delta, n):
    return {"client_id": cid, "token": c.token(cid), "round": task["round"], "model_version": task["model_version"],
            "num_examples": n, "nonce": os.urandom(16), "encoding": "dense",
            "update": {k: np.asarray(v, np.float32) for k, v in delta.items()}, "train_loss": 0.5}


def _poisoned_round(make_cluster, **policy):
    """7 honest clients (10 examples, small deltas) and one attacker (1000 examples, norm just under the bound)."""
    pol = RoundPolicy(rounds=1, window_seconds=120, start_clients=8, min_fraction=1.0,
                      round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1), **policy)
    c = make_cluster(pol, n_servers=1, server_options=ServerOptions(sync_wait_s=0.2, max_update_norm=MAX_NORM,
                                                                    max_examples=MAX_EXAMPLES))
    p = c.peer(0)
    for cid in HONEST:
        p.call("register", {"client_id": cid, "token": c.token(cid), "num_examples": 10})
    p.call("register", {"client_id": "mallory", "token": c.token("mallory"), "num_examples": MAX_EXAMPLES})
    _wait(lambda: c.scheduler.phase == "open")
    task = p.call("get_task", {"client_id": "mallory", "token": c.token("mallory"), "have_version": -1,
                               "wait_s": 5.0}).body
    init = {k: np.asarray(v, np.float64) for k, v in task["params"].items()}
    rng = np.random.default_rng(0)
    honest = {cid: {k: rng.normal(0.01, 0.01, v.shape) for k, v in init.items()} for cid in HONEST}
    size = sum(v.size for v in init.values())
    evil = {k: np.full(v.shape, 0.999 * MAX_NORM / np.sqrt(size)) for k, v in init.items()}
    for cid in HONEST:
        t = p.call("get_task", {"client_id": cid, "token": c.token(cid), "have_version": task["model_version"],
                                "wait_s": 5.0}).body
        assert p.call("upload", _body(c, cid, t, honest[cid], 10)).kind == "ack"
    with pytest.raises(RemoteError) as info:  # claiming more than it registered is refused; the server serves on
        p.call("upload", _body(c, "mallory", task, evil, MAX_EXAMPLES + 1))
    assert info.value.code == "too_many_examples"
    assert p.call("upload", _body(c, "mallory", task, evil, MAX_EXAMPLES)).kind == "ack"
    _wait(lambda: c.scheduler.version == 1)
    with c.scheduler.cond:
        got = {k: np.asarray(v, np.float64) - init[k] for k, v in c.scheduler.params.items()}
        row = dict(c.scheduler.history[0])
    honest_mean = {k: np.mean([honest[cid][k].astype(np.float32) for cid in HONEST], axis=0) for k in init}
    return got, honest_mean, honest, evil, row


def _norm(d):
    return float(np.sqrt(sum(np.sum(np.square(v)) for v in d.values())))


def test_one_poisoning_upload_moves_the_default_mean_by_less_than_one_honest_step(make_cluster):
    got, honest_mean, honest, evil, row = _poisoned_round(make_cluster)
    # oracle: the attacker's weight 1000 against 7 x 10 is cut to L = c W_rest / (1 - c); its delta is clipped to
    # k times the median norm of the 8 deltas
    c, k = 0.25, 3.0
    level = c * 70 / (1 - c)
    h32 = {cid: {n: v.astype(np.float32).astype(np.float64) for n, v in d.items()} for cid, d in honest.items()}
    e32 = {n: v.astype(np.float32).astype(np.float64) for n, v in evil.items()}
    norms = [_norm(d) for d in h32.values()] + [_norm(e32)]
    bound = k * float(np.median(norms))
    want = {n: (sum(10 * h32[cid][n] for cid in HONEST) + level * e32[n] * bound / _norm(e32)) / (70 + level)
            for n in got}
    for n in got:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-6)  # float32 model
    assert row["weight_capped"] == 1 and row["norm_clipped"] == 1 and row["norm_bound"] == pytest.approx(bound)
    moved = _norm({n: got[n] - honest_mean[n] for n in got}) / _norm(honest_mean)
    assert moved < 1.0  # bounded by c k median norms
    print(f"default mean: the attacker moved the model {moved:.3g} x the honest step")


def test_the_plain_weighted_mean_is_what_the_attack_breaks(make_cluster):
    # the check that the attack is real: with the cap and the clipping off, the same upload dominates the round
    got, honest_mean, *_ = _poisoned_round(make_cluster, max_client_weight=1.0, norm_bound_multiple=0.0)
    moved = _norm({n: got[n] - honest_mean[n] for n in got}) / _norm(honest_mean)
    assert moved > 100
    print(f"plain mean: the attacker moved the model {moved:.4g} x the honest step")


@pytest.mark.parametrize("seed", range(6))
def test_cap_weights_matches_the_water_level_found_by_bisection(seed):
    rng = np.random.default_rng(seed)
    w = rng.pareto(1.0, size=rng.integers(5, 30)) + 0.1
    cap = float(rng.uniform(1.5 / w.size, 0.5))
    got = cap_weights(w, cap)
    # oracle: L solves L = cap * sum(min(w, L)) (the largest root); bisection on that equation
    lo, hi = 0.0, float(w.max())
    if w.max() <= cap * w.sum():
        level = hi
    else:
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cap * np.minimum(w, mid).sum() >= mid else (lo, mid)
        level = lo
    np.testing.assert_allclose(got, np.minimum(w, level), rtol=1e-9)
    assert got.max() <= cap * got.sum() * (1 + 1e-12)
    np.testing.assert_allclose(cap_weights([5.0, 1.0, 1.0], 0.25), [7 / 3] * 3)  # cap * n <= 1: equal weights


def test_bounded_mean_is_the_weighted_mean_when_nothing_binds():
    rng = np.random.default_rng(1)
    deltas = [{"w": rng.normal(size=(3, 2))} for _ in range(6)]
    weights = [1.0, 2.0, 1.0, 1.5, 1.0, 1.2]  # at most 0.26 of the total
    mean, info = bounded_mean(deltas, weights, 0.3, 10.0)
    np.testing.assert_allclose(mean["w"], np.average([d["w"] for d in deltas], axis=0, weights=weights))
    assert info["norm_clipped"] == 0 and info["weight_capped"] == 0


def test_policy_fields_are_checked():
    with pytest.raises(ValueError, match=r"^max_client_weight: must lie in \(0, 1\]"):
        RoundPolicy(max_client_weight=0.0)
    with pytest.raises(ValueError, match=r"^norm_bound_multiple: must be 0 \(off\) or >= 1"):
        RoundPolicy(norm_bound_multiple=0.5)


def test_registration_fixes_the_example_count(make_cluster):
    c = make_cluster(n_servers=1)
    p = c.peer(0)
    p.call("register", {"client_id": "a", "token": c.token("a"), "num_examples": 20})
    p.call("register", {"client_id": "a", "token": c.token("a"), "num_examples": 12})  # lowering is fine
    with pytest.raises(RemoteError) as info:
        p.call("register", {"client_id": "a", "token": c.token("a"), "num_examples": 13})
    assert (info.value.code, info.value.field) == ("too_many_examples", "body.num_examples")
    assert "registered 12 examples" in info.value.reason
    assert p.call("ping", {}).kind == "pong"  # the server keeps serving
