"""Post-training int8 quantization of engine models (dense and convolution layers), the int8 forward
pass on the native kernel or its numpy reference, and the quantized model file.

A model is read as a plan of steps (:func:`layer_plan`): ``nn.MLP`` (ReLU or identity between
layers) or ``nn.Sequential`` of ``Linear``, ``Conv2d``, ``MaxPool2d``, ``Flatten`` and ReLU.  A ReLU
right after a dense or convolution layer is fused into its requantization; every dense or
convolution output is a quantization point, as is the model's input.  :func:`calibrate` runs the
float model over a calibration set and records each point's range (min-max, or a percentile of a
histogram); :func:`quantize_model` turns weights into per-channel symmetric int8, biases into int32
(scale ``s_x * s_w``, Jacob et al., CVPR 2018, section 2.4) and returns a :class:`QuantizedModel`,
whose :meth:`QuantizedModel.forward` quantizes the input, runs every layer in int8 (convolutions as
im2col + int8 GEMM, the padding filled with the input's zero point so it stands for 0.0; max
pooling directly on int8, which commutes with the monotone quantizer) and dequantizes the output.

The file (:meth:`QuantizedModel.save`) is ``FAQM`` + a little-endian uint64 header length + the
header, zlib-compressed UTF-8 JSON (layers, quantization parameters, and each array's offset, dtype
and shape; inflated to at most 16 MiB) + the raw arrays: int8 weights, float32 per-channel scales and
float32 biases.  Nothing is unpickled, and :meth:`QuantizedModel.load` checks every field and raises
one ``ValueError`` naming it.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import nn
from .. import ops
from ..core.pytree import tree_leaves
from .kernel import backend as kernel_backend
from .scheme import (
    OBSERVERS,
    ActivationQuant,
    MinMaxObserver,
    PercentileObserver,
    activation_params,
    check_bits,
    quantize_weights,
)

MAGIC = b"FAQM"
FORMAT_VERSION = 1
MAX_HEADER = 1 << 24


# ----------------------------------------------------------------------------- the plan of a model


@dataclass(frozen=True)
class Step:
    """One step of a model's forward pass: ``kind`` in linear/conv/maxpool/flatten/relu, the engine
    layer, its parameters, and (dense/conv) whether a ReLU follows and is fused."""

    kind: str
    layer: Any
    params: Any = None
    relu: bool = False


def _is_relu(layer: Any) -> bool:
    if isinstance(layer, nn.Activation):
        return layer.fn in ("relu", ops.relu)
    return layer is ops.relu


def _is_identity(layer: Any) -> bool:
    return isinstance(layer, nn.Activation) and layer.fn in ("identity", None)


def layer_plan(model: nn.Module, params: Any) -> list[Step]:
    """The steps of ``model`` (``nn.MLP`` or ``nn.Sequential``) with their parameters; a ReLU that
    follows a dense or convolution layer is folded into it."""
    if isinstance(model, nn.MLP):
        for name, act in (("activation", model.activation), ("output_activation", model.output_activation)):
            if act not in ("relu", "identity", None, ops.relu):
                raise ValueError(f"model.{name}: int8 quantization supports relu or identity, got {act!r}")
        if len(params) != len(model.layers):
            raise ValueError(f"params: the MLP has {len(model.layers)} layers but params has {len(params)} entries")
        n = len(model.layers)
        act_relu = model.activation in ("relu", ops.relu)
        out_relu = model.output_activation in ("relu", ops.relu)
        return [Step("linear", layer, p, act_relu if i < n - 1 else out_relu) for i, (layer, p) in enumerate(zip(model.layers, params))]
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model: int8 quantization takes nn.MLP or nn.Sequential, got {type(model).__name__}")
    if len(params) != len(model.layers):
        raise ValueError(f"params: the Sequential has {len(model.layers)} layers but params has {len(params)} entries")
    steps: list[Step] = []
    for i, (layer, p) in enumerate(zip(model.layers, params)):
        if isinstance(layer, nn.Linear):
            steps.append(Step("linear", layer, p))
        elif isinstance(layer, nn.Conv2d):
            steps.append(Step("conv", layer, p))
        elif isinstance(layer, nn.MaxPool2d):
            steps.append(Step("maxpool", layer))
        elif isinstance(layer, nn.Flatten):
            if layer.start_dim != 1:
                raise ValueError(f"model.layers[{i}]: Flatten must keep the batch axis (start_dim=1), got {layer.start_dim}")
            steps.append(Step("flatten", layer))
        elif _is_relu(layer):
            prev = steps[-1] if steps else None
            if prev is not None and prev.kind in ("linear", "conv") and not prev.relu:
                steps[-1] = Step(prev.kind, prev.layer, prev.params, True)
            else:
                steps.append(Step("relu", layer))
        elif _is_identity(layer):
            continue
        else:
            raise ValueError(
                f"model.layers[{i}]: int8 quantization supports Linear, Conv2d, MaxPool2d, Flatten and ReLU, got {type(layer).__name__}"
            )
    return steps


def _float_step(step: Step, x: Any) -> Any:
    if step.kind == "relu":
        return ops.relu(x)
    y = step.layer.apply(step.params, x)
    return ops.relu(y) if step.relu else y


def quant_points(steps: Sequence[Step]) -> int:
    """How many quantization points a plan has: the input and every dense/conv output."""
    return 1 + sum(s.kind in ("linear", "conv") for s in steps)


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Calibration:
    """The float range [lo, hi] of every quantization point (the input, then each dense/conv output)."""

    ranges: tuple[tuple[float, float], ...]
    method: str


def _batches(data: Any, batch_size: int) -> list[np.ndarray]:
    if isinstance(data, np.ndarray):
        return [data[i : i + batch_size] for i in range(0, len(data), batch_size)]
    return [np.asarray(b) for b in data]


def _observe(steps: Sequence[Step], batches: list[np.ndarray], observers: list) -> None:
    for xb in batches:
        x = np.asarray(xb, np.float32)
        observers[0].observe(x)
        j = 1
        for step in steps:
            x = np.asarray(_float_step(step, x))
            if step.kind in ("linear", "conv"):
                observers[j].observe(x)
                j += 1


def calibrate(model: nn.Module, params: Any, data: Any, method: str = "minmax", percentile: float = 99.99,
              bins: int = 2048, batch_size: int = 256) -> Calibration:
    """Run the float model over ``data`` (an array of examples, or an iterable of batches) and record
    the range of every quantization point: ``"minmax"`` or ``"percentile"`` (of a ``bins``-bin
    histogram over the min-max range, see :class:`PercentileObserver`)."""
    if method not in OBSERVERS:
        raise ValueError(f"calibration.method: must be one of {', '.join(OBSERVERS)}, got {method!r}")
    if batch_size < 1:
        raise ValueError(f"calibration.batch_size: must be >= 1, got {batch_size}")
    steps = layer_plan(model, params)
    batches = [b for b in _batches(data, batch_size) if len(b)]
    if not batches:
        raise ValueError("calibration: the calibration set is empty")
    n = quant_points(steps)
    minmax = [MinMaxObserver() for _ in range(n)]
    _observe(steps, batches, minmax)
    if method == "minmax":
        return Calibration(tuple(o.range() for o in minmax), method)
    hist = [PercentileObserver(*o.range(), percentile=percentile, bins=bins) for o in minmax]
    _observe(steps, batches, hist)
    return Calibration(tuple(o.range() for o in hist), method)


# ----------------------------------------------------------------------------- int8 layers


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


@dataclass(frozen=True, eq=False)
class QuantizedLayer:
    """One int8 step.  ``kind`` linear/conv: ``weight`` int8 (N, K) with K = in_features or
    C * KH * KW, ``weight_scale`` float32 (N,), ``bias`` float32 (N,) or None, ``out`` the output's
    quantizer, ``relu`` fused; conv also ``kernel`` (KH, KW), ``stride``, ``padding``, ``dilation``,
    ``in_channels``.  maxpool: ``kernel``, ``stride``, ``padding``.  flatten / relu: nothing."""

    kind: str
    weight: np.ndarray | None = None
    weight_scale: np.ndarray | None = None
    bias: np.ndarray | None = None
    out: ActivationQuant | None = None
    relu: bool = False
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    in_channels: int = 0
    _derived: dict = field(default_factory=dict, compare=False, repr=False)

    def requant(self, inq: ActivationQuant) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(int32 bias with the input zero point folded in, float64 multipliers, lo, hi) for input ``inq``."""
        key = (inq.scale, inq.zero_point)
        if key not in self._derived:
            sx = np.float64(inq.scale)
            sw = self.weight_scale.astype(np.float64)
            acc_scale = sx * sw
            bias_f = np.zeros(len(sw)) if self.bias is None else np.rint(self.bias.astype(np.float64) / acc_scale)
            if not np.all(np.abs(bias_f) < 2**31):
                raise ValueError(f"{self.kind} layer: a bias does not fit int32 at scale s_x * s_w (input scale {inq.scale:g})")
            folded = bias_f.astype(np.int64) - inq.zero_point * self.weight.astype(np.int64).sum(axis=1)
            if np.abs(folded).max(initial=0) + self.weight.shape[1] * 128 * 128 > 2**31 - 1:
                raise ValueError(f"{self.kind} layer: the bias or K={self.weight.shape[1]} overflows the int32 accumulator")
            multiplier = np.ascontiguousarray(acc_scale / np.float64(self.out.scale))
            lo = max(self.out.qmin, self.out.zero_point) if self.relu else self.out.qmin
            self._derived[key] = (np.ascontiguousarray(folded.astype(np.int32)), multiplier, lo, self.out.qmax)
        return self._derived[key]

    def run(self, q: np.ndarray, inq: ActivationQuant, ops_: Any) -> tuple[np.ndarray, ActivationQuant]:
        """This layer on int8 ``q`` quantized by ``inq``, with the operations ``ops_`` of a
        :func:`~fedarena.engine.quantization.kernel.backend`; returns the output and its quantizer."""
        if self.kind == "flatten":
            return q.reshape(q.shape[0], -1), inq
        if self.kind == "relu":
            return np.maximum(q, np.int8(inq.zero_point)), inq
        if self.kind == "maxpool":
            if q.ndim != 4:
                raise ValueError(f"maxpool layer: input of shape {q.shape} is not NCHW")
            return ops_.maxpool(q, self.kernel, self.stride, self.padding, inq.qmin), inq
        bias, mult, lo, hi = self.requant(inq)
        zp = self.out.zero_point
        if self.kind == "linear":
            if q.ndim != 2 or q.shape[1] != self.weight.shape[1]:
                raise ValueError(f"linear layer: input of shape {q.shape} does not match {self.weight.shape[1]} features")
            return ops_.gemm(q, self.weight, bias, mult, zp, lo, hi), self.out
        if q.ndim != 4 or q.shape[1] != self.in_channels:
            raise ValueError(f"conv layer: input of shape {q.shape} is not NCHW with {self.in_channels} channels")
        cols, (b, oh, ow) = ops_.im2col(q, self.kernel, self.stride, self.padding, self.dilation, inq.zero_point)
        return ops_.gemm(cols, self.weight, bias, mult, zp, lo, hi, group=oh * ow).reshape(b, -1, oh, ow), self.out


