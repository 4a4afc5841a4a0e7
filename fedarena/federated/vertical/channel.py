"""Message passing between vertical-FL parties: an in-process link that really serialises every message.

Each message is encoded to wire bytes by the sender and decoded (and type-checked) by the receiver,
exactly as it would be over gRPC, so the byte counts and the transcripts recorded here are those of
the real protocol. :class:`Link` counts bytes per direction, the time spent encoding, moving and
decoding (the *communication* share of an epoch), and can keep the full transcript for audits.
"""

from __future__ import annotations

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
