"""Attacks on the FL runtime by hostile participants, on real loopback gRPC (issue 17, findings 1, 3, 4, 6, 11).

Each test performs the attack through the nodes' public requests (a hand-driven client speaking the protocol)
and asserts the fixed behaviour: the attacked round is abandoned cleanly and the next one opens, the global model
is unchanged by the attacker, the error names the field, and the stored state keeps every round.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from fedarena.federated.client import FLClient
from fedarena.federated.protocol import RoundConfig, model_bytes
from fedarena.federated.scheduler import RoundPolicy, load_state
from fedarena.federated.secure_round import capacity, fixed_point_scale, run_client, secagg_params, threshold
from fedarena.federated.server import ServerOptions
from fedarena.federated.task import TaskSpec
from fedarena.federated.transport import RemoteError
from fedarena.privacy.secagg.messages import UnmaskShares


def wait_until(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not reached")


def _register(peer, c, cid, n=10):
    return peer.call("register", {"client_id": cid, "token": c.token(cid), "num_examples": n})


def _task(peer, c, cid, rnd):
    while True:
        reply = peer.call("get_task", {"client_id": cid, "token": c.token(cid), "have_version": -1, "wait_s": 2.0})
        if reply.kind == "task" and reply.body["round"] == rnd:
            return reply.body


def _drive(peer, c, cid, task, x, cfg):
    """Take part in a secure round by hand with the masked input ``x`` (any vector the SecAgg client accepts)."""
    params = secagg_params(cfg, task["secagg_selected"], x.size)
    base = {"client_id": cid, "token": c.token(cid), "round": task["round"]}

    def send(data):
        peer.call("secagg_send", dict(base, message=data))

    def poll(stage):
        reply = peer.call("secagg_poll", dict(base, stage=stage, wait_s=1.0))
        return reply.body["message"] if reply.kind == "secagg" else None

    return run_client(send, poll, params, task["secagg_party"], task["round"], x, time.monotonic() + 60)


def _start(clients):
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    return threads


SECURE = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_stage_seconds=5.0)


def test_out_of_range_masked_inputs_abandon_the_round_and_the_next_one_opens(make_cluster, tmp_path):
    """Finding 1: a selected client masks a weight of -N examples, then one example carrying the largest values; each
    attacked round is abandoned with the model untouched, and the following round aggregates."""
    c = make_cluster(RoundPolicy(rounds=3, window_seconds=30, start_clients=4, round_config=SECURE))
    init = {k: v.copy() for k, v in c.task.trainer.init_params(0).items()}
    dim = sum(v.size for v in init.values()) + 1
    p = c.peer(0)
    _register(p, c, "c3")
    honest = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(3)]
    threads = _start(honest)
    big = SECURE.secagg_max_examples
    negative = np.zeros(dim)
    negative[-1] = -1.0  # weight -N: the sum of weights goes negative (the old code then froze in 'closing')
    extreme = np.ones(dim)
    extreme[-1] = 1.0 / big  # one example whose every coordinate is N times the clip
    for rnd, x in ((1, negative), (2, extreme)):
        assert _drive(p, c, "c3", _task(p, c, "c3", rnd), x, SECURE)
        wait_until(lambda: len(c.scheduler.history) >= rnd)
        assert c.scheduler.version == 0 and model_bytes(c.scheduler.params) == model_bytes(init)
    zero = np.concatenate([np.zeros(dim - 1), [10 / big]])  # an honest zero update of 10 examples
    assert _drive(p, c, "c3", _task(p, c, "c3", 3), zero, SECURE)
    for t in threads:
        t.join(60)
    h = c.scheduler.history
    assert [r["outcome"] for r in h] == ["abandoned", "abandoned", "aggregated"]
    assert h[0]["close_reason"] == "secagg_done" and h[0]["abort_reason"].startswith("aggregate.weight:")
    assert h[1]["abort_reason"].startswith("aggregate.update[0]:") and "secagg_clip" in h[1]["abort_reason"]
    assert h[2]["reporting"] == 4 and h[2]["examples"] == 10 + sum(len(c.task.clients[i][1]) for i in range(3))
    assert c.scheduler.version == 1
    moved = max(float(np.abs(c.scheduler.params[k].astype(np.float64) - init[k]).max()) for k in init)
    assert 0 < moved <= SECURE.secagg_clip  # a mean of clipped deltas moves no coordinate further than the clip
    saved = load_state(tmp_path / "state.fl")  # nothing stored was lost: three rounds, the aggregated model
    assert len(saved["history"]) == 3 and model_bytes(saved["params"]) == model_bytes(c.scheduler.params)


class _NaNTrainer:
    """A trainer whose local model diverged to NaN."""

    def __init__(self, inner):
        self.inner = inner

    def train(self, params, x, y, **kw):
        local, loss = self.inner.train(params, x, y, **kw)
        return {k: np.full_like(v, np.nan) for k, v in local.items()}, loss


def test_a_nan_update_is_refused_by_its_client_and_the_round_aggregates_the_others(make_cluster):
    """Finding 11: the old code masked NaN as a garbage integer and summed it in."""
    c = make_cluster(RoundPolicy(rounds=1, window_seconds=6, start_clients=4, round_config=SECURE))
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i],
                        _NaNTrainer(c.task.trainer) if i == 3 else c.task.trainer) for i in range(4)]
    threads = _start(clients)
    for t in threads:
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["clients"] == ["c0", "c1", "c2"]
    assert all(np.isfinite(v).all() for v in c.scheduler.params.values())
    assert clients[3].stats.uploads_refused.get("secagg", 0) >= 1 and clients[3].stats.uploads_accepted == 0


def test_no_client_is_locked_out_when_the_round_advances_during_its_last_secure_message(make_cluster):
    """Finding 4: the scheduler's reply to a client's final SecAgg message arrives after the next round opened
    (here forced by holding the reply until the server has applied the new plan); the old server then marked the
    client as having taken part in the *new* round and never offered it that round's task."""
    c = make_cluster(RoundPolicy(rounds=3, window_seconds=8, start_clients=3, round_config=SECURE))
    for srv in c.servers:
        real = srv.scheduler.call

        def call(kind, body, timeout=10.0, real=real, srv=srv):
            reply = real(kind, body, timeout)
            if kind == "secagg_up" and body["message"][4] == UnmaskShares.TYPE:
                end = time.monotonic() + 15
                while srv.partial_round == body["round"] and time.monotonic() < end:
                    time.sleep(0.01)
            return reply

        srv.scheduler.call = call
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(3)]
    for t in _start(clients):
        t.join(120)
    h = c.scheduler.history
    assert len(h) == 3
    for row in h:
        assert row["outcome"] == "aggregated" and row["clients"] == ["c0", "c1", "c2"], row
        assert row["close_reason"] == "secagg_done"


