"""Compression of model differences in both directions, with exact encoded sizes.

The FL chapter's weight-difference compression: a client uploads ``C(Delta_i)``, the server
broadcasts ``C(x_t - x_hat)`` where ``x_hat`` is the model the clients already hold. Codecs act on
the flattened difference (tensors in sorted name order) and produce real bytes, so the byte counts
in the metrics are ``len`` of the encoding:

* ``dense``: float32, ``4 d`` bytes.
* ``quantize`` (k bits, 1..8): uniform levels between the min and the max, stochastic rounding
  (unbiased; QSGD, Alistarh et al. NeurIPS 2017): ``q = floor((x - lo) / s + u)``, ``u ~ U[0, 1)``,
  ``s = (hi - lo) / (2^k - 1)``; ``lo`` and ``s`` as float32, the levels bit-packed:
  ``8 + ceil(k d / 8)`` bytes.
* ``topk`` (fraction f): the ``k = ceil(f d)`` largest-magnitude entries (Aji & Heafield 2017;
  Lin et al. ICLR 2018): uint32 count, sorted indices (uint16 when ``d <= 65536``, else uint32),
  float32 values.
* ``topk_quantize``: top-k whose values are then k-bit quantized.

Error feedback (Seide et al. 2014; Karimireddy et al., ICML 2019): the sender keeps the residual
``e <- (v + e) - C(v + e)`` and adds it to the next message, so what top-k drops is sent later.

Under partial participation a client's residual waits until it is selected again, and top-1% of one update
carries too little of it: at 10 of 100 clients a round, top-1% loses ~25 points after 50 rounds. EF21
(Richtarik et al. 2021) and DIANA (Mishchenko et al. 2019) compress the difference between the message and a
*shift* both sides know; EF21's shift, the client's own last estimate, is stale after ten rounds away. The
``trajectory`` prediction (a shifted compressor in the sense of Shulgin & Richtarik 2022) uses what both sides
hold without extra uploads: the mean global step since the client's last delivered upload,
``p_i = (x_t - x_{tau_i}) / (t - tau_i)`` (the server keeps the models its clients last trained from; a client
keeps the model of its last upload), and for a client's first upload the last global step ``x_t - x_{t-1}``, sent
with its first model (``4 d`` bytes, counted in the download). The client sends ``C(v - p_i + e)``; the server
adds ``p_i`` back; error feedback keeps what ``C`` drops.
One codec family serves every runtime: the simulation and Flower's :class:`~fedarena.federated.flower.UploadMod`
send a codec's bytes of the flattened difference, the gRPC runtime sends the same codec tensor by tensor in its wire
form (:meth:`Codec.encode_tensor`; its ``dense``, ``topk`` and ``q8`` encodings are :func:`wire_codec`), which the
simulation reproduces with ``UploadCompression(per_tensor=True)``. Every runtime draws a client's rounding from the
generator ``(seed, round, client key, 13)``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from fedarena.federated.wire import WireError, check_array

Params = dict[str, np.ndarray]
CODECS = ("dense", "quantize", "topk", "topk_quantize")


def stochastic_quantize(x: np.ndarray, bits: int, rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
    """Levels ``q`` (uint8, 0..2^bits-1), ``lo`` and ``scale`` with ``E[lo + scale q] = x``."""
    levels = (1 << bits) - 1
    x = np.asarray(x, np.float64)
    lo = float(x.min()) if x.size else 0.0
    hi = float(x.max()) if x.size else 0.0
    scale = (hi - lo) / levels
    if scale == 0.0:
        return np.zeros(x.shape, np.uint8), lo, scale
    t = (x - lo) / scale
    return np.floor(t + rng.random(x.shape)).clip(0, levels).astype(np.uint8), lo, scale


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices of the ``k`` largest-magnitude entries of the vector ``x``."""
    n = x.size
    if k <= 0:
        return np.zeros(0, np.int64)
    if k >= n:
        return np.arange(n)
    return np.sort(np.argpartition(np.abs(x), n - k)[n - k:])


def _pack(q: np.ndarray, bits: int) -> bytes:
    if bits == 8:
        return q.astype(np.uint8).tobytes()
    planes = np.unpackbits(q.astype(np.uint8)[:, None], axis=1)[:, 8 - bits:]  # (n, bits), MSB first
    return np.packbits(planes.ravel()).tobytes()


