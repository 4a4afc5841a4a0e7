"""Per-stage messages of secure aggregation and their binary wire format.

Stages follow Bonawitz et al. (CCS 2017), Figure 4: 0 AdvertiseKeys, 1 ShareKeys, 2 MaskedInputCollection,
3 ConsistencyCheck (only with ``SecAggConfig.consistency_check``; the malicious-server variant of the paper's
Figure 5), 4 Unmasking; server-to-client messages carry what a client needs for its next stage.

Wire format (all integers little-endian; no pickle): a 17-byte header ``b"FSA" | version u8 = 2 | type u8 |
round_id u64 | party u32`` (``party`` = sender id for client messages, recipient id for server messages), then the
payload of the type as documented on each class. Lists are ``count u32`` followed by the items. :func:`decode`
checks every length and count against the buffer and raises :class:`MalformedMessage` naming the field.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"FSA"
VERSION = 2
KEY_BYTES = 32
SIGNATURE_BYTES = 64  # Ed25519
HEADER = struct.Struct("<3sBBQI")


class MalformedMessage(ValueError):
    """A message that cannot be parsed (wrong length, bad count, unknown type)."""


@dataclass(frozen=True, eq=False)
class AdvertiseKeys:
    """Stage 0, client -> server. Payload: ``c_pk[32] s_pk[32]`` (X25519 public keys for encryption and masks),
    then, with the consistency check, ``sig_pk[32] key_signature[64]``: the client's Ed25519 verification key and
    its signature of the two X25519 keys (:func:`~fedarena.privacy.secagg.protocol.key_transcript`)."""

    TYPE = 1
    round_id: int
    client_id: int
    c_pk: bytes
    s_pk: bytes
    sig_pk: bytes = b""
    key_signature: bytes = b""


@dataclass(frozen=True, eq=False)
class KeyBroadcast:
    """Stage 0 -> 1, server -> client. Payload: ``graph_seed[32] | members: list of u32 | keys: list of
    (id u32, c_pk[32], s_pk[32]) | signing: list of (id u32, sig_pk[32], key_signature[64])`` with the keys of the
    recipient and its neighbours (``signing`` is empty without the consistency check)."""

    TYPE = 2
    round_id: int
    recipient: int
    graph_seed: bytes
    members: tuple[int, ...]
    keys: dict[int, tuple[bytes, bytes]]
    signing: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class ShareKeys:
    """Stage 1, client -> server. Payload: list of (recipient u32, length u32, ciphertext) -- the sender's
    authenticated-encrypted Shamir shares, one per neighbour."""

    TYPE = 3
    round_id: int
    client_id: int
    ciphertexts: dict[int, bytes]


@dataclass(frozen=True, eq=False)
class ShareBroadcast:
    """Stage 1 -> 2, server -> client. Payload: list of (sender u32, length u32, ciphertext) addressed to the
    recipient; the senders are the recipient's neighbours that completed stage 1."""

    TYPE = 4
    round_id: int
    recipient: int
    ciphertexts: dict[int, bytes]


@dataclass(frozen=True, eq=False)
class MaskedInput:
    """Stage 2, client -> server. Payload: ``d u32 | y: d x u32`` (the masked, quantized input mod 2^k)."""

    TYPE = 5
    round_id: int
    client_id: int
    masked: np.ndarray


@dataclass(frozen=True, eq=False)
class SurvivorList:
    """Stage 2 -> 3 (consistency check), server -> client. Payload: ``survivors: list of u32`` (U3, the clients
    whose masked input the server holds)."""

    TYPE = 8
    round_id: int
    recipient: int
    survivors: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ConsistencySignature:
    """Stage 3, client -> server. Payload: ``signature[64]``, the client's Ed25519 signature of the survivor list
    it received (:func:`~fedarena.privacy.secagg.protocol.survivor_transcript`)."""

    TYPE = 9
    round_id: int
    client_id: int
    signature: bytes


