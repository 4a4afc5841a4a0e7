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
``signds_aggregate``. Secure-aggregation masking is not an upload stage yet (it needs extra protocol
rounds between the clients); see docs/architecture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np

from fedarena.federated.compression import stochastic_quantize, topk_indices
from fedarena.federated.wire import WireError, check_array
from fedarena.privacy.secure_random import SecureRandom

Params = dict[str, np.ndarray]
ENCODINGS = ("dense", "topk", "q8", "signds")


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
    """The upload payload of ``delta`` in ``encoding`` (dense, topk or q8; see module docstring)."""
    if encoding == "dense":
        return {k: np.asarray(v, np.float32) for k, v in delta.items()}
    if encoding == "topk":
        if not 0 < topk_fraction <= 1:
            raise ValueError(f"topk_fraction: must lie in (0, 1], got {topk_fraction}")
        out = {}
        for k, v in delta.items():
            flat = np.asarray(v, np.float32).ravel()
            kk = max(1, math.ceil(topk_fraction * flat.size)) if flat.size else 0
            idx = topk_indices(flat, kk)
            out[k] = {"indices": idx.astype(np.uint32), "values": flat[idx].astype(np.float32)}
        return out
    if encoding == "q8":
        out = {}
        for k, v in delta.items():
            q, lo, scale = stochastic_quantize(np.asarray(v, np.float64), 8, rng)  # stochastic rounding
            out[k] = {"q": q, "lo": lo, "scale": scale}
        return out
    raise ValueError(f"encoding: unknown '{encoding}' (one of {', '.join(ENCODINGS)})")


def _number(entry: Mapping[str, Any], key: str, path: str) -> float:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{path}.{key}", f"expected a number, got {type(v).__name__}")
    if not math.isfinite(float(v)):
        raise WireError(f"{path}.{key}", "must be finite")
    return float(v)


