"""Fuzzing a live FL-Server (and the scheduler) over gRPC: >= 1000 random and mutated messages.

Every message must get an error reply or be dropped by gRPC (a well-formed non-upload request may get
its normal reply); the server must never hit an internal error, must keep serving, and neither the
global model nor the round's partial aggregate may change.
"""

from __future__ import annotations

import os
import time

import msgpack
import numpy as np

from fedarena.federated import auth, wire
from fedarena.federated.protocol import model_bytes
from fedarena.federated.server import ServerOptions
from fedarena.federated.transport import Peer, TransportError


def _random_value(rng, depth=0):
    t = rng.integers(0, 12 if depth < 2 else 9)
    if t == 0:
        return None
    if t == 1:
        return bool(rng.integers(2))
    if t == 2:
        vals = [0, -1, 1, 2**31, -(2**63), 2**64 - 1, int(rng.integers(-1000, 1000))]
        return vals[int(rng.integers(len(vals)))]
    if t == 3:
        return float(rng.choice([0.0, -0.0, np.nan, np.inf, -np.inf, 1e308, rng.standard_normal()]))
    if t == 4:
        return "".join(chr(int(c)) for c in rng.integers(32, 0x2FF, rng.integers(0, 20)))
    if t == 5:
        return bytes(rng.integers(0, 256, rng.integers(0, 40), dtype=np.uint8))
    if t == 6:
        dt = rng.choice(["float32", "float64", "int64", "uint8", "bool", "float16", "uint32"])
        shape = tuple(int(d) for d in rng.integers(0, 5, rng.integers(0, 4)))
        return np.asarray(rng.standard_normal(shape) * 10).astype(dt)
    if t == 7:
        return np.full(int(rng.integers(1, 50)), rng.choice([np.nan, np.inf, 1e30]), np.float32)
    if t == 8:
        if rng.random() < 0.2:
            return msgpack.Timestamp(int(rng.integers(0, 2**32)), 0)
        return msgpack.ExtType(int(rng.integers(0, 128)), bytes(rng.integers(0, 256, 10, dtype=np.uint8)))
    if t == 9:
        return [_random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))]
    return {str(rng.integers(100)): _random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))}


def _raw_envelope(kind, body):
    """Encode without the encoder's checks (so hostile values like foreign ext types get through)."""
    def prep(x):
        if isinstance(x, np.ndarray):
            a = x.astype(x.dtype.newbyteorder("<")) if x.dtype.byteorder == ">" else np.ascontiguousarray(x)
            h = msgpack.packb([a.dtype.str, list(a.shape)])
            return msgpack.ExtType(1, len(h).to_bytes(2, "big") + h + a.tobytes())
        if isinstance(x, dict):
            return {k: prep(v) for k, v in x.items()}
        if isinstance(x, list):
            return [prep(v) for v in x]
        return x
    return msgpack.packb({"v": 1, "kind": kind, "body": prep(body)}, use_bin_type=True)


def _mutate_bytes(rng, data):
    buf = bytearray(data)
    op = rng.integers(0, 4)
    if op == 0:
        for _ in range(rng.integers(1, 6)):
            buf[rng.integers(len(buf))] ^= 1 << int(rng.integers(8))
    elif op == 1:
        buf = buf[: rng.integers(0, len(buf))]
    elif op == 2:
        pos = rng.integers(len(buf))
        buf[pos:pos] = bytes(rng.integers(0, 256, rng.integers(1, 30), dtype=np.uint8))
    else:
        a, b = sorted(rng.integers(0, len(buf), 2))
        buf[a:b] = bytes(reversed(buf[a:b]))
    return bytes(buf)