@dataclass(frozen=True, eq=False)
class UnmaskRequest:
    """Stage 2 (or 3) -> 4, server -> client. Payload: ``survivors: list of u32 | dropped: list of u32 |
    signatures: list of (id u32, signature[64])``; the signatures (of the clients that passed the consistency
    check, U4) are empty without the check."""

    TYPE = 6
    round_id: int
    recipient: int
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: dict[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class UnmaskShares:
    """Stage 3, client -> server. Payload: ``mask_seed_shares: list of (id u32, share) | key_shares: list of
    (id u32, share)``; a share is ``SECRET_BYTES`` little-endian uint16 field elements. Seed shares are for
    surviving neighbours, key shares for dropped ones (never both for one client)."""

    TYPE = 7
    round_id: int
    client_id: int
    seed_shares: dict[int, np.ndarray]
    key_shares: dict[int, np.ndarray]


SHARE_LEN = 32  # field elements per share (one per byte of a 32-byte secret)
Message = (AdvertiseKeys | KeyBroadcast | ShareKeys | ShareBroadcast | MaskedInput | SurvivorList | ConsistencySignature
           | UnmaskRequest | UnmaskShares)


def _ids(ids) -> bytes:
    return struct.pack("<I", len(ids)) + np.asarray(list(ids), dtype="<u4").tobytes()


def _blobs(items: dict[int, bytes]) -> bytes:
    parts = [struct.pack("<I", len(items))]
    for k, v in items.items():
        parts.append(struct.pack("<II", k, len(v)))
        parts.append(bytes(v))
    return b"".join(parts)


def _signatures(items: dict[int, bytes]) -> bytes:
    parts = [struct.pack("<I", len(items))]
    for k, v in items.items():
        if len(v) != SIGNATURE_BYTES:
            raise ValueError(f"signatures[{k}]: must be {SIGNATURE_BYTES} bytes, got {len(v)}")
        parts.append(struct.pack("<I", k) + bytes(v))
    return b"".join(parts)


def _shares(items: dict[int, np.ndarray]) -> bytes:
    parts = [struct.pack("<I", len(items))]
    for k, v in items.items():
        parts.append(struct.pack("<I", k))
        parts.append(np.asarray(v, dtype="<u2").tobytes())
    return b"".join(parts)


def encode(msg: Message) -> bytes:
    """Serialize a message (see the module docstring for the layout)."""
    party = getattr(msg, "client_id", None)
    if party is None:
        party = msg.recipient
    head = HEADER.pack(MAGIC, VERSION, msg.TYPE, msg.round_id, party)
    if isinstance(msg, AdvertiseKeys):
        body = msg.c_pk + msg.s_pk
        if msg.sig_pk or msg.key_signature:
            if len(msg.sig_pk) != KEY_BYTES or len(msg.key_signature) != SIGNATURE_BYTES:
                raise ValueError("AdvertiseKeys.sig_pk/key_signature: must be 32 and 64 bytes")
            body += msg.sig_pk + msg.key_signature
    elif isinstance(msg, KeyBroadcast):
        keys = [struct.pack("<I", len(msg.keys))]
        for k, (c, s) in msg.keys.items():
            keys.append(struct.pack("<I", k) + c + s)
        keys.append(struct.pack("<I", len(msg.signing)))
        for k, (pk, sig) in msg.signing.items():
            keys.append(struct.pack("<I", k) + pk + sig)
        body = msg.graph_seed + _ids(msg.members) + b"".join(keys)
    elif isinstance(msg, (ShareKeys, ShareBroadcast)):
        body = _blobs(msg.ciphertexts)
    elif isinstance(msg, MaskedInput):
        body = struct.pack("<I", msg.masked.size) + np.asarray(msg.masked, dtype="<u4").tobytes()
    elif isinstance(msg, SurvivorList):
        body = _ids(msg.survivors)
    elif isinstance(msg, ConsistencySignature):
        if len(msg.signature) != SIGNATURE_BYTES:
            raise ValueError(f"ConsistencySignature.signature: must be {SIGNATURE_BYTES} bytes")
        body = bytes(msg.signature)
    elif isinstance(msg, UnmaskRequest):
        body = _ids(msg.survivors) + _ids(msg.dropped) + _signatures(msg.signatures)
    elif isinstance(msg, UnmaskShares):
        body = _shares(msg.seed_shares) + _shares(msg.key_shares)
    else:
        raise TypeError(f"not a secure-aggregation message: {type(msg).__name__}")
    return head + body


class _Reader:
    def __init__(self, data: bytes, kind: str):
        self.data = memoryview(data)
        self.pos = 0
        self.kind = kind

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise MalformedMessage(f"{self.kind}.{field}: truncated (need {n} bytes at offset {self.pos}, "
                                   f"message has {len(self.data)})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self, field: str) -> int:
        return struct.unpack("<I", self.take(4, field))[0]

    def ids(self, field: str) -> tuple[int, ...]:
        n = self.u32(field + ".count")
        return tuple(int(i) for i in np.frombuffer(self.take(4 * n, field), dtype="<u4"))

    def blobs(self, field: str) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.u32(field + ".count")):
            k = self.u32(field + ".id")
            v = bytes(self.take(self.u32(field + ".length"), field))
            if k in out:
                raise MalformedMessage(f"{self.kind}.{field}: id {k} appears twice")
            out[k] = v
        return out

    def shares(self, field: str) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for _ in range(self.u32(field + ".count")):
            k = self.u32(field + ".id")
            if k in out:
                raise MalformedMessage(f"{self.kind}.{field}: id {k} appears twice")
            out[k] = np.frombuffer(self.take(2 * SHARE_LEN, field), dtype="<u2").copy()
        return out

    def signatures(self, field: str) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.u32(field + ".count")):
            k = self.u32(field + ".id")
            if k in out:
                raise MalformedMessage(f"{self.kind}.{field}: id {k} appears twice")
            out[k] = bytes(self.take(SIGNATURE_BYTES, field))
        return out

    def left(self) -> int:
        return len(self.data) - self.pos

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage(f"{self.kind}: {len(self.data) - self.pos} trailing bytes")


