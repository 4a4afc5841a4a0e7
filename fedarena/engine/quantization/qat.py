"""Quantization-aware training: fake quantization with a straight-through estimator, and a model's
fake-quant forward pass and training step over engine parameter pytrees.

``fake_quant(x, scale, zero_point, qmin, qmax) = scale * (clip(rint(x / scale) + zero_point, qmin, qmax)
- zero_point)`` (Jacob et al., CVPR 2018, section 3) is an engine ``custom_vjp``.  Its reverse rule:

* ``d/dx``: the clipped straight-through estimator (Bengio et al., 2013): the cotangent passes where
  ``qmin <= x / scale + zero_point <= qmax`` and is zero outside, i.e. the gradient of
  ``clip(x, scale * (qmin - zp), scale * (qmax - zp))``;
* ``d/dscale``: LSQ's (Esser et al., "Learned Step Size Quantization", ICLR 2020, eq. 3):
  ``rint(x / s) - x / s`` inside the range, ``qmin - zp`` below and ``qmax - zp`` above, summed over
  the axes ``scale`` is broadcast along (without LSQ's gradient scale factor; apply it in the
  optimizer if wanted), so a scale can be learned;
* ``d/dzero_point``: zero (the zero point is an integer, not trained).

:class:`QATModel` wraps a model plan (:func:`~fedarena.engine.quantization.model.layer_plan`):
weights are fake-quantized per output channel, symmetric, with ``scale = max|w_c| / qmax`` (not
differentiated), and every activation quantization point (the input and each dense/conv output,
after a fused ReLU) with a range tracked by an exponential moving average of batch min/max
(Jacob et al., section 3, "EMA ranges"), started from a post-training calibration.  After training,
:meth:`QATModel.to_int8` gives the :class:`~fedarena.engine.quantization.model.QuantizedModel` whose
int8 forward pass computes what the fake-quant forward simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import nn, ops
from ..custom import custom_vjp
from ..jit import jit
from ..transforms.autodiff import value_and_grad
from .model import QuantizedModel, Step, build_quantized, calibrate, layer_plan, quant_points
from .scheme import activation_range, check_bits, weight_range

_MAGIC32 = np.float32(1.5 * 2**23)  # x + M - M rounds a float32 |x| < 2^22 to the nearest integer, ties to even


def round_half_even(x: Any) -> Any:
    """``np.rint`` of float32 values with |x| < 2^22 from additions alone (the engine has no round
    primitive): adding and subtracting 1.5 * 2^23 leaves no fraction bits, and IEEE addition rounds
    to nearest, ties to even."""
    return (x + _MAGIC32) - _MAGIC32


def _sum_to(g: Any, shape: tuple) -> Any:
    """Sum ``g`` over the axes a value of ``shape`` was broadcast along."""
    gshape = ops.shape(g)
    if tuple(shape) == tuple(gshape):
        return g
    if len(shape) == 0:
        return ops.sum(g)
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and gshape[i + lead] != 1)
    out = ops.sum(g, axis=axes, keepdims=True) if axes else g
    return ops.reshape(out, tuple(shape))


def fake_quant(x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int) -> Any:
    """Quantize and dequantize ``x`` (float32) with ``scale`` and ``zero_point`` broadcast against it;
    differentiable by the straight-through rule in the module docstring."""
    qmin, qmax = int(qmin), int(qmax)
    if not -128 <= qmin < qmax <= 127:
        raise ValueError(f"fake_quant: need -128 <= qmin < qmax <= 127, got qmin={qmin} qmax={qmax}")
    lo, hi = np.float32(qmin), np.float32(qmax)

    def value(x, scale, zero_point):
        u = ops.clip(x / scale, lo - zero_point - 1, hi - zero_point + 1)  # bounded, so rounding by addition is exact
        q = ops.clip(round_half_even(u) + zero_point, lo, hi)
        return (q - zero_point) * scale

    def fwd(x, scale, zero_point):
        return value(x, scale, zero_point), (x, scale, zero_point)

    def bwd(res, ct):
        x, scale, zero_point = res
        v = x / scale
        u = v + zero_point
        inside = ops.astype((u >= lo) & (u <= hi), np.float32)
        below = ops.astype(u < lo, np.float32)
        above = ops.astype(u > hi, np.float32)
        vc = ops.clip(v, lo - zero_point - 1, hi - zero_point + 1)
        ds = inside * (round_half_even(vc) - v) + below * (lo - zero_point) + above * (hi - zero_point)
        return ct * inside, _sum_to(ct * ds, ops.shape(scale)), ops.zeros_like(zero_point)

    f = custom_vjp(value)
    f.defvjp(fwd, bwd)
    return f(x, scale, zero_point)


def range_quant_params(lo: Any, hi: Any, qmin: int, qmax: int) -> tuple[Any, Any]:
    """(scale, zero_point) of the range [min(lo, 0), max(hi, 0)] as engine values (float32), the same
    formula as :func:`~fedarena.engine.quantization.scheme.activation_params`."""
    lo = ops.minimum(lo, np.float32(0.0))
    hi = ops.maximum(hi, np.float32(0.0))
    width = hi - lo
    scale = ops.where(width > 0, width / np.float32(qmax - qmin), np.float32(1.0))
    zp = ops.clip(round_half_even(np.float32(qmin) - lo / scale), np.float32(qmin), np.float32(qmax))
    return scale, zp


def _weight_fake_quant(w: Any, axis: int, qmax: int) -> Any:
    red = tuple(i for i in range(len(ops.shape(w))) if i != axis)
    amax = ops.stop_gradient(ops.max(ops.abs(w), axis=red, keepdims=True))
    scale = ops.where(amax > 0, amax / np.float32(qmax), np.float32(1.0))
    return fake_quant(w, scale, np.float32(0.0), -qmax, qmax)


@dataclass(frozen=True)
class QATModel:
    """A model's fake-quant forward pass and training step.

    ``apply(params, ranges, x) -> (output, stats)``: ``params`` the model's float parameter pytree,
    ``ranges`` a float32 array (points, 2) of [lo, hi] per quantization point, ``stats`` the batch's
    [min, max] per point (not differentiated), to update the ranges with :meth:`update_ranges`.
    """

    model: nn.Module
    weight_bits: int = 8
    activation_bits: int = 8
    ema_decay: float = 0.99

    def __post_init__(self) -> None:
        check_bits(self.weight_bits, "weight_bits")
        check_bits(self.activation_bits, "activation_bits")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay: must lie in [0, 1), got {self.ema_decay}")

    def _steps(self, params: Any) -> list[Step]:
        return layer_plan(self.model, params)

    def apply(self, params: Any, ranges: Any, x: Any) -> tuple[Any, Any]:
        steps = self._steps(params)
        qmin, qmax = activation_range(self.activation_bits)
        wmax = weight_range(self.weight_bits)
        stats = []

        def point(v: Any, j: int) -> Any:
            flat = ops.reshape(ops.stop_gradient(v), (-1,))
            stats.append(ops.stack([ops.min(flat), ops.max(flat)]))
            scale, zp = range_quant_params(ranges[j, 0], ranges[j, 1], qmin, qmax)
            return fake_quant(v, scale, zp, qmin, qmax)

        x = point(x, 0)
        j = 1
        for step in steps:
            if step.kind == "relu":
                x = ops.relu(x)
            elif step.kind in ("maxpool", "flatten"):
                x = step.layer.apply(None, x)
            else:
                p = step.params
                if step.kind == "linear":
                    y = ops.matmul(x, _weight_fake_quant(p["w"], 1, wmax))
                    if p.get("b") is not None:
                        y = y + p["b"]
                else:
                    l = step.layer
                    y = ops.conv2d(x, _weight_fake_quant(p["w"], 0, wmax), l.stride, l.padding, l.dilation, bias=p.get("b"))
                x = point(ops.relu(y) if step.relu else y, j)
                j += 1
        return x, ops.stack(stats)

    def init_ranges(self, params: Any, data: Any, method: str = "minmax") -> np.ndarray:
        """Starting ranges: a post-training calibration of the float model on ``data``."""
        cal = calibrate(self.model, params, data, method=method)
        return np.asarray(cal.ranges, np.float32)

    def update_ranges(self, ranges: np.ndarray, stats: Any) -> np.ndarray:
        """The EMA step ``r <- decay * r + (1 - decay) * batch [min, max]``."""
        d = np.float32(self.ema_decay)
        return (d * np.asarray(ranges, np.float32) + (np.float32(1) - d) * np.asarray(stats, np.float32)).astype(np.float32)

    def train_step(self, optimizer: Any, loss: Callable[[Any, Any], Any] | None = None) -> Callable:
        """A jitted ``step(params, opt_state, ranges, x, y) -> (params, opt_state, ranges, loss)``: one
        optimizer step on ``loss(output, y)`` (default: cross-entropy on integer labels) through the
        fake-quant forward pass, then the EMA update of the ranges."""
        loss = loss or ops.cross_entropy

        def objective(params, ranges, x, y):
            out, stats = self.apply(params, ranges, x)
            return loss(out, y), stats

        def step(params, opt_state, ranges, x, y):
            (value, stats), grads = value_and_grad(objective, has_aux=True)(params, ranges, x, y)
            params, opt_state = optimizer.update(grads, opt_state, params)
            return params, opt_state, stats, value

        compiled = jit(step, shape_varies=True)

        def run(params, opt_state, ranges, x, y):
            params, opt_state, stats, value = compiled(params, opt_state, ranges, x, y)
            return params, opt_state, self.update_ranges(ranges, stats), float(value)

        return run

    def to_int8(self, params: Any, ranges: Any) -> QuantizedModel:
        """The int8 model of the trained parameters and the tracked ranges."""
        steps = self._steps(params)
        ranges = np.asarray(ranges, np.float64)
        if ranges.shape != (quant_points(steps), 2):
            raise ValueError(f"ranges: must have shape ({quant_points(steps)}, 2), got {ranges.shape}")
        return build_quantized(steps, [tuple(r) for r in ranges], self.weight_bits, self.activation_bits)


def qat_model(model: nn.Module, weight_bits: int = 8, activation_bits: int = 8, ema_decay: float = 0.99) -> QATModel:
    """The quantization-aware training view of an engine model (``nn.MLP`` or ``nn.Sequential``)."""
    return QATModel(model, weight_bits, activation_bits, ema_decay)


__all__ = ["QATModel", "fake_quant", "qat_model", "range_quant_params", "round_half_even"]
