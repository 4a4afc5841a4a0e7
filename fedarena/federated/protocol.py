"""Messages of the horizontal-FL protocol (wire version 1): kinds, body fields, the round config.

All messages are :mod:`fedarena.federated.wire` envelopes sent over :mod:`fedarena.federated.transport`.
Bodies (``?`` = optional; arrays are wire arrays; ``params`` maps tensor name -> float32 array):

Client -> FL-Server (every request carries ``client_id`` and ``token``)
  ``register``  {num_examples}                                  -> ``registered`` {server_id, round}
  ``get_task``  {have_version, wait_s}                          -> ``task`` {round, model_version,
                config, deadline_s, params?} | ``wait`` {round, reason} | ``done`` {round}
  ``upload``    {round, model_version, num_examples, nonce (16 bytes), encoding, update, train_loss}
                                                                -> ``ack`` {round, clients_admitted}
Client -> FL-Scheduler
  ``assign``    {client_id, token, failed_server}               -> ``assignment`` {server_id, address}
FL-Server -> FL-Scheduler (every request carries ``server_id`` and ``cluster_token``)
  ``server_join`` {address}                                     -> ``joined`` {}
  ``sync``      {known_round, known_phase, known_version, clients, wait_s} -> ``plan`` {round, model_version,
                phase, selected, config, deadline_s, rounds, collect_updates, params? (when known_version is stale)}
  ``admit``     {round, client_id}                              -> ``admitted`` {count}
  ``partial``   {round, weight, clients, sums, loss_sum, bytes_up, bytes_down, updates? and update_weights?
                (per-client deltas and weights, when the plan says collect_updates)} -> ``ack`` {}
  ``get_model`` {version}                                       -> ``model`` {version, params}
Secure-aggregation rounds (``config.secagg``; see :mod:`fedarena.federated.secure_round`): the task also
carries ``secagg_party``; client -> server ``secagg_send`` {round, message: bytes} -> ``ack`` and
``secagg_poll`` {round, stage (1..4; 3 = consistency check), wait_s} -> ``secagg`` {message} | ``wait``
(uploads and SecAgg messages need ``register`` on that server first); the server relays them to the
scheduler as ``secagg_up`` / ``secagg_down`` {client_id, round, ...}.
Observer -> FL-Scheduler: ``status`` {cluster_token} -> ``status`` {round, model_version, phase, history,
  servers, clients}; ``get_model`` as above.  Anyone -> node: ``ping`` {} -> ``pong`` {node}.

Any request may instead get ``error`` {code, field, reason}. Codes: ``malformed`` (wire/field
problems), ``unauthenticated``, ``stale_round``, ``stale_version``, ``not_selected``, ``replay``,
``duplicate``, ``norm_bound``, ``too_many_examples``, ``unavailable``, ``dropped``, ``aborted``, ``internal``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Mapping

import numpy as np

from fedarena.federated import wire

CLIENT_KINDS = ("register", "get_task", "upload", "secagg_send", "secagg_poll", "ping")
SCHEDULER_KINDS = ("assign", "server_join", "sync", "admit", "partial", "get_model", "status", "secagg_up",
                   "secagg_down", "ping")
class Phase(str, Enum):
    """Where a round stands in the plan: waiting to open, open for uploads, waiting for the FL-Servers' partials, or
    every round is done. The values are the ``phase`` strings of ``plan`` and ``status`` bodies."""

    IDLE = "idle"
    OPEN = "open"
    CLOSING = "closing"
    DONE = "done"

    def __str__(self) -> str:  # messages and logs show the wire string
        return self.value

    __format__ = str.__format__


PHASES = tuple(p.value for p in Phase)


@dataclass(frozen=True)
class RoundConfig:
    """What the round plan tells every selected client to do."""

    epochs: int = 2
    batch_size: int = 16
    lr: float = 0.1
    prox_mu: float = 0.0
    """FedProx proximal coefficient mu (0 = FedAvg local objective)"""
    signds_k: int = 0
    """SignDS top-k size (0 = SignDS off); when on, every client uploads a SignDS report"""
    signds_h: int = 0
    """SignDS output size h (number of reported dimensions)"""
    signds_epsilon: float = 1.0
    """SignDS local DP epsilon per upload"""
    signds_lr: float = 0.01
    """SignDS global learning rate: each reported dimension moves by sign * signds_lr / n"""
    secagg: bool = False
    """secure aggregation (SecAgg, Bonawitz et al. 2017) of the round's updates"""
    secagg_threshold: float = 2 / 3
    """Shamir threshold t = floor(f * m) + 1 (at most m) for m share holders (selected clients, or k + 1 with SecAgg+);
    f in [0.5, 1], so t > m / 2. At 2/3 a malicious scheduler needs more than floor(m / 3) colluding clients
    (2 t - m of them) to unmask one client's input (docs/security.md, section 8)"""
    secagg_colluders: int = -1
    """K >= 0: set t = floor((m + K) / 2) + 1, the smallest threshold at which a malicious scheduler together with K
    colluding share holders cannot unmask any client (2 t > m + K); -1 = use secagg_threshold"""
    secagg_neighbours: int = 0
    """SecAgg+ neighbourhood size (even; 0 = every pair of clients masks, plain SecAgg)"""
    secagg_clip: float = 1.0
    """per-coordinate clipping of the secure input before fixed-point quantization"""
    secagg_scale: float = 4194304.0
    """fixed-point scale of the secure input (2^22)"""
    secagg_max_examples: int = 10000
    """N: example counts are clipped to 1..N inside the masked vector (weight n / N)"""
    secagg_consistency_check: bool = True
    """the signed survivor-list round of Bonawitz et al. 2017 (malicious-server variant)"""
    secagg_stage_seconds: float = 10.0
    """window of each secure-aggregation stage after the first"""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"round.epochs: must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"round.batch_size: must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"round.lr: must be > 0, got {self.lr}")
        if self.prox_mu < 0:
            raise ValueError(f"round.prox_mu: must be >= 0, got {self.prox_mu}")
        if self.signds_k < 0 or (self.signds_k and not 0 < self.signds_h):
            raise ValueError(f"round.signds_k/signds_h: need k >= 0 and, with k > 0, h > 0; got "
                             f"{self.signds_k}, {self.signds_h}")
        if self.signds_k and not (self.signds_epsilon > 0 and self.signds_lr > 0):
            raise ValueError("round.signds_epsilon/signds_lr: must be > 0")
        if self.secagg and self.signds_k:
            raise ValueError("round.secagg: cannot be combined with SignDS (signds_k > 0)")
        if self.secagg and not (0.5 <= self.secagg_threshold <= 1):
            raise ValueError(f"round.secagg_threshold: must lie in [0.5, 1] (t must exceed half of the share "
                             f"holders), got {self.secagg_threshold}")
        if isinstance(self.secagg_colluders, bool) or not isinstance(self.secagg_colluders, int) \
                or self.secagg_colluders < -1:
            raise ValueError(f"round.secagg_colluders: must be an integer >= 0 (or -1 = use secagg_threshold), got "
                             f"{self.secagg_colluders!r}")
        if self.secagg and not (self.secagg_clip > 0 and self.secagg_scale > 0 and self.secagg_stage_seconds > 0):
            raise ValueError("round.secagg_clip/scale/stage_seconds: must be > 0")
        if self.secagg and not (isinstance(self.secagg_max_examples, int) and self.secagg_max_examples >= 1):
            raise ValueError(f"round.secagg_max_examples: must be an integer >= 1, got {self.secagg_max_examples!r}")
        if self.secagg_neighbours < 0 or self.secagg_neighbours % 2:
            raise ValueError(f"round.secagg_neighbours: must be even and >= 0, got {self.secagg_neighbours}")

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Mapping[str, Any], where: str = "body.config") -> "RoundConfig":
        try:
            return cls(
                epochs=wire.field(body, "epochs", int, where=where),
                batch_size=wire.field(body, "batch_size", int, where=where),
                lr=wire.field(body, "lr", float, where=where),
                prox_mu=wire.field(body, "prox_mu", float, where=where),
                signds_k=wire.field(body, "signds_k", int, where=where, default=0),
                signds_h=wire.field(body, "signds_h", int, where=where, default=0),
                signds_epsilon=wire.field(body, "signds_epsilon", float, where=where, default=1.0),
                signds_lr=wire.field(body, "signds_lr", float, where=where, default=0.01),
                secagg=wire.field(body, "secagg", bool, where=where, default=False),
                secagg_threshold=wire.field(body, "secagg_threshold", float, where=where, default=2 / 3),
                secagg_colluders=wire.field(body, "secagg_colluders", int, where=where, default=-1),
                secagg_neighbours=wire.field(body, "secagg_neighbours", int, where=where, default=0),
                secagg_clip=wire.field(body, "secagg_clip", float, where=where, default=1.0),
                secagg_scale=wire.field(body, "secagg_scale", float, where=where, default=4194304.0),
                secagg_max_examples=wire.field(body, "secagg_max_examples", int, where=where, default=10000),
                secagg_consistency_check=wire.field(body, "secagg_consistency_check", bool, where=where,
                                                    default=True),
                secagg_stage_seconds=wire.field(body, "secagg_stage_seconds", float, where=where, default=10.0),
            )
        except ValueError as e:
            if isinstance(e, wire.WireError):
                raise
            raise wire.WireError(where, str(e)) from None


def signds_config(cfg: RoundConfig, shapes: Mapping[str, tuple[int, ...]]):
    """The :class:`fedarena.privacy.signds.SignDSConfig` of a round (None when SignDS is off)."""
    if not cfg.signds_k:
        return None
    from fedarena.privacy.signds import SignDSConfig

    d = sum(int(np.prod(s)) for s in shapes.values())
    return SignDSConfig(d=d, k=cfg.signds_k, h=cfg.signds_h, epsilon=cfg.signds_epsilon)


def params_shapes(params: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in params.items()}


def model_bytes(params: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a model: names sorted, each ``name | dtype | shape | raw data``."""
    out = bytearray()
    for k in sorted(params):
        v = params[k]
        out += f"{k}|{v.dtype.str}|{list(v.shape)}|".encode() + v.tobytes()
    return bytes(out)