# ----------------------------------------------------------------------------- the quantized model


@dataclass(frozen=True, eq=False)
class QuantizedModel:
    """An int8 model: the input's quantizer and the int8 layers; :meth:`forward` maps float inputs
    to float outputs (the last quantized activation, dequantized)."""

    input: ActivationQuant
    layers: tuple[QuantizedLayer, ...]
    weight_bits: int = 8
    activation_bits: int = 8

    def forward_int8(self, x: np.ndarray, backend: str = "native") -> tuple[np.ndarray, ActivationQuant]:
        """The int8 output and its quantizer."""
        ops_ = kernel_backend(backend)
        inq = self.input
        q, quant = ops_.quantize(x, inq.scale, inq.zero_point, inq.qmin, inq.qmax), inq
        for layer in self.layers:
            q, quant = layer.run(q, quant, ops_)
        return q, quant

    def forward(self, x: np.ndarray, backend: str = "native") -> np.ndarray:
        """Float input -> float output through int8: ``backend`` "native" (C kernels), "scalar" (C
        without SIMD) or "reference" (numpy)."""
        q, quant = self.forward_int8(x, backend)
        return kernel_backend(backend).dequantize(q, quant.scale, quant.zero_point)

    __call__ = forward

    def ranges(self) -> np.ndarray:
        """The float range [scale * (qmin - zp), scale * (qmax - zp)] of every quantization point (the
        input, then each dense/conv output): (points, 2) float32, the ``ranges`` a :class:`QATModel`
        trains with."""
        quants = [self.input] + [l.out for l in self.layers if l.kind in ("linear", "conv")]
        return np.array([[q.scale * (q.qmin - q.zero_point), q.scale * (q.qmax - q.zero_point)] for q in quants], np.float32)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the stored arrays (int8 weights, float32 scales and biases)."""
        return sum(a.nbytes for l in self.layers for a in (l.weight, l.weight_scale, l.bias) if a is not None)

    # ------------------------------------------------------------------ file
    def to_bytes(self) -> bytes:
        blobs: list[bytes] = []
        offset = 0

        def put(a: np.ndarray | None) -> dict | None:
            nonlocal offset
            if a is None:
                return None
            a = np.ascontiguousarray(a)
            entry = {"offset": offset, "dtype": a.dtype.str, "shape": list(a.shape)}
            blobs.append(a.tobytes())
            offset += a.nbytes
            return entry

        def quant(q: ActivationQuant | None) -> dict | None:
            return None if q is None else {"scale": q.scale, "zero_point": q.zero_point, "qmin": q.qmin, "qmax": q.qmax}

        layers = []
        for l in self.layers:
            d: dict[str, Any] = {"kind": l.kind}
            if l.kind in ("linear", "conv"):
                d.update(weight=put(l.weight), weight_scale=put(l.weight_scale), bias=put(l.bias), out=quant(l.out), relu=l.relu)
            if l.kind == "conv":
                d.update(kernel=list(l.kernel), stride=list(l.stride), padding=list(l.padding), dilation=list(l.dilation), in_channels=l.in_channels)
            if l.kind == "maxpool":
                d.update(kernel=list(l.kernel), stride=list(l.stride), padding=list(l.padding))
            layers.append(d)
        header = {"format": "fedarena.int8", "version": FORMAT_VERSION, "weight_bits": self.weight_bits,
                  "activation_bits": self.activation_bits, "input": quant(self.input), "layers": layers}
        h = zlib.compress(json.dumps(header, separators=(",", ":")).encode(), 9)
        return MAGIC + len(h).to_bytes(8, "little") + h + b"".join(blobs)

    def save(self, path: str | Path) -> int:
        """Write the model file; returns its size in bytes."""
        data = self.to_bytes()
        Path(path).write_bytes(data)
        return len(data)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "quantized model") -> "QuantizedModel":
        return _parse(data, where)

    @classmethod
    def load(cls, path: str | Path) -> "QuantizedModel":
        """Read a file written by :meth:`save`; a malformed one raises ``ValueError`` naming the field."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"quantized model file {path}: cannot be read ({e.strerror})") from None
        return _parse(data, f"quantized model file {path}")