def _unpack(data: bytes, n: int, bits: int) -> np.ndarray:
    if bits == 8:
        return np.frombuffer(data, np.uint8, n).copy()
    flat = np.unpackbits(np.frombuffer(data, np.uint8))[: n * bits].reshape(n, bits)
    return (flat.astype(np.uint16) << np.arange(bits - 1, -1, -1, dtype=np.uint16)).sum(1).astype(np.uint8)


@dataclass(frozen=True)
class Codec:
    """One of :data:`CODECS` with its parameters (see the module docstring)."""

    kind: Literal["dense", "quantize", "topk", "topk_quantize"] = "dense"
    bits: int = 8
    fraction: float = 0.01

    def __post_init__(self) -> None:
        if self.kind not in CODECS:
            raise ValueError(f"codec: unknown '{self.kind}' (one of {', '.join(CODECS)})")
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits: must lie in 1..8, got {self.bits}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction: must lie in (0, 1], got {self.fraction}")

    def encode(self, v: np.ndarray, rng: np.random.Generator) -> bytes:
        v = np.asarray(v, np.float64).ravel()
        d = v.size
        if self.kind == "dense":
            return v.astype(np.float32).tobytes()
        if self.kind == "quantize":
            q, lo, s = stochastic_quantize(v, self.bits, rng)
            return struct.pack("<ff", lo, s) + _pack(q, self.bits)
        k = max(1, math.ceil(self.fraction * d))
        idx = topk_indices(v, k)
        itype = np.uint16 if d <= 65536 else np.uint32
        head = struct.pack("<I", len(idx)) + idx.astype(itype).tobytes()
        if self.kind == "topk":
            return head + v[idx].astype(np.float32).tobytes()
        q, lo, s = stochastic_quantize(v[idx], self.bits, rng)
        return head + struct.pack("<ff", lo, s) + _pack(q, self.bits)

    def decode(self, data: bytes, d: int) -> np.ndarray:
        """The dense float64 vector of an encoding of a ``d``-vector (raises ValueError on a malformed one)."""
        if self.kind == "dense":
            if len(data) != 4 * d:
                raise ValueError(f"update: {len(data)} bytes for {d} float32 values")
            return np.frombuffer(data, np.float32).astype(np.float64)
        if self.kind == "quantize":
            want = 8 + math.ceil(d * self.bits / 8)
            if len(data) != want:
                raise ValueError(f"update: {len(data)} bytes, expected {want}")
            lo, s = struct.unpack("<ff", data[:8])
            return lo + s * _unpack(data[8:], d, self.bits).astype(np.float64)
        (k,) = struct.unpack("<I", data[:4])
        isz = 2 if d <= 65536 else 4
        if k > d:
            raise ValueError(f"update: {k} entries for a {d}-vector")
        idx = np.frombuffer(data[4: 4 + isz * k], np.uint16 if isz == 2 else np.uint32).astype(np.int64)
        if idx.size != k or (k and (idx.max() >= d or np.any(np.diff(idx) <= 0))):
            raise ValueError("update: indices must be k strictly increasing values below d")
        rest = data[4 + isz * k:]
        out = np.zeros(d, np.float64)
        if self.kind == "topk":
            if len(rest) != 4 * k:
                raise ValueError(f"update: {len(rest)} value bytes for {k} entries")
            out[idx] = np.frombuffer(rest, np.float32)
        else:
            if len(rest) != 8 + math.ceil(k * self.bits / 8):
                raise ValueError("update: wrong size of the quantized values")
            lo, s = struct.unpack("<ff", rest[:8])
            out[idx] = lo + s * _unpack(rest[8:], k, self.bits).astype(np.float64)
        if not np.isfinite(out).all():
            raise ValueError("update: values are not finite")
        return out


    # ------------------------------------------------------------------ the runtime's per-tensor wire form

    def encode_tensor(self, x: np.ndarray, rng: np.random.Generator) -> Any:
        """One tensor's entry of a gRPC upload payload (wire maps, see :data:`WIRE_ENCODINGS`): ``dense`` the float32
        array; ``topk`` ``{"indices": uint32[k], "values": float32[k]}``; ``quantize`` (8 bits)
        ``{"q": uint8[shape], "lo": float, "scale": float}``."""
        if self.kind == "dense":
            return np.asarray(x, np.float32)
        if self.kind == "topk":
            flat = np.asarray(x, np.float32).ravel()
            k = max(1, math.ceil(self.fraction * flat.size)) if flat.size else 0
            idx = topk_indices(flat, k)
            return {"indices": idx.astype(np.uint32), "values": flat[idx].astype(np.float32)}
        if self.kind == "quantize" and self.bits == 8:
            q, lo, scale = stochastic_quantize(np.asarray(x, np.float64), 8, rng)
            return {"q": q, "lo": lo, "scale": scale}
        raise ValueError(f"codec: {self.kind}:{self.bits} has no wire form (dense, topk, 8-bit quantize)")

    def decode_tensor(self, entry: Any, shape: tuple[int, ...], path: str) -> np.ndarray:
        """The dense float64 tensor of one payload entry; checks dtype, shape, index range and finiteness and raises
        :class:`~fedarena.federated.wire.WireError` naming ``path``."""
        size = int(np.prod(shape))
        if self.kind == "dense":
            return check_array(entry, path, dtype="float32", shape=tuple(shape), finite=True).astype(np.float64)
        if self.kind == "topk":
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
            return dense.reshape(shape)
        if not isinstance(entry, dict) or set(entry) != {"q", "lo", "scale"}:
            raise WireError(path, "expected a map with exactly 'q', 'lo' and 'scale'")
        q = check_array(entry["q"], f"{path}.q", dtype="uint8", shape=tuple(shape))
        lo, scale = _number(entry, "lo", path), _number(entry, "scale", path)
        if scale < 0:
            raise WireError(f"{path}.scale", f"must be >= 0, got {scale}")
        with np.errstate(over="ignore", invalid="ignore"):
            out = lo + scale * q.astype(np.float64)
        if not np.isfinite(out).all():
            raise WireError(path, "dequantized values are not finite")
        return out


