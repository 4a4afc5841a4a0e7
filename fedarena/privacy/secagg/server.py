"""The secure-aggregation server: validates each stage's messages, routes shares, and unmasks the sum.

Bonawitz et al. (CCS 2017), Figure 4, server side, with dropout recovery: for a client ``v`` that shared keys but
sent no masked input, ``t`` surviving holders reveal shares of ``s_v^SK`` and the server removes the pairwise masks
``PRG(s_uv)`` from the survivors' inputs; for each survivor ``u`` it reconstructs ``b_u`` and removes
``PRG(b_u)``. SecAgg+ (Bell et al., CCS 2020) is the same with shares and masks restricted to a k-regular graph.
With ``config.consistency_check`` the server runs the consistency-check round of the paper's malicious-server
protocol between masked-input collection and unmasking: it sends every survivor the survivor list U3, collects
their Ed25519 signatures of it (U4 = the clients that signed) and forwards all of them with the unmasking
request; the clients verify them before revealing anything.

The server is transport-independent: ``receive(message)`` checks one message (round, stage, sender, duplicates,
lengths) and stores it or raises :class:`ProtocolError` without touching its state; ``close_stage()`` ends a stage
(the transport decides when: all replies in, or a timeout), checks the threshold, and returns the messages for
the next stage (recipient -> message) or, after the last stage, the :class:`AggregateResult`. With fewer than
``threshold`` survivors, or a secret that cannot be rebuilt, it raises :class:`InsufficientSurvivorsError`,
moves to the aborted stage and computes nothing.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedarena.privacy.secagg import prg, shamir
from fedarena.privacy.secagg.messages import (
    KEY_BYTES,
    SHARE_LEN,
    AdvertiseKeys,
    ConsistencySignature,
    KeyBroadcast,
    MaskedInput,
    Message,
    ShareBroadcast,
    ShareKeys,
    SurvivorList,
    UnmaskRequest,
    UnmaskShares,
    decode,
)
from fedarena.privacy.secagg.neighbours import neighbour_table
from fedarena.privacy.secagg.protocol import (
    SHARE_CIPHERTEXT_BYTES,
    InsufficientSurvivorsError,
    ProtocolError,
    SecAggConfig,
    agree,
    key_transcript,
    survivor_transcript,
    verify,
)
from fedarena.privacy.secagg.quantization import dequantize

STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask", "done", "aborted")
DONE, ABORTED = 5, 6
_EXPECTED = {0: AdvertiseKeys, 1: ShareKeys, 2: MaskedInput, 3: ConsistencySignature, 4: UnmaskShares}


@dataclass(frozen=True)
class AggregateResult:
    """The unmasked sum of the survivors' quantized inputs (mod 2^k) and its float reading."""

    total: np.ndarray  # uint32, the exact modular sum
    survivors: tuple[int, ...]
    values: np.ndarray  # dequantized sum (float64)


@dataclass
class ServerState:
    """Everything the server keeps for one round."""

    stage: int = 0
    graph_seed: bytes = b""
    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # U1: id -> (c_pk, s_pk)
    signing: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # id -> (sig_pk, key signature)
    neighbours: dict[int, np.ndarray] = field(default_factory=dict)
    ciphertexts: dict[int, dict[int, bytes]] = field(default_factory=dict)  # U2: sender -> recipient -> ct
    masked: dict[int, np.ndarray] = field(default_factory=dict)  # U3
    dropped: tuple[int, ...] = ()  # U2 \ U3
    signatures: dict[int, bytes] = field(default_factory=dict)  # U4: id -> signature of U3
    shares: dict[int, UnmaskShares] = field(default_factory=dict)  # U5
    rejected: list[str] = field(default_factory=list)  # reasons of rejected messages, for the log