_KINDS = ("linear", "conv", "maxpool", "flatten", "relu")


def _parse(data: bytes, where: str) -> QuantizedModel:
    def bad(field_: str, why: str) -> ValueError:
        return ValueError(f"{where}: {field_}: {why}")

    if len(data) < 12 or data[:4] != MAGIC:
        raise bad("magic", f"not a fedarena int8 model (expected {MAGIC!r})")
    hlen = int.from_bytes(data[4:12], "little")
    if hlen > min(MAX_HEADER, len(data) - 12):
        raise bad("header", f"length {hlen} exceeds the file")
    try:
        inflate = zlib.decompressobj()
        text = inflate.decompress(data[12 : 12 + hlen], MAX_HEADER)
        if inflate.unconsumed_tail or not inflate.eof:
            raise bad("header", f"is truncated or inflates past {MAX_HEADER} bytes")
        header = json.loads(text.decode("utf-8"))
    except zlib.error:
        raise bad("header", "is not zlib-compressed data") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("header", "is not UTF-8 JSON") from None
    if not isinstance(header, dict) or header.get("format") != "fedarena.int8":
        raise bad("header.format", "is not 'fedarena.int8'")
    if header.get("version") != FORMAT_VERSION:
        raise bad("header.version", f"unsupported version {header.get('version')!r} (this reader knows {FORMAT_VERSION})")
    blob = memoryview(data)[12 + hlen :]

    def integer(v: Any, name: str, lo: int, hi: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise bad(name, f"must be an integer in [{lo}, {hi}], got {v!r}")
        return v

    def pair(v: Any, name: str, lo: int, hi: int = 1 << 16) -> tuple[int, int]:
        if not isinstance(v, list) or len(v) != 2:
            raise bad(name, f"must be a pair of integers, got {v!r}")
        return integer(v[0], f"{name}[0]", lo, hi), integer(v[1], f"{name}[1]", lo, hi)

    def window(d: dict, name: str, conv: bool) -> dict:
        kernel = pair(d.get("kernel"), f"{name}.kernel", 1, 1 << 10)
        out = {"kernel": kernel, "stride": pair(d.get("stride"), f"{name}.stride", 1, 1 << 10),
               "padding": pair(d.get("padding"), f"{name}.padding", 0, max(kernel))}  # no more padding than a kernel
        if conv:
            out["dilation"] = pair(d.get("dilation"), f"{name}.dilation", 1, 1 << 10)
        return out

    def quant(d: Any, name: str) -> ActivationQuant:
        if not isinstance(d, dict):
            raise bad(name, "missing")
        s = d.get("scale")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s > 0):
            raise bad(f"{name}.scale", f"must be a finite positive number, got {s!r}")
        qmin = integer(d.get("qmin"), f"{name}.qmin", -128, 127)
        qmax = integer(d.get("qmax"), f"{name}.qmax", qmin, 127)
        return ActivationQuant(float(s), integer(d.get("zero_point"), f"{name}.zero_point", qmin, qmax), qmin, qmax)

    def array(e: Any, name: str, dtype: str, ndim: int) -> np.ndarray:
        if not isinstance(e, dict) or e.get("dtype") != np.dtype(dtype).str:
            raise bad(name, f"must be a {dtype} array entry, got {e!r:.80}")
        shape = e.get("shape")
        if not isinstance(shape, list) or len(shape) != ndim or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 31 for s in shape):
            raise bad(f"{name}.shape", f"must be {ndim} non-negative integers, got {shape!r}")
        off = e.get("offset")
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if isinstance(off, bool) or not isinstance(off, int) or off < 0 or off + size > len(blob):
            raise bad(f"{name}.offset", f"{off!r} (+{size} bytes) lies outside the file's {len(blob)} data bytes")
        return np.frombuffer(blob[off : off + size], dtype=dtype).reshape(shape).copy()

    wb = integer(header.get("weight_bits"), "header.weight_bits", 2, 8)
    ab = integer(header.get("activation_bits"), "header.activation_bits", 2, 8)
    inq = quant(header.get("input"), "header.input")
    raw = header.get("layers")
    if not isinstance(raw, list) or len(raw) > 10_000:
        raise bad("header.layers", "must be a list")
    layers = []
    for i, d in enumerate(raw):
        name = f"layers[{i}]"
        if not isinstance(d, dict) or d.get("kind") not in _KINDS:
            raise bad(f"{name}.kind", f"must be one of {', '.join(_KINDS)}, got {(d.get('kind') if isinstance(d, dict) else d)!r}")
        kind = d["kind"]
        if kind in ("flatten", "relu"):
            layers.append(QuantizedLayer(kind))
            continue
        if kind == "maxpool":
            layers.append(QuantizedLayer(kind, **window(d, name, conv=False)))
            continue
        w = array(d.get("weight"), f"{name}.weight", "int8", 2)
        n = w.shape[0]
        sc = array(d.get("weight_scale"), f"{name}.weight_scale", "float32", 1)
        if sc.shape != (n,) or not np.all(np.isfinite(sc) & (sc > 0)):
            raise bad(f"{name}.weight_scale", f"must hold {n} finite positive scales")
        b = None if d.get("bias") is None else array(d.get("bias"), f"{name}.bias", "float32", 1)
        if b is not None and (b.shape != (n,) or not np.all(np.isfinite(b))):
            raise bad(f"{name}.bias", f"must hold {n} finite values")
        relu = d.get("relu")
        if not isinstance(relu, bool):
            raise bad(f"{name}.relu", f"must be true or false, got {relu!r}")
        extra: dict[str, Any] = {}
        if kind == "conv":
            extra = dict(window(d, name, conv=True), in_channels=integer(d.get("in_channels"), f"{name}.in_channels", 1, 1 << 20))
            if extra["in_channels"] * extra["kernel"][0] * extra["kernel"][1] != w.shape[1]:
                raise bad(f"{name}.weight.shape", f"{w.shape} does not match in_channels x kernel = {extra['in_channels']} x {extra['kernel']}")
        layers.append(QuantizedLayer(kind, w, sc, b, quant(d.get("out"), f"{name}.out"), relu, **extra))
    return QuantizedModel(inq, tuple(layers), wb, ab)


