"""Secure-aggregation rounds: SecAgg / SecAgg+ (fedarena.privacy.secagg) driven over the FL runtime.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017
(Figure 4, plus the consistency-check round of their malicious-server protocol, on by default), and
Bell et al., CCS 2020 (SecAgg+ neighbour graphs), as implemented by :mod:`fedarena.privacy.secagg`.
When a round's config sets ``secagg = true``:

* the selected clients are numbered 1..n in the plan's (sorted) order; the task tells each its number;
* a client trains and forms its input with bounded entries (:func:`client_input`): its example count is
  clipped to ``1..N`` (``N = secagg_max_examples``), every delta coordinate to ``[-c, c]``
  (``c = secagg_clip``), and it inputs ``x = [clip(Delta) * n / N, n / N]`` with the fixed-point scale
  rounded down to a multiple of ``N``, so the weight coordinate is an exact whole number of examples.
  A non-finite delta is refused before anything is masked (the client sits the round out);
* its messages (the secagg binary format, carried as ``bytes`` inside wire envelopes) go to its
  FL-Server (``secagg_send``), which checks the token, registration, round and selection and relays
  them to the scheduler; it fetches the scheduler's per-stage replies through the server
  (``secagg_poll``, long-poll);
* the scheduler hosts the round's :class:`~fedarena.privacy.secagg.SecAggServer` (opened by the
  :class:`~fedarena.federated.wrappers.SecureAggregation` strategy, the simulation's): a stage closes when
  every expected client has sent its message or at the stage deadline (stage 0 at the round's window,
  which includes local training; later stages after ``secagg_stage_seconds``); clients that miss a
  stage are dropped and their masks are removed through the Shamir shares of the others;
* the unmasked sum gives ``S_j = sum_i n_i clip(Delta_ij)`` and ``K = sum_i n_i`` (in fixed point); the
  strategy refuses a sum that no set of bounded inputs can produce (``K`` not a whole number in
  ``survivors..survivors * N``, or some ``|S_j| > c K``; :func:`decode_aggregate`) and the scheduler abandons the
  round; otherwise ``S / K`` is the FedAvg mean delta, applied by the inner strategy's server optimizer. Fewer than ``threshold`` survivors abort the
  round (abandoned; no aggregate is ever released).

The threshold ``t`` is set over ``m``, the number of share holders of each secret (the number of selected
clients for SecAgg, ``min(n, k + 1)`` for SecAgg+ with ``k`` neighbours): ``t = floor(secagg_threshold * m) + 1``
(at most ``m``; 2/3 by default), or, with ``secagg_colluders = n_C``, ``t = floor((m + n_C) / 2) + 1``, the
smallest threshold with ``2 t > m + n_C``.

What is hidden from whom (see docs/security.md, section 8): no FL-Server or scheduler learns an individual
client's delta, only the sum over at least ``t`` clients, provided fewer than ``2 t - m`` of each client's
share holders collude with the scheduler (:func:`colluders_tolerated`; a scheduler that sends split views
needs ``t`` shares of both secrets of one client, and honest holders reveal only one of the two, so it needs
``2 (t - n_C) <= m - n_C``), the scheduler cannot add clients of its own making (clients given a
:class:`SecAggIdentity`, a PKI, refuse members without an identity key and keys not signed by their owner's
identity key; :class:`~fedarena.federated.deployment.Deployment` distributes one), and the clients' own code is
honest. A malicious client cannot read others' inputs but can bias the aggregate within the bounds above, or
make the round be abandoned.

The masked sum is exact modulo 2^32; the only error is the fixed-point rounding of each input
(``1 / (2 scale)`` per coordinate).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.federated.transport import ProtocolError

STAGE_NAMES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask")


class AggregateOutOfRange(ValueError):
    """The unmasked sum cannot come from inputs inside the declared bounds (a client sent out-of-range values)."""


def holders(cfg: Any, n_selected: int) -> int:
    """Share holders of each secret: every selected client (SecAgg) or a neighbourhood of k + 1 (SecAgg+)."""
    k = cfg.secagg_neighbours
    return n_selected if not k or k >= n_selected - 1 else k + 1


def threshold(cfg: Any, n_selected: int) -> int:
    """``t`` for ``m`` share holders: ``floor((m + n_C) / 2) + 1`` with ``secagg_colluders = n_C >= 0`` (may exceed
    ``m``: then no threshold resists n_C colluders and the round cannot run), else
    ``min(m, floor(secagg_threshold * m) + 1)`` (the floor is taken with a 1e-9 tolerance, so 2/3 written as a
    decimal still gives ``floor(2 m / 3)``)."""
    m = holders(cfg, n_selected)
    k = getattr(cfg, "secagg_colluders", -1)
    if k >= 0:
        return (m + k) // 2 + 1
    return min(m, math.floor(cfg.secagg_threshold * m + 1e-9) + 1)


def colluders_tolerated(cfg: Any, n_selected: int) -> int:
    """Most colluding share holders of one client (``2 t - m - 1``) with which a malicious scheduler still cannot
    rebuild both of its secrets; ``-1`` when ``t <= m / 2`` (refused everywhere)."""
    m = holders(cfg, n_selected)
    return min(m - 1, 2 * threshold(cfg, n_selected) - m - 1)


def fixed_point_scale(cfg: Any) -> float:
    """``secagg_scale`` rounded down to a multiple of ``N = secagg_max_examples`` (so ``n / N`` is exact)."""
    n = int(cfg.secagg_max_examples)
    return float(n * max(1, int(cfg.secagg_scale) // n))


def secagg_params(cfg: Any, n_selected: int, dimension: int):
    """The :class:`~fedarena.privacy.secagg.SecAggConfig` of a round with ``n_selected`` clients and a model
    of ``dimension - 1`` parameters (the last input coordinate carries the weight)."""
    from fedarena.privacy.secagg import SecAggConfig

    return SecAggConfig(
        dimension=dimension, threshold=max(2, threshold(cfg, n_selected)),
        clip=max(1.0, float(cfg.secagg_clip)), scale=fixed_point_scale(cfg), modulus_bits=32,
        # a neighbourhood of k >= n - 1 is every client: plain SecAgg
        num_neighbours=cfg.secagg_neighbours if holders(cfg, n_selected) < n_selected else None,
        consistency_check=bool(cfg.secagg_consistency_check),
    )


def check_secure_config(cfg: Any, max_clients: int, where: str = "round") -> None:
    """Refuse, with one line naming the field, a secure-round config that cannot run with up to ``max_clients``
    selected clients (threshold, neighbourhood, fixed-point capacity). No-op when ``secagg`` is off."""
    if not cfg.secagg:
        return
    if cfg.secagg_scale < cfg.secagg_max_examples:
        raise ValueError(f"{where}.secagg_scale: {cfg.secagg_scale:g} is below secagg_max_examples "
                         f"{cfg.secagg_max_examples}; example counts would not be whole numbers in fixed point")
    if max_clients < 3:
        raise ValueError(f"{where}.clients: a secure round needs at least 3 clients, got {max_clients}")
    k_col = getattr(cfg, "secagg_colluders", -1)
    m = holders(cfg, max_clients)
    if k_col >= 0 and threshold(cfg, max_clients) > m:
        raise ValueError(f"{where}.secagg_colluders: {k_col} colluders among {m} share holders need a threshold above "
                         f"{(m + k_col) / 2:g}, more than the {m} holders; at most {m - 1} can be tolerated")
    k = cfg.secagg_neighbours
    if k and k < 2:
        raise ValueError(f"{where}.secagg_neighbours: must be 0 or an even number >= 2, got {k}")
    for n in sorted({3, max_clients} if k_col < 0 else {max_clients}):
        try:
            secagg_params(cfg, n, 2).validate_for(n)
        except ValueError as e:
            msg = str(e)
            if msg.startswith("modulus_bits"):
                cap = capacity(cfg)
                raise ValueError(f"{where}.secagg_scale: {n} clients x secagg_clip x secagg_scale overflow the "
                                 f"32-bit masked sum (at most {cap} clients with secagg_clip={cfg.secagg_clip:g}, "
                                 f"secagg_scale={cfg.secagg_scale:g}); lower secagg_scale or select fewer "
                                 "clients") from None
            if msg.startswith("threshold"):
                raise ValueError(f"{where}.secagg_threshold: {msg.split(': ', 1)[1]}") from None
            raise ValueError(f"{where}.{msg}") from None


def capacity(cfg: Any) -> int:
    """Most clients whose bounded inputs sum exactly in 32 bits."""
    per = round(max(1.0, float(cfg.secagg_clip)) * fixed_point_scale(cfg))
    return max(0, (2**31 - 1) // per)


def client_input(delta_flat: np.ndarray, num_examples: int, cfg: Any) -> np.ndarray:
    """``[clip(Delta, c) * n / N, n / N]`` with ``n`` clipped to ``1..N``: the client's secure-aggregation input.

    Raises ValueError (naming the entries) when the delta has a NaN or infinite entry."""
    d = np.asarray(delta_flat, np.float64).ravel()
    bad = np.flatnonzero(~np.isfinite(d))
    if bad.size:
        raise ValueError(f"update: entries {bad[:5].tolist()} are not finite ({bad.size} NaN/inf); the client "
                         "refuses to mask it")
    big = int(cfg.secagg_max_examples)
    n = min(max(1, int(num_examples)), big)
    c = float(cfg.secagg_clip)
    return np.concatenate([np.clip(d, -c, c) * (n / big), [n / big]])


def decode_aggregate(cfg: Any, total: np.ndarray, survivors: int) -> tuple[np.ndarray, int]:
    """Mean delta and example count from the unmasked modular sum; :class:`AggregateOutOfRange` when no set of
    ``survivors`` inputs inside the bounds of :func:`client_input` sums to it."""
    z = np.asarray(total, np.int64) % (1 << 32)
    z = np.where(z >= (1 << 31), z - (1 << 32), z)
    big = int(cfg.secagg_max_examples)
    unit = int(fixed_point_scale(cfg)) // big  # fixed-point value of one example in the weight coordinate
    w = int(z[-1])
    if w % unit:
        raise AggregateOutOfRange(f"aggregate.weight: {w / unit:.6g} is not a whole number of examples")
    k = w // unit
    if not survivors <= k <= survivors * big:
        raise AggregateOutOfRange(f"aggregate.weight: {k} examples from {survivors} clients is outside "
                                  f"{survivors}..{survivors * big} (each client declares 1..{big})")
    limit = float(cfg.secagg_clip) * unit * k + survivors / 2.0
    s = z[:-1].astype(np.float64)
    over = np.flatnonzero(np.abs(s) > limit)
    if over.size:
        j = int(over[0])
        raise AggregateOutOfRange(f"aggregate.update[{j}]: |sum| {abs(s[j]) / (unit * k):.6g} x examples exceeds "
                                  f"secagg_clip {cfg.secagg_clip:g} x examples ({over.size} coordinates out of range)")
    return s / w, k


@dataclass(frozen=True)
class SecAggIdentity:
    """A client's long-term Ed25519 signing key and the public keys of every client (a PKI, distributed out of
    band). With it, a client accepts only peers' keys signed by their identity keys, so a scheduler that
    substitutes keys in stage 0 (and could then forge survivor-list signatures) is caught."""

    signing_key: Any  # cryptography Ed25519PrivateKey
    directory: dict[str, bytes]  # client id -> raw Ed25519 public key

    def party_keys(self, client_id: str, party: int, members: list[str]) -> dict[int, bytes]:
        """Party number -> identity key for the round's members (party i is ``members[i - 1]``)."""
        if not 1 <= party <= len(members) or members[party - 1] != client_id:
            raise ValueError(f"secagg_members: party {party} is not {client_id} in the round's member list")
        if len(set(members)) != len(members):
            raise ValueError("secagg_members: a client is listed twice")
        return {i + 1: self.directory[m] for i, m in enumerate(members) if m in self.directory}