def test_secagg_plus_with_six_neighbours_runs_through_the_runtime(make_cluster):
    """Finding 3: the threshold comes from the neighbourhood (k + 1 = 7 holders: t = floor(2 * 7 / 3) + 1 = 5 at the
    default secagg_threshold), not from the 16 clients (the old ceil(0.5 * 16) = 8 exceeded the 7 share holders, and
    the round never opened)."""
    task = TaskSpec(dataset="synthetic", num_clients=16, hidden=(8,), trainer="numpy", synthetic_features=10,
                    synthetic_classes=3, synthetic_examples=800)
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_neighbours=6, secagg_stage_seconds=5.0)
    assert threshold(cfg, 16) == 5 and secagg_params(cfg, 16, 10).threshold == 5
    c = make_cluster(RoundPolicy(rounds=1, window_seconds=30, start_clients=16, round_config=cfg), task=task)
    init = c.task.trainer.init_params(0)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(16)]
    for t in _start(clients):
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["reporting"] == 16 and row["needed"] == 5
    # the result is FedAvg over the 16 clients (replayed locally) up to fixed-point rounding
    num = {k: np.zeros(v.shape) for k, v in init.items()}
    total = 0
    for i in range(16):
        x, y = c.task.clients[i]
        rng = np.random.default_rng([0, 1, int.from_bytes(f"c{i}".encode()[:8], "little")])
        local, _ = c.task.trainer.train(init, x, y, epochs=1, batch_size=8, lr=0.1, prox_mu=0.0, rng=rng)
        for k in init:
            num[k] += len(x) * (local[k].astype(np.float64) - init[k].astype(np.float64)).astype(np.float32)
        total += len(x)
    unit = fixed_point_scale(cfg) / cfg.secagg_max_examples
    for k in init:
        expect = (init[k].astype(np.float64) + num[k] / total).astype(np.float32)
        np.testing.assert_allclose(c.scheduler.params[k], expect, rtol=0, atol=16 * 0.5 / (total * unit) + 1e-6)