_TYPES = {c.TYPE: c for c in (AdvertiseKeys, KeyBroadcast, ShareKeys, ShareBroadcast, MaskedInput, SurvivorList,
                              ConsistencySignature, UnmaskRequest, UnmaskShares)}


def decode(data: bytes) -> Message:
    """Parse bytes produced by :func:`encode`; raise :class:`MalformedMessage` on any inconsistency."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedMessage(f"message: expected bytes, got {type(data).__name__}")
    if len(data) < HEADER.size:
        raise MalformedMessage(f"header: truncated ({len(data)} < {HEADER.size} bytes)")
    magic, version, mtype, round_id, party = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedMessage(f"header.magic: expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise MalformedMessage(f"header.version: unsupported version {version}")
    if mtype not in _TYPES:
        raise MalformedMessage(f"header.type: unknown message type {mtype}")
    cls = _TYPES[mtype]
    r = _Reader(bytes(data[HEADER.size:]), cls.__name__)
    if cls is AdvertiseKeys:
        c_pk, s_pk = bytes(r.take(KEY_BYTES, "c_pk")), bytes(r.take(KEY_BYTES, "s_pk"))
        sig_pk = sig = b""
        if r.left() == KEY_BYTES + SIGNATURE_BYTES:  # anything else is left for end() to refuse as trailing bytes
            sig_pk, sig = bytes(r.take(KEY_BYTES, "sig_pk")), bytes(r.take(SIGNATURE_BYTES, "key_signature"))
        msg = cls(round_id, party, c_pk, s_pk, sig_pk, sig)
    elif cls is KeyBroadcast:
        seed = bytes(r.take(KEY_BYTES, "graph_seed"))
        members = r.ids("members")
        keys: dict[int, tuple[bytes, bytes]] = {}
        for _ in range(r.u32("keys.count")):
            k = r.u32("keys.id")
            if k in keys:
                raise MalformedMessage(f"KeyBroadcast.keys: id {k} appears twice")
            keys[k] = (bytes(r.take(KEY_BYTES, "keys.c_pk")), bytes(r.take(KEY_BYTES, "keys.s_pk")))
        signing: dict[int, tuple[bytes, bytes]] = {}
        for _ in range(r.u32("signing.count")):
            k = r.u32("signing.id")
            if k in signing:
                raise MalformedMessage(f"KeyBroadcast.signing: id {k} appears twice")
            signing[k] = (bytes(r.take(KEY_BYTES, "signing.sig_pk")),
                          bytes(r.take(SIGNATURE_BYTES, "signing.key_signature")))
        msg = cls(round_id, party, seed, members, keys, signing)
    elif cls in (ShareKeys, ShareBroadcast):
        msg = cls(round_id, party, r.blobs("ciphertexts"))
    elif cls is MaskedInput:
        d = r.u32("masked.length")
        msg = cls(round_id, party, np.frombuffer(r.take(4 * d, "masked"), dtype="<u4").copy())
    elif cls is SurvivorList:
        msg = cls(round_id, party, r.ids("survivors"))
    elif cls is ConsistencySignature:
        msg = cls(round_id, party, bytes(r.take(SIGNATURE_BYTES, "signature")))
    elif cls is UnmaskRequest:
        msg = cls(round_id, party, r.ids("survivors"), r.ids("dropped"), r.signatures("signatures"))
    else:
        msg = cls(round_id, party, r.shares("seed_shares"), r.shares("key_shares"))
    r.end()
    return msg
