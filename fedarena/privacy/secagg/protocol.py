"""What the SecAgg client and server share: the round configuration, errors, and the key-derivation and
share-encryption primitives of Bonawitz et al. (CCS 2017), Section 4.

* Key agreement: X25519 (RFC 7748); the raw shared secret goes through HKDF-SHA256 (RFC 5869) with a label,
  the round id and the (ordered) pair of ids, giving a 32-byte key.
* Pairwise mask seed ``s_uv = HKDF(X25519(s_u^SK, s_v^PK), "mask", round, min(u,v), max(u,v))``; client ``u`` adds
  ``+PRG(s_uv)`` when ``u < v`` and ``-PRG(s_uv)`` when ``u > v``, so the pair's masks cancel in the sum.
* Share encryption: AES-256-GCM with ``c_uv = HKDF(X25519(c_u^SK, c_v^PK), "enc", round, min, max)``, a random
  96-bit nonce, and associated data binding the round, sender and recipient, so a ciphertext moved to another
  pair or round fails authentication.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
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
    neighbourhood (its neighbours plus itself)."""

    dimension: int
    threshold: int
    clip: float = 1.0
    scale: float = 2.0**16
    modulus_bits: int = 32
    num_neighbours: int | None = None

    def __post_init__(self) -> None:
        def posint(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
            return v

        posint("dimension")
        posint("threshold")
        if self.dimension >= 2**32:
            raise ValueError(f"dimension: must be < 2^32, got {self.dimension}")
        if self.num_neighbours is not None:
            k = posint("num_neighbours")
            if k % 2:
                raise ValueError(f"num_neighbours: must be even (Harary graph), got {k}")
            if self.threshold > k + 1:
                raise ValueError(f"threshold: {self.threshold} exceeds num_neighbours + 1 = {k + 1} share holders")
        check_capacity(1, float(self.clip), float(self.scale), self.modulus_bits)

    def validate_for(self, num_clients: int) -> None:
        """Check the parameters against the number of clients of a round."""
        if num_clients < 2:
            raise ValueError(f"clients: secure aggregation needs at least 2 clients, got {num_clients}")
        if num_clients >= PRIME:
            raise ValueError(f"clients: at most {PRIME - 1} clients (Shamir field size), got {num_clients}")
        if self.threshold > num_clients:
            raise ValueError(f"threshold: {self.threshold} exceeds the number of clients {num_clients}")
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