def test_fuzzed_messages_never_crash_or_change_the_model(make_cluster):
    c = make_cluster(server_options=ServerOptions(sync_wait_s=0.2, max_update_norm=50.0, max_wait_s=0.01))
    pa = c.peer(0)
    for cid in ("a", "b"):
        pa.call("register", {"client_id": cid, "token": c.token(cid), "num_examples": 10})
    end = time.monotonic() + 30
    while c.scheduler.phase != "open" and time.monotonic() < end:
        time.sleep(0.02)
    task = pa.call("get_task", {"client_id": "a", "token": c.token("a"), "have_version": -1, "wait_s": 1.0}).body
    delta = {k: np.full(v.shape, 0.01, np.float32) for k, v in task["params"].items()}
    base = {"client_id": "a", "token": c.token("a"), "round": task["round"], "model_version": task["model_version"],
            "num_examples": 10, "nonce": os.urandom(16), "encoding": "dense", "update": delta, "train_loss": 0.5}
    assert pa.call("upload", base).kind == "ack"  # 'a' is counted once; the fuzz below must not change anything
    model_before = model_bytes(c.scheduler.params)
    srv = c.servers[0]
    partial_before = model_bytes(srv.partial.sums), srv.partial.weight, list(srv.partial.clients)
    admitted_before = dict(c.scheduler.admitted)
    valid = wire.encode("upload", base)
    pa.credentials = auth.client_credentials(c.secret, "a")  # raw frames below pass the stream check as client a
    kinds = ["upload", "register", "get_task", "secagg_send", "secagg_poll", "ping", "sync", "admit", "", "x" * 300]

    rng = np.random.default_rng(1234)
    outcome = {"error": 0, "dropped": 0, "reply": 0}
    codes: dict[str, int] = {}
    n_server = 1200
    for i in range(n_server):
        mode = i % 6
        if mode == 0:  # random bytes as one frame
            frames = [bytes(rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8))]
        elif mode == 1:  # a valid frame around random bytes
            frames = list(wire.split_frames(bytes(rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8))))
        elif mode == 2:  # byte-level mutations of a valid upload
            frames = list(wire.split_frames(_mutate_bytes(rng, valid)))
        elif mode == 3:  # structural mutations: change, drop or add fields, change the kind
            body = dict(base, nonce=os.urandom(16))
            for _ in range(rng.integers(1, 4)):
                key = str(rng.choice(list(base) + ["extra"]))
                if rng.random() < 0.2:
                    body.pop(key, None)
                else:
                    body[key] = _random_value(rng)
            if rng.random() < 0.3:
                body["update"] = {str(rng.choice(list(delta) + ["zz"])): _random_value(rng)}
            frames = list(wire.split_frames(_raw_envelope(str(rng.choice(kinds)), body)))
        elif mode == 4:  # frame-level mutations of a multi-frame valid message
            frames = list(wire.split_frames(valid, 64))
            j = int(rng.integers(len(frames)))
            choice = rng.integers(0, 4)
            if choice == 0:
                frames[j] = _mutate_bytes(rng, frames[j])
            elif choice == 1:
                del frames[j]
            elif choice == 2:
                frames.insert(j, frames[j])
            else:
                frames = frames[: j]  # possibly an empty stream
        else:  # envelope-level: wrong versions, extra keys, non-map bodies, huge declared sizes
            variants = [
                msgpack.packb({"v": int(rng.integers(-5, 5)), "kind": "upload", "body": {}}),
                _raw_envelope("upload", _random_value(rng)),
                msgpack.packb({"v": 1, "kind": "upload", "body": {}, "x": 1}),
                msgpack.packb([1, "upload", {}]),
                msgpack.packb([1, 0, 1, 2**40, b"x"]),
            ]
            frames = [variants[i // 6 % len(variants)]] if i % 12 == 5 else list(
                wire.split_frames(variants[i // 6 % len(variants)]))
        try:
            reply = wire.decode(pa.exchange_frames(frames, timeout=10))
        except TransportError:
            outcome["dropped"] += 1
            continue
        if reply.kind == "error":
            outcome["error"] += 1
            codes[reply.body["code"]] = codes.get(reply.body["code"], 0) + 1
        else:
            outcome["reply"] += 1
            assert reply.kind in ("pong", "registered", "wait", "task"), reply.kind  # never an 'ack'
    pa.credentials = None  # back to the credentials each request body carries
    # a few oversize gRPC messages: gRPC itself drops them
    big = Peer(srv.address, chunk_bytes=4 * 1024 * 1024)
    for _ in range(3):
        try:
            big.exchange_frames([b"\x00" * (3 * 1024 * 1024)], timeout=10)
            raise AssertionError("oversize gRPC message was accepted")
        except TransportError as e:
            assert e.code == "RESOURCE_EXHAUSTED"
            outcome["dropped"] += 1
    big.close()

    # and the scheduler, which faces the clients' assign requests
    sched = Peer(c.address, credentials=auth.client_credentials(c.secret, "a"))
    for i in range(200):
        if i % 2:
            frames = [bytes(rng.integers(0, 256, rng.integers(0, 100), dtype=np.uint8))]
        else:
            body = {"client_id": "a", "token": c.token("a"), "failed_server": "s0"}
            body[str(rng.choice(list(body) + ["cluster_token"]))] = _random_value(rng)
            frames = list(wire.split_frames(_raw_envelope(str(rng.choice(["assign", "status", "partial", "admit",
                                                                          "sync", "get_model"])), body)))
        try:
            reply = wire.decode(sched.exchange_frames(frames, timeout=10))
            if reply.kind == "error":
                codes[reply.body["code"]] = codes.get(reply.body["code"], 0) + 1
            else:
                assert reply.kind == "assignment", reply.kind
        except TransportError:
            pass
    sched.close()

    print("fuzz outcome", outcome, "error codes", codes)
    total = sum(outcome.values())
    assert total >= 1000
    assert outcome["error"] > 900
    assert "internal" not in codes, codes
    # nothing changed: global model, the server's partial aggregate, the global counter
    assert model_bytes(c.scheduler.params) == model_before
    assert (model_bytes(srv.partial.sums), srv.partial.weight, list(srv.partial.clients)) == partial_before
    assert c.scheduler.admitted == admitted_before
    # still serving: b's upload closes the round with exactly a's and b's updates
    task_b = pa.call("get_task", {"client_id": "b", "token": c.token("b"), "have_version": -1, "wait_s": 1.0}).body
    pa.call("upload", dict(base, client_id="b", token=c.token("b"), nonce=os.urandom(16),
                           update={k: np.full(v.shape, 0.03, np.float32) for k, v in task_b["params"].items()}))
    end = time.monotonic() + 30
    while c.scheduler.version != 1 and time.monotonic() < end:
        time.sleep(0.02)
    init = task["params"]
    for k in init:
        expect = (init[k].astype(np.float64) + (np.float64(np.float32(0.01)) + np.float64(np.float32(0.03))) / 2)
        np.testing.assert_allclose(c.scheduler.params[k], expect.astype(np.float32), rtol=1e-6)
