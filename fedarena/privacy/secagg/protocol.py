"""What the SecAgg client and server share: the round configuration, errors, and the key-derivation and
share-encryption primitives of Bonawitz et al. (CCS 2017), Section 4.

* Key agreement: X25519 (RFC 7748); the raw shared secret goes through HKDF-SHA256 (RFC 5869) with a label,
  the round id and the (ordered) pair of ids, giving a 32-byte key.
* Pairwise mask seed ``s_uv = HKDF(X25519(s_u^SK, s_v^PK), "mask", round, min(u,v), max(u,v))``; client ``u`` adds
  ``+PRG(s_uv)`` when ``u < v`` and ``-PRG(s_uv)`` when ``u > v``, so the pair's masks cancel in the sum.
* Share encryption: AES-256-GCM with ``c_uv = HKDF(X25519(c_u^SK, c_v^PK), "enc", round, min, max)``, a random
  96-bit nonce, and associated data binding the round, sender and recipient, so a ciphertext moved to another
  pair or round fails authentication.
* Consistency check (``consistency_check=True``; Bonawitz et al. 2017, Figure 5, the malicious-server variant):
  every client holds an Ed25519 signing key, signs its two X25519 keys in stage 0 and, in stage 3, the survivor
  list U3 it was sent; before revealing any share in stage 4 it requires valid signatures of *its own* U3 from at
  least ``threshold`` members of its neighbourhood (verified with the keys it got in stage 1), so a server that
  sends different survivor lists to different clients is caught before any share leaves a client.

Thresholds: ``threshold >= 2`` always (with ``t = 1`` one holder's share is the secret itself), at least 3
clients per round, and ``2 t > m`` where ``m`` is the number of share holders of each secret (``n`` for SecAgg,
``min(n, k + 1)`` for SecAgg+ with ``k`` neighbours). Each holder reveals, for a given peer, either its share of
the mask seed or its share of the mask key, never both; with ``2 t > m`` no two disjoint sets of ``t`` holders
exist, so no survivor/dropped split can rebuild both secrets of one client.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedarena.privacy.secagg.messages import SHARE_LEN
from fedarena.privacy.secagg.quantization import check_capacity
from fedarena.privacy.secagg.shamir import PRIME

# plaintext of an encrypted share: sender u32 | recipient u32 | seed share | key share (uint16 each)
SHARE_PLAINTEXT_BYTES = 8 + 2 * 2 * SHARE_LEN
NONCE_BYTES = 12
TAG_BYTES = 16
SHARE_CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + TAG_BYTES


class ProtocolError(ValueError):
    """A message was rejected (wrong round or stage, unknown or duplicate sender, bad content)."""


class InsufficientSurvivorsError(RuntimeError):
    """Fewer than ``threshold`` clients remain (or hold shares); the round is aborted with no result."""


@dataclass(frozen=True)
class SecAggConfig:
    """Parameters of one secure-aggregation round (all parties must agree on them).

    ``num_neighbours=None`` runs SecAgg (every pair of clients masks); an even ``num_neighbours`` runs SecAgg+
    with a random ``num_neighbours``-regular graph, and then ``threshold`` counts shares within a client's
    neighbourhood (its neighbours plus itself). ``consistency_check`` adds the signed survivor-list round of
    the malicious-server protocol (off here, the semi-honest Figure 4 protocol; the FL runtime turns it on)."""

    dimension: int
    threshold: int
    clip: float = 1.0
    scale: float = 2.0**16
    modulus_bits: int = 32
    num_neighbours: int | None = None
    consistency_check: bool = False

    def __post_init__(self) -> None:
        def posint(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
            return v

        posint("dimension")
        posint("threshold")
        if self.threshold < 2:
            raise ValueError("threshold: must be >= 2 (with threshold 1 a single share is the secret itself)")
        if self.dimension >= 2**32:
            raise ValueError(f"dimension: must be < 2^32, got {self.dimension}")
        if not isinstance(self.consistency_check, bool):
            raise ValueError(f"consistency_check: must be a bool, got {self.consistency_check!r}")
        if self.num_neighbours is not None:
            k = posint("num_neighbours")
            if k % 2:
                raise ValueError(f"num_neighbours: must be even (Harary graph), got {k}")
            if self.threshold > k + 1:
                raise ValueError(f"threshold: {self.threshold} exceeds num_neighbours + 1 = {k + 1} share holders")
            if 2 * self.threshold <= k + 1:
                raise ValueError(f"threshold: {self.threshold} is not more than half of the {k + 1} share holders "
                                 "of a SecAgg+ neighbourhood (two disjoint sets of holders could rebuild both "
                                 "secrets of one client)")
        check_capacity(1, float(self.clip), float(self.scale), self.modulus_bits)

    def holders(self, num_clients: int) -> int:
        """Number of share holders of each secret in a round of ``num_clients`` (the neighbourhood size)."""
        k = self.num_neighbours
        return num_clients if k is None or k >= num_clients - 1 else k + 1

    def validate_for(self, num_clients: int) -> None:
        """Check the parameters against the number of clients of a round."""
        if num_clients < 3:
            raise ValueError(f"clients: secure aggregation needs at least 3 clients, got {num_clients} (with 2, "
                             "the sum and one's own input give the other's)")
        if num_clients >= PRIME:
            raise ValueError(f"clients: at most {PRIME - 1} clients (Shamir field size), got {num_clients}")
        if self.threshold > num_clients:
            raise ValueError(f"threshold: {self.threshold} exceeds the number of clients {num_clients}")
        m = self.holders(num_clients)
        if 2 * self.threshold <= m:
            raise ValueError(f"threshold: {self.threshold} is not more than half of the {m} share holders (two "
                             "disjoint sets of holders could rebuild both secrets of one client)")
        check_capacity(num_clients, float(self.clip), float(self.scale), self.modulus_bits)


def _kdf(shared: bytes, label: bytes, round_id: int, u: int, v: int) -> bytes:
    a, b = (u, v) if u < v else (v, u)
    info = b"fedarena-secagg/" + label + struct.pack("<QII", round_id, a, b)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def agree(private: X25519PrivateKey, peer_public: bytes, label: bytes, round_id: int, u: int, v: int) -> bytes:
    """32-byte key shared by ``u`` and ``v`` (symmetric in u, v)."""
    try:
        peer = X25519PublicKey.from_public_bytes(peer_public)
        shared = private.exchange(peer)
    except ValueError as exc:
        raise ProtocolError(f"public key of client {v}: {exc}") from None
    return _kdf(shared, label, round_id, u, v)


def share_aad(round_id: int, sender: int, recipient: int) -> bytes:
    return b"fedarena-secagg/share" + struct.pack("<QII", round_id, sender, recipient)


def key_transcript(round_id: int, client_id: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """What a client signs in stage 0: its two X25519 public keys, bound to the round and its id."""
    return b"fedarena-secagg/keys" + struct.pack("<QI", round_id, client_id) + c_pk + s_pk


def survivor_transcript(round_id: int, survivors) -> bytes:
    """What a client signs in the consistency check: the sorted survivor list U3 of the round."""
    ids = sorted(int(u) for u in survivors)
    return b"fedarena-secagg/survivors" + struct.pack(f"<QI{len(ids)}I", round_id, len(ids), *ids)


def sign(key: Ed25519PrivateKey, data: bytes) -> bytes:
    return key.sign(data)


def verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``data`` under the raw public key ``public``."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
        return True
    except (InvalidSignature, ValueError):
        return False
