"""Denial of service before authentication (issue 17, finding 5) and mutual TLS, attacked over real loopback gRPC.

The attacker opens streams with ``grpc.aio`` from a thread of its own (so 300 stalled streams cost
the test no threads) and never finishes them. The checks are the runtime's own deadlines: an upload
gets the client's normal 10 s RPC timeout, a health ping the scheduler's normal 1 s.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

import grpc
import grpc.aio

from fedarena.federated import auth, wire
from fedarena.federated.client import FLClient
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.transport import FULL_METHOD, Peer, RemoteError, TLSFiles, TransportError

# forged client credentials in the stream metadata (literal, so this attack also runs against older code)
FORGED = (("fedarena-role", "client"), ("fedarena-id", "mallory"), ("fedarena-token", "0" * 64))


class Attacker:
    """Opens streams that send ``frames`` and then stall until ``release``; runs on its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.channels: list = []
        self.calls: list = []
        self.replies: list = []
        self._release = None

        async def make_event():
            return asyncio.Event()

        self._release = self._run(make_event())

    def _run(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def open(self, address: str, count: int, metadata=(), frames=lambda: iter(())) -> None:
        release = self._release

        async def start():
            ch = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 8 << 20)])
            self.channels.append(ch)
            stub = ch.stream_stream(FULL_METHOD)
            for _ in range(count):
                async def requests():
                    for f in frames():
                        yield f
                    await release.wait()  # stall: never finish the request

                call = stub(requests(), metadata=tuple(metadata) or None)
                self.calls.append(call)

                async def read(call=call):
                    try:
                        self.replies.append(wire.join_frames([f async for f in call]))
                    except grpc.aio.AioRpcError as e:
                        self.replies.append(e.code())

                asyncio.ensure_future(read())

        self._run(start())

    def close(self) -> None:
        async def stop():
            self._release.set()
            for c in self.calls:
                c.cancel()
            for ch in self.channels:
                await ch.close()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def attacker():
    a = Attacker()
    yield a
    a.close()


def _open_round(c, clients=("a", "b")):
    pa = c.peer(0)
    for cid in clients:
        pa.call("register", {"client_id": cid, "token": c.token(cid), "num_examples": 10})
    end = time.monotonic() + 30
    while c.scheduler.phase != "open" and time.monotonic() < end:
        time.sleep(0.02)
    assert c.scheduler.phase == "open"
    task = pa.call("get_task", {"client_id": "a", "token": c.token("a"), "have_version": -1, "wait_s": 1.0}).body
    return pa, task


def _upload(c, cid, task, value=0.01):
    delta = {k: np.full(v.shape, value, np.float32) for k, v in task["params"].items()}
    return {"client_id": cid, "token": c.token(cid), "round": task["round"], "model_version": task["model_version"],
            "num_examples": 10, "nonce": os.urandom(16), "encoding": "dense", "update": delta, "train_loss": 0.5}


