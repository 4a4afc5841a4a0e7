"""The models of the federated benchmarks of Reddi et al. 2021 ("Adaptive Federated Optimization", ICLR,
appendix on the tasks and models), as ``init``/``apply`` pairs over parameter pytrees built from
:mod:`fedarena.engine.nn`.

- :class:`ResNetGN`: ResNet (He et al. 2016, torchvision's BasicBlock layout) with every batch norm
  replaced by group norm of 2 groups, the CIFAR-100 model of Reddi et al. after Hsieh et al. 2020
  ("The Non-IID Data Quagmire of Decentralized Machine Learning", ICML); :func:`resnet18_gn` is
  ResNet-18 (torchvision's ImageNet stem: 7x7/2 convolution and 3x3/2 max pool), :func:`resnet8_gn` a
  ResNet-8 (CIFAR stem: one 3x3 convolution; stages of 16/32/64 channels) small enough for CPU runs.
- :class:`EmnistCNN`: Reddi et al.'s EMNIST character-recognition CNN (3x3 convolutions of 32 and 64
  channels, 2x2 max pool, dropout 0.25, a 128-unit ReLU layer, dropout 0.5, 62 outputs).
- :class:`RecurrentLM`: embedding, stacked LSTM and a dense output per position; :func:`char_lstm` is the
  Shakespeare next-character model (embedding 8, two LSTM layers of 256; 86 characters plus the pad,
  out-of-vocabulary, beginning and end tokens = 90), :func:`word_lstm` the StackOverflow next-word model
  (embedding 96, one LSTM of 670, a dense projection to 96, then 10,000 words + 4 special tokens =
  10,004 outputs).  Our LSTM keeps PyTorch's two bias vectors (``b_ih``, ``b_hh``), so it has 4H more
  parameters per layer than the Keras models of the paper (which have one).
- :class:`TransformerLM`: a small transformer encoder (Vaswani et al. 2017) over token and learned
  positional embeddings, causal by default, with a dense output per position.

Images are NCHW, tokens integer ids; the language models return logits (batch, time, vocab).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import nn, ops
from . import random as _random
from .core.tracing import aval_of
from .initializers import as_rng

Params = Any


def _kaiming_conv(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
    """torchvision's ResNet convolution init: N(0, 2 / fan_out), fan_out = out_channels * kh * kw."""
    fan_out = shape[0] * shape[2] * shape[3]
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_out)).astype(dtype)


@dataclass(frozen=True)
class ResNetGN(nn.Module):
    """ResNet of BasicBlocks (two 3x3 convolutions and an identity or 1x1-convolution shortcut) with
    :class:`~fedarena.engine.nn.GroupNorm` of ``groups`` groups after every convolution.

    ``blocks[i]`` blocks in stage i of ``widths[i]`` channels; every stage after the first halves the
    resolution with a stride-2 first block. ``stem="imagenet"``: 7x7/2 convolution, norm, ReLU, 3x3/2 max
    pool (torchvision's ResNet); ``stem="cifar"``: a 3x3/1 convolution, norm, ReLU. Then global average
    pooling and a dense layer to ``num_classes``. Convolutions have no bias (the norm shifts)."""

    num_classes: int
    blocks: Sequence[int] = (2, 2, 2, 2)
    widths: Sequence[int] = (64, 128, 256, 512)
    in_channels: int = 3
    groups: int = 2
    stem: str = "imagenet"

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        if len(self.blocks) != len(self.widths) or not self.blocks or min(self.blocks) < 1:
            raise ValueError(f"ResNetGN: blocks {self.blocks} and widths {self.widths} need one positive entry per "
                             "stage")
        if self.stem not in ("imagenet", "cifar"):
            raise ValueError(f"ResNetGN: stem must be 'imagenet' or 'cifar', got {self.stem!r}")

    def _conv(self, cin: int, cout: int, k: int, stride: int) -> nn.Conv2d:
        return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False, w_init=_kaiming_conv)

    def _norm(self, c: int) -> nn.GroupNorm:
        return nn.GroupNorm(self.groups, c)

    def _plan(self) -> list[tuple[str, int, int, int]]:
        """(name, in channels, out channels, stride) of every block."""
        out, cin = [], self.widths[0]
        for s, (n, w) in enumerate(zip(self.blocks, self.widths)):
            for b in range(n):
                out.append((f"layer{s + 1}", cin, w, 2 if (b == 0 and s > 0) else 1))
                cin = w
        return out

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        w0 = self.widths[0]
        k = 7 if self.stem == "imagenet" else 3
        p: dict = {"stem": {"conv": self._conv(self.in_channels, w0, k, 1).init(rng, dtype),
                            "norm": self._norm(w0).init(rng, dtype)}}
        for name, cin, cout, stride in self._plan():
            blk = {"conv1": self._conv(cin, cout, 3, stride).init(rng, dtype),
                   "norm1": self._norm(cout).init(rng, dtype),
                   "conv2": self._conv(cout, cout, 3, 1).init(rng, dtype), "norm2": self._norm(cout).init(rng, dtype)}
            if stride != 1 or cin != cout:
                blk["down_conv"] = self._conv(cin, cout, 1, stride).init(rng, dtype)
                blk["down_norm"] = self._norm(cout).init(rng, dtype)
            p.setdefault(name, []).append(blk)
        p["fc"] = nn.Linear(self.widths[-1], self.num_classes).init(rng, dtype)
        return p

    def apply(self, params: Params, x: Any) -> Any:
        w0 = self.widths[0]
        if self.stem == "imagenet":
            z = self._conv(self.in_channels, w0, 7, 2).apply(params["stem"]["conv"], x)
            z = ops.relu(self._norm(w0).apply(params["stem"]["norm"], z))
            z = ops.max_pool2d(z, 3, 2, 1)
        else:
            z = self._conv(self.in_channels, w0, 3, 1).apply(params["stem"]["conv"], x)
            z = ops.relu(self._norm(w0).apply(params["stem"]["norm"], z))
        counts: dict[str, int] = {}
        for name, cin, cout, stride in self._plan():
            i = counts.get(name, 0)
            counts[name] = i + 1
            p = params[name][i]
            h = ops.relu(self._norm(cout).apply(p["norm1"], self._conv(cin, cout, 3, stride).apply(p["conv1"], z)))
            h = self._norm(cout).apply(p["norm2"], self._conv(cout, cout, 3, 1).apply(p["conv2"], h))
            if "down_conv" in p:
                z = self._norm(cout).apply(p["down_norm"], self._conv(cin, cout, 1, stride).apply(p["down_conv"], z))
            z = ops.relu(ops.add(h, z))
        return nn.Linear(self.widths[-1], self.num_classes).apply(params["fc"], ops.mean(z, (2, 3)))


