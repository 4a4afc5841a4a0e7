"""Upload stages of an FL-Client and the matching server-side decoding of an uploaded update.

A client turns its model delta ``Delta = w_local - w_global`` into an upload by a chain of stages
(the FL chapter's "protect and compress what is uploaded"; Flower calls such a chain client mods):

* transform stages, dense -> dense: ``clip`` (scale to L2 norm <= C, as in DP-FedAvg, McMahan et al.
  ICLR 2018) and ``ldp_gaussian`` (clip + Gaussian noise from :mod:`fedarena.privacy.ldp`, the
  analytic Gaussian mechanism of Balle & Wang 2018);
* one final encoder: ``dense`` (float32 arrays), ``topk`` (keep the k = ceil(f d) largest-magnitude
  entries of each tensor, sent as sorted flat uint32 indices plus float32 values; Aji & Heafield
  2017 / Lin et al. "Deep Gradient Compression" ICLR 2018), or ``q8`` (per-tensor uniform 8-bit
  quantization with stochastic rounding, unbiased, as in QSGD, Alistarh et al. NeurIPS 2017:
  ``x = lo + scale * q`` with ``q`` in 0..255).

Payload per tensor name, by encoding: ``dense``: array; ``topk``: ``{"indices": uint32[k],
"values": float32[k]}``; ``q8``: ``{"q": uint8[shape], "lo": float, "scale": float}``.
:func:`decode_update` checks every name, dtype, shape, index range and finiteness before it builds
a dense delta, and raises :class:`~fedarena.federated.wire.WireError` naming the offending field.

``signds`` (SignDS, Jiang et al. 2022, from :mod:`fedarena.privacy.signds`) replaces the whole
upload when the round config enables it: the flattened delta (tensors in sorted name order) becomes a
report ``{"report": bytes}`` (sign byte + h uint32 indices); the server turns it into the dense delta
``sign * signds_lr * 1[J]`` and averages reports with equal weight, which is exactly
``signds_aggregate``. The encoders are the codecs of :mod:`fedarena.federated.compression` applied tensor by
tensor (:func:`~fedarena.federated.compression.wire_codec`). Secure aggregation is not an upload stage (it needs extra
protocol rounds between the clients): it wraps the strategy, as DP-FedAvg does (:mod:`fedarena.federated.wrappers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from fedarena.federated.compression import WIRE_ENCODINGS, decode_tensors, encode_tensors, wire_codec
from fedarena.federated.wire import WireError

Params = dict[str, np.ndarray]
ENCODINGS = (*WIRE_ENCODINGS, "signds")


class UploadStage(Protocol):
    """A dense -> dense transform of the client's delta (clipping, local DP noise, ...)."""

    def __call__(self, delta: Params, rng: np.random.Generator) -> Params: ...


def global_norm(delta: Mapping[str, np.ndarray]) -> float:
    return float(math.sqrt(sum(float(np.sum(np.square(np.asarray(v, np.float64)))) for v in delta.values())))


@dataclass(frozen=True)
class Clip:
    """Scale the whole delta so its global L2 norm is at most ``max_norm``."""

    max_norm: float

    def __post_init__(self) -> None:
        if not self.max_norm > 0:
            raise ValueError(f"clip.max_norm: must be > 0, got {self.max_norm}")

    def __call__(self, delta: Params, rng: np.random.Generator) -> Params:
        norm = global_norm(delta)
        if norm <= self.max_norm:
            return dict(delta)
        s = self.max_norm / norm
        return {k: (v * s).astype(v.dtype) for k, v in delta.items()}


@dataclass(frozen=True)
class GaussianLDP:
    """Local DP: clip the flattened delta to ``clip_norm`` and add analytic-Gaussian noise for (epsilon, delta)."""

    epsilon: float
    delta: float
    clip_norm: float

    def __call__(self, update: Params, rng: np.random.Generator) -> Params:
        from fedarena.privacy.ldp import GaussianMechanism

        mech = GaussianMechanism(epsilon=self.epsilon, delta=self.delta, clip_norm=self.clip_norm)
        names = sorted(update)
        flat = np.concatenate([np.asarray(update[k], np.float64).ravel() for k in names]) if names else np.zeros(0)
        noisy = mech(flat, rng)
        out, i = {}, 0
        for k in names:
            n = update[k].size
            out[k] = noisy[i : i + n].reshape(update[k].shape).astype(np.float32)
            i += n
        return out


