"""Clients that receive an int8 model and train it quantization-aware: the device-cloud setting of issue 35, where
a phone downloads a quantized model (a quarter of the float32 bytes) and trains with fake quantization
(Jacob et al., CVPR 2018, section 3; the engine's :mod:`fedarena.engine.quantization`).

One such client's round, for a sub-model of layer sizes ``sizes`` (any width level of :mod:`.hetero`):

1. the server folds HeteroFL's scaler into the weights (a hidden output multiplied by ``s`` feeds the next layer,
   so ``W'_i = s W_i`` for every layer ``i >= 1``; the ReLU MLP without a scaler is the same function), quantizes
   the folded sub-model post-training (per-channel int8 weights, int8 activations calibrated by min-max on the
   server's calibration sample) and sends the int8 file (:meth:`QuantizedModel.to_bytes`, priced at its length);
2. the client parses the file, starts from its dequantized parameters (``dequantize_params``) and the int8
   model's activation ranges, and runs the same minibatches a float client would, each an SGD step through the
   fake-quant forward pass (:meth:`QATModel.train_step`, the ranges tracked by EMA). SGD on the folded weight
   ``W' = s W`` with step ``lr s^2`` is SGD on ``W`` with step ``lr`` (``dL/dW' = dL/dW / s``), so each layer
   ``i >= 1`` steps with ``lr s^2`` and the trajectory is that of the scaled model;
3. it unfolds (``W = W' / s``) and uploads the float32 update ``trained - start`` (its start is the dequantized
   model: it never saw the float one); the server aggregates it per coordinate with the float clients' updates.

The server's calibration sample is a fixed sample of the training pool (:func:`calibration_sample`; the
server-side proxy data that post-training quantization needs; a deployment would use a small public set). The
simulation and the gRPC runtime's scheduler draw it, and quantize, with the same functions; a gRPC client parses
the int8 file it receives from the network with :func:`parse_int8_mlp` (the file format's checked parser, never
unpickling, then the checks that it is a ReLU MLP over the client's own features and labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedarena.engine import nn, ops
from fedarena.engine.optim import Optimizer
from fedarena.engine.quantization import QuantizedModel, dequantize_params, qat_model, quantize_model
from fedarena.federated.strategy import Params


def calibration_sample(x: Any, train: Sequence[Any], seed: int, size: int) -> np.ndarray:
    """The server's calibration sample: ``size`` examples of ``x`` (at most the pool) drawn without replacement
    from the training pool (the union of the clients' index arrays ``train``) by the run's ``seed``, float32."""
    pool = np.sort(np.concatenate([np.asarray(t, np.int64) for t in train]))
    rng = np.random.default_rng([seed, 35])
    take = np.sort(rng.choice(pool, size=min(size, len(pool)), replace=False))
    return np.asarray(x[take], np.float32)


def parse_int8_mlp(blob: Any, where: str, features: int, classes: int) -> tuple[QuantizedModel, tuple[int, ...]]:
    """The int8 file ``blob`` (bytes from the network) parsed (:meth:`QuantizedModel.from_bytes` checks every
    field) and its layer sizes, checked to be an MLP a client can train: dense layers chained in size, a ReLU
    after each but the last, ``features`` inputs and at least ``classes`` outputs. Raises one ``ValueError``
    naming ``where`` and the reason."""
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError(f"{where}: expected bytes, got {type(blob).__name__}")
    q = QuantizedModel.from_bytes(bytes(blob), where)
    if not q.layers or any(layer.kind != "linear" for layer in q.layers):
        raise ValueError(f"{where}: not an MLP (layers {[layer.kind for layer in q.layers]})")
    sizes = (q.layers[0].weight.shape[1], *(layer.weight.shape[0] for layer in q.layers))
    for i, layer in enumerate(q.layers):
        if i and layer.weight.shape[1] != sizes[i]:
            raise ValueError(f"{where}: layer {i} takes {layer.weight.shape[1]} inputs but layer {i - 1} has "
                             f"{sizes[i]} outputs")
        if layer.bias is None or layer.relu != (i < len(q.layers) - 1):
            raise ValueError(f"{where}: layer {i} must have a bias and {'a' if i < len(q.layers) - 1 else 'no'} "
                             "fused ReLU")
    if sizes[0] != features or sizes[-1] < classes:
        raise ValueError(f"{where}: the model maps {sizes[0]} features to {sizes[-1]} classes; this client's data "
                         f"has {features} features and labels up to {classes - 1}")
    if not np.all(np.isfinite(q.ranges())):
        raise ValueError(f"{where}: an activation range is not finite")
    return q, tuple(int(z) for z in sizes)


def folded_tree(params: Params, depth: int, scale: float) -> list[dict[str, np.ndarray]]:
    """The ``nn.MLP`` parameter pytree of a flat MLP ``{"l{i}.w", "l{i}.b"}`` whose hidden outputs are multiplied
    by ``scale``: layer ``i >= 1``'s weight times ``scale`` (module docstring)."""
    s = np.float32(scale)
    return [{"w": np.asarray(params[f"l{i}.w"], np.float32) * (s if i else np.float32(1)),
             "b": np.asarray(params[f"l{i}.b"], np.float32)} for i in range(depth)]


def unfolded(tree: Sequence[dict[str, Any]], scale: float) -> Params:
    """The flat parameters of a folded pytree (:func:`folded_tree`'s inverse)."""
    s = np.float32(scale)
    return {k: v for i, p in enumerate(tree) for k, v in
            ((f"l{i}.w", np.asarray(p["w"], np.float32) / (s if i else np.float32(1))),
             (f"l{i}.b", np.asarray(p["b"], np.float32)))}


def layer_sgd(lr: float, scale: float) -> Optimizer:
    """Plain SGD over an ``nn.MLP`` pytree whose layers ``i >= 1`` step with ``lr scale^2`` (the folded scaler)."""
    def init(params: Any) -> Any:
        return {}

    def update(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        def rate(i: int, k: str) -> np.float32:
            return np.float32(lr * scale * scale if i and k == "w" else lr)

        new = [{k: ops.subtract(p[k], ops.multiply(g[k], rate(i, k))) for k in p}
               for i, (p, g) in enumerate(zip(params, grads))]
        return new, state

    return Optimizer(init, update, "layer_sgd")


@dataclass
class Int8Download:
    """The server's int8 sub-models and the clients' quantization-aware training (module docstring).

    ``calibration``: the server's calibration sample (float32 inputs; None on a client, which only trains)."""

    calibration: np.ndarray | None = None

    def __post_init__(self) -> None:
        self._steps: dict[tuple, Any] = {}

    def quantize(self, params: Params, sizes: Sequence[int], scale: float) -> bytes:
        """The int8 file of the sub-model ``params`` (layer sizes ``sizes``) whose hidden outputs are scaled by
        ``scale``."""
        if self.calibration is None:
            raise ValueError("int8 download: quantizing needs the server's calibration sample")
        mlp = nn.MLP(list(sizes), activation="relu")
        tree = folded_tree(params, len(sizes) - 1, scale)
        return quantize_model(mlp, tree, self.calibration).to_bytes()

    def accuracy(self, params: Params, sizes: Sequence[int], scale: float, x: np.ndarray, y: np.ndarray) -> float:
        """Test accuracy of the int8 model of ``params`` (what an int8 client would run), by the native int8
        forward pass."""
        q = QuantizedModel.from_bytes(self.quantize(params, sizes, scale))
        return float(np.mean(np.argmax(q.forward(np.asarray(x, np.float32)), axis=1) == np.asarray(y)))

    @staticmethod
    def start(blob: bytes | QuantizedModel, sizes: Sequence[int]) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        """What a client starts from: the int8 file's (parsed here unless already a :class:`QuantizedModel`)
        dequantized (folded) parameters and its ranges."""
        q = blob if isinstance(blob, QuantizedModel) else QuantizedModel.from_bytes(blob, "int8 download")
        return dequantize_params(nn.MLP(list(sizes), activation="relu"), q), q.ranges()

    def train(self, blob: bytes | QuantizedModel, sizes: Sequence[int], scale: float, batches: Sequence[np.ndarray],
              last_epoch: Sequence[bool], x: Any, y: np.ndarray, lr: float) -> tuple[Params, Params, float]:
        """One client's quantization-aware local training from the int8 file ``blob``: SGD steps on the
        minibatches ``batches`` (global example indices) of ``x``/``y`` (integer labels). Returns the unfolded
        start and trained parameters and the mean loss of the steps flagged ``last_epoch``."""
        tree, ranges = Int8Download.start(blob, sizes)
        start = unfolded(tree, scale)
        key = (tuple(sizes), float(scale), float(lr))
        if key not in self._steps:  # one compiled step per sub-model and learning rate
            self._steps[key] = qat_model(nn.MLP(list(sizes), activation="relu")).train_step(layer_sgd(lr, scale))
        step, state = self._steps[key], {}
        losses = []
        for idx, last in zip(batches, last_epoch):
            tree, state, ranges, loss = step(tree, state, ranges, np.asarray(x[idx], np.float32),
                                             np.asarray(y[idx], np.int64))
            if last:
                losses.append(loss)
        return start, unfolded(tree, scale), float(np.mean(losses)) if losses else float("nan")