def _number(entry: Mapping[str, Any], key: str, path: str) -> float:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{path}.{key}", f"expected a number, got {type(v).__name__}")
    if not math.isfinite(float(v)):
        raise WireError(f"{path}.{key}", "must be finite")
    return float(v)


WIRE_ENCODINGS = ("dense", "topk", "q8")
"""the gRPC runtime's upload encodings, each a :class:`Codec` applied tensor by tensor (:func:`wire_codec`)"""


def wire_codec(encoding: str, topk_fraction: float = 0.1) -> Codec:
    """The codec of a runtime upload ``encoding``: ``dense``, ``topk`` (``topk_fraction``) or ``q8`` (8-bit
    quantize)."""
    if encoding == "dense":
        return Codec("dense")
    if encoding == "topk":
        if not 0 < topk_fraction <= 1:
            raise ValueError(f"topk_fraction: must lie in (0, 1], got {topk_fraction}")
        return Codec("topk", fraction=topk_fraction)
    if encoding == "q8":
        return Codec("quantize", bits=8)
    raise ValueError(f"encoding: unknown '{encoding}' (one of {', '.join(WIRE_ENCODINGS)})")


def encode_tensors(delta: Params, codec: Codec, rng: np.random.Generator) -> dict[str, Any]:
    """The wire payload of ``delta``: ``codec.encode_tensor`` of every tensor, in sorted name order (the order in
    which a quantizing codec draws its rounding)."""
    return {k: codec.encode_tensor(delta[k], rng) for k in sorted(delta)}


def decode_tensors(payload: Any, shapes: Mapping[str, tuple[int, ...]], codec: Codec, where: str) -> Params:
    """Validate a wire payload against the model's tensor ``shapes`` and return the dense float64 delta."""
    if not isinstance(payload, dict):
        raise WireError(where, f"expected a map of tensor name to payload, got {type(payload).__name__}")
    missing, extra = set(shapes) - set(payload), set(payload) - set(shapes)
    if missing or extra:
        raise WireError(where, f"tensor names differ from the model: missing {sorted(missing)}, "
                        f"unexpected {sorted(extra)}")
    return {name: codec.decode_tensor(payload[name], tuple(shape), f"{where}.{name}") for name, shape in shapes.items()}


def flatten(p: Params) -> np.ndarray:
    names = sorted(p)
    return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in names]) if names else np.zeros(0)


def unflatten(flat: np.ndarray, like: Params) -> Params:
    out, i = {}, 0
    for k in sorted(like):
        n = like[k].size
        out[k] = flat[i: i + n].reshape(like[k].shape)
        i += n
    return out


PREDICTIONS = ("none", "trajectory")


