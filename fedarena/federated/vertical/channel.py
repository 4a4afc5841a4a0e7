"""Message passing between vertical-FL parties: an in-process link and a gRPC link, same messages.

:class:`Link` encodes every message to wire bytes and decodes (and type-checks) it on the receiving
side, exactly as on a network, so its byte counts and transcripts are those of the real protocol;
it counts bytes per direction and the time spent encoding, moving and decoding (the
*communication* share of an epoch), and can keep the full transcript for audits.
:class:`GrpcLink` carries the same envelopes over the horizontal runtime's gRPC method
(:mod:`fedarena.federated.transport`, frames of :mod:`fedarena.federated.wire`): every party runs a
node whose handler drops each authenticated message into a bounded per-sender inbox, and
``transfer`` is a real RPC.
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
    """Parties as gRPC nodes on ``host`` (loopback by default); ``transfer`` sends a real RPC.

    Every party authenticates every stream it sends (:class:`~fedarena.federated.auth.PartyAuthenticator`):
    the stream's metadata names the sending party, carries its token for this *session* (derived
    from ``secret`` and ``session``; a fresh secret and session id by default) and an HMAC of the
    message bytes with its direction and sequence number. A receiver refuses, before reading, a
    stream without a valid party token, and, before decoding, a message whose MAC or sequence
    number is wrong (another session, an altered message, a replay, a reordering). Received
    messages wait in one inbox per sender holding at most ``inbox_size`` messages; a sender that
    overfills it is refused (``unavailable``), and ``transfer(sender, receiver, ...)`` takes the next
    message from ``sender``'s inbox only, so an intruder's message can never stand in for a party's.
    ``tls`` (e.g. mutual TLS from :func:`fedarena.federated.certs.loopback_pki`) encrypts the links.
    """

    def __init__(self, parties: tuple[str, ...] = ("A", "B", "C"), host: str = "127.0.0.1", timeout: float = 120.0,
                 *, secret: bytes | None = None, session: str | None = None, inbox_size: int = 64,
                 tls=None) -> None:
        import secrets as _secrets
        import threading

        from fedarena.federated import auth, transport, wire

        if inbox_size < 1:
            raise ValueError(f"inbox_size: must be >= 1, got {inbox_size}")
        if len(set(parties)) != len(parties) or not all(auth.valid_client_id(p) for p in parties):
            raise ValueError(f"parties: must be distinct names matching [A-Za-z0-9_.-]{{1,64}}, got {parties}")
        self._auth, self._wire, self._transport = auth, wire, transport
        self.timeout = timeout
        self.stats = LinkStats()
        self.session = session or _secrets.token_hex(16)
        self._secret = secret or auth.new_secret()
        self.inbox_size = int(inbox_size)
        self._inbox: dict[str, dict[str, queue.Queue]] = {}
        self._next_in: dict[str, dict[str, int]] = {}
        self._next_out: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()
        self._servers, self._peers = {}, {}
        allowed = messages.kinds()
        for p in parties:
            boxes = {q: queue.Queue(maxsize=self.inbox_size) for q in parties if q != p}
            self._inbox[p] = boxes
            self._next_in[p] = {q: 0 for q in boxes}

            def handler(msg, size, identity, metadata, me=p):
                return self._deliver(me, msg, identity, metadata)

            authenticator = auth.PartyAuthenticator(self._secret, self.session, tuple(parties), p)
            server, port = transport.serve(handler, f"{host}:0", kinds=allowed, name=f"vfl-{p}", tls=tls,
                                           authenticator=authenticator, pass_identity=True,
                                           stream_limits=transport.StreamLimits(workers=4, cluster_workers=1,
                                                                                health_workers=1))
            self._servers[p] = server
            self._peers[p] = transport.Peer(f"{host}:{port}", tls=tls)

    def _deliver(self, me: str, msg, identity, metadata) -> tuple[str, dict]:
        seq = self._auth.message_seq(metadata)
        sender = identity.name
        with self._lock:  # the sequence check and the put are one step: a replay cannot slip in between
            want = self._next_in[me][sender]
            if seq != want:
                raise self._transport.ProtocolError("metadata.fedarena-seq", f"expected message {want} from {sender}, "
                                                    f"got {seq} (replay or reorder)", "replay")
            try:
                self._inbox[me][sender].put_nowait(msg)
            except queue.Full:
                raise self._transport.ProtocolError("inbox", f"{me}'s inbox from {sender} holds {self.inbox_size} "
                                                    "unread messages", "unavailable") from None
            self._next_in[me][sender] = want + 1
        return "vfl.ack", {}

    def pending(self, receiver: str, sender: str) -> int:
        """Messages from ``sender`` waiting in ``receiver``'s inbox."""
        return self._inbox[receiver][sender].qsize()

    def send(self, sender: str, receiver: str, message: object) -> int:
        """Send one message (authenticated, sequenced) without waiting for it to be taken; returns its bytes."""
        if receiver == sender or sender not in self._inbox or receiver not in self._inbox:
            raise ValueError(f"send: unknown sender/receiver {sender!r} -> {receiver!r}")
        kind, body = messages.body_of(message)
        data = self._wire.encode(kind, body)
        seq = self._next_out[(sender, receiver)]
        creds = self._auth.Credentials("party", sender, self._auth.party_token(self._secret, self.session, sender))
        mac = self._auth.message_mac(self._secret, self.session, sender, receiver, seq, data)
        peer = self._peers[receiver]
        frames = list(self._wire.split_frames(data, peer.chunk_bytes))
        reply = self._wire.decode(peer.exchange_frames(frames, self.timeout, creds,
                                                       ((self._auth.SEQ_KEY, str(seq)), (self._auth.MAC_KEY, mac))))
        if reply.kind == "error":
            b = reply.body
            raise self._transport.RemoteError(str(b.get("code", "")), str(b.get("field", "")), str(b.get("reason", "")))
        self._next_out[(sender, receiver)] = seq + 1
        return sum(len(f) for f in frames)

    def transfer(self, sender: str, receiver: str, message: object, expected: type | tuple[type, ...] | None = None):
        t0 = time.perf_counter()
        sent = self.send(sender, receiver, message)
        self.stats.bytes[(sender, receiver)] += sent
        self.stats.messages[(sender, receiver)] += 1
        env = self._inbox[receiver][sender].get(timeout=self.timeout)
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