def test_secure_parameters_that_cannot_run_are_refused_at_config_load():
    """Finding 3 (512 clients overflow the fixed-point sum) and finding 2 (minority thresholds): one line naming the
    field, before any process starts."""
    from fedarena.federated.config import GrpcPrivacyConfig, GrpcSecAggConfig, TaskDataConfig
    from fedarena.federated.grpc_experiment import FedAvgGrpcConfig

    cfg = RoundConfig(secagg=True)
    cap = capacity(cfg)  # (2^31 - 1) // (clip x scale); the scale 2^22 is rounded down to 419 x 10000
    assert cap == (2**31 - 1) // 4190000 == 512
    with pytest.raises(ValueError, match=rf"^round\.secagg_scale: {cap + 1} clients .*at most {cap} clients"):
        RoundPolicy(clients_per_round=cap + 1, round_config=cfg)
    RoundPolicy(clients_per_round=cap, round_config=cfg)
    with pytest.raises(ValueError, match=r"^round\.secagg_scale: 600 clients"):
        FedAvgGrpcConfig(data=TaskDataConfig(num_clients=600),
                         privacy=GrpcPrivacyConfig(secagg=GrpcSecAggConfig(enabled=True)))
    with pytest.raises(ValueError, match=r"^round\.secagg_threshold: must lie in \[0.5, 1\]"):
        RoundConfig(secagg=True, secagg_threshold=0.4)
    with pytest.raises(ValueError, match=r"^clients_per_round/start_clients: a secure round needs at least 3"):
        RoundPolicy(clients_per_round=2, round_config=cfg)
    # the defaults give a strict majority of the share holders for every round size and neighbourhood
    for k in (0, 2, 4, 6, 10):
        kcfg = RoundConfig(secagg=True, secagg_neighbours=k)
        for n in range(3, 120):
            m = n if not k or k >= n - 1 else k + 1
            assert m / 2 < threshold(kcfg, n) <= m
    assert RoundConfig().secagg_consistency_check and secagg_params(cfg, 5, 10).consistency_check