def _rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_300_stalled_unauthenticated_streams_leave_uploads_and_health_checks_working(make_cluster, attacker, tmp_path):
    c = make_cluster(n_servers=1)
    pa, task = _open_round(c)
    srv = c.servers[0]
    bogus = FORGED
    frame0 = list(wire.split_frames(b"\x00" * 3000, 1000))[:1]  # one valid frame of a 3-frame message, then stall
    for address in (srv.address, c.address):  # the FL-Server and the scheduler
        attacker.open(address, 150)  # no credentials at all
        attacker.open(address, 150, metadata=bogus, frames=lambda: iter(frame0))  # a forged token
    time.sleep(0.5)  # let the 600 streams reach the nodes
    # an authenticated client's upload goes through within the client's normal RPC timeout
    reply = pa.call("upload", _upload(c, "a", task), timeout=10)
    assert reply.kind == "ack"
    # the scheduler's health check of the server answers within its normal 1 s
    assert c.scheduler._ping_server("s0")
    # a client can still be assigned a server
    sched = Peer(c.address)
    assert sched.call("assign", {"client_id": "b", "token": c.token("b"), "failed_server": ""}, timeout=10).kind == \
        "assignment"
    sched.close()
    # the server's sync heartbeat kept it alive through more than the scheduler's server timeout
    time.sleep(c.scheduler.policy.server_timeout_s + 0.5)
    assert c.scheduler.servers["s0"].alive
    assert c.scheduler._ping_server("s0")
    # the forged streams were refused unread; unauthenticated streams held at most the anonymous cap
    from fedarena.federated.transport import StreamLimits

    for node in (srv._grpc, c.scheduler._server):
        assert node.admission.anonymous <= StreamLimits().max_anonymous_streams
        assert node.admission.refused.get("unavailable", 0) >= 150 - StreamLimits().max_anonymous_streams
    refusals = [wire.decode(r) for r in attacker.replies if isinstance(r, bytes) and r]
    assert sum(m.body.get("code") == "unauthenticated" for m in refusals) >= 300  # 150 forged per node
    # and the round still completes with b's upload: the attack changed nothing stored
    pa.call("upload", _upload(c, "b", task, 0.03), timeout=10)

    def finished_round():  # read under the scheduler's lock: it bumps the version before it appends the round's row
        with c.scheduler.cond:
            return (c.scheduler.version, list(c.scheduler.history))

    end = time.monotonic() + 30
    while finished_round()[0] != 1 and time.monotonic() < end:
        time.sleep(0.02)
    version, history = finished_round()
    assert version == 1 and history[0]["clients"] == ["a", "b"]
    from fedarena.federated.protocol import model_bytes
    from fedarena.federated.scheduler import load_state

    end = time.monotonic() + 10
    while (load_state(tmp_path / "state.fl") or {}).get("version") != 1 and time.monotonic() < end:
        time.sleep(0.05)
    saved = load_state(tmp_path / "state.fl")  # the stored state is intact and is the aggregated model
    assert saved["version"] == 1 and model_bytes(saved["params"]) == model_bytes(c.scheduler.params)


_NODE = r"""
import inspect, sys, time
from fedarena.federated import auth, protocol, transport
kw = {"secret": auth.new_secret()} if "secret" in inspect.signature(transport.serve).parameters else {}
node, port = transport.serve(lambda m, n: ("pong", {}), "127.0.0.1:0", kinds=protocol.CLIENT_KINDS, **kw)
print(port, flush=True)
time.sleep(600)
"""


def test_large_unauthenticated_streams_are_refused_before_anything_is_buffered(attacker, tmp_path):
    import subprocess
    import sys

    # the node in a process of its own, so that its memory is measured alone
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _NODE], stdout=subprocess.PIPE, env=env, text=True)
    try:
        address = f"127.0.0.1:{int(proc.stdout.readline())}"
        chunk = b"\x01" * (1 << 20)
        total = 16 << 20

        def frames():  # 15 of the 16 1-MiB frames of a 16 MiB message, built as sent; then the stream stalls
            for i in range(15):
                yield msgpack.packb([wire.WIRE_VERSION, i, 16, total, chunk], use_bin_type=True)

        p = Peer(address)
        p.call("ping", {})  # warm up the node's gRPC machinery before measuring
        p.close()
        before = _rss_bytes(proc.pid)
        attacker.open(address, 2, metadata=FORGED, frames=frames)
        attacker.open(address, 2, frames=frames)  # no credentials: 4 KiB is all an anonymous stream may send
        end = time.monotonic() + 60  # a wait, not a speed limit: under heavy load replies can take many seconds
        while len(attacker.replies) < 4 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)
        grown = _rss_bytes(proc.pid) - before
        assert grown < 24 << 20, f"node memory grew by {grown / 2**20:.0f} MiB"  # 4 buffered streams: 60 MiB
        assert len(attacker.replies) == 4  # every stream got its answer instead of being buffered
        # an error reply, or (when the refusal races the attacker's writes) the stream cut by gRPC
        codes = [wire.decode(r).body["code"] if isinstance(r, bytes) else r for r in attacker.replies]
        assert all(x in ("malformed", "unauthenticated") or isinstance(x, grpc.StatusCode) for x in codes), codes
        assert "unauthenticated" in codes
    finally:
        proc.kill()
        proc.wait(10)