class SecAggServer:
    """Server of one round over the registered ``client_ids``."""

    def __init__(self, config: SecAggConfig, round_id: int, client_ids):
        ids = sorted(int(c) for c in client_ids)
        if len(set(ids)) != len(ids):
            raise ValueError("client_ids: duplicate ids")
        if ids and (ids[0] < 1 or ids[-1] >= shamir.PRIME):
            raise ValueError(f"client_ids: ids must lie in 1..{shamir.PRIME - 1}")
        config.validate_for(len(ids))
        self.config = config
        self.round_id = int(round_id)
        self.client_ids = tuple(ids)
        self.state = ServerState()

    @property
    def stage_name(self) -> str:
        return STAGES[self.state.stage]

    # -- receiving -------------------------------------------------------------------------------------------
    def receive(self, message: Message | bytes) -> None:
        """Validate and store one client message; raise :class:`ProtocolError` (state unchanged) if rejected."""
        try:
            msg = decode(message) if isinstance(message, (bytes, bytearray, memoryview)) else message
            self._check(msg)
        except ValueError as exc:  # MalformedMessage and ProtocolError are ValueErrors
            self.state.rejected.append(str(exc))
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError(str(exc)) from None
        self._store(msg)

    def _check(self, msg) -> None:
        st, cfg = self.state, self.config
        if st.stage >= DONE:
            raise ProtocolError(f"round {self.round_id} is {self.stage_name}; no more messages accepted")
        expected = _EXPECTED[st.stage]
        name = type(msg).__name__
        if not isinstance(msg, expected):
            raise ProtocolError(f"{name}: unexpected in stage '{self.stage_name}' (expected {expected.__name__}; "
                                "replayed or out-of-order message)")
        if msg.round_id != self.round_id:
            raise ProtocolError(f"{name}.round_id: {msg.round_id} is not the current round {self.round_id} "
                                "(replayed or stale message)")
        u = msg.client_id
        unmaskers = st.signatures if cfg.consistency_check else st.masked
        allowed = {0: self.client_ids, 1: st.keys, 2: st.ciphertexts, 3: st.masked, 4: unmaskers}[st.stage]
        if u not in allowed:
            raise ProtocolError(f"{name}.client_id: client {u} is unknown or not part of stage '{self.stage_name}'")
        stored = {0: st.keys, 1: st.ciphertexts, 2: st.masked, 3: st.signatures, 4: st.shares}[st.stage]
        if u in stored:
            raise ProtocolError(f"{name}.client_id: duplicate message from client {u} in stage '{self.stage_name}'")
        if isinstance(msg, AdvertiseKeys):
            for fname in ("c_pk", "s_pk"):
                if not isinstance(getattr(msg, fname), bytes) or len(getattr(msg, fname)) != KEY_BYTES:
                    raise ProtocolError(f"AdvertiseKeys.{fname}: client {u} sent a key that is not {KEY_BYTES} bytes")
            if cfg.consistency_check and not verify(msg.sig_pk, msg.key_signature,
                                                    key_transcript(self.round_id, u, msg.c_pk, msg.s_pk)):
                raise ProtocolError(f"AdvertiseKeys.key_signature: client {u} sent no valid signature of its keys "
                                    "(this round runs the consistency check)")
        elif isinstance(msg, ConsistencySignature):
            if not verify(st.signing[u][0], msg.signature, survivor_transcript(self.round_id, st.masked)):
                raise ProtocolError(f"ConsistencySignature.signature: client {u}'s signature of the survivor list "
                                    "does not verify")
        elif isinstance(msg, ShareKeys):
            want = set(int(v) for v in st.neighbours[u])
            got = set(msg.ciphertexts)
            if got != want:
                extra, lack = sorted(got - want), sorted(want - got)
                raise ProtocolError(f"ShareKeys.ciphertexts: client {u} must address exactly its neighbours "
                                    f"(unexpected {extra[:5]}, missing {lack[:5]})")
            for v, ct in msg.ciphertexts.items():
                if len(ct) != SHARE_CIPHERTEXT_BYTES:
                    raise ProtocolError(f"ShareKeys.ciphertexts[{v}]: client {u} sent {len(ct)} bytes, expected "
                                        f"{SHARE_CIPHERTEXT_BYTES}")
        elif isinstance(msg, MaskedInput):
            y = msg.masked
            if not isinstance(y, np.ndarray) or y.dtype != np.uint32 or y.ndim != 1:
                raise ProtocolError(f"MaskedInput.masked: client {u} must send a 1-d uint32 array")
            if y.size != cfg.dimension:
                raise ProtocolError(f"MaskedInput.masked: client {u} sent {y.size} entries, expected "
                                    f"{cfg.dimension}")
            if cfg.modulus_bits < 32 and y.size and int(y.max()) >= (1 << cfg.modulus_bits):
                raise ProtocolError(f"MaskedInput.masked: client {u} sent values >= 2^{cfg.modulus_bits}")
        else:  # UnmaskShares
            holders_of = set(int(v) for v in st.neighbours[u]) | {u}
            bad_seed = sorted(set(msg.seed_shares) - (set(st.masked) & holders_of))
            bad_key = sorted(set(msg.key_shares) - (set(st.dropped) & holders_of))
            if bad_seed:
                raise ProtocolError(f"UnmaskShares.seed_shares: client {u} sent shares for {bad_seed[:5]}, which are "
                                    "not surviving neighbours")
            if bad_key:
                raise ProtocolError(f"UnmaskShares.key_shares: client {u} sent shares for {bad_key[:5]}, which are "
                                    "not dropped neighbours")
            for fname, shares in (("seed_shares", msg.seed_shares), ("key_shares", msg.key_shares)):
                for v, s in shares.items():
                    s = np.asarray(s)
                    if s.shape != (SHARE_LEN,) or (s.size and int(s.max()) >= shamir.PRIME):
                        raise ProtocolError(f"UnmaskShares.{fname}[{v}]: client {u} sent a malformed share")

    def _store(self, msg) -> None:
        st = self.state
        if isinstance(msg, AdvertiseKeys):
            st.keys[msg.client_id] = (msg.c_pk, msg.s_pk)
            if self.config.consistency_check:
                st.signing[msg.client_id] = (msg.sig_pk, msg.key_signature)
        elif isinstance(msg, ConsistencySignature):
            st.signatures[msg.client_id] = msg.signature
        elif isinstance(msg, ShareKeys):
            st.ciphertexts[msg.client_id] = dict(msg.ciphertexts)
        elif isinstance(msg, MaskedInput):
            st.masked[msg.client_id] = msg.masked
        else:
            st.shares[msg.client_id] = msg

    # -- stage transitions -----------------------------------------------------------------------------------
    def _abort(self, reason: str) -> None:
        self.state.stage = ABORTED
        raise InsufficientSurvivorsError(f"round {self.round_id} aborted: {reason}; no aggregate is released")

    def close_stage(self):
        """End the current stage; return the next stage's messages (dict recipient -> message) or the result."""
        st, t = self.state, self.config.threshold
        if st.stage == 0:
            if len(st.keys) < t:
                self._abort(f"{len(st.keys)} clients advertised keys, threshold is {t}")
            st.graph_seed = os.urandom(KEY_BYTES)
            members = np.array(sorted(st.keys), dtype=np.int64)
            st.neighbours = neighbour_table(st.graph_seed, members, self.config.num_neighbours)
            st.stage = 1
            out = {}
            for u in members.tolist():
                parties = [u] + st.neighbours[u].tolist()
                ks = {v: st.keys[v] for v in parties}
                sg = {v: st.signing[v] for v in parties} if self.config.consistency_check else {}
                out[u] = KeyBroadcast(self.round_id, u, st.graph_seed, tuple(members.tolist()), ks, sg)
            return out
        if st.stage == 1:
            if len(st.ciphertexts) < t:
                self._abort(f"{len(st.ciphertexts)} clients shared keys, threshold is {t}")
            inbox: dict[int, dict[int, bytes]] = defaultdict(dict)
            for u, cts in st.ciphertexts.items():
                for v, ct in cts.items():
                    if v in st.ciphertexts:  # only recipients that are still in the round
                        inbox[v][u] = ct
            st.stage = 2
            return {v: ShareBroadcast(self.round_id, v, dict(inbox[v])) for v in sorted(st.ciphertexts)}
        if st.stage == 2:
            if len(st.masked) < t:
                self._abort(f"{len(st.masked)} clients sent masked inputs, threshold is {t}")
            survivors = tuple(sorted(st.masked))
            st.dropped = tuple(sorted(set(st.ciphertexts) - set(st.masked)))
            if self.config.consistency_check:
                st.stage = 3
                return {u: SurvivorList(self.round_id, u, survivors) for u in survivors}
            st.stage = 4
            return {u: UnmaskRequest(self.round_id, u, survivors, st.dropped) for u in survivors}
        if st.stage == 3:
            if len(st.signatures) < t:
                self._abort(f"{len(st.signatures)} clients signed the survivor list, threshold is {t}")
            survivors = tuple(sorted(st.masked))
            st.stage = 4
            sigs = dict(sorted(st.signatures.items()))
            return {u: UnmaskRequest(self.round_id, u, survivors, st.dropped, sigs) for u in sorted(st.signatures)}
        if st.stage == 4:
            if len(st.shares) < t:
                self._abort(f"{len(st.shares)} clients answered the unmasking request, threshold is {t}")
            result = self._unmask()
            st.stage = DONE
            return result
        raise ProtocolError(f"round {self.round_id} is {self.stage_name}; nothing to close")

    # -- unmasking -------------------------------------------------------------------------------------------
    def _reconstruct(self, kind: str) -> dict[int, bytes]:
        """Rebuild the ``kind`` ('seed' or 'key') secret of every survivor or dropped client from t shares."""
        st, t = self.state, self.config.threshold
        targets = st.masked if kind == "seed" else st.dropped
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        short = []
        for v in targets:
            holders = [w for w in sorted(st.shares)
                       if v in (st.shares[w].seed_shares if kind == "seed" else st.shares[w].key_shares)]
            if len(holders) < t:
                short.append((v, len(holders)))
            else:
                groups[tuple(holders[:t])].append(v)
        if short:
            v, h = short[0]
            what = "mask seed b_u" if kind == "seed" else "key s_u^SK"
            self._abort(f"the {what} of client {v} has {h} shares, threshold is {t} "
                        f"({len(short)} secrets cannot be rebuilt)")
        out: dict[int, bytes] = {}
        for holders, vs in groups.items():
            pick = (lambda m: m.seed_shares) if kind == "seed" else (lambda m: m.key_shares)
            stacked = np.stack([np.stack([pick(st.shares[w])[v] for v in vs], axis=0) for w in holders])
            try:
                limbs = shamir.combine(np.array(holders), stacked)  # (len(vs), SHARE_LEN)
            except shamir.ShamirError as exc:
                self._abort(f"inconsistent shares for clients {vs[:5]}: {exc}")
            for v, row in zip(vs, limbs):
                out[v] = row.tobytes()
        return out

    def _unmask(self) -> AggregateResult:
        st, cfg = self.state, self.config
        seeds = self._reconstruct("seed")
        keys = self._reconstruct("key") if st.dropped else {}
        secret_keys = {}
        for v, raw in keys.items():
            sk = X25519PrivateKey.from_private_bytes(raw)
            if sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) != st.keys[v][1]:
                self._abort(f"rebuilt key of dropped client {v} does not match its advertised public key")
            secret_keys[v] = sk
        total = np.zeros(cfg.dimension, dtype=np.uint32)
        for y in st.masked.values():
            np.add(total, y, out=total)
        for u in st.masked:
            prg.add_into(total, seeds[u], negate=True)
        survivors = set(st.masked)
        for v, sk in secret_keys.items():
            for u in st.neighbours[v].tolist():
                if u in survivors:
                    seed = agree(sk, st.keys[u][1], b"mask", self.round_id, v, u)
                    prg.add_into(total, seed, negate=u < v)  # u added +PRG if u < v: remove it
        if cfg.modulus_bits < 32:
            np.bitwise_and(total, np.uint32((1 << cfg.modulus_bits) - 1), out=total)
        return AggregateResult(total, tuple(sorted(survivors)), dequantize(total, cfg.scale, cfg.modulus_bits))