def decode_update(encoding: Any, payload: Any, shapes: Mapping[str, tuple[int, ...]], where: str = "body.update") -> Params:
    """Validate an uploaded payload against the model's tensor ``shapes`` and return the dense float64 delta."""
    if encoding == "signds":
        raise WireError("body.encoding", "signds uploads are not enabled in this round")
    if encoding not in ENCODINGS:
        raise WireError("body.encoding", f"unknown encoding {encoding!r} (one of {', '.join(ENCODINGS)})")
    if not isinstance(payload, dict):
        raise WireError(where, f"expected a map of tensor name to payload, got {type(payload).__name__}")
    missing, extra = set(shapes) - set(payload), set(payload) - set(shapes)
    if missing or extra:
        raise WireError(where, f"tensor names differ from the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
    out: Params = {}
    for name, shape in shapes.items():
        path = f"{where}.{name}"
        entry = payload[name]
        size = int(np.prod(shape))
        if encoding == "dense":
            arr = check_array(entry, path, dtype="float32", shape=tuple(shape), finite=True)
            out[name] = arr.astype(np.float64)
        elif encoding == "topk":
            if not isinstance(entry, dict) or set(entry) != {"indices", "values"}:
                raise WireError(path, "expected a map with exactly 'indices' and 'values'")
            idx = check_array(entry["indices"], f"{path}.indices", dtype="uint32")
            val = check_array(entry["values"], f"{path}.values", dtype="float32", finite=True)
            if idx.ndim != 1 or val.shape != idx.shape:
                raise WireError(path, f"indices {idx.shape} and values {val.shape} must be equal-length vectors")
            if idx.size > size:
                raise WireError(f"{path}.indices", f"{idx.size} entries for a tensor of {size}")
            if idx.size and int(idx.max()) >= size:
                raise WireError(f"{path}.indices", f"index {int(idx.max())} out of range for {size} entries")
            if idx.size > 1 and not np.all(np.diff(idx.astype(np.int64)) > 0):
                raise WireError(f"{path}.indices", "must be strictly increasing (sorted, no repeats)")
            dense = np.zeros(size, np.float64)
            dense[idx.astype(np.int64)] = val
            out[name] = dense.reshape(shape)
        else:  # q8
            if not isinstance(entry, dict) or set(entry) != {"q", "lo", "scale"}:
                raise WireError(path, "expected a map with exactly 'q', 'lo' and 'scale'")
            q = check_array(entry["q"], f"{path}.q", dtype="uint8", shape=tuple(shape))
            lo, scale = _number(entry, "lo", path), _number(entry, "scale", path)
            if scale < 0:
                raise WireError(f"{path}.scale", f"must be >= 0, got {scale}")
            with np.errstate(over="ignore", invalid="ignore"):
                out[name] = lo + scale * q.astype(np.float64)
            if not np.isfinite(out[name]).all():
                raise WireError(path, "dequantized values are not finite")
    return out


# ----------------------------------------------------------------------------- strategy wrappers (server-side stages)


def _flat_updates(updates, names):
    return [np.concatenate([np.asarray(u.delta[k], np.float64).ravel() for k in names]) for u in updates]


@dataclass(frozen=True)
class DPFedAvg:
    """DP-FedAvg (McMahan et al. 2018) around a FedAvg-family strategy: Poisson client sampling with rate
    ``q``, server-side clipping, Gaussian noise on the sum, fixed denominator ``q N``; the inner strategy's
    server optimizer applies the noisy mean. ``epsilon(rounds)`` comes from the RDP accountant."""

    inner: Any
    mechanism: Any  # fedarena.privacy.dp_fedavg.DPFedAvgMechanism

    @property
    def clients_per_round(self) -> int:
        return 0

    def select(self, rnd: int, candidates, seed: int) -> list[str]:
        """Poisson sampling with rate ``q``. The accountant's amplification by sampling assumes the sample is
        secret, so it is drawn from the OS CSPRNG unless the mechanism has an explicit test seed."""
        seeded = self.mechanism.seed is not None
        rng = np.random.default_rng([self.mechanism.seed, rnd, 17]) if seeded else SecureRandom()
        cands = sorted(candidates)
        return [c for c, keep in zip(cands, rng.random(len(cands)) < self.mechanism.sample_rate) if keep]

    def configure(self, rnd: int, state):
        return self.inner.configure(rnd, state)

    def init_state(self, params):
        return self.inner.init_state(params)

    def aggregate(self, state, updates, num_clients: int):
        from fedarena.federated.strategy import RoundState

        names = sorted(state.params)
        d = sum(state.params[k].size for k in names)
        mean = self.mechanism.noisy_mean(_flat_updates(updates, names), d, state.round)
        delta, i = {}, 0
        for k in names:
            n = state.params[k].size
            delta[k] = mean[i: i + n].reshape(state.params[k].shape)
            i += n
        params, opt = self.inner.server_optimizer.step(state.params, delta, state.opt_state)
        return RoundState(state.round + 1, params, opt, state.control)

    def evaluate(self, rnd: int, client_accuracies):
        out = self.inner.evaluate(rnd, client_accuracies)
        out["dp_epsilon"] = self.mechanism.epsilon(rnd)
        return out


@dataclass
class SecureAggregation:
    """SecAgg / SecAgg+ (Bonawitz et al. 2017; Bell et al. 2020) of a FedAvg round, run with the real protocol
    objects of :mod:`fedarena.privacy.secagg` (X25519, Shamir, AES-GCM, every message through its wire format).

    Client ``i`` inputs ``[Delta_i n_i / W, n_i / W]`` (clipped to ``clip``, fixed point ``scale``); the server
    learns only the sum over the survivors and divides. ``dropout`` of the clients go silent before sending
    their masked input (drawn per round with the given seed); their masks are removed with Shamir shares."""

    inner: Any
    neighbours: int = 0
    """SecAgg+ neighbourhood size (even; 0 = every pair masks)"""
    threshold: float = 0.5
    clip: float = 1.0
    scale: float = 2.0 ** 20
    """fixed-point scale; ``clients * clip * scale`` must stay below 2^31 (at most 2,047 clients at 2^20)"""
    weight_scale: float = 1000.0
    """W: a client inputs weight ``n / W``, so ``n`` may not exceed ``W * clip``"""
    dropout: float = 0.0
    seed: int = 0
    last_report: dict = field(default_factory=dict)
    """time and survivors of the last secure round (logged by the fedsim kind)"""

    @property
    def clients_per_round(self) -> int:
        return self.inner.clients_per_round

    def select(self, rnd, candidates, seed):
        return self.inner.select(rnd, candidates, seed)

    def configure(self, rnd, state):
        return self.inner.configure(rnd, state)

    def init_state(self, params):
        return self.inner.init_state(params)

    def evaluate(self, rnd, accs):
        return self.inner.evaluate(rnd, accs)

    def secure_sum(self, inputs: dict[int, np.ndarray], round_id: int):
        """Run one secure round over ``inputs`` (party id >= 1 -> vector); returns the simulation report."""
        from fedarena.privacy.secagg.protocol import SecAggConfig
        from fedarena.privacy.secagg.simulation import secure_aggregate

        n = len(inputs)
        d = next(iter(inputs.values())).size
        k = self.neighbours if self.neighbours and self.neighbours < n else None
        holders = (k + 1) if k else n
        # t = floor(f m) + 1 (at most m) over the m share holders, the formula of the runtime's
        # secure_round.threshold: a strict majority at f = 0.5, which the protocol requires (the in-process server
        # here is honest, so the runtime's colluder bound, which sets its default f = 2/3, does not arise)
        t = min(holders, math.floor(self.threshold * holders) + 1)
        cfg = SecAggConfig(dimension=d, threshold=max(2, t), clip=self.clip,
                           scale=self.scale, num_neighbours=k)
        rng = np.random.default_rng([self.seed, round_id, 29])
        ids = sorted(inputs)
        drop = {u for u, r in zip(ids, rng.random(n)) if r < self.dropout}
        return secure_aggregate(inputs, cfg, round_id=round_id, dropouts={"masked_input": drop})

    def aggregate(self, state, updates, num_clients: int):
        from fedarena.federated.strategy import PartialAggregate

        if len(updates) < 3:
            raise ValueError("secagg: secure aggregation needs at least 3 reporting clients per round (with 2, "
                             "the sum and one's own input give the other's)")
        names = sorted(state.params)
        flats = _flat_updates(updates, names)
        inputs = {}
        for j, (u, f) in enumerate(zip(updates, flats), start=1):
            w = self.inner.weight(u.num_examples) / self.weight_scale
            if w > self.clip:
                raise ValueError(f"secagg.weight_scale: client {u.client_id} has {u.num_examples} examples, more "
                                 f"than weight_scale * clip = {self.weight_scale * self.clip}")
            inputs[j] = np.concatenate([f * w, [w]])
        import time

        from dataclasses import replace

        from fedarena.privacy.secagg.protocol import InsufficientSurvivorsError

        t0 = time.perf_counter()
        try:
            rep = self.secure_sum(inputs, state.round)
        except InsufficientSurvivorsError:  # too few shares survive: the round is abandoned, the model kept
            self.last_report = {"secagg_seconds": time.perf_counter() - t0, "secagg_survivors": 0,
                                "secagg_aborted": 1}
            return replace(state, round=state.round + 1)
        total = rep.result.values
        self.last_report = {"secagg_seconds": time.perf_counter() - t0, "secagg_survivors": len(rep.result.survivors),
                            "secagg_aborted": 0}
        part = PartialAggregate()
        sums, i = {}, 0
        for k in names:
            n = state.params[k].size
            sums[k] = total[i: i + n].reshape(state.params[k].shape) * self.weight_scale
            i += n
        part.sums, part.weight = sums, float(total[-1]) * self.weight_scale
        part.clients = [updates[j - 1].client_id for j in rep.result.survivors]
        return self.inner.aggregate_partial(state, part)


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

    def __call__(self, client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]:
        from fedarena.privacy.signds import SignDSConfig

        shapes = {k: tuple(v.shape) for k, v in delta.items()}
        cfg = SignDSConfig(d=sum(int(np.prod(s)) for s in shapes.values()), k=self.k, h=self.h, epsilon=self.epsilon)
        payload = encode_signds(delta, cfg, rng)
        return decode_signds(payload, shapes, cfg, self.lr), len(payload["report"])
