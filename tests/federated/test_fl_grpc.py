"""Scheduler + two FL-Servers on real loopback gRPC (in-process): FedAvg, validation, server switching, TLS, resume."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from fedarena.federated import wire
from fedarena.federated.client import FLClient
from fedarena.federated.protocol import RoundConfig, model_bytes
from fedarena.federated.scheduler import RoundPolicy, Scheduler, load_state
from fedarena.federated.transport import Peer, RemoteError, TransportError



def wait_until(pred, timeout=30.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not reached")


def _register(peer, c, cid, n=10):
    return peer.call("register", {"client_id": cid, "token": c.token(cid), "num_examples": n})


def _task(peer, c, cid, have=-1):
    return peer.call("get_task", {"client_id": cid, "token": c.token(cid), "have_version": have, "wait_s": 5.0})


def _upload(c, cid, task, delta, **over):
    body = {"client_id": cid, "token": c.token(cid), "round": task["round"], "model_version": task["model_version"],
            "num_examples": 10, "nonce": os.urandom(16), "encoding": "dense",
            "update": {k: np.asarray(v, np.float32) for k, v in delta.items()}, "train_loss": 0.5}
    body.update(over)
    return body


def _client_rng(seed, rnd, cid):
    return np.random.default_rng([seed, rnd, int.from_bytes(cid.encode()[:8], "little")])


def test_fedavg_over_grpc_equals_local_weighted_average(make_cluster):
    # the plain example-weighted mean (weight cap and norm clipping off: the servers' partial sums)
    policy = RoundPolicy(rounds=1, window_seconds=60, start_clients=4, min_fraction=1.0,
                         round_config=RoundConfig(epochs=2, batch_size=8, lr=0.1), max_client_weight=1.0,
                         norm_bound_multiple=0.0)
    c = make_cluster(policy)
    init = c.task.trainer.init_params(0)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(4)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["reporting"] == 4 and row["close_reason"] == "all_reported"
    assert sorted(row["servers"]) == ["s0", "s1"]  # both servers aggregated part of the clients
    # oracle: every client's local training replayed here, then the example-weighted mean
    num = {k: np.zeros(v.shape) for k, v in init.items()}
    total = 0
    for i in range(4):
        x, y = c.task.clients[i]
        local, _ = c.task.trainer.train(init, x, y, epochs=2, batch_size=8, lr=0.1, prox_mu=0.0,
                                        rng=_client_rng(0, 1, f"c{i}"))
        for k in init:
            d = (local[k].astype(np.float64) - init[k].astype(np.float64)).astype(np.float32)
            num[k] += len(x) * d.astype(np.float64)
        total += len(x)
    for k in init:
        expect = (init[k].astype(np.float64) + num[k] / total).astype(np.float32)
        np.testing.assert_allclose(c.scheduler.params[k], expect, rtol=1e-6, atol=1e-7)
    assert all(cl.stats.uploads_accepted == 1 for cl in clients)
    assert row["test_acc"] == pytest.approx(c.task.trainer.evaluate(c.scheduler.params, *c.task.test)[1])


def test_every_bad_upload_gets_a_clear_error_and_changes_nothing(make_cluster):
    c = make_cluster(limits=wire.Limits(max_message_bytes=200_000))
    pa, pb = c.peer(0), c.peer(1)
    _register(pa, c, "a")
    _register(pb, c, "b")
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(pa, c, "a").body
    assert task["round"] == 1 and task["model_version"] == 0
    init = {k: v.copy() for k, v in task["params"].items()}
    good = {k: np.full(v.shape, 0.01, np.float32) for k, v in init.items()}
    name = sorted(init)[0]
    bad_shape = dict(good, **{name: np.zeros((1, 1), np.float32)})
    nan = dict(good, **{name: np.full(init[name].shape, np.nan, np.float32)})
    f64 = dict(good, **{name: good[name].astype(np.float64)})
    huge = {k: np.full(v.shape, 10.0, np.float32) for k, v in init.items()}
    cases = [
        # credentials are refused from the stream metadata, before the request is read
        (dict(token="0" * 64), "unauthenticated", "metadata.fedarena-token"),
        (dict(client_id="bad id!"), "unauthenticated", "metadata.fedarena-id"),
        (dict(round=2), "stale_round", "body.round"),
        (dict(model_version=1), "stale_version", "body.model_version"),
        (dict(nonce=b"short"), "malformed", "body.nonce"),
        (dict(num_examples=0), "too_many_examples", "body.num_examples"),
        (dict(num_examples=10**9), "too_many_examples", "body.num_examples"),
        (dict(train_loss=float("inf")), "malformed", "body.train_loss"),
        (dict(round="1"), "malformed", "body.round"),
        (dict(encoding="zip"), "malformed", "body.encoding"),
        (dict(update=bad_shape), "malformed", f"body.update.{name}"),
        (dict(update=nan), "malformed", f"body.update.{name}"),
        (dict(update=f64), "malformed", f"body.update.{name}"),
        (dict(update=huge), "norm_bound", "body.update"),
    ]
    for over, code, field in cases:
        with pytest.raises(RemoteError) as info:
            pa.call("upload", _upload(c, "a", task, good, **over))
        assert (info.value.code, info.value.field) == (code, field), over
        assert info.value.reason  # a human-readable reason comes back
    body = _upload(c, "a", task, good)
    del body["round"]
    with pytest.raises(RemoteError, match="body.round: missing required field"):
        pa.call("upload", body)
    # oversize: refused by the frame limit before anything is buffered
    big = Peer(c.servers[0].address, limits=wire.Limits(max_message_bytes=10**7))
    with pytest.raises(RemoteError) as info:
        big.call("upload", _upload(c, "a", task, good, pad=b"x" * 300_000))
    assert info.value.field.startswith("frame") and "exceed" in info.value.reason
    big.close()
    # a client that registered after the plan was made is not selected
    _register(pa, c, "late")
    with pytest.raises(RemoteError) as info:
        pa.call("upload", _upload(c, "late", task, good))
    assert info.value.code == "not_selected"
    # nothing was counted, nothing aggregated, the model is unchanged
    assert c.scheduler.admitted == {} and all(s.partial.weight == 0 for s in c.servers)
    assert model_bytes(c.scheduler.params) == model_bytes(init)
    # the server still serves: a good upload is accepted, its replay and a second upload are refused
    body = _upload(c, "a", task, good)
    assert pa.call("upload", body).kind == "ack"
    with pytest.raises(RemoteError) as info:
        pa.call("upload", body)
    assert info.value.code == "replay"
    with pytest.raises(RemoteError) as info:
        pa.call("upload", _upload(c, "a", task, good))
    assert info.value.code == "duplicate"
    assert c.servers[0].rejections["malformed"] == 8  # nonce, loss, round type, encoding, shape, NaN, dtype, missing
    # b uploads through its own (the other) server; the round closes with exactly a's and b's updates
    other = {k: np.full(v.shape, -0.03, np.float32) for k, v in init.items()}
    with pytest.raises(RemoteError) as info:  # b registered 10 examples: it may not claim more
        pb.call("upload", _upload(c, "b", task, other, num_examples=30))
    assert (info.value.code, info.value.field) == ("too_many_examples", "body.num_examples")
    assert "claims 30 examples but registered 10" in info.value.reason
    assert pb.call("upload", _upload(c, "b", task, other, num_examples=10)).kind == "ack"
    wait_until(lambda: c.scheduler.version == 1)
    for k in init:
        expect = (init[k].astype(np.float64) + (10 * 0.01 + 10 * np.float64(np.float32(-0.03))) / 20).astype(np.float32)
        np.testing.assert_allclose(c.scheduler.params[k], expect, rtol=1e-6)


def test_client_switching_server_gets_same_round_and_is_counted_once(make_cluster):
    c = make_cluster()
    p0, p1 = c.peer(0), c.peer(1)
    _register(p0, c, "a")
    _register(p1, c, "b")
    wait_until(lambda: c.scheduler.phase == "open")
    t0 = _task(p0, c, "a").body
    _register(p1, c, "a")
    t1 = _task(p1, c, "a").body
    assert (t0["round"], t0["model_version"]) == (t1["round"], t1["model_version"])
    assert model_bytes(t0["params"]) == model_bytes(t1["params"])
    delta = {k: np.full(v.shape, 0.02, np.float32) for k, v in t0["params"].items()}
    assert p1.call("upload", _upload(c, "a", t0, delta)).kind == "ack"
    with pytest.raises(RemoteError) as info:  # same client, other server, fresh nonce: the global counter refuses
        p0.call("upload", _upload(c, "a", t0, delta))
    assert info.value.code == "duplicate"
    assert c.scheduler.admitted == {"a": "s1"}


def test_bad_token_is_refused_everywhere(make_cluster):
    c = make_cluster()
    p = c.peer(0)
    for kind, extra in (("register", {"num_examples": 3}), ("get_task", {"have_version": -1})):
        with pytest.raises(RemoteError) as info:
            p.call(kind, {"client_id": "mallory", "token": c.token("alice"), **extra})
        assert info.value.code == "unauthenticated" and "invalid authentication token" in info.value.reason
    sched = Peer(c.address)
    with pytest.raises(RemoteError) as info:
        sched.call("assign", {"client_id": "mallory", "token": "x", "failed_server": ""})
    assert info.value.code == "unauthenticated"
    with pytest.raises(RemoteError) as info:
        sched.call("status", {"cluster_token": c.token("alice")})
    assert info.value.code == "unauthenticated"
    with pytest.raises(RemoteError) as info:
        sched.call("partial", {"cluster_token": "nope", "server_id": "s0"})
    assert info.value.code == "unauthenticated"
    sched.close()
    assert "mallory" not in c.servers[0].clients


def test_tls_deployment_trains_and_refuses_plaintext(make_cluster, self_signed_tls):
    tls = self_signed_tls
    policy = RoundPolicy(rounds=1, window_seconds=60, start_clients=2, min_fraction=1.0,
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    c = make_cluster(policy, tls=tls)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer, tls=tls)
               for i in range(2)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert c.scheduler.history[0]["outcome"] == "aggregated" and c.scheduler.version == 1
    plain = Peer(c.servers[0].address)
    with pytest.raises(TransportError):
        plain.call("ping", {}, timeout=3)
    plain.close()


def test_scheduler_state_resumes_with_identical_model_bytes(make_cluster, tmp_path):
    policy = RoundPolicy(rounds=2, window_seconds=60, start_clients=2, min_fraction=1.0,
                         server_optimizer=__import__("fedarena.federated.strategy", fromlist=["x"]).ServerOptimizer(
                             "fedadam", lr=0.05),
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    c = make_cluster(policy)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(2)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    saved_bytes = model_bytes(c.scheduler.params)
    c.close()
    state = load_state(tmp_path / "state.fl")
    assert state["round"] == 3 and state["version"] == 2 and len(state["history"]) == 2
    again = Scheduler(policy, c.task.trainer.init_params(99), c.secret, tmp_path / "state.fl")
    assert model_bytes(again.params) == saved_bytes
    assert (again.round, again.version, again.phase) == (3, 2, "done")
    for k in again.opt_state["m"]:
        np.testing.assert_array_equal(again.opt_state["m"][k], c.scheduler.opt_state["m"][k])
    (tmp_path / "state.fl").write_bytes(b"\x93garbage")
    with pytest.raises(wire.WireError):
        Scheduler(policy, c.task.trainer.init_params(0), c.secret, tmp_path / "state.fl")


def test_signds_rounds_aggregate_exactly_like_signds_aggregate(make_cluster):
    from fedarena.federated.client import ClientOptions
    from fedarena.federated.protocol import params_shapes, signds_config
    from fedarena.federated.stages import flatten
    from fedarena.privacy.signds import signds_aggregate, signds_report

    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, signds_k=10, signds_h=5, signds_epsilon=1.0, signds_lr=0.02)
    policy = RoundPolicy(rounds=1, window_seconds=60, start_clients=3, min_fraction=1.0, round_config=cfg)
    c = make_cluster(policy)
    init = c.task.trainer.init_params(0)
    opts = ClientOptions(privacy_seed=5)
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer, opts)
               for i in range(3)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert c.scheduler.history[0]["reporting"] == 3
    sds = signds_config(cfg, params_shapes(init))
    reports = []
    for i in range(3):
        x, y = c.task.clients[i]
        local, _ = c.task.trainer.train(init, x, y, epochs=1, batch_size=8, lr=0.1, prox_mu=0.0,
                                        rng=_client_rng(0, 1, f"c{i}"))
        delta = {k: (local[k].astype(np.float64) - init[k].astype(np.float64)).astype(np.float32) for k in init}
        prng = np.random.default_rng([5, 1, int.from_bytes(f"c{i}".encode()[:8], "little")])
        reports.append(signds_report(flatten(delta), sds, prng))
    expect_flat = flatten(init) + signds_aggregate(reports, sds.d, 0.02)
    np.testing.assert_allclose(flatten(c.scheduler.params), expect_flat.astype(np.float32), rtol=1e-6, atol=1e-7)
    assert np.count_nonzero(flatten(c.scheduler.params) != flatten(init)) <= 3 * 5  # only reported dimensions moved


def test_signds_round_refuses_dense_uploads_and_bad_reports(make_cluster):
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, signds_k=10, signds_h=5)
    c = make_cluster(RoundPolicy(rounds=2, window_seconds=60, start_clients=2, round_config=cfg))
    p = c.peer(0)
    _register(p, c, "a")
    _register(p, c, "b")
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(p, c, "a").body
    dense = {k: np.zeros(v.shape, np.float32) for k, v in task["params"].items()}
    with pytest.raises(RemoteError, match="SignDS reports only"):
        p.call("upload", _upload(c, "a", task, dense))
    for report, reason in ((b"\x01" + b"\x00" * 3, "expected 21 bytes"), (b"\x07" + b"\x00" * 20, "sign byte"),
                           (b"\x01" + np.array([1, 1, 2, 3, 4], "<u4").tobytes(), "distinct"),
                           (b"\x01" + np.array([1, 2, 3, 4, 10**6], "<u4").tobytes(), "out of range")):
        body = _upload(c, "a", task, dense, encoding="signds")
        body["update"] = {"report": report}
        with pytest.raises(RemoteError, match=reason) as info:
            p.call("upload", body)
        assert info.value.field == "body.update.report"
    assert c.scheduler.admitted == {}


def _replayed_weighted_mean(c, init, ids, epochs, lr):
    num = {k: np.zeros(v.shape) for k, v in init.items()}
    total = 0
    for i in ids:
        x, y = c.task.clients[i]
        local, _ = c.task.trainer.train(init, x, y, epochs=epochs, batch_size=8, lr=lr, prox_mu=0.0,
                                        rng=_client_rng(0, 1, f"c{i}"))
        for k in init:
            num[k] += len(x) * (local[k].astype(np.float64) - init[k].astype(np.float64)).astype(np.float32)
        total += len(x)
    return {k: init[k].astype(np.float64) + num[k] / total for k in init}


def test_secure_aggregation_round_matches_plain_fedavg_and_survives_a_dropout(make_cluster):
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_threshold=0.5, secagg_stage_seconds=3.0)
    policy = RoundPolicy(rounds=1, window_seconds=20, start_clients=4, min_fraction=0.5, round_config=cfg)
    c = make_cluster(policy)
    init = c.task.trainer.init_params(0)
    # client c3 is driven by hand: it advertises its keys, then vanishes (a SecAgg dropout after stage 0)
    p = c.peer(1)
    _register(p, c, "c3")
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(3)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(p, c, "c3").body
    from fedarena.federated.secure_round import secagg_params
    from fedarena.privacy.secagg import SecAggClient, encode

    dim = sum(v.size for v in init.values()) + 1
    ghost = SecAggClient(task["secagg_party"], secagg_params(cfg, 4, dim), task["round"])
    p.call("secagg_send", {"client_id": "c3", "token": c.token("c3"), "round": 1,
                           "message": encode(ghost.advertise_keys())})
    with pytest.raises(RemoteError) as info:  # plain uploads are refused in a secure round
        p.call("upload", _upload(c, "c3", task, {k: np.zeros(v.shape) for k, v in init.items()}))
    assert "secure aggregation" in info.value.reason
    for t in threads:
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["close_reason"] == "secagg_done"
    assert row["reporting"] == 3 and row["clients"] == ["c0", "c1", "c2"]
    expect = _replayed_weighted_mean(c, init, range(3), 1, 0.1)
    # the only error is fixed-point rounding: each of the 3 inputs' coordinates is rounded by at most 1/2 unit, the
    # weight coordinate is exact (K examples of `unit` each), so the mean is off by at most 1.5 / (K unit) (plus
    # float32 storage of the model); no delta coordinate reaches the clip
    from fedarena.federated.secure_round import fixed_point_scale

    examples = sum(len(c.task.clients[i][1]) for i in range(3))
    unit = fixed_point_scale(cfg) / cfg.secagg_max_examples
    assert row["examples"] == examples and unit == int(unit)
    assert max(np.abs(expect[k] - init[k]).max() for k in init) < cfg.secagg_clip
    bound = 3 * 0.5 / (examples * unit) + 1e-6
    for k in init:
        np.testing.assert_allclose(c.scheduler.params[k], expect[k].astype(np.float32), rtol=0, atol=bound)
    assert any(np.abs(c.scheduler.params[k] - init[k]).max() > 1e-3 for k in init)  # it did move
    # no FL-Server ever held an individual update: the partial aggregates stayed empty
    assert all(s.partial.weight == 0 for s in c.servers)
    assert row["bytes_up"] > 0 and row["bytes_down"] > 4 * sum(v.nbytes for v in init.values())


def test_secure_round_below_threshold_is_abandoned_without_releasing_anything(make_cluster):
    cfg = RoundConfig(epochs=1, batch_size=8, lr=0.1, secagg=True, secagg_threshold=1.0, secagg_stage_seconds=1.0)
    c = make_cluster(RoundPolicy(rounds=1, window_seconds=20, start_clients=3, round_config=cfg))
    init = c.task.trainer.init_params(0)
    p = c.peer(0)
    _register(p, c, "c2")
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer) for i in range(2)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(p, c, "c2").body
    from fedarena.federated.secure_round import secagg_params
    from fedarena.privacy.secagg import SecAggClient, encode

    ghost = SecAggClient(task["secagg_party"], secagg_params(cfg, 3, sum(v.size for v in init.values()) + 1), 1)
    p.call("secagg_send", {"client_id": "c2", "token": c.token("c2"), "round": 1,
                           "message": encode(ghost.advertise_keys())})
    with pytest.raises(RemoteError) as info:  # a second stage-0 message from the same client
        p.call("secagg_send", {"client_id": "c2", "token": c.token("c2"), "round": 1,
                               "message": encode(SecAggClient(task["secagg_party"], ghost.config, 1)
                                                 .advertise_keys())})
    assert info.value.code == "rejected"
    with pytest.raises(RemoteError) as info:  # impersonation: c2's token, another party's message
        other = SecAggClient(task["secagg_party"] % 3 + 1, ghost.config, 1)
        p.call("secagg_send", {"client_id": "c2", "token": c.token("c2"), "round": 1,
                               "message": encode(other.advertise_keys())})
    assert info.value.code == "rejected" and "party" in info.value.reason
    for t in threads:
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "abandoned" and row["close_reason"] == "secagg_aborted"
    assert "threshold" in row["abort_reason"]
    assert c.scheduler.version == 0 and model_bytes(c.scheduler.params) == model_bytes(init)


def test_state_file_of_another_model_or_optimizer_is_refused(tmp_path):
    from fedarena.federated import auth
    from fedarena.federated.scheduler import save_state
    from fedarena.federated.strategy import ServerOptimizer
    from fedarena.federated.trainer import mlp_init

    params = mlp_init((4, 3), 0)
    path = tmp_path / "s.fl"
    save_state(path, {"round": 2, "version": 1, "params": params, "opt_state": {}, "history": [{"round": 1}]})
    secret = auth.new_secret()
    ok = Scheduler(RoundPolicy(), mlp_init((4, 3), 9), secret, path)
    assert model_bytes(ok.params) == model_bytes(params) and ok.round == 2
    with pytest.raises(wire.WireError, match="does not match the task's model"):
        Scheduler(RoundPolicy(), mlp_init((4, 5, 3), 0), secret, path)
    with pytest.raises(wire.WireError, match="server optimizer 'fedadam'"):
        Scheduler(RoundPolicy(server_optimizer=ServerOptimizer("fedadam")), mlp_init((4, 3), 0), secret, path)
    save_state(path, {"round": 2, "version": 1, "params": params, "opt_state": {}, "history": []})
    with pytest.raises(wire.WireError, match="inconsistent round state"):
        Scheduler(RoundPolicy(), mlp_init((4, 3), 0), secret, path)
    save_state(path, {"round": 2, "params": params})
    with pytest.raises(wire.WireError, match="version: missing required field"):
        Scheduler(RoundPolicy(), mlp_init((4, 3), 0), secret, path)


def test_models_and_uploads_stream_in_many_small_frames(make_cluster):
    policy = RoundPolicy(rounds=1, window_seconds=60, start_clients=2, min_fraction=1.0,
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1), max_client_weight=1.0,
                         norm_bound_multiple=0.0)  # the plain weighted mean, the oracle below
    c = make_cluster(policy, chunk_bytes=128)  # the ~500-byte model travels in several frames each way
    clients = [FLClient(f"c{i}", c.token(f"c{i}"), c.address, c.task.clients[i], c.task.trainer,
                        chunk_bytes=128) for i in range(2)]
    threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["reporting"] == 2
    assert row["bytes_up"] > 4 * 128 and row["bytes_down"] > 4 * 128
    expect = _replayed_weighted_mean(c, c.task.trainer.init_params(0), range(2), 1, 0.1)
    for k, v in expect.items():
        np.testing.assert_allclose(c.scheduler.params[k], v.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_a_restarted_scheduler_reruns_its_open_round_and_earlier_uploads_count_again(make_cluster, tmp_path):
    """The scheduler dies while round 1 is open and two of three clients have uploaded; a new scheduler on the same
    port resumes from the state file and opens round 1 afresh. The servers forget the dead scheduler's uploads when
    they re-join, so the two clients upload again and the round aggregates all three."""
    from fedarena.federated.scheduler import Scheduler

    policy = RoundPolicy(rounds=1, window_seconds=120, start_clients=3, min_fraction=1.0,
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    c = make_cluster(policy, n_servers=1)
    p = c.peer(0)
    for cid in ("a", "b", "z"):
        _register(p, c, cid)
    wait_until(lambda: c.scheduler.phase == "open")
    task = _task(p, c, "a").body
    init = task["params"]
    delta = {k: np.full(v.shape, 0.01, np.float32) for k, v in init.items()}
    for cid in ("a", "b"):
        t = _task(p, c, cid).body
        assert p.call("upload", _upload(c, cid, t, delta)).kind == "ack"
    port = int(c.address.rsplit(":", 1)[1])
    c.scheduler.stop()
    c.scheduler = Scheduler(policy, c.task.trainer.init_params(0), c.secret, tmp_path / "state.fl",
                            evaluate=c.evaluate)
    c.scheduler.start(f"127.0.0.1:{port}")
    wait_until(lambda: c.scheduler.phase == "open" and "s0" in c.scheduler.servers)
    for cid in ("a", "b", "z"):  # a and b get the round's task again and their second upload counts
        t = _task(p, c, cid).body
        assert t["round"] == 1 and p.call("upload", _upload(c, cid, t, delta)).kind == "ack"
    wait_until(lambda: c.scheduler.version == 1)
    with c.scheduler.cond:
        row = c.scheduler.history[0]
    assert row["outcome"] == "aggregated" and row["clients"] == ["a", "b", "z"]
