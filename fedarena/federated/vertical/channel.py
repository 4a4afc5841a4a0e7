"""Message passing between vertical-FL parties: an in-process link and a gRPC link, same messages.

:class:`Link` encodes every message to wire bytes and decodes (and type-checks) it on the receiving
side, exactly as on a network, so its byte counts and transcripts are those of the real protocol;
it counts bytes per direction and the time spent encoding, moving and decoding (the
*communication* share of an epoch), and can keep the full transcript for audits.
:class:`GrpcLink` carries the same envelopes over the horizontal runtime's gRPC method
(:mod:`fedarena.federated.transport`, frames of :mod:`fedarena.federated.wire`): every party runs a
node whose handler drops each received message into its inbox, and ``transfer`` is a real RPC.
Both offer ``transfer(sender, receiver, message, expected_type) -> decoded message``.
"""

from __future__ import annotations

import queue
import time
from collections import defaultdict
from dataclasses import dataclass, field

from fedarena.federated.vertical import messages


@dataclass
class LinkStats:
    bytes: dict = field(default_factory=lambda: defaultdict(int))
    messages: dict = field(default_factory=lambda: defaultdict(int))
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return int(sum(self.bytes.values()))


class Link:
    """In-process channel between named parties; ``transfer`` = send + receive of one message."""

    def __init__(self, record: bool = False, latency_s: float = 0.0) -> None:
        self.record = record
        self.latency_s = float(latency_s)
        self.stats = LinkStats()
        self.transcripts: dict[tuple[str, str], list[bytes]] = defaultdict(list)

    def transfer(self, sender: str, receiver: str, message: object, expected: type | tuple[type, ...] | None = None):
        t0 = time.perf_counter()
        data = messages.encode(message)
        self.stats.bytes[(sender, receiver)] += len(data)
        self.stats.messages[(sender, receiver)] += 1
        if self.record:
            self.transcripts[(sender, receiver)].append(data)
        if self.latency_s:
            time.sleep(self.latency_s)
        out = messages.decode(data, expected)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def received_by(self, party: str) -> bytes:
        """Everything ``party`` received, concatenated (for transcript audits)."""
        return b"".join(b"".join(v) for (s, r), v in self.transcripts.items() if r == party)

    def reset_stats(self) -> LinkStats:
        old, self.stats = self.stats, LinkStats()
        return old


class GrpcLink:
    """Parties as gRPC nodes on ``host`` (loopback by default); ``transfer`` sends a real RPC."""

    def __init__(self, parties: tuple[str, ...] = ("A", "B", "C"), host: str = "127.0.0.1", timeout: float = 120.0) -> None:
        from fedarena.federated import transport

        self._transport = transport
        self.timeout = timeout
        self.stats = LinkStats()
        self._inbox: dict[str, queue.Queue] = {}
        self._servers, self._peers = {}, {}
        allowed = messages.kinds()
        for p in parties:
            box: queue.Queue = queue.Queue()
            self._inbox[p] = box

            def handler(msg, size, box=box):
                box.put(msg)
                return "vfl.ack", {}

            server, port = transport.serve(handler, f"{host}:0", kinds=allowed, name=f"vfl-{p}", max_workers=4)
            self._servers[p] = server
            self._peers[p] = transport.Peer(f"{host}:{port}")

    def transfer(self, sender: str, receiver: str, message: object, expected: type | tuple[type, ...] | None = None):
        t0 = time.perf_counter()
        kind, body = messages.body_of(message)
        peer = self._peers[receiver]
        before = peer.bytes_sent
        peer.call(kind, body, timeout=self.timeout)
        self.stats.bytes[(sender, receiver)] += peer.bytes_sent - before
        self.stats.messages[(sender, receiver)] += 1
        env = self._inbox[receiver].get(timeout=self.timeout)
        out = messages.from_envelope(env, expected)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def reset_stats(self) -> LinkStats:
        old, self.stats = self.stats, LinkStats()
        return old

    def close(self) -> None:
        for p in self._peers.values():
            p.close()
        for s in self._servers.values():
            s.stop(grace=None)