@dataclass
class UploadCompression:
    """A simulation upload function: error feedback per client (optional), an optional shared prediction of the
    update (``trajectory``, see the module docstring), encode, decode; returns bytes used. The simulation calls
    :meth:`begin_round` with the model the clients trained from before the round's uploads."""

    codec: Codec
    error_feedback: bool = False
    prediction: Literal["none", "trajectory"] = "none"
    per_tensor: bool = False
    """encode tensor by tensor in the gRPC runtime's wire form (:func:`encode_tensors` / :func:`decode_tensors`, what
    a runtime client with the matching ``encoding`` uploads) instead of the flattened difference; bytes are then the
    payload's array and number bytes"""
    residuals: dict[str, np.ndarray] = field(default_factory=dict)
    last_seen: dict[str, int] = field(default_factory=dict)
    """trajectory: the round of each client's last delivered upload (the model it keeps is that round's)"""
    models: dict[int, np.ndarray] = field(default_factory=dict)
    """trajectory: the flattened model of every round some client last uploaded from (and the current round's)"""
    _round: int = 0
    _download_bytes: int = 0
    private = False  # stochastic rounding needs no secrecy
    equal_weight = False

    def __post_init__(self) -> None:
        if self.prediction not in PREDICTIONS:
            raise ValueError(f"upload_prediction: unknown '{self.prediction}' (one of {', '.join(PREDICTIONS)})")

    def begin_round(self, rnd: int, params: Params) -> None:
        """Record the round's model (the clients' starting point); drop models no client refers to any more."""
        if self.prediction == "none":
            return
        self._round = rnd
        self.models[rnd] = flatten(params)
        keep = set(self.last_seen.values()) | {rnd, rnd - 1}
        for r in [r for r in self.models if r not in keep]:
            del self.models[r]

    def predict(self, client_id: str) -> np.ndarray | float:
        """``p_i``: the mean global step since the client's last upload (the last global step for a first upload;
        0 in the first round)."""
        if self.prediction == "none" or self._round not in self.models:
            return 0.0
        now = self.models[self._round]
        tau = self.last_seen.get(client_id)
        if tau is None or tau not in self.models:
            if self._round - 1 not in self.models:
                return 0.0
            self._download_bytes += 4 * now.size  # the first model comes with the last global step
            return now - self.models[self._round - 1]
        return (now - self.models[tau]) / max(self._round - tau, 1)

    def pop_download_bytes(self) -> int:
        """Bytes the prediction added to this round's download (first uploads' last global step); resets."""
        b, self._download_bytes = self._download_bytes, 0
        return b

    def __call__(self, client_id: str, delta: Params, rng: np.random.Generator) -> tuple[Params, int]:
        v = flatten(delta)
        p = self.predict(client_id)
        w = v - p
        if self.error_feedback:
            w = w + self.residuals.get(client_id, 0.0)
        if self.per_tensor:
            shapes = {k: v.shape for k, v in delta.items()}
            payload = encode_tensors(unflatten(w, delta), self.codec, rng)
            dec, nbytes = flatten(decode_tensors(payload, shapes, self.codec, "upload")), _payload_bytes(payload)
        else:
            data = self.codec.encode(w, rng)
            dec, nbytes = self.codec.decode(data, w.size), len(data)
        if self.error_feedback:
            self.residuals[client_id] = w - dec
        if self.prediction != "none":
            self.last_seen[client_id] = self._round
        return unflatten(dec + p, delta), nbytes


def _payload_bytes(payload: Mapping[str, Any]) -> int:
    """Array bytes plus 8 per number of a wire payload (its msgpack framing not counted)."""
    total = 0
    for entry in payload.values():
        for v in (entry.values() if isinstance(entry, dict) else [entry]):
            total += v.nbytes if isinstance(v, np.ndarray) else 8
    return total


@dataclass
class Broadcast:
    """Compressed broadcast of the model difference: the server sends ``C(x_t - x_hat)`` and every client adds
    the decoded difference to its copy ``x_hat`` (the server tracks ``x_hat``, so what a codec drops stays in
    ``x_t - x_hat`` and is sent later: error feedback by construction). All clients hold the same ``x_hat``; a
    client that missed rounds would fetch each difference it missed. Bytes are counted once per selected client.
    The initial model is not sent: every client derives it from the run's seed (as every node of the gRPC
    deployment derives it from ``init_seed``)."""

    codec: Codec
    seed: int = 0
    reference: Params | None = None
    _round: int = 0

    def broadcast(self, params: Params, receivers: int) -> tuple[Params, int]:
        self._round += 1
        if self.reference is None:
            self.reference = {k: np.asarray(v, np.float32).copy() for k, v in params.items()}
            return self.reference, 0
        diff = flatten(params) - flatten(self.reference)
        data = self.codec.encode(diff, np.random.default_rng([self.seed, self._round, 3]))
        ref = flatten(self.reference) + self.codec.decode(data, diff.size)
        self.reference = {k: v.astype(np.float32) for k, v in unflatten(ref, self.reference).items()}
        return self.reference, len(data) * receivers