def test_authenticated_peer_is_bounded_in_streams_bytes_and_time(attacker):
    from fedarena.federated.transport import StreamLimits, serve

    secret = auth.new_secret()
    limits = wire.Limits(max_message_bytes=8 << 20)
    handled = []

    def handler(msg, n):
        handled.append(msg.kind)
        return "pong", {"n": n}

    node, port = serve(handler, "127.0.0.1:0", kinds=("ping", "echo"), limits=limits, secret=secret, name="t",
                       stream_limits=StreamLimits(max_streams_per_peer=3, request_deadline_s=3.0))
    address = f"127.0.0.1:{port}"
    creds = auth.client_credentials(secret, "a")
    try:
        big = 8 << 20

        def half():  # declares 8 MiB, sends 1 MiB, stalls
            yield msgpack.packb([wire.WIRE_VERSION, 0, 8, big, b"\x00" * (1 << 20)], use_bin_type=True)

        attacker.open(address, 3, metadata=creds.metadata(), frames=half)
        end = time.monotonic() + 10
        while len(attacker.replies) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        # the first stream reserved the peer's 8 MiB; the two others were refused at their first frame
        first = [wire.decode(r).body for r in attacker.replies[:2]]
        assert [(b["code"], b["field"]) for b in first] == [("unavailable", "frame.total_bytes")] * 2
        # with the first one stalled, two more fill the peer's 3 streams, and a fourth is refused ...
        attacker.open(address, 2, metadata=creds.metadata(), frames=lambda: iter(()))
        time.sleep(0.2)
        attacker.open(address, 1, metadata=creds.metadata(), frames=lambda: iter(()))
        end = time.monotonic() + 10
        while len(attacker.replies) < 3 and time.monotonic() < end:
            time.sleep(0.02)
        b = wire.decode(attacker.replies[2]).body
        assert (b["code"], b["field"]) == ("unavailable", "stream") and "open streams" in b["reason"]
        # ... until the request deadline cuts the stalled ones off
        end = time.monotonic() + 20
        while len(attacker.replies) < 6 and time.monotonic() < end:
            time.sleep(0.05)
        late = [wire.decode(r).body for r in attacker.replies[3:]]
        assert [x["code"] for x in late] == ["timeout"] * 3
        assert node.admission.streams == {} and node.admission.bytes_total == 0
        # and the peer is served normally again; nothing of the attack reached the handler
        assert handled == []
        p = Peer(address, limits=limits, credentials=creds)
        assert p.call("echo", {"x": 1}).kind == "pong"
        # a client cannot speak for another client inside the body
        with pytest.raises(RemoteError) as info:
            p.call("echo", {"client_id": "b", "token": auth.client_token(secret, "b")})
        assert info.value.code == "unauthenticated" and "not the stream's authenticated client" in info.value.reason
        p.close()
        anon = Peer(address, limits=limits)
        assert anon.call("ping", {}).kind == "pong"  # anonymous: ping only ...
        with pytest.raises(RemoteError) as info:
            anon.call("echo", {})
        assert info.value.code == "unauthenticated" and "only ping" in info.value.reason
        with pytest.raises(RemoteError) as info:  # ... and at most 4 KiB
            anon.call("ping", {"pad": b"x" * 5000})
        assert info.value.code == "malformed" and info.value.field.startswith("frame")
        anon.close()
    finally:
        node.stop(0)