def test_uploads_need_registration_and_example_counts_are_bounded(make_cluster):
    """Finding 6: an authenticated but unregistered client (or one registered on another server) is refused; example
    counts above the bound are refused on register and upload; a deployment takes the bound from its task."""
    from fedarena.federated.config import GrpcUploadConfig, TaskDataConfig
    from fedarena.federated.grpc_experiment import FedAvgGrpcConfig, _spec
    from fedarena.federated.task import build_task

    opts = ServerOptions(sync_wait_s=0.2, max_update_norm=50.0, max_examples=40)
    plain = RoundPolicy(rounds=3, window_seconds=60, start_clients=2, min_fraction=0.5,
                        round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1), max_client_weight=1.0,
                        norm_bound_multiple=0.0)  # the plain example-weighted mean, the oracle below
    c = make_cluster(plain, server_options=opts)
    pa, pb = c.peer(0), c.peer(1)
    _register(pa, c, "a")
    _register(pb, c, "b", 30)
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(pa, c, "a", 1)
    init = {k: v.copy() for k, v in task["params"].items()}

    def upload(cid, n=10, value=0.01):
        return {"client_id": cid, "token": c.token(cid), "round": 1, "model_version": 0, "num_examples": n,
                "nonce": os.urandom(16), "encoding": "dense", "train_loss": 0.5,
                "update": {k: np.full(v.shape, value, np.float32) for k, v in init.items()}}

    for cid, peer in (("b", pa), ("a", pb)):  # registered, but on the other server
        with pytest.raises(RemoteError) as info:
            peer.call("upload", upload(cid))
        assert (info.value.code, info.value.field) == ("unauthenticated", "body.client_id")
        assert "not registered here" in info.value.reason
    with pytest.raises(RemoteError) as info:
        pa.call("secagg_poll", {"client_id": "b", "token": c.token("b"), "round": 1, "stage": 1})
    assert info.value.code == "unauthenticated"
    with pytest.raises(RemoteError) as info:
        pa.call("register", {"client_id": "c", "token": c.token("c"), "num_examples": 41})
    assert (info.value.code, info.value.field) == ("too_many_examples", "body.num_examples")
    with pytest.raises(RemoteError) as info:
        pa.call("upload", upload("a", n=41, value=5.0))
    assert (info.value.code, info.value.field) == ("too_many_examples", "body.num_examples")
    assert c.scheduler.admitted == {} and model_bytes(c.scheduler.params) == model_bytes(init)
    assert pa.call("upload", upload("a", n=10, value=0.01)).kind == "ack"
    assert pb.call("upload", upload("b", n=30, value=-0.03)).kind == "ack"
    wait_until(lambda: c.scheduler.version == 1)
    for k in init:
        expect = (init[k].astype(np.float64) + (10 * 0.01 + 30 * np.float64(np.float32(-0.03))) / 40)
        np.testing.assert_allclose(c.scheduler.params[k], expect.astype(np.float32), rtol=1e-6)
    # a deployment's default bound is its largest client shard
    data = TaskDataConfig(dataset="synthetic", num_clients=6)
    spec = _spec(FedAvgGrpcConfig(data=data))
    assert spec.server.max_examples == max(len(y) for _, y in build_task(spec.task).clients)
    assert _spec(FedAvgGrpcConfig(data=data, upload=GrpcUploadConfig(max_examples=77))).server.max_examples == 77


def _median(deltas, weights):
    """Coordinate-wise median (Yin et al. 2018), ignoring the self-declared weights."""
    return {k: np.median(np.stack([np.asarray(d[k], np.float64) for d in deltas]), axis=0) for k in deltas[0]}