def resnet18_gn(num_classes: int = 100, in_channels: int = 3, groups: int = 2) -> ResNetGN:
    """ResNet-18 with group norm (Reddi et al. 2021's CIFAR-100 model; Hsieh et al. 2020): 11,227,812
    parameters for 100 classes, as torchvision's ``resnet18(num_classes=100)`` (a norm layer's gamma and
    beta replace a batch norm's)."""
    return ResNetGN(num_classes, (2, 2, 2, 2), (64, 128, 256, 512), in_channels, groups, "imagenet")


def resnet8_gn(num_classes: int = 100, in_channels: int = 3, groups: int = 2) -> ResNetGN:
    """ResNet-8 with group norm for CPU runs: a 3x3 stem and one BasicBlock in each of three stages of
    16, 32 and 64 channels (the CIFAR ResNet layout of He et al. 2016, Sec. 4.2, with n = 1, here with 1x1
    projection shortcuts where the shape changes and group norm)."""
    return ResNetGN(num_classes, (1, 1, 1), (16, 32, 64), in_channels, groups, "cifar")


@dataclass(frozen=True)
class EmnistCNN(nn.Module):
    """Reddi et al. 2021's EMNIST CNN (their appendix; TFF's EMNIST character model): ``conv(3x3,
    channels[0]) - ReLU - conv(3x3, channels[1]) - ReLU - maxpool(2x2) - dropout(0.25) - dense(hidden) -
    ReLU - dropout(0.5) - dense(num_classes)``, valid convolutions; defaults 32/64 channels, 128 units, 62
    classes on 28x28 (1,206,590 parameters).  ``apply(params, x, key=None)``: dropout only when a ``key`` is given."""

    num_classes: int = 62
    image: Sequence[int] = (1, 28, 28)
    channels: Sequence[int] = (32, 64)
    hidden: int = 128
    dropout: Sequence[float] = (0.25, 0.5)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image", tuple(int(v) for v in self.image))
        object.__setattr__(self, "channels", tuple(int(v) for v in self.channels))
        object.__setattr__(self, "dropout", tuple(float(v) for v in self.dropout))
        c, h, w = self.image
        if h < 6 or w < 6 or (h - 4) % 2 or (w - 4) % 2:
            raise ValueError(f"EmnistCNN: image {self.image} must be at least 6x6 with even height-4 and width-4")

    @property
    def flat_features(self) -> int:
        _, h, w = self.image
        return self.channels[1] * ((h - 4) // 2) * ((w - 4) // 2)

    def _layers(self):
        c = self.image[0]
        return (nn.Conv2d(c, self.channels[0], 3), nn.Conv2d(self.channels[0], self.channels[1], 3),
                nn.Linear(self.flat_features, self.hidden), nn.Linear(self.hidden, self.num_classes))

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        return {n: m.init(rng, dtype) for n, m in zip(("conv1", "conv2", "fc", "out"), self._layers())}

    def apply(self, params: Params, x: Any, key: Any = None) -> Any:
        conv1, conv2, fc, out = self._layers()
        k1 = k2 = None
        if key is not None:
            k1, k2 = _random.split(key)
        z = ops.relu(conv2.apply(params["conv2"], ops.relu(conv1.apply(params["conv1"], x))))
        z = nn.Dropout(self.dropout[0]).apply(None, ops.max_pool2d(z, 2), k1)
        z = ops.relu(fc.apply(params["fc"], ops.reshape(z, (ops.shape(z)[0], self.flat_features))))
        return out.apply(params["out"], nn.Dropout(self.dropout[1]).apply(None, z, k2))


@dataclass(frozen=True)
class RecurrentLM(nn.Module):
    """Next-token model: ``Embedding(vocab, embed_dim)`` - ``num_layers`` LSTM layers of ``hidden_size`` -
    (a dense projection to ``projection`` units, no activation, when > 0) - dense to ``vocab_size`` logits
    at every position.  ``apply(params, tokens (batch, time) ints) -> (batch, time, vocab_size)``."""

    vocab_size: int
    embed_dim: int
    hidden_size: int
    num_layers: int = 1
    projection: int = 0
    unroll: bool = False

    def _parts(self):
        last = self.projection or self.hidden_size
        return (nn.Embedding(self.vocab_size, self.embed_dim),
                nn.LSTM(self.embed_dim, self.hidden_size, self.num_layers, self.unroll),
                nn.Linear(self.hidden_size, self.projection) if self.projection else None,
                nn.Linear(last, self.vocab_size))

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        emb, lstm, proj, out = self._parts()
        p = {"embedding": emb.init(rng, dtype), "lstm": lstm.init(rng, dtype)}
        if proj is not None:
            p["projection"] = proj.init(rng, dtype)
        p["out"] = out.init(rng, dtype)
        return p

    def apply(self, params: Params, tokens: Any) -> Any:
        emb, lstm, proj, out = self._parts()
        h = lstm.apply(params["lstm"], emb.apply(params["embedding"], tokens))
        if proj is not None:
            h = proj.apply(params["projection"], h)
        return out.apply(params["out"], h)


SHAKESPEARE_VOCAB = 86 + 4
"""TFF's Shakespeare character vocabulary (86 characters) plus pad, out-of-vocabulary, BOS and EOS."""
STACKOVERFLOW_VOCAB = 10_000 + 4
"""The StackOverflow next-word task's 10,000 most frequent words plus pad, out-of-vocabulary, BOS and EOS."""


def char_lstm(vocab_size: int = SHAKESPEARE_VOCAB, embed_dim: int = 8, hidden_size: int = 256,
              num_layers: int = 2) -> RecurrentLM:
    """Reddi et al. 2021's Shakespeare model: embedding 8, two LSTM layers of 256 units, dense output."""
    return RecurrentLM(vocab_size, embed_dim, hidden_size, num_layers)


def word_lstm(vocab_size: int = STACKOVERFLOW_VOCAB, embed_dim: int = 96, hidden_size: int = 670,
              projection: int = 96) -> RecurrentLM:
    """Reddi et al. 2021's StackOverflow next-word model: embedding 96, one LSTM of 670 units, dense 96,
    dense output over the 10,004-token vocabulary."""
    return RecurrentLM(vocab_size, embed_dim, hidden_size, 1, projection)


@dataclass(frozen=True)
class TransformerLM(nn.Module):
    """Token embedding plus a learned positional embedding (``max_len`` positions), ``num_layers``
    :class:`~fedarena.engine.nn.TransformerEncoderLayer` (post-norm, ReLU; causal self-attention unless
    ``causal=False``) and a dense output to ``vocab_size`` logits at every position."""

    vocab_size: int
    d_model: int = 64
    num_heads: int = 4
    dim_feedforward: int = 128
    num_layers: int = 2
    max_len: int = 128
    causal: bool = True

    def _parts(self):
        layer = nn.TransformerEncoderLayer(self.d_model, self.num_heads, self.dim_feedforward)
        return (nn.Embedding(self.vocab_size, self.d_model), nn.Embedding(self.max_len, self.d_model), layer,
                nn.Linear(self.d_model, self.vocab_size))

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        tok, pos, layer, out = self._parts()
        return {"token": tok.init(rng, dtype), "position": pos.init(rng, dtype),
                "layers": [layer.init(rng, dtype) for _ in range(self.num_layers)], "out": out.init(rng, dtype)}

    def apply(self, params: Params, tokens: Any) -> Any:
        tok, pos, layer, out = self._parts()
        t = ops.shape(tokens)[-1]
        if t > self.max_len:
            raise ValueError(f"TransformerLM: sequences of {t} tokens exceed max_len {self.max_len}")
        h = ops.add(tok.apply(params["token"], tokens), pos.apply(params["position"], np.arange(t)))
        mask = nn.causal_mask(t, aval_of(params["out"]["w"]).dtype) if self.causal else None
        for p in params["layers"]:
            h = layer.apply(p, h, mask)
        return out.apply(params["out"], h)