def test_mutual_tls_deployment_trains_and_refuses_callers_without_a_valid_certificate(make_cluster, tmp_path):
    from fedarena.federated.certs import loopback_pki

    tls = loopback_pki(tmp_path / "pki")
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
    # server-authenticated TLS only (no client certificate): the handshake is refused
    one_way = TLSFiles(root_cert=tls.root_cert, server_name="localhost")
    other = loopback_pki(tmp_path / "other")  # a certificate from a CA the cluster does not trust
    for bad in (one_way, TLSFiles(cert_chain=other.cert_chain, private_key=other.private_key,
                                  root_cert=tls.root_cert, server_name="localhost", mutual=True)):
        for address in (c.address, c.servers[0].address):
            p = Peer(address, tls=bad)
            with pytest.raises(TransportError) as info:
                p.call("ping", {"cluster_token": auth.cluster_token(c.secret)}, timeout=3)
            assert info.value.code == "UNAVAILABLE"
            p.close()
    assert os.stat(tls.private_key).st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="tls.mutual"):
        TLSFiles(root_cert=tls.root_cert, mutual=True)


def test_a_client_certificate_speaks_only_for_its_own_client_id(tmp_path):
    """With one certificate per client, client001's certificate plus client002's token is refused on every call."""
    from fedarena.federated.certs import loopback_pki
    from fedarena.federated.protocol import CLIENT_KINDS
    from fedarena.federated.transport import serve

    tls = loopback_pki(tmp_path / "pki", client_ids=["client001", "client002"])
    secret = auth.new_secret()
    node, port = serve(lambda m, n: ("pong", {"who": m.body["client_id"]}), "127.0.0.1:0", kinds=CLIENT_KINDS,
                       secret=secret, tls=tls)
    try:
        def call(cert_of, as_id):
            p = Peer(f"127.0.0.1:{port}", tls=tls.for_client(cert_of))
            try:
                return p.call("get_task", {"client_id": as_id, "token": auth.client_token(secret, as_id)}, timeout=10)
            finally:
                p.close()

        assert call("client002", "client002").body["who"] == "client002"
        for _ in range(2):  # on every call, not just the first of a connection
            with pytest.raises(RemoteError) as info:
                call("client001", "client002")
            assert info.value.code == "unauthenticated" and info.value.field == "metadata.fedarena-id"
            assert "presents the TLS certificate of client001" in info.value.reason
        # the node certificate (the cluster's) does not speak for a client either
        p = Peer(f"127.0.0.1:{port}", tls=tls)
        with pytest.raises(RemoteError, match="presents the TLS certificate of"):
            p.call("get_task", {"client_id": "client001", "token": auth.client_token(secret, "client001")}, timeout=10)
        p.close()
        assert call("client001", "client001").body["who"] == "client001"
        assert os.stat(tmp_path / "pki" / "clients" / "client001.key").st_mode & 0o777 == 0o600
    finally:
        node.stop(0)
    with pytest.raises(ValueError, match="tls.client_certs"):
        TLSFiles(client_certs=str(tmp_path), root_cert=tls.root_cert)


def test_cluster_members_relaying_for_many_clients_are_not_cut_off_by_per_peer_limits(attacker):
    from fedarena.federated.transport import StreamLimits, serve

    secret = auth.new_secret()
    node, port = serve(lambda m, n: ("pong", {}), "127.0.0.1:0", kinds=("ping", "secagg_down"), secret=secret,
                       name="t", stream_limits=StreamLimits(max_streams_per_peer=2, request_deadline_s=30.0))
    address = f"127.0.0.1:{port}"
    try:  # a server holding 6 relayed long-polls at once: a client id would be refused after 2
        attacker.open(address, 6, metadata=auth.cluster_credentials(secret, "server0").metadata())
        attacker.open(address, 3, metadata=auth.client_credentials(secret, "c").metadata())
        end = time.monotonic() + 10
        while len(attacker.replies) < 1 and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.3)
        assert node.admission.streams == {"cluster:server0": 6, "client:c": 2}
        assert [wire.decode(r).body["field"] for r in attacker.replies] == ["stream"]  # the client's third stream
    finally:
        node.stop(0)