def new_identities(client_ids) -> dict[str, SecAggIdentity]:
    """Fresh Ed25519 identity keys for ``client_ids``, each with the full directory (for tests and deployments)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    keys = {c: Ed25519PrivateKey.generate() for c in client_ids}
    directory = {c: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for c, k in keys.items()}
    return {c: SecAggIdentity(k, dict(directory)) for c, k in keys.items()}


def write_identities(folder, client_ids) -> None:
    """Issue the PKI of a deployment into ``folder``: ``<id>.key`` (PKCS#8 PEM, mode 0600) per client and
    ``directory.json`` (client id -> hex raw Ed25519 public key). Keys already there are kept (a resumed deployment
    keeps its identities); missing clients get new keys. Done by the launcher, not by the scheduler."""
    import json
    import os
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption, PrivateFormat, PublicFormat,
                                                              load_pem_private_key)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    directory = {}
    for cid in client_ids:
        path = folder / f"{cid}.key"
        if path.exists():
            key = load_pem_private_key(path.read_bytes(), password=None)
        else:
            key = Ed25519PrivateKey.generate()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        directory[cid] = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    tmp = folder / "directory.json.tmp"
    tmp.write_text(json.dumps(directory, indent=1, sort_keys=True))
    tmp.replace(folder / "directory.json")


def load_identity(folder, client_id: str) -> SecAggIdentity:
    """Client ``client_id``'s :class:`SecAggIdentity` from a folder written by :func:`write_identities`."""
    import json
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    folder = Path(folder)
    key = load_pem_private_key((folder / f"{client_id}.key").read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"identity: {folder / (client_id + '.key')} is not an Ed25519 key")
    directory = {c: bytes.fromhex(h) for c, h in json.loads((folder / "directory.json").read_text()).items()}
    return SecAggIdentity(key, directory)


@dataclass
class SecureRound:
    """Scheduler side of one secure round: the SecAggServer (opened by
    :meth:`fedarena.federated.wrappers.SecureAggregation.open_round`), the stage clock and the per-client outbox the
    scheduler relays; the wrapper's ``aggregate_unmasked`` decodes :attr:`result`."""

    server: Any
    ids: dict[str, int]
    stage: int
    deadline: float
    stage_seconds: float
    outbox: dict[int, bytes]
    expected: set[int]
    round_config: Any = None
    result: Any = None
    aborted: str = ""
    bytes_up: int = 0
    bytes_down: int = 0

    @classmethod
    def open(cls, cfg: Any, round_id: int, selected: list[str], dimension: int,
             window_deadline: float) -> "SecureRound":
        from fedarena.privacy.secagg import SecAggServer

        ids = {cid: i + 1 for i, cid in enumerate(sorted(selected))}
        server = SecAggServer(secagg_params(cfg, len(selected), dimension), round_id, sorted(ids.values()))
        return cls(server, ids, 0, window_deadline, cfg.secagg_stage_seconds, {}, set(ids.values()), cfg)

    def received(self) -> int:
        st = self.server.state
        return len((st.keys, st.ciphertexts, st.masked, st.signatures, st.shares)[self.stage])

    @property
    def finished(self) -> bool:
        return self.result is not None or bool(self.aborted)

    def due(self, now: float) -> bool:
        """Should the current stage close now (every expected message in, or its deadline passed)?"""
        return not self.finished and (self.received() >= len(self.expected) or now >= self.deadline)

    def close_stage(self, now: float) -> None:
        from fedarena.privacy.secagg import InsufficientSurvivorsError, encode
        from fedarena.privacy.secagg.server import DONE

        try:
            out = self.server.close_stage()
        except InsufficientSurvivorsError as e:
            self.aborted = str(e)
            self.outbox = {}
            return
        if self.server.state.stage == DONE:
            self.result = out
            self.outbox = {}
            return
        self.outbox = {u: encode(m) for u, m in out.items()}
        self.expected = set(out)
        self.stage = self.server.state.stage
        self.deadline = now + self.stage_seconds

    def receive(self, client_id: str, data: bytes) -> None:
        """Accept one client message (already authenticated as ``client_id``); raises ProtocolError."""
        from fedarena.privacy.secagg import decode
        from fedarena.privacy.secagg import ProtocolError as SecAggError

        u = self.ids.get(client_id)
        if u is None:
            raise ProtocolError("body.client_id", f"client {client_id} is not in this secure round", "not_selected")
        if self.finished:
            raise ProtocolError("body.round", "the secure round is over", "stale_round")
        try:
            msg = decode(data)
        except ValueError as e:
            raise ProtocolError("body.message", str(e), "malformed") from None
        if getattr(msg, "client_id", None) != u:
            raise ProtocolError("body.message", f"message is signed as party {getattr(msg, 'client_id', None)}, "
                                f"but {client_id} is party {u}", "rejected")
        try:
            self.server.receive(data)
        except (SecAggError, ValueError) as e:
            raise ProtocolError("body.message", str(e), "rejected") from None
        self.bytes_up += len(data)

    def message_for(self, client_id: str, stage: int) -> bytes | None:
        """The scheduler's message opening ``stage`` for this client; None while that stage is not open yet."""
        u = self.ids.get(client_id)
        if u is None:
            raise ProtocolError("body.client_id", f"client {client_id} is not in this secure round", "not_selected")
        if self.aborted:
            raise ProtocolError("body.round", f"secure round aborted: {self.aborted}", "aborted")
        check = self.server.config.consistency_check
        if not 1 <= stage <= 4 or (stage == 3 and not check):
            raise ProtocolError("body.stage", f"must be 1, 2{', 3' if check else ''} or 4, got {stage}", "malformed")
        if self.stage < stage and not self.finished:
            return None
        if self.stage > stage or self.finished:
            raise ProtocolError("body.stage", f"stage {stage} is over (now {STAGE_NAMES[min(self.stage, 4)]})",
                                "stale_round")
        if u not in self.outbox:
            raise ProtocolError("body.client_id", f"client {client_id} was dropped before stage {stage}", "dropped")
        self.bytes_down += len(self.outbox[u])
        return self.outbox[u]


def run_client(send, poll, secagg_cfg: Any, party: int, round_id: int, x: np.ndarray, deadline: float, *,
               signing_key: Any = None, identities: dict[int, bytes] | None = None) -> bool:
    """Client side: the four stages (five with the consistency check). ``send(bytes)`` relays a message;
    ``poll(stage) -> bytes | None``; ``signing_key`` / ``identities``: the PKI of :class:`SecAggIdentity`.

    Returns True when the client completed its part (the sum may still be aborted by the scheduler).
    """
    from fedarena.privacy.secagg import SecAggClient, decode, encode

    client = SecAggClient(party, secagg_cfg, round_id, signing_key=signing_key, identities=identities)
    send(encode(client.advertise_keys()))
    steps = [(1, client.share_keys), (2, lambda m: client.masked_input(m, x))]
    if secagg_cfg.consistency_check:
        steps.append((3, client.consistency))
    steps.append((4, client.unmask))
    for stage, step in steps:
        data = None
        while data is None:
            if time.monotonic() > deadline:
                return False
            data = poll(stage)
        reply = step(decode(data))
        send(encode(reply))
    return True