def flatten(delta: Mapping[str, np.ndarray]) -> np.ndarray:
    """The tensors of ``delta`` in sorted name order, raveled and concatenated (float64)."""
    names = sorted(delta)
    return np.concatenate([np.asarray(delta[k], np.float64).ravel() for k in names]) if names else np.zeros(0)


def encode_signds(delta: Params, signds_cfg: Any, rng: np.random.Generator) -> dict[str, Any]:
    from fedarena.privacy.signds import signds_report

    return {"report": signds_report(flatten(delta), signds_cfg, rng).to_bytes()}


def decode_signds(payload: Any, shapes: Mapping[str, tuple[int, ...]], signds_cfg: Any, lr: float,
                  where: str = "body.update") -> Params:
    """Validate a SignDS report and return its dense delta ``sign * lr * 1[J]`` split into the model's tensors."""
    from fedarena.privacy.signds import SignDSReport

    if signds_cfg is None:
        raise WireError("body.encoding", "signds uploads are not enabled in this round")
    if not isinstance(payload, dict) or set(payload) != {"report"} or not isinstance(payload["report"], bytes):
        raise WireError(where, "expected a map with exactly 'report' (bytes)")
    try:
        rep = SignDSReport.from_bytes(payload["report"], signds_cfg)
    except ValueError as e:
        raise WireError(f"{where}.report", str(e)) from None
    flat = np.zeros(signds_cfg.d, np.float64)
    flat[rep.indices.astype(np.int64)] = rep.sign * lr
    out, i = {}, 0
    for name in sorted(shapes):
        n = int(np.prod(shapes[name]))
        out[name] = flat[i : i + n].reshape(shapes[name])
        i += n
    return out


def encode_update(delta: Params, encoding: str, rng: np.random.Generator, topk_fraction: float = 0.1) -> dict[str, Any]:
    """The upload payload of ``delta`` in ``encoding`` (dense, topk or q8: the codec
    :func:`~fedarena.federated.compression.wire_codec`, tensor by tensor; see the module docstring)."""
    return encode_tensors(delta, wire_codec(encoding, topk_fraction), rng)


def decode_update(encoding: Any, payload: Any, shapes: Mapping[str, tuple[int, ...]], where: str = "body.update") -> Params:
    """Validate an uploaded payload against the model's tensor ``shapes`` and return the dense float64 delta."""
    if encoding == "signds":
        raise WireError("body.encoding", "signds uploads are not enabled in this round")
    if encoding not in ENCODINGS:
        raise WireError("body.encoding", f"unknown encoding {encoding!r} (one of {', '.join(ENCODINGS)})")
    return decode_tensors(payload, shapes, wire_codec(encoding), where)


@dataclass
class SignDSUpload:
    """SignDS (Jiang et al. 2022) as the simulation's upload: the runtime's ``encode_signds`` on the client and
    ``decode_signds`` on the server (dense ``sign * lr * 1[J]``); reports are averaged with equal weight, as the
    FL-Server does (``equal_weight``). ``k``, ``h``, ``epsilon`` as in :class:`fedarena.privacy.signds.SignDSConfig`."""

    k: int
    h: int
    epsilon: float
    lr: float
    equal_weight: bool = True
    private: bool = True
    """a privacy mechanism: the simulation hands it the privacy randomness (the OS CSPRNG by default)"""

    def begin_round(self, rnd: int, params: Params) -> None:
        return None

    def pop_download_bytes(self) -> int:
        return 0

    def __call__(self, client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]:
        from fedarena.privacy.signds import SignDSConfig

        shapes = {k: tuple(v.shape) for k, v in delta.items()}
        cfg = SignDSConfig(d=sum(int(np.prod(s)) for s in shapes.values()), k=self.k, h=self.h, epsilon=self.epsilon)
        payload = encode_signds(delta, cfg, rng)
        return decode_signds(payload, shapes, cfg, self.lr), len(payload["report"])


# the strategy wrappers lived here; they are in :mod:`fedarena.federated.wrappers` now (re-exported for old imports)
from fedarena.federated.wrappers import DPFedAvg, SecureAggregation  # noqa: E402,F401
