"""Private set intersection by RSA blind signatures, streamed in chunks: the sample alignment of VFL.

Protocol (Yang et al., *Federated Learning*, 2019, sec. 5.2, after De Cristofaro & Tsudik, FC 2010).
Party A (the *server*) holds an RSA key (n, e, d); party B (the *client*) holds none.

1. A -> B: the public key (n, e) and the size of A's set.  B -> A: the size of B's set.
2. A -> B: t_j = H'(H(a_j)^d mod n) for every ID of A, in a secret random order (streamed in chunks).
3. B -> A: y_i = H(b_i) * R_i^e mod n with fresh random R_i in Z_n^* (chunks).
4. A -> B: y_i' = y_i^d mod n (CRT, on all cores).  B unblinds K_i = y_i' / R_i mod n, checks
   K_i^e = H(b_i) (a cheating or faulty A is caught), and keeps b_i whose H'(K_i) is among the t_j.
5. B -> A: the matched tags; A maps them to its IDs. Both then order the shared IDs by their bytes,
   which gives the two parties the same row order for training, whatever the key or input order.

A sees only blinded values (uniform in Z_n^*) and the tags of shared IDs; B sees tags of A's IDs,
which it cannot compute without d. Each party keeps O(chunk) big numbers in flight plus 32 bytes per
ID of A's set, so a million IDs fit in about 32 MB of tags.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import gmpy2
import numpy as np

from fedarena.federated.vertical import messages as msg
from fedarena.federated.vertical.messages import ProtocolError, message
from fedarena.federated.vertical.rsa_blind import (
    ALLOWED_KEY_BITS,
    DEFAULT_KEY_BITS,
    MIN_KEY_BITS,
    TAG_BYTES,
    RsaPrivateKey,
    RsaPublicKey,
    SigningPool,
    encode_id,
    full_domain_hash,
    check_key_bits,
    generate_key,
    tag,
)

DEFAULT_CHUNK = 2048
MAX_CHUNK = 1 << 16
MAX_SET = 1 << 31
DEFAULT_MAX_SIGNATURES = 1 << 22
"""default cap on blinded values one client may have A sign (each signature lets B test one ID against A's set)"""


# ----------------------------------------------------------------------------- messages


@message("psi.server_hello")
@dataclass(frozen=True)
class ServerHello:
    modulus_bits: int
    n: bytes
    e: int
    set_size: int
    chunk_size: int


@message("psi.client_hello")
@dataclass(frozen=True)
class ClientHello:
    set_size: int
    chunk_size: int


@message("psi.server_tags")
@dataclass(frozen=True)
class ServerTags:
    index: int
    count: int
    tags: bytes
    last: bool


@message("psi.blinded")
@dataclass(frozen=True)
class Blinded:
    index: int
    count: int
    values: bytes
    last: bool


@message("psi.signed")
@dataclass(frozen=True)
class Signed:
    index: int
    count: int
    values: bytes


@message("psi.matches")
@dataclass(frozen=True)
class Matches:
    count: int
    tags: bytes


@dataclass(frozen=True)
class PsiResult:
    """One party's view of the intersection: IDs in the agreed (tag) order and their input positions."""

    ids: list
    indices: list[int]


def _dedupe(ids: Iterable[str | bytes]) -> tuple[list, list[int], list[bytes]]:
    first: dict[bytes, int] = {}
    values: list = []
    for pos, x in enumerate(ids):
        b = encode_id(x)
        if b not in first:
            first[b] = pos
            values.append(x)
    return values, list(first.values()), list(first.keys())


def _canonical(ids: list, positions: list[int], chosen: Sequence[int]) -> PsiResult:
    """The shared IDs ordered by their canonical bytes: both parties know them, so both get the same
    order, independent of the key and of either party's input order."""
    order = sorted(chosen, key=lambda j: encode_id(ids[j]))
    return PsiResult([ids[j] for j in order], [positions[j] for j in order])


def _chunks(seq: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def _tags_array(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=f"S{TAG_BYTES}") if blob else np.empty(0, dtype=f"S{TAG_BYTES}")


# ----------------------------------------------------------------------------- party A


class SigningLedger:
    """How many blinded values each client has had signed, over all its PSI sessions, against one cap.

    Share one ledger between the :class:`PsiServer` sessions of a party A so that a client cannot
    reset its allowance by starting a new session."""

    def __init__(self, max_signatures: int = DEFAULT_MAX_SIGNATURES) -> None:
        if max_signatures < 0:
            raise ValueError(f"max_signatures: must be >= 0, got {max_signatures}")
        self.max_signatures = int(max_signatures)
        self.signed: dict[str, int] = {}

    def reserve(self, client: str, count: int, field: str) -> None:
        have = self.signed.get(client, 0)
        if have + count > self.max_signatures:
            raise ProtocolError(field, f"client {client!r} would have {have + count} values signed, over the cap "
                                f"of {self.max_signatures}")
        self.signed[client] = have + count


class PsiServer:
    """Party A: holds the RSA key, signs, and learns the intersection from B's matched tags.

    A signs at most ``max_signatures`` blinded values for the client of this session (``ledger``
    and ``client`` carry the count across sessions): the client's hello may not declare more,
    and every chunk is counted before it is signed."""

    def __init__(self, ids: Iterable[str | bytes], *, key: RsaPrivateKey | None = None,
                 key_bits: int = DEFAULT_KEY_BITS, chunk_size: int = DEFAULT_CHUNK,
                 workers: int | None = None, crt: bool = True, allow_insecure_keys: bool = False,
                 max_signatures: int = DEFAULT_MAX_SIGNATURES, ledger: SigningLedger | None = None,
                 client: str = "client") -> None:
        if not 1 <= chunk_size <= MAX_CHUNK:
            raise ValueError(f"chunk_size: must be in 1..{MAX_CHUNK}, got {chunk_size}")
        if key is not None:
            check_key_bits(key.public.bits, allow_insecure_keys)
        self.key = key if key is not None else generate_key(key_bits, allow_insecure_keys=allow_insecure_keys)
        self.ledger = ledger if ledger is not None else SigningLedger(max_signatures)
        self.client = client
        self.chunk_size = chunk_size
        self._ids, self._positions, id_bytes = _dedupe(ids)
        order = list(range(len(self._ids)))
        random.SystemRandom().shuffle(order)  # secret order: B must not learn A's ID order
        self._order = order
        self._id_bytes_shuffled = [id_bytes[i] for i in order]
        self._pool = SigningPool(self.key, workers, crt)
        self._tags: np.ndarray | None = None
        self._client_size: int | None = None
        self._client_chunk: int | None = None
        self._next_blinded = 0
        self._blinded_total = 0
        self._result: PsiResult | None = None

    @property
    def public_key(self) -> RsaPublicKey:
        return self.key.public

    def hello(self) -> ServerHello:
        pub = self.key.public
        return ServerHello(pub.bits, pub.n.to_bytes(pub.width, "big"), pub.e, len(self._ids), self.chunk_size)

    def receive_hello(self, m: ClientHello) -> None:
        left = self.ledger.max_signatures - self.ledger.signed.get(self.client, 0)
        msg.check_count(m.set_size, "psi.client_hello.set_size", 0, min(MAX_SET, max(0, left)))
        msg.check_count(m.chunk_size, "psi.client_hello.chunk_size", 1, MAX_CHUNK)
        self._client_size, self._client_chunk = m.set_size, m.chunk_size

    def tag_messages(self) -> Iterator[ServerTags]:
        """Stream t_j for A's IDs in the secret order; A keeps the tags to map matches back."""
        parts: list[bytes] = []
        chunks = list(_chunks(self._id_bytes_shuffled, self.chunk_size)) or [[]]
        for i, blob in enumerate(self._pool.map_tags(chunks)):
            parts.append(blob)
            yield ServerTags(i, len(blob) // TAG_BYTES, blob, i == len(chunks) - 1)
        self._tags = _tags_array(b"".join(parts))
        self._id_bytes_shuffled = []  # no longer needed

    def _check_blinded(self, m: Blinded) -> list[int]:
        if self._client_size is None:
            raise ProtocolError("psi.blinded", "received before the client hello")
        if m.index != self._next_blinded:
            raise ProtocolError("psi.blinded.index", f"expected chunk {self._next_blinded}, got {m.index}")
        msg.check_count(m.count, "psi.blinded.count", 0, self._client_chunk)
        width = self.key.public.width
        values = msg.blob_to_ints(m.values, width, m.count, "psi.blinded.values")
        msg.check_in_range(values, 1, self.key.public.n, "psi.blinded.values")
        if self._blinded_total + m.count > self._client_size:
            raise ProtocolError("psi.blinded.count", f"more values ({self._blinded_total + m.count}) than the declared set size {self._client_size}")
        if m.last and self._blinded_total + m.count != self._client_size:
            raise ProtocolError("psi.blinded.last", f"stream ended after {self._blinded_total + m.count} of {self._client_size} values")
        self.ledger.reserve(self.client, m.count, "psi.blinded.count")
        self._blinded_total += m.count
        self._next_blinded += 1
        return values

    def sign(self, m: Blinded) -> Signed:
        """Sign one chunk (validated first)."""
        values = self._check_blinded(m)
        out = next(self._pool.map_sign([values]))
        return Signed(m.index, len(out), msg.ints_to_blob(out, self.key.public.width))

    def sign_stream(self, stream: Iterable[Blinded]) -> Iterator[Signed]:
        """Sign a stream of chunks on all workers, in order; each chunk is validated before signing."""
        meta: list[int] = []

        def checked() -> Iterator[list[int]]:
            for m in stream:
                values = self._check_blinded(m)
                meta.append(m.index)
                yield values

        width = self.key.public.width
        for i, out in enumerate(self._pool.map_sign(checked())):
            yield Signed(meta[i], len(out), msg.ints_to_blob(out, width))

    def receive_matches(self, m: Matches) -> PsiResult:
        """Map B's matched tags to A's IDs; unknown or repeated tags are rejected."""
        if self._tags is None:
            raise ProtocolError("psi.matches", "received before A sent its tags")
        limit = min(len(self._ids), self._client_size or 0)
        msg.check_count(m.count, "psi.matches.count", 0, limit)
        if len(m.tags) != m.count * TAG_BYTES:
            raise ProtocolError("psi.matches.tags", f"{len(m.tags)} bytes for {m.count} tags of {TAG_BYTES} bytes")
        got = _tags_array(m.tags)
        if len(got) > 1 and not bool(np.all(got[1:] > got[:-1])):
            raise ProtocolError("psi.matches.tags", "tags must be strictly increasing (sorted, no repeats)")
        sort = np.argsort(self._tags, kind="stable")
        sorted_tags = self._tags[sort]
        pos = np.searchsorted(sorted_tags, got)
        pos_c = np.minimum(pos, max(len(sorted_tags) - 1, 0))
        ok = (pos < len(sorted_tags)) & (sorted_tags[pos_c] == got) if len(sorted_tags) else np.zeros(len(got), bool)
        if not bool(np.all(ok)):
            bad = int(np.argmin(ok))
            raise ProtocolError(f"psi.matches.tags[{bad}]", "not a tag that A sent")
        shuffled_idx = sort[pos]
        dedup_idx = [self._order[int(j)] for j in shuffled_idx]
        self._result = _canonical(self._ids, self._positions, dedup_idx)
        return self._result

    def close(self) -> None:
        self._pool.close()


# ----------------------------------------------------------------------------- party B


class PsiClient:
    """Party B: blinds its hashed IDs, unblinds A's signatures, finds and reports the matches."""

    def __init__(self, ids: Iterable[str | bytes], *, chunk_size: int = DEFAULT_CHUNK,
                 min_key_bits: int = DEFAULT_KEY_BITS, allowed_key_bits: Sequence[int] = ALLOWED_KEY_BITS) -> None:
        if not 1 <= chunk_size <= MAX_CHUNK:
            raise ValueError(f"chunk_size: must be in 1..{MAX_CHUNK}, got {chunk_size}")
        self.chunk_size = chunk_size
        self.min_key_bits = min_key_bits
        self.allowed_key_bits = tuple(allowed_key_bits)
        self._ids, self._positions, self._id_bytes = _dedupe(ids)
        self._pub: RsaPublicKey | None = None
        self._server_size: int | None = None
        self._server_chunk: int | None = None
        self._tag_parts: list[np.ndarray] = []
        self._tag_total = 0
        self._next_tag = 0
        self._server_tags: np.ndarray | None = None
        self._pending: dict[int, tuple[int, list[int], list[int]]] = {}  # index -> (start, fdh, r_inv)
        self._matched: list[tuple[bytes, int]] = []
        self._result: PsiResult | None = None

    def hello(self) -> ClientHello:
        return ClientHello(len(self._ids), self.chunk_size)

    def receive_hello(self, m: ServerHello) -> None:
        if m.modulus_bits not in self.allowed_key_bits or m.modulus_bits < self.min_key_bits:
            raise ProtocolError("psi.server_hello.modulus_bits",
                                f"{m.modulus_bits}-bit modulus refused (need one of {[b for b in self.allowed_key_bits if b >= self.min_key_bits]})")
        if len(m.n) != (m.modulus_bits + 7) // 8:
            raise ProtocolError("psi.server_hello.n", f"{len(m.n)} bytes for a {m.modulus_bits}-bit modulus")
        n = int.from_bytes(m.n, "big")
        if n.bit_length() != m.modulus_bits:
            raise ProtocolError("psi.server_hello.n", f"modulus has {n.bit_length()} bits, declared {m.modulus_bits}")
        if n % 2 == 0 or gmpy2.is_prime(n) or gmpy2.is_square(n):
            raise ProtocolError("psi.server_hello.n", "not an RSA modulus (even, prime or a square)")
        if not (3 <= m.e < 2**32 and m.e % 2 == 1):
            raise ProtocolError("psi.server_hello.e", f"public exponent {m.e} must be odd and in 3..2^32")
        msg.check_count(m.set_size, "psi.server_hello.set_size", 0, MAX_SET)
        msg.check_count(m.chunk_size, "psi.server_hello.chunk_size", 1, MAX_CHUNK)
        self._pub = RsaPublicKey(n, m.e)
        self._server_size, self._server_chunk = m.set_size, m.chunk_size

    def receive_tags(self, m: ServerTags) -> None:
        if self._pub is None:
            raise ProtocolError("psi.server_tags", "received before the server hello")
        if self._server_tags is not None:
            raise ProtocolError("psi.server_tags", "received after the last chunk")
        if m.index != self._next_tag:
            raise ProtocolError("psi.server_tags.index", f"expected chunk {self._next_tag}, got {m.index}")
        msg.check_count(m.count, "psi.server_tags.count", 0, self._server_chunk)
        if len(m.tags) != m.count * TAG_BYTES:
            raise ProtocolError("psi.server_tags.tags", f"{len(m.tags)} bytes for {m.count} tags of {TAG_BYTES} bytes")
        self._tag_total += m.count
        if self._tag_total > self._server_size:
            raise ProtocolError("psi.server_tags.count", f"more tags ({self._tag_total}) than the declared set size {self._server_size}")
        self._tag_parts.append(_tags_array(m.tags).copy())
        self._next_tag += 1
        if m.last:
            if self._tag_total != self._server_size:
                raise ProtocolError("psi.server_tags.last", f"stream ended after {self._tag_total} of {self._server_size} tags")
            all_tags = np.concatenate(self._tag_parts) if self._tag_parts else _tags_array(b"")
            self._server_tags = np.sort(all_tags)
            self._tag_parts = []

    def blinded_messages(self) -> Iterator[Blinded]:
        """Stream y_i = H(b_i) R_i^e mod n; the blinding inverses are kept only until the reply."""
        if self._pub is None:
            raise ProtocolError("psi", "blinding needs the server hello first")
        pub = self._pub
        n, e = gmpy2.mpz(pub.n), gmpy2.mpz(pub.e)
        chunks = list(range(0, len(self._id_bytes), self.chunk_size)) or [0]
        for idx, start in enumerate(chunks):
            part = self._id_bytes[start : start + self.chunk_size]
            fdh, r_inv, ys = [], [], []
            for b in part:
                h = full_domain_hash(b, pub)
                while True:
                    r = gmpy2.mpz(secrets.randbelow(pub.n - 2) + 2)
                    if gmpy2.gcd(r, n) == 1:
                        break
                fdh.append(h)
                r_inv.append(int(gmpy2.invert(r, n)))
                ys.append(int((h * gmpy2.powmod(r, e, n)) % n))
            self._pending[idx] = (start, fdh, r_inv)
            yield Blinded(idx, len(ys), msg.ints_to_blob(ys, pub.width), idx == len(chunks) - 1)

    def receive_signed(self, m: Signed) -> None:
        if self._server_tags is None:
            raise ProtocolError("psi.signed", "received before all of A's tags")
        if m.index not in self._pending:
            raise ProtocolError("psi.signed.index", f"chunk {m.index} was not sent or was already answered")
        start, fdh, r_inv = self._pending[m.index]
        if m.count != len(fdh):
            raise ProtocolError("psi.signed.count", f"{m.count} values for a chunk of {len(fdh)}")
        pub = self._pub
        values = msg.blob_to_ints(m.values, pub.width, m.count, "psi.signed.values")
        msg.check_in_range(values, 1, pub.n, "psi.signed.values")
        n, e = gmpy2.mpz(pub.n), gmpy2.mpz(pub.e)
        tags = []
        for i, (s, h, ri) in enumerate(zip(values, fdh, r_inv)):
            k = (gmpy2.mpz(s) * ri) % n
            if gmpy2.powmod(k, e, n) != h:
                raise ProtocolError(f"psi.signed.values[{i}]", "not the signature of the blinded value (y^d mod n)")
            tags.append(tag(int(k), pub))
        arr = np.array(tags, dtype=f"S{TAG_BYTES}")
        srv = self._server_tags
        if len(srv) and len(arr):
            pos = np.minimum(np.searchsorted(srv, arr), len(srv) - 1)
            hit = srv[pos] == arr
            for j in np.flatnonzero(hit):
                self._matched.append((tags[j], start + int(j)))
        del self._pending[m.index]

    def matches_message(self) -> Matches:
        """The matched tags, sorted; also fixes B's result in the same order."""
        if self._pending:
            raise ProtocolError("psi", f"{len(self._pending)} chunks still unanswered")
        self._matched.sort()
        self._result = _canonical(self._ids, self._positions, [j for _, j in self._matched])
        return Matches(len(self._matched), b"".join(t for t, _ in self._matched))

    @property
    def result(self) -> PsiResult:
        if self._result is None:
            raise RuntimeError("PSI not finished")
        return self._result


# ----------------------------------------------------------------------------- driver


Transfer = Callable[[str, str, object, type], object]
"""``transfer(sender, receiver, message, expected_type) -> decoded message`` (see channel.Link)."""


def run_psi(server: PsiServer, client: PsiClient, transfer: Transfer | None = None) -> tuple[PsiResult, PsiResult]:
    """Run the whole protocol between A (server) and B (client); every message crosses ``transfer``.

    Returns ``(A's result, B's result)``; both list the shared IDs in the same order.
    """
    if transfer is None:
        from fedarena.federated.vertical.channel import Link

        transfer = Link().transfer
    client.receive_hello(transfer("A", "B", server.hello(), ServerHello))
    server.receive_hello(transfer("B", "A", client.hello(), ClientHello))
    for m in server.tag_messages():
        client.receive_tags(transfer("A", "B", m, ServerTags))
    blinded = (transfer("B", "A", m, Blinded) for m in client.blinded_messages())
    for signed in server.sign_stream(blinded):
        client.receive_signed(transfer("A", "B", signed, Signed))
    result_a = server.receive_matches(transfer("B", "A", client.matches_message(), Matches))
    return result_a, client.result


def intersect(ids_a: Iterable[str | bytes], ids_b: Iterable[str | bytes], *, key_bits: int = DEFAULT_KEY_BITS,
              key: RsaPrivateKey | None = None, chunk_size: int = DEFAULT_CHUNK, workers: int | None = None,
              transfer: Transfer | None = None, allow_insecure_keys: bool = False,
              max_signatures: int = DEFAULT_MAX_SIGNATURES) -> tuple[PsiResult, PsiResult]:
    """Convenience: PSI between A's and B's ID lists in one process (A signs on ``workers`` processes).

    Keys below 2048 bits are refused unless ``allow_insecure_keys`` (fast tests)."""
    server = PsiServer(ids_a, key=key, key_bits=key_bits, chunk_size=chunk_size, workers=workers,
                       allow_insecure_keys=allow_insecure_keys, max_signatures=max_signatures)
    try:
        bits = server.public_key.bits
        client = PsiClient(ids_b, chunk_size=chunk_size,
                           min_key_bits=min(bits, MIN_KEY_BITS) if allow_insecure_keys else MIN_KEY_BITS)
        return run_psi(server, client, transfer)
    finally:
        server.close()