# ----------------------------------------------------------------------------- post-training quantization


def quantize_model(model: nn.Module, params: Any, calibration: Calibration | Any, weight_bits: int = 8,
                   activation_bits: int = 8, method: str = "minmax", percentile: float = 99.99) -> QuantizedModel:
    """Post-training quantization: per-channel symmetric ``weight_bits`` weights, activations quantized
    with the ranges of ``calibration`` (a :class:`Calibration`, or a calibration set that
    :func:`calibrate` is run on with ``method``)."""
    weight_bits = check_bits(weight_bits, "weight_bits")
    activation_bits = check_bits(activation_bits, "activation_bits")
    steps = layer_plan(model, params)
    if not isinstance(calibration, Calibration):
        calibration = calibrate(model, params, calibration, method=method, percentile=percentile)
    if len(calibration.ranges) != quant_points(steps):
        raise ValueError(f"calibration: has {len(calibration.ranges)} ranges but the model has {quant_points(steps)} quantization points")
    return build_quantized(steps, calibration.ranges, weight_bits, activation_bits)


def build_quantized(steps: Sequence[Step], ranges: Sequence[tuple[float, float]], weight_bits: int,
                    activation_bits: int, weights: Sequence[Any] | None = None) -> QuantizedModel:
    """The :class:`QuantizedModel` of a plan and one range per quantization point (``weights``: the
    dense/conv parameters to use instead of the plan's, e.g. after quantization-aware training)."""
    quants = [activation_params(lo, hi, activation_bits) for lo, hi in ranges]
    layers: list[QuantizedLayer] = []
    j = 1
    for step in steps:
        if step.kind in ("flatten", "relu"):
            layers.append(QuantizedLayer(step.kind))
        elif step.kind == "maxpool":
            l = step.layer
            layers.append(QuantizedLayer("maxpool", kernel=_pair(l.kernel_size), stride=_pair(l.stride if l.stride is not None else l.kernel_size),
                                         padding=_pair(l.padding)))
        else:
            p = step.params if weights is None else weights[j - 1]
            w = np.asarray(p["w"], np.float32)
            b = None if p.get("b") is None else np.asarray(p["b"], np.float32)
            if step.kind == "linear":
                wq, sc = quantize_weights(w.T, weight_bits, axis=0)
                layers.append(QuantizedLayer("linear", np.ascontiguousarray(wq), sc, b, quants[j], step.relu))
            else:
                l = step.layer
                wq, sc = quantize_weights(w, weight_bits, axis=0)
                layers.append(QuantizedLayer("conv", wq.reshape(w.shape[0], -1), sc, b, quants[j], step.relu, kernel=(w.shape[2], w.shape[3]),
                                             stride=_pair(l.stride), padding=_pair(l.padding), dilation=_pair(l.dilation), in_channels=w.shape[1]))
            j += 1
    return QuantizedModel(quants[0], tuple(layers), weight_bits, activation_bits)


