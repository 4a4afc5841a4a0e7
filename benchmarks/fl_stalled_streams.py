"""Latency of an authenticated upload and of the scheduler's health checks, with and without stalled streams.

An in-process FL deployment on loopback gRPC (scheduler + one FL-Server, numpy task). For each condition
(0 stalled streams, then N stalled unauthenticated streams opened at the server and at the scheduler: half
without credentials, half with a forged token and one frame sent), the script times REPEATS of:

* an authenticated ``upload`` (the client's normal RPC timeout is 10 s),
* the scheduler's health ping of the server (normal timeout 1 s),
* a client's ``assign`` request to the scheduler,

and checks that the server never missed its heartbeat. It prints the median and max of each and the ratio
to the unloaded median. Usage::

    python benchmarks/fl_stalled_streams.py [--streams 300] [--repeats 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import grpc.aio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedarena.federated import auth, wire  # noqa: E402
from fedarena.federated.protocol import RoundConfig  # noqa: E402
from fedarena.federated.scheduler import RoundPolicy, Scheduler  # noqa: E402
from fedarena.federated.server import FLServer, ServerOptions  # noqa: E402
from fedarena.federated.task import TaskSpec, build_task  # noqa: E402
from fedarena.federated.transport import FULL_METHOD, Peer  # noqa: E402


def stall(address: str, count: int, loop: asyncio.AbstractEventLoop, release) -> None:
    forged = auth.Credentials("client", "mallory", "0" * 64).metadata()
    frame0 = list(wire.split_frames(b"\x00" * 3000, 1000))[:1]

    async def start():
        ch = grpc.aio.insecure_channel(address)
        stub = ch.stream_stream(FULL_METHOD)
        calls = []
        for i in range(count):
            async def requests(first=frame0 if i % 2 else ()):
                for f in first:
                    yield f
                await release.wait()

            call = stub(requests(), metadata=forged if i % 2 else None)
            calls.append(call)

            async def drain(call=call):
                try:
                    async for _ in call:
                        pass
                except grpc.aio.AioRpcError:
                    pass

            asyncio.ensure_future(drain())
        return ch, calls

    return asyncio.run_coroutine_threadsafe(start(), loop).result(60)


def measure(sched, srv, pa, secret, task, clients):
    ups, pings, assigns = [], [], []
    sp = Peer(sched_address(sched))
    for cid in clients:  # every upload is a different selected client's first one: all are accepted
        delta = {k: np.full(v.shape, 1e-3, np.float32) for k, v in task["params"].items()}
        body = {"client_id": cid, "token": auth.client_token(secret, cid), "round": task["round"],
                "model_version": task["model_version"], "num_examples": 10, "nonce": os.urandom(16),
                "encoding": "dense", "update": delta, "train_loss": 0.5}
        t = time.perf_counter()
        assert pa.call("upload", body, timeout=10).kind == "ack"
        ups.append(time.perf_counter() - t)
        t = time.perf_counter()
        ok = sched._ping_server("s0")
        pings.append(time.perf_counter() - t if ok else float("inf"))
        t = time.perf_counter()
        sp.call("assign", {"client_id": "b", "token": auth.client_token(secret, "b"), "failed_server": ""}, timeout=10)
        assigns.append(time.perf_counter() - t)
    sp.close()
    return ups, pings, assigns


def sched_address(sched):
    return f"127.0.0.1:{sched.port}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    task_spec = TaskSpec(dataset="synthetic", num_clients=4, hidden=(8,), trainer="numpy", synthetic_features=10,
                         synthetic_classes=3, synthetic_examples=400)
    tb = build_task(task_spec)
    secret = auth.new_secret()
    tmp = tempfile.mkdtemp(prefix="fl-stall-")
    clients = [f"c{i}" for i in range(2 * args.repeats + 1)]  # the last one never uploads: the round stays open
    policy = RoundPolicy(rounds=3, window_seconds=600, start_clients=len(clients), min_fraction=0.5,
                         round_config=RoundConfig(epochs=1, batch_size=8, lr=0.1))
    sched = Scheduler(policy, tb.trainer.init_params(0), secret, Path(tmp) / "state.fl")
    sched.start("127.0.0.1:0")
    srv = FLServer("s0", sched_address(sched), secret, ServerOptions(sync_wait_s=0.2, max_update_norm=50.0))
    srv.start("127.0.0.1:0")
    pa = Peer(srv.address)
    for cid in clients:
        pa.call("register", {"client_id": cid, "token": auth.client_token(secret, cid), "num_examples": 10})
    while sched.phase != "open":
        time.sleep(0.02)
    task = pa.call("get_task", {"client_id": "c0", "token": auth.client_token(secret, "c0"), "have_version": -1,
                                "wait_s": 1.0}).body
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def make_event():
        return asyncio.Event()

    release = asyncio.run_coroutine_threadsafe(make_event(), loop).result()

    results = {}
    results[0] = measure(sched, srv, pa, secret, task, clients[: args.repeats])
    stall(srv.address, args.streams, loop, release)
    stall(sched_address(sched), args.streams, loop, release)
    time.sleep(0.5)
    t_start = time.monotonic()
    results[args.streams] = measure(sched, srv, pa, secret, task, clients[args.repeats : 2 * args.repeats])
    time.sleep(max(0.0, policy.server_timeout_s + 0.5 - (time.monotonic() - t_start)))
    alive = sched.servers["s0"].alive
    base = {name: statistics.median(v) for name, v in zip(("upload", "ping", "assign"), results[0])}
    print(f"{args.streams} stalled unauthenticated streams at the server and at the scheduler; {args.repeats} "
          "repeats each")
    for n, (ups, pings, assigns) in results.items():
        for name, v in (("upload", ups), ("ping", pings), ("assign", assigns)):
            med = statistics.median(v)
            print(f"  streams={n:4d} {name:7s} median {med * 1e3:8.2f} ms  max {max(v) * 1e3:8.2f} ms  "
                  f"ratio to unloaded median {med / base[name]:5.2f}")
    print(f"  server alive in the scheduler's view after {policy.server_timeout_s + 0.5:.1f} s of attack: {alive}")
    print(f"  server admission: anonymous open {srv._grpc.admission.anonymous}, refused {srv._grpc.admission.refused}")
    loop.call_soon_threadsafe(release.set)
    pa.close()
    srv.stop()
    sched.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
