"""Model quantization on the engine: post-training int8 quantization, quantization-aware training,
and int8 inference on a native int8 GEMM (Jacob et al., "Quantization and Training of Neural
Networks for Efficient Integer-Arithmetic-Only Inference", CVPR 2018; Krishnamoorthi, "Quantizing
deep convolutional networks for efficient inference: a whitepaper", 2018).

Dense (``nn.Linear``, ``nn.MLP``) and convolution (``nn.Conv2d``) layers, in an ``nn.MLP`` or an
``nn.Sequential`` that may also hold ``MaxPool2d``, ``Flatten`` and ReLU:

* :mod:`.scheme`: the integer ranges, per-channel symmetric weights, min-max and histogram
  percentile observers;
* :mod:`.model`: :func:`calibrate`, :func:`quantize_model` (post-training), :class:`QuantizedModel`
  (``forward(x, backend="native" | "reference")``, ``save``/``load``: a file of int8 weights,
  float32 scales and biases and a JSON header, never unpickled);
* :mod:`.kernel`: :func:`qgemm`, the int8 GEMM with int32 accumulation and fused requantization in
  C (``qgemm.c``, compiled at first use and cached), and :func:`qgemm_reference`, its numpy
  definition, which it equals bit for bit;
* :mod:`.qat`: :func:`fake_quant` (straight-through estimator, LSQ scale gradient) and
  :class:`QATModel`.

Quantization-aware training of a float parameter pytree (what a federated client that receives an
int8 model does)::

    qat = qat_model(model)                        # model: the nn.MLP / nn.Sequential description
    ranges = qat.init_ranges(params, x_calib)     # (points, 2) float32, EMA-tracked during training
    opt = optim.adam(1e-3); state = opt.init(params)
    step = qat.train_step(opt)                    # jitted; loss defaults to cross-entropy
    params, state, ranges, loss = step(params, state, ranges, x, y)
    logits, _ = qat.apply(params, ranges, x)      # the fake-quant forward pass, differentiable
    int8 = qat.to_int8(params, ranges)            # QuantizedModel; int8.forward(x) runs int8

The parameters stay float32 throughout (fake quantization only simulates int8), so they can be
averaged by any federated aggregator; ``quantize_model(model, params, x_calib)`` gives the int8 model
of float parameters received from a server.  A client that receives an int8 model instead
(``QuantizedModel.load`` / ``from_bytes``) trains from ``params = dequantize_params(model, int8)``
and ``ranges = int8.ranges()``.
"""

from .kernel import KernelBuildError, isa, qgemm, qgemm_reference
from .model import Calibration, QuantizedLayer, QuantizedModel, calibrate, dequantize_params, float_bytes, layer_plan, quantize_model
from .qat import QATModel, fake_quant, qat_model
from .scheme import ActivationQuant, activation_params, quantize_weights

__all__ = [
    "ActivationQuant",
    "Calibration",
    "KernelBuildError",
    "QATModel",
    "QuantizedLayer",
    "QuantizedModel",
    "activation_params",
    "calibrate",
    "dequantize_params",
    "fake_quant",
    "float_bytes",
    "isa",
    "layer_plan",
    "qat_model",
    "qgemm",
    "qgemm_reference",
    "quantize_model",
    "quantize_weights",
]