def dequantize_params(model: nn.Module, qmodel: QuantizedModel) -> Any:
    """The float parameter pytree of ``model`` (the ``nn.MLP`` / ``nn.Sequential`` ``qmodel`` was made
    from) holding ``qmodel``'s dequantized weights ``q * s_w`` and biases: what a client that received
    an int8 model starts quantization-aware training from."""
    dense = [l for l in qmodel.layers if l.kind in ("linear", "conv")]
    layers = model.layers if isinstance(model, (nn.MLP, nn.Sequential)) else None
    if layers is None:
        raise ValueError(f"model: int8 quantization takes nn.MLP or nn.Sequential, got {type(model).__name__}")
    wanted = [l for l in layers if isinstance(l, (nn.Linear, nn.Conv2d))]
    if len(wanted) != len(dense):
        raise ValueError(f"qmodel: has {len(dense)} dense/conv layers but the model has {len(wanted)}")
    out, it = [], iter(dense)
    for layer in layers:
        if not isinstance(layer, (nn.Linear, nn.Conv2d)):
            out.append(None)
            continue
        q = next(it)
        w = q.weight.astype(np.float32) * q.weight_scale[:, None]
        if isinstance(layer, nn.Linear):
            w, want = w.T, (layer.in_features, layer.out_features)
        else:
            want = (layer.out_channels, layer.in_channels, *_pair(layer.kernel_size))
            w = w.reshape(want) if w.size == int(np.prod(want)) else w
        if tuple(w.shape) != tuple(want) or (q.bias is None) == layer.bias:
            raise ValueError(f"qmodel: a {q.kind} layer of weight shape {q.weight.shape} does not match the model's {type(layer).__name__} {want}")
        p = {"w": np.ascontiguousarray(w, np.float32)}
        if q.bias is not None:
            p["b"] = q.bias.astype(np.float32).copy()
        out.append(p)
    return out


def float_bytes(params: Any) -> int:
    """Bytes of a float32 parameter pytree's arrays."""
    return sum(np.asarray(a, np.float32).nbytes for a in tree_leaves(params) if a is not None)


__all__ = [
    "Calibration",
    "QuantizedLayer",
    "QuantizedModel",
    "Step",
    "build_quantized",
    "calibrate",
    "dequantize_params",
    "float_bytes",
    "layer_plan",
    "quant_points",
    "quantize_model",
]
