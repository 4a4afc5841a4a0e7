"""What bounding gRPC's HTTP/2 receive window would cost a legitimate upload, and what it saves under attack.

The transport's server takes gRPC's default flow control: BDP probing grows each stream's receive window
with the measured bandwidth-delay product. A stream the server refuses (forged credentials, or an anonymous
stream past its 4 KiB) might therefore have part of its data buffered by gRPC before the handler's refusal
closes it; turning BDP probing off (``grpc.http2.bdp_probe=0``) and fixing the window
(``grpc.http2.lookahead_bytes``) would bound that, at a price on links with a long round trip. This script
measures both sides.

For each server option set this script starts a node (``transport.serve``) in a process of its own, with
the options appended to the transport's channel options (the transport has no setting for them, so the
node's process patches ``transport._channel_options``), and measures

* the wall time of an authenticated upload of ``--mib`` MiB through a loopback TCP proxy that delays every
  byte by ``--delay-ms`` in each direction (round trip twice that; pipelined, no bandwidth limit of its own),
* the node's resident-memory growth while four streams (two with forged credentials, two anonymous) each
  send 15 MiB of a declared 16 MiB message and stall: the attack of
  ``tests/federated/test_fl_transport_attacks.py``, with that test's attacker (full buffering would be 60 MiB).

Usage::

    python benchmarks/grpc_receive_window.py [--mib 64] [--delay-ms 25] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests" / "federated"))

from test_fl_transport_attacks import FORGED, Attacker, _rss_bytes  # noqa: E402  the test's attacker

from fedarena.federated import auth, wire  # noqa: E402
from fedarena.federated.transport import Peer  # noqa: E402

CONFIGS = {
    "gRPC defaults": [],
    "bdp_probe=0": [["grpc.http2.bdp_probe", 0]],
    **{f"bdp_probe=0, lookahead {m} MiB": [["grpc.http2.bdp_probe", 0], ["grpc.http2.lookahead_bytes", m << 20]]
       for m in (1, 2, 4, 8)},
}

_NODE = r"""
import json, os, time
from fedarena.federated import auth, protocol, transport, wire
extra = [tuple(x) for x in json.loads(os.environ["EXTRA_OPTS"])]
base = transport._channel_options
transport._channel_options = lambda chunk: base(chunk) + extra
node, port = transport.serve(lambda m, n: ("pong", {"n": n}), "127.0.0.1:0", kinds=protocol.CLIENT_KINDS,
                             secret=bytes.fromhex(os.environ["SECRET"]), limits=wire.Limits(max_message_bytes=1 << 30))
print(port, flush=True)
time.sleep(3600)
"""

_PROXY = r"""
import asyncio, sys, time
target, delay = int(sys.argv[1]), float(sys.argv[2])

async def pipe(reader, writer):
    queue = asyncio.Queue()

    async def deliver():
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            writer.write(data)
            await writer.drain()

    task = asyncio.ensure_future(deliver())
    while True:
        data = await reader.read(1 << 16)
        await queue.put((time.monotonic() + delay, data or None))
        if not data:
            break
    await task

async def handle(r1, w1):
    r2, w2 = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(r1, w2), pipe(r2, w1), return_exceptions=True)

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""



def _frames():  # 15 of the 16 1-MiB frames of a 16 MiB message, as the test sends them; then the stream stalls
    chunk, total = b"\x01" * (1 << 20), 16 << 20
    for i in range(15):
        yield msgpack.packb([wire.WIRE_VERSION, i, 16, total, chunk], use_bin_type=True)


def _measure(extra: list, mib: int, delay_s: float) -> tuple[float, float]:
    secret = auth.new_secret()
    env = dict(os.environ, PYTHONPATH=str(ROOT), EXTRA_OPTS=json.dumps(extra), SECRET=secret.hex())
    node = subprocess.Popen([sys.executable, "-c", _NODE], stdout=subprocess.PIPE, env=env, text=True)
    proxy = None
    try:
        port = int(node.stdout.readline())
        proxy = subprocess.Popen([sys.executable, "-c", _PROXY, str(port), str(delay_s)], stdout=subprocess.PIPE, text=True)
        # first the attack, straight to the node (no proxy: the buffering a fast attacker gets), on a node
        # that has answered one call
        warm = Peer(f"127.0.0.1:{port}")
        warm.call("ping", {}, timeout=60)
        warm.close()
        before = _rss_bytes(node.pid)
        attacker = Attacker()
        attacker.open(f"127.0.0.1:{port}", 2, metadata=FORGED, frames=_frames)
        attacker.open(f"127.0.0.1:{port}", 2, frames=_frames)  # no credentials
        end = time.monotonic() + 60
        while len(attacker.replies) < 4 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)
        grown = (_rss_bytes(node.pid) - before) / 2**20
        attacker.close()
        peer = Peer(f"127.0.0.1:{int(proxy.stdout.readline())}", credentials=auth.client_credentials(secret, "a"),
                    limits=wire.Limits(max_message_bytes=1 << 30))
        peer.call("ping", {}, timeout=60)
        payload = np.ones(mib << 18, np.float32)
        t0 = time.perf_counter()
        reply = peer.call("ping", {"x": payload}, timeout=600)
        upload_s = time.perf_counter() - t0
        peer.close()
        if reply.body["n"] < payload.nbytes:
            raise SystemExit("grpc_receive_window: the node did not receive the whole upload")
        return upload_s, grown
    finally:
        for p in (node, proxy):
            if p is not None:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="size of the authenticated upload")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay of the proxy (round trip: twice)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{args.mib} MiB authenticated upload through a {2 * args.delay_ms:g} ms round-trip proxy; node memory growth "
          "under four stalled 15 MiB streams refused by the node (full buffering: 60 MiB)")
    print(f"{'server options':34s}{'upload s (median)':>18s}{'vs defaults':>12s}{'growth MiB (max)':>18s}   runs")
    base = None
    for name, extra in CONFIGS.items():
        runs = [_measure(extra, args.mib, args.delay_ms / 1e3) for _ in range(args.repeats)]
        up = statistics.median(u for u, _ in runs)
        base = base or up
        print(f"{name:34s}{up:18.2f}{up / base:11.2f}x{max(g for _, g in runs):18.1f}   "
              + ", ".join(f"{u:.2f} s / {g:.1f} MiB" for u, g in runs), flush=True)


if __name__ == "__main__":
    main()