def test_a_robust_aggregator_plugs_into_the_runtime_and_outvotes_a_byzantine_client(make_cluster):
    """Finding 6: with FedAvg one client claiming many examples and a large delta drags the mean; the scheduler's
    aggregator receives every individual delta (the servers forward them) and the median ignores the outlier. An
    aggregator that returns garbage abandons the round and the next one opens."""
    calls = []

    def rule(deltas, weights):
        calls.append((len(deltas), list(weights)))
        if len(calls) == 2:  # second round: a broken rule
            return {k: np.full(v.shape, np.nan) for k, v in deltas[0].items()}
        return _median(deltas, weights)

    opts = ServerOptions(sync_wait_s=0.2, max_update_norm=60.0, max_examples=1000)
    policy = RoundPolicy(rounds=3, window_seconds=60, start_clients=4, min_fraction=0.5,
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    c = make_cluster(policy, server_options=opts, aggregator=rule)
    peers = [c.peer(i % 2) for i in range(4)]
    ids = ["a", "b", "c", "evil"]
    for p, cid in zip(peers, ids):
        _register(p, c, cid, 1000 if cid == "evil" else 10)
    values = {"a": 0.01, "b": 0.02, "c": 0.03, "evil": 4.0}
    history = []
    for rnd in (1, 2, 3):
        params = None
        for p, cid in zip(peers, ids):
            task = _task(p, c, cid, rnd)
            params = params or {k: v.copy() for k, v in task["params"].items()}
            n = 1000 if cid == "evil" else 10
            body = {"client_id": cid, "token": c.token(cid), "round": rnd, "model_version": task["model_version"],
                    "num_examples": n, "nonce": os.urandom(16), "encoding": "dense", "train_loss": 0.5,
                    "update": {k: np.full(v.shape, values[cid], np.float32) for k, v in params.items()}}
            assert p.call("upload", body).kind == "ack"
        wait_until(lambda: len(c.scheduler.history) >= rnd)
        history.append({k: v.copy() for k, v in c.scheduler.params.items()})
        if rnd == 1:
            first = params
    assert calls[0] == (4, [10.0, 10.0, 10.0, 1000.0])  # every individual update and weight reached the rule
    h = c.scheduler.history
    assert [r["outcome"] for r in h] == ["aggregated", "abandoned", "aggregated"]
    assert "not finite" in h[1]["abort_reason"]
    for k in first:
        expect = (first[k].astype(np.float64) + np.median([0.01, 0.02, 0.03, np.float32(4.0)])).astype(np.float32)
        np.testing.assert_allclose(history[0][k], expect, rtol=1e-6)  # FedAvg would have moved it by ~3.96
        np.testing.assert_array_equal(history[1][k], history[0][k])  # the broken round changed nothing
    assert c.scheduler.version == 2


def test_identity_keys_catch_a_scheduler_that_substitutes_keys_in_stage_0(make_cluster, monkeypatch):
    """With a PKI (SecAggIdentity) a client refuses the keys a malicious scheduler substituted for a peer's (with a
    matching forged signature), drops out before sharing anything, and the round completes without it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from fedarena.federated import scheduler as scheduler_module
    from fedarena.federated.secure_round import SecureRound, new_identities
    from fedarena.privacy.secagg.messages import KeyBroadcast
    from fedarena.privacy.secagg.protocol import key_transcript

    raw = (Encoding.Raw, PublicFormat.Raw)
    real_open = SecureRound.open.__func__

    def hostile_open(cls, *args, **kw):
        sec = real_open(cls, *args, **kw)
        real_close = sec.server.close_stage

        def close():
            out = real_close()
            if sec.server.state.stage == 1:  # the key broadcasts: party 2's keys in party 1's copy are the attacker's
                kb = out[1]
                c_pk, s_pk = (X25519PrivateKey.generate().public_key().public_bytes(*raw) for _ in range(2))
                mitm = Ed25519PrivateKey.generate()
                sig = (mitm.public_key().public_bytes(*raw), mitm.sign(key_transcript(kb.round_id, 2, c_pk, s_pk)))
                out[1] = KeyBroadcast(kb.round_id, 1, kb.graph_seed, kb.members, kb.keys | {2: (c_pk, s_pk)},
                                      kb.signing | {2: sig})
            return out

        sec.server.close_stage = close
        return sec

    monkeypatch.setattr(scheduler_module.SecureRound, "open", classmethod(hostile_open))
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_stage_seconds=2.0)
    c = make_cluster(RoundPolicy(rounds=1, window_seconds=30, start_clients=4, round_config=cfg))
    ids = new_identities([f"c{i}" for i in range(4)])
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer,
                        identity=ids[f"c{i}"]) for i in range(4)]
    for t in _start(clients):
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["clients"] == ["c1", "c2", "c3"]  # party 1 (c0) refused
    assert clients[0].stats.uploads_refused.get("secagg", 0) >= 1 and clients[0].stats.uploads_accepted == 0
    assert all(cl.stats.uploads_accepted == 1 for cl in clients[1:])
