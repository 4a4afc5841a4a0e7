"""The secure-aggregation client: one object per client and round, driven stage by stage by any transport.

Bonawitz et al. (CCS 2017), Figure 4, client side, plus the consistency check of their malicious-server protocol
(Figure 5) when ``config.consistency_check`` is set; SecAgg+ (Bell et al., CCS 2020) when the config names a
neighbour count. Each method consumes the server's message for a stage and returns the client's reply; the client
refuses messages for another round, another recipient, an out-of-order stage, a request that would make it reveal
both shares of one peer, a survivor list other than the one it signed, an input that is not finite, and (with the
check) keys or survivor lists its peers did not sign.

Without a public-key infrastructure (``identities``), each client's Ed25519 key is fresh per round and reaches
its peers through the server; a server that substitutes keys already in stage 0 can then forge signatures, so
the check protects against inconsistent survivor lists from a server that relays stage 0 faithfully. Passing
``identities`` (party id -> raw Ed25519 public key, distributed out of band) and ``signing_key`` closes that gap.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedarena.privacy.secagg import prg, shamir
from fedarena.privacy.secagg.messages import (
    KEY_BYTES,
    SHARE_LEN,
    AdvertiseKeys,
    ConsistencySignature,
    KeyBroadcast,
    MaskedInput,
    ShareBroadcast,
    ShareKeys,
    SurvivorList,
    UnmaskRequest,
    UnmaskShares,
)
from fedarena.privacy.secagg.neighbours import neighbours_of
from fedarena.privacy.secagg.protocol import (
    NONCE_BYTES,
    SHARE_CIPHERTEXT_BYTES,
    InsufficientSurvivorsError,
    ProtocolError,
    SecAggConfig,
    agree,
    key_transcript,
    share_aad,
    survivor_transcript,
    verify,
)
from fedarena.privacy.secagg.quantization import quantize

_RAW = (Encoding.Raw, PublicFormat.Raw)


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(*_RAW)


@dataclass
class ClientState:
    """Everything a client remembers between stages."""

    stage: int = 0  # next expected stage: 0 advertise, 1 share keys, 2 masked input, 3 consistency, 4 unmask, 5 done
    neighbours: np.ndarray | None = None
    members: frozenset[int] = frozenset()
    sig_keys: dict[int, bytes] = field(default_factory=dict)  # peer -> Ed25519 public key (consistency check)
    signed_survivors: tuple[int, ...] | None = None  # the U3 this client signed
    peer_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    held_shares: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # peer -> (seed, key)
    share_errors: dict[int, str] = field(default_factory=dict)  # peer -> why its share was rejected
    stage2_peers: tuple[int, ...] = ()  # neighbours that completed ShareKeys (the client's view of U2)


class SecAggClient:
    """A client with id ``client_id`` (1..65520) in round ``round_id``.

    ``signing_key`` / ``identities``: the client's long-term Ed25519 key and every party's public key (a PKI),
    used by the consistency check; without them a fresh signing key is drawn for the round."""

    def __init__(self, client_id: int, config: SecAggConfig, round_id: int, *,
                 signing_key: Ed25519PrivateKey | None = None, identities: dict[int, bytes] | None = None):
        if not (1 <= int(client_id) < shamir.PRIME):
            raise ValueError(f"client_id: must lie in 1..{shamir.PRIME - 1}, got {client_id}")
        self.client_id = int(client_id)
        self.config = config
        self.round_id = int(round_id)
        self.state = ClientState()
        self._c_key = X25519PrivateKey.generate()
        self._s_key = X25519PrivateKey.generate()
        self._mask_seed = os.urandom(prg.SEED_BYTES)  # b_u
        self._sig_key = signing_key or Ed25519PrivateKey.generate()
        self._identities = None if identities is None else {int(k): bytes(v) for k, v in identities.items()}
        if self._identities is not None and self._identities.get(self.client_id) != _raw_public(self._sig_key):
            raise ValueError(f"identities: entry {self.client_id} is not this client's signing key")

    # -- helpers ---------------------------------------------------------------------------------------------
    def _expect(self, msg, cls, stage: int) -> None:
        name = cls.__name__
        if not isinstance(msg, cls):
            raise ProtocolError(f"client {self.client_id}: expected {name}, got {type(msg).__name__}")
        if msg.round_id != self.round_id:
            raise ProtocolError(f"client {self.client_id}: {name}.round_id {msg.round_id} != current round "
                                f"{self.round_id} (replayed or stale message)")
        if msg.recipient != self.client_id:
            raise ProtocolError(f"client {self.client_id}: {name}.recipient is {msg.recipient}")
        if self.state.stage != stage:
            raise ProtocolError(f"client {self.client_id}: {name} arrived in stage {self.state.stage}, "
                                f"expected in stage {stage} (out of order or repeated)")

    # -- stage 0 ---------------------------------------------------------------------------------------------
    def advertise_keys(self) -> AdvertiseKeys:
        """Stage 0: send the two X25519 public keys."""
        if self.state.stage != 0:
            raise ProtocolError(f"client {self.client_id}: keys already advertised")
        self.state.stage = 1
        c_pk, s_pk = _raw_public(self._c_key), _raw_public(self._s_key)
        if not self.config.consistency_check:
            return AdvertiseKeys(self.round_id, self.client_id, c_pk, s_pk)
        sig = self._sig_key.sign(key_transcript(self.round_id, self.client_id, c_pk, s_pk))
        return AdvertiseKeys(self.round_id, self.client_id, c_pk, s_pk, _raw_public(self._sig_key), sig)

    # -- stage 1 ---------------------------------------------------------------------------------------------
    def share_keys(self, msg: KeyBroadcast) -> ShareKeys:
        """Stage 1: Shamir-share ``b_u`` and ``s_u^SK`` among the neighbourhood; encrypt each share to its holder."""
        self._expect(msg, KeyBroadcast, 1)
        cfg = self.config
        members = np.asarray(sorted(set(msg.members)), dtype=np.int64)
        if members.size != len(msg.members):
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.members has duplicates")
        if self.client_id not in msg.members:
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.members does not include this client")
        if members.size < cfg.threshold:
            raise InsufficientSurvivorsError(
                f"client {self.client_id}: only {members.size} clients advertised keys, threshold is {cfg.threshold}")
        if len(msg.graph_seed) != KEY_BYTES:
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.graph_seed must be {KEY_BYTES} bytes")
        nb = neighbours_of(self.client_id, msg.graph_seed, members, cfg.num_neighbours)
        own = msg.keys.get(self.client_id)
        if own != (_raw_public(self._c_key), _raw_public(self._s_key)):
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.keys does not carry this client's own keys")
        missing = [int(v) for v in nb if int(v) not in msg.keys]
        if missing:
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.keys lacks neighbours {missing[:5]}")
        for v in nb:
            c, s = msg.keys[int(v)]
            if len(c) != KEY_BYTES or len(s) != KEY_BYTES:
                raise ProtocolError(f"client {self.client_id}: KeyBroadcast.keys[{int(v)}] has a wrong key length")
        if self._identities is not None:
            strangers = sorted(set(int(v) for v in members) - set(self._identities))
            if strangers:
                raise ProtocolError(f"client {self.client_id}: KeyBroadcast.members lists {strangers[:5]}, who have "
                                    "no identity key")
        if cfg.consistency_check:
            self.state.sig_keys = self._check_key_signatures(msg, np.append(nb, self.client_id))
        holders = np.sort(np.append(nb, self.client_id))
        if cfg.threshold > holders.size:
            raise ProtocolError(f"client {self.client_id}: threshold {cfg.threshold} > {holders.size} share holders")
        if 2 * cfg.threshold <= holders.size:
            raise ProtocolError(f"client {self.client_id}: threshold {cfg.threshold} is not more than half of its "
                                f"{holders.size} share holders; refusing to share secrets")
        self.state.members = frozenset(int(v) for v in members)
        secret = self._mask_seed + self._s_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        shares = shamir.split(secret, holders, cfg.threshold)  # (holders, 64): seed limbs then key limbs
        self.state.neighbours = nb
        self.state.peer_keys = {int(v): msg.keys[int(v)] for v in nb}
        cts: dict[int, bytes] = {}
        for row, v in zip(shares, holders):
            v = int(v)
            if v == self.client_id:
                self.state.held_shares[v] = (row[:SHARE_LEN].copy(), row[SHARE_LEN:].copy())
                continue
            key = agree(self._c_key, self.state.peer_keys[v][0], b"enc", self.round_id, self.client_id, v)
            nonce = os.urandom(NONCE_BYTES)
            plain = struct.pack("<II", self.client_id, v) + row.astype("<u2").tobytes()
            cts[v] = nonce + AESGCM(key).encrypt(nonce, plain, share_aad(self.round_id, self.client_id, v))
        self.state.stage = 2
        return ShareKeys(self.round_id, self.client_id, cts)

    def _check_key_signatures(self, msg: KeyBroadcast, parties) -> dict[int, bytes]:
        """Every party's (neighbours' and own) signature of its X25519 keys; returns party -> Ed25519 key."""
        out: dict[int, bytes] = {}
        for v in (int(p) for p in parties):
            entry = msg.signing.get(v)
            if entry is None:
                raise ProtocolError(f"client {self.client_id}: KeyBroadcast.signing lacks the signing key of {v}")
            pk, sig = entry
            if self._identities is not None and self._identities.get(v) != pk:
                raise ProtocolError(f"client {self.client_id}: KeyBroadcast.signing[{v}] is not party {v}'s "
                                    "identity key")
            c_pk, s_pk = msg.keys[v]
            if not verify(pk, sig, key_transcript(self.round_id, v, c_pk, s_pk)):
                raise ProtocolError(f"client {self.client_id}: KeyBroadcast.signing[{v}]: the signature of client "
                                    f"{v}'s keys does not verify (substituted keys)")
            out[v] = pk
        if out[self.client_id] != _raw_public(self._sig_key):
            raise ProtocolError(f"client {self.client_id}: KeyBroadcast.signing does not carry this client's key")
        return out

    # -- stage 2 ---------------------------------------------------------------------------------------------
    def _open_share(self, sender: int, ct: bytes) -> tuple[np.ndarray, np.ndarray]:
        if len(ct) != SHARE_CIPHERTEXT_BYTES:
            raise ProtocolError(f"share from client {sender}: ciphertext has {len(ct)} bytes, "
                                f"expected {SHARE_CIPHERTEXT_BYTES}")
        key = agree(self._c_key, self.state.peer_keys[sender][0], b"enc", self.round_id, self.client_id, sender)
        try:
            plain = AESGCM(key).decrypt(ct[:NONCE_BYTES], ct[NONCE_BYTES:],
                                        share_aad(self.round_id, sender, self.client_id))
        except InvalidTag:
            raise ProtocolError(f"share from client {sender}: authentication failed (tampered, replayed or "
                                "misaddressed ciphertext)") from None
        u, v = struct.unpack_from("<II", plain)
        if (u, v) != (sender, self.client_id):
            raise ProtocolError(f"share from client {sender}: plaintext names sender {u} and recipient {v}")
        limbs = np.frombuffer(plain, dtype="<u2", offset=8).astype(np.uint16)
        if int(limbs.max()) >= shamir.PRIME:
            raise ProtocolError(f"share from client {sender}: share value out of the field")
        return limbs[:SHARE_LEN].copy(), limbs[SHARE_LEN:].copy()

    def masked_input(self, msg: ShareBroadcast, x: np.ndarray) -> MaskedInput:
        """Stage 2: store the shares received, then send ``y_u = q(x_u) + PRG(b_u) + sum_v +-PRG(s_uv) mod 2^k``.

        A share that fails authentication is recorded in ``state.share_errors`` and skipped (this client cannot
        help reconstruct that peer's secrets); the round continues. An input with a NaN or infinite entry is
        refused before anything is masked (the client's state is unchanged)."""
        self._expect(msg, ShareBroadcast, 2)
        cfg = self.config
        x = np.asarray(x)
        if x.size != cfg.dimension:
            raise ValueError(f"client {self.client_id}: input has {x.size} entries, expected dimension "
                             f"{cfg.dimension}")
        if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
            raise ValueError(f"input: client {self.client_id} must mask a real vector, got dtype {x.dtype}")
        bad = np.flatnonzero(~np.isfinite(x.ravel()))
        if bad.size:
            raise ValueError(f"input: client {self.client_id}'s entries {bad[:5].tolist()} are not finite "
                             f"({bad.size} NaN/inf); refusing to mask")
        nbset = set(int(v) for v in self.state.neighbours)
        strangers = sorted(set(msg.ciphertexts) - nbset)
        if strangers:
            raise ProtocolError(f"client {self.client_id}: ShareBroadcast has shares from non-neighbours "
                                f"{strangers[:5]}")
        peers = sorted(msg.ciphertexts)
        if len(peers) + 1 < cfg.threshold:
            raise InsufficientSurvivorsError(
                f"client {self.client_id}: only {len(peers) + 1} clients in its neighbourhood shared keys, "
                f"threshold is {cfg.threshold}")
        for v in peers:
            try:
                self.state.held_shares[v] = self._open_share(v, msg.ciphertexts[v])
            except ProtocolError as exc:
                self.state.share_errors[v] = str(exc)
        y = quantize(x, cfg.clip, cfg.scale, cfg.modulus_bits)
        prg.add_into(y, self._mask_seed)
        for v in peers:
            seed = agree(self._s_key, self.state.peer_keys[v][1], b"mask", self.round_id, self.client_id, v)
            prg.add_into(y, seed, negate=self.client_id > v)
        if cfg.modulus_bits < 32:
            np.bitwise_and(y, np.uint32((1 << cfg.modulus_bits) - 1), out=y)
        self.state.stage2_peers = tuple(peers)
        self.state.stage = 3 if cfg.consistency_check else 4
        return MaskedInput(self.round_id, self.client_id, y)

    # -- stage 3 ---------------------------------------------------------------------------------------------
    def consistency(self, msg: SurvivorList) -> ConsistencySignature:
        """Stage 3 (consistency check): sign the survivor list U3; only this list is accepted at unmasking."""
        self._expect(msg, SurvivorList, 3)
        survivors = tuple(sorted(set(msg.survivors)))
        if len(survivors) != len(msg.survivors):
            raise ProtocolError(f"client {self.client_id}: SurvivorList lists a client twice")
        if self.client_id not in survivors:
            raise ProtocolError(f"client {self.client_id}: SurvivorList does not list this client")
        unknown = sorted(set(survivors) - self.state.members)
        if unknown:
            raise ProtocolError(f"client {self.client_id}: SurvivorList names {unknown[:5]}, who never advertised "
                                "keys")
        if len(survivors) < self.config.threshold:
            raise InsufficientSurvivorsError(f"client {self.client_id}: only {len(survivors)} survivors, threshold "
                                             f"is {self.config.threshold}; refusing to sign")
        self.state.signed_survivors = survivors
        self.state.stage = 4
        return ConsistencySignature(self.round_id, self.client_id,
                                    self._sig_key.sign(survivor_transcript(self.round_id, survivors)))

    def _check_consistency(self, msg: UnmaskRequest) -> None:
        """The survivor list is the one this client signed and ``threshold`` neighbourhood members signed it too."""
        cid, t = self.client_id, self.config.threshold
        if tuple(sorted(msg.survivors)) != self.state.signed_survivors:
            raise ProtocolError(f"client {cid}: UnmaskRequest.survivors differs from the survivor list this client "
                                "signed (the server sent different lists); refusing to unmask")
        outside = sorted(set(msg.signatures) - set(msg.survivors))
        if outside:
            raise ProtocolError(f"client {cid}: UnmaskRequest.signatures has signers {outside[:5]} outside the "
                                "survivor list")
        transcript = survivor_transcript(self.round_id, self.state.signed_survivors)
        valid = 0
        for v, sig in sorted(msg.signatures.items()):
            pk = self.state.sig_keys.get(v)
            if pk is None:  # SecAgg+: not a neighbour, this client has no key to check it with
                continue
            if not verify(pk, sig, transcript):
                raise ProtocolError(f"client {cid}: UnmaskRequest.signatures[{v}]: client {v} did not sign this "
                                    "survivor list (the server sent different lists); refusing to unmask")
            valid += 1
        if valid < t:
            raise InsufficientSurvivorsError(f"client {cid}: only {valid} neighbourhood members signed the survivor "
                                             f"list, threshold is {t}; refusing to unmask")

    # -- stage 4 ---------------------------------------------------------------------------------------------
    def unmask(self, msg: UnmaskRequest) -> UnmaskShares:
        """Stage 4: reveal ``b_v`` shares of surviving and ``s_v^SK`` shares of dropped neighbours, never both."""
        self._expect(msg, UnmaskRequest, 4)
        cfg = self.config
        survivors, dropped = set(msg.survivors), set(msg.dropped)
        if len(survivors) != len(msg.survivors) or len(dropped) != len(msg.dropped):
            raise ProtocolError(f"client {self.client_id}: UnmaskRequest lists a client twice")
        both = survivors & dropped
        if both:
            raise ProtocolError(f"client {self.client_id}: UnmaskRequest lists {sorted(both)[:5]} as both "
                                "surviving and dropped (would reveal both shares)")
        if self.client_id not in survivors:
            raise ProtocolError(f"client {self.client_id}: UnmaskRequest does not list this client as a survivor")
        if len(survivors) < cfg.threshold:
            raise InsufficientSurvivorsError(f"client {self.client_id}: only {len(survivors)} survivors, "
                                             f"threshold is {cfg.threshold}; refusing to unmask")
        view = set(self.state.stage2_peers)
        nbset = set(int(v) for v in self.state.neighbours)
        unknown = sorted((survivors | dropped) & (nbset - view))
        if unknown:
            raise ProtocolError(f"client {self.client_id}: UnmaskRequest names neighbours {unknown[:5]} that did "
                                "not share keys")
        unaccounted = sorted(view - survivors - dropped)
        if unaccounted:
            raise ProtocolError(f"client {self.client_id}: UnmaskRequest leaves neighbours {unaccounted[:5]} "
                                "neither surviving nor dropped")
        if cfg.consistency_check:
            self._check_consistency(msg)
        seed_shares = {v: s for v, (s, _) in self.state.held_shares.items() if v in survivors}
        key_shares = {v: k for v, (_, k) in self.state.held_shares.items() if v in dropped}
        self.state.stage = 5
        return UnmaskShares(self.round_id, self.client_id, seed_shares, key_shares)
