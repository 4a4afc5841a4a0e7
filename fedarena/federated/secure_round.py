"""Secure-aggregation rounds: SecAgg / SecAgg+ (fedarena.privacy.secagg) driven over the FL runtime.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017
(Figure 4, four stages), and Bell et al., CCS 2020 (SecAgg+ neighbour graphs), as implemented by
:mod:`fedarena.privacy.secagg`. When a round's config sets ``secagg = true``:

* the selected clients are numbered 1..n in the plan's (sorted) order; the task tells each its number;
* a client trains, forms its input ``x = [Delta * n_i / W, n_i / W]`` (the example-weighted delta and
  its weight, ``W = secagg_weight_scale``) and runs the four client stages. Its messages (the secagg
  binary format, carried as ``bytes`` inside wire envelopes) go to its FL-Server (``secagg_send``),
  which checks the token, round and selection and relays them to the scheduler; it fetches the
  scheduler's per-stage replies through the server (``secagg_poll``, long-poll);
* the scheduler hosts the round's :class:`~fedarena.privacy.secagg.SecAggServer`: a stage closes when
  every expected client has sent its message or at the stage deadline (stage 0 at the round's window,
  which includes local training; later stages after ``secagg_stage_seconds``); clients that miss a
  stage are dropped and their masks are removed through the Shamir shares of the others;
* the unmasked sum gives ``sum_i n_i Delta_i / W`` and ``sum_i n_i / W``; their ratio is the FedAvg
  mean delta, applied with the server optimizer. Fewer than ``threshold`` survivors abort the round
  (abandoned; no aggregate is ever released). No server sees an individual client's delta.

The masked sum is exact modulo 2^k; the only error is the fixed-point rounding of each input
(``1 / (2 secagg_scale)`` per coordinate).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedarena.federated.transport import ProtocolError

STAGE_NAMES = ("advertise_keys", "share_keys", "masked_input", "unmask")


def secagg_params(cfg: Any, n_selected: int, dimension: int):
    """The :class:`~fedarena.privacy.secagg.SecAggConfig` of a round with ``n_selected`` clients and a model
    of ``dimension - 1`` parameters (the last input coordinate carries the weight)."""
    from fedarena.privacy.secagg import SecAggConfig

    return SecAggConfig(
        dimension=dimension, threshold=max(2, math.ceil(cfg.secagg_threshold * n_selected)),
        clip=cfg.secagg_clip, scale=cfg.secagg_scale, modulus_bits=32,
        num_neighbours=cfg.secagg_neighbours or None,
    )


def client_input(delta_flat: np.ndarray, num_examples: int, weight_scale: float) -> np.ndarray:
    """``[Delta * n / W, n / W]``: the client's secure-aggregation input."""
    w = float(num_examples) / float(weight_scale)
    return np.concatenate([np.asarray(delta_flat, np.float64) * w, [w]])


@dataclass
class SecureRound:
    """Scheduler side of one secure round: the SecAggServer, the stage clock and the per-client outbox."""

    server: Any
    ids: dict[str, int]
    stage: int
    deadline: float
    stage_seconds: float
    outbox: dict[int, bytes]
    expected: set[int]
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
        return cls(server, ids, 0, window_deadline, cfg.secagg_stage_seconds, {}, set(ids.values()))

    def received(self) -> int:
        st = self.server.state
        return len((st.keys, st.ciphertexts, st.masked, st.shares)[self.stage])

    @property
    def finished(self) -> bool:
        return self.result is not None or bool(self.aborted)

    def due(self, now: float) -> bool:
        """Should the current stage close now (every expected message in, or its deadline passed)?"""
        return not self.finished and (self.received() >= len(self.expected) or now >= self.deadline)

    def close_stage(self, now: float) -> None:
        from fedarena.privacy.secagg import InsufficientSurvivorsError, encode

        try:
            out = self.server.close_stage()
        except InsufficientSurvivorsError as e:
            self.aborted = str(e)
            self.outbox = {}
            return
        if self.stage == 3:
            self.result = out
            self.outbox = {}
            return
        self.outbox = {u: encode(m) for u, m in out.items()}
        self.expected = set(out)
        self.stage += 1
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
        if not 1 <= stage <= 3:
            raise ProtocolError("body.stage", f"must be 1, 2 or 3, got {stage}", "malformed")
        if self.stage < stage and not self.finished:
            return None
        if self.stage > stage or self.finished:
            raise ProtocolError("body.stage", f"stage {stage} is over (now {STAGE_NAMES[min(self.stage, 3)]})",
                                "stale_round")
        if u not in self.outbox:
            raise ProtocolError("body.client_id", f"client {client_id} was dropped before stage {stage}", "dropped")
        self.bytes_down += len(self.outbox[u])
        return self.outbox[u]

    def mean_delta(self) -> tuple[np.ndarray, float, int]:
        """``(sum n_i Delta_i / sum n_i, sum n_i / W, survivors)`` from the unmasked sum."""
        values = np.asarray(self.result.values, np.float64)
        weight = float(values[-1])
        if not weight > 0:
            raise ValueError("weight: the unmasked weight is not positive")
        return values[:-1] / weight, weight, len(self.result.survivors)


def run_client(send, poll, secagg_cfg: Any, party: int, round_id: int, x: np.ndarray, deadline: float) -> bool:
    """Client side: the four stages. ``send(bytes)`` relays a message; ``poll(stage) -> bytes | None``.

    Returns True when the client completed its part (the sum may still be aborted by the scheduler).
    """
    from fedarena.privacy.secagg import SecAggClient, decode, encode

    client = SecAggClient(party, secagg_cfg, round_id)
    send(encode(client.advertise_keys()))
    steps = (client.share_keys, lambda m: client.masked_input(m, x), client.unmask)
    for stage, step in zip((1, 2, 3), steps):
        data = None
        while data is None:
            if time.monotonic() > deadline:
                return False
            data = poll(stage)
        reply = step(decode(data))
        send(encode(reply))
    return True
