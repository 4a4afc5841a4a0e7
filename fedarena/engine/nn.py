"""Neural-network layers as ``init``/``apply`` pairs over parameter pytrees.

A layer is a small frozen dataclass holding its hyper-parameters; ``layer.init(seed, dtype)``
returns its parameters (nested dicts of numpy arrays) and ``layer.apply(params, x)`` (also
``layer(params, x)``) computes the output with :mod:`fedarena.engine.ops`, so it runs eagerly or
inside ``jit``/``grad``.  Dense weights are stored (in, out) so ``y = x @ w + b``; convolution
weights are OIHW like PyTorch.  Cell equations: GRU (Cho et al., 2014) and LSTM (Hochreiter &
Schmidhuber, 1997) in PyTorch's gate order and bias layout; LayerNorm (Ba et al., 2016); GroupNorm
(Wu & He, 2018); multi-head self-attention and the transformer encoder layer (Vaswani et al., 2017) with
PyTorch's ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` equations (post-norm by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import initializers as I
from . import ops
from . import random as _random
from .control_flow import scan as _scan
from .core.tracing import aval_of
from .initializers import as_rng

Params = Any
Seed = "int | np.random.Generator"


class Module:
    """Base: ``init(seed, dtype) -> params`` and ``apply(params, *inputs)``."""

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:  # pragma: no cover
        raise NotImplementedError

    def apply(self, params: Params, *inputs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, params: Params, *inputs: Any) -> Any:
        return self.apply(params, *inputs)


def _activation(act: str | Callable | None) -> Callable:
    if act is None:
        return lambda x: x
    if callable(act):
        return act
    table = {
        "tanh": ops.tanh,
        "relu": ops.relu,
        "sigmoid": ops.sigmoid,
        "softplus": ops.softplus,
        "leaky_relu": ops.leaky_relu,
        "identity": lambda x: x,
    }
    try:
        return table[act]
    except KeyError:
        raise ValueError(f"unknown activation {act!r}; known: {', '.join(sorted(table))}") from None


@dataclass(frozen=True)
class Linear(Module):
    """y = x @ w + b with w of shape (in_features, out_features).

    Default init is PyTorch's: w, b ~ U(-1/sqrt(in), 1/sqrt(in)).
    """

    in_features: int
    out_features: int
    bias: bool = True
    w_init: Callable | str | None = None
    b_init: Callable | str | None = None

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        w_init = I.get(self.w_init) if self.w_init is not None else I.lecun_uniform()
        p = {"w": w_init(rng, (self.in_features, self.out_features), dtype)}
        if self.bias:
            b_init = I.get(self.b_init) if self.b_init is not None else I.lecun_uniform(self.in_features)
            p["b"] = b_init(rng, (self.out_features,), dtype)
        return p

    def apply(self, params: Params, x: Any) -> Any:
        y = ops.matmul(x, params["w"])
        return ops.add(y, params["b"]) if "b" in params else y


@dataclass(frozen=True)
class MLP(Module):
    """Linear layers with ``activation`` between them: sizes [in, h1, ..., out].

    ``w_init``/``b_init`` apply to every layer; ``last_w_init`` overrides the last layer's
    weight init (e.g. ``initializers.orthogonal(0.01)`` for a PPO policy head).
    """

    sizes: Sequence[int]
    activation: str | Callable = "tanh"
    output_activation: str | Callable | None = None
    w_init: Callable | str | None = None
    b_init: Callable | str | None = None
    last_w_init: Callable | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        if len(self.sizes) < 2:
            raise ValueError(f"MLP needs at least [in, out] sizes, got {self.sizes}")

    @property
    def layers(self) -> list[Linear]:
        n = len(self.sizes) - 1
        return [
            Linear(
                self.sizes[i],
                self.sizes[i + 1],
                w_init=self.last_w_init if (i == n - 1 and self.last_w_init is not None) else self.w_init,
                b_init=self.b_init,
            )
            for i in range(n)
        ]

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        return [layer.init(rng, dtype) for layer in self.layers]

    def apply(self, params: Params, x: Any) -> Any:
        act = _activation(self.activation)
        out_act = _activation(self.output_activation)
        layers = self.layers
        for i, (layer, p) in enumerate(zip(layers, params)):
            x = layer.apply(p, x)
            x = act(x) if i < len(layers) - 1 else out_act(x)
        return x


@dataclass(frozen=True)
class Conv2d(Module):
    """2-d convolution (cross-correlation), NCHW input, OIHW weights, PyTorch's default init."""

    in_channels: int
    out_channels: int
    kernel_size: int | tuple = 3
    stride: int | tuple = 1
    padding: int | tuple = 0
    dilation: int | tuple = 1
    bias: bool = True
    w_init: Callable | str | None = None
    b_init: Callable | str | None = None

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        kh, kw = (self.kernel_size, self.kernel_size) if isinstance(self.kernel_size, int) else self.kernel_size
        shape = (self.out_channels, self.in_channels, kh, kw)
        w_init = I.get(self.w_init) if self.w_init is not None else I.lecun_uniform()
        p = {"w": w_init(rng, shape, dtype)}
        if self.bias:
            b_init = I.get(self.b_init) if self.b_init is not None else I.lecun_uniform(self.in_channels * kh * kw)
            p["b"] = b_init(rng, (self.out_channels,), dtype)
        return p

    def apply(self, params: Params, x: Any) -> Any:
        return ops.conv2d(x, params["w"], self.stride, self.padding, self.dilation, bias=params.get("b"))


@dataclass(frozen=True)
class _Pool2d(Module):
    """A parameter-free 2-d pooling layer over NCHW input; subclasses name the pooling op."""

    kernel_size: int | tuple = 2
    stride: int | tuple | None = None
    padding: int | tuple = 0
    _pool = staticmethod(ops.max_pool2d)

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        return None

    def apply(self, params: Params, x: Any) -> Any:
        return self._pool(x, self.kernel_size, self.stride, self.padding)


@dataclass(frozen=True)
class MaxPool2d(_Pool2d):
    _pool = staticmethod(ops.max_pool2d)


@dataclass(frozen=True)
class AvgPool2d(_Pool2d):
    _pool = staticmethod(ops.avg_pool2d)


@dataclass(frozen=True)
class Flatten(Module):
    """Flatten all axes from ``start_dim`` on (default: keep the batch axis)."""

    start_dim: int = 1

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        return None

    def apply(self, params: Params, x: Any) -> Any:
        sh = ops.shape(x)
        return ops.reshape(x, sh[: self.start_dim] + (-1,))


@dataclass(frozen=True)
class Activation(Module):
    """A parameter-free elementwise function as a layer: ``Activation("relu")``."""

    fn: str | Callable = "relu"

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        return None

    def apply(self, params: Params, x: Any) -> Any:
        return _activation(self.fn)(x)


def GELU(approximate: str = "none") -> Activation:
    """PyTorch's ``nn.GELU(approximate=...)``: exact (erf) or the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Activation(lambda x: ops.gelu(x, approximate))


def ReLU() -> Activation:
    return Activation("relu")


def Tanh() -> Activation:
    return Activation("tanh")


def Sigmoid() -> Activation:
    return Activation("sigmoid")


@dataclass(frozen=True)
class Embedding(Module):
    """Row lookup in a (num_embeddings, dim) table initialised N(0, 1) (PyTorch's default)."""

    num_embeddings: int
    embedding_dim: int
    init_fn: Callable | str | None = None

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        f = I.get(self.init_fn) if self.init_fn is not None else I.normal(1.0)
        return {"table": f(rng, (self.num_embeddings, self.embedding_dim), dtype)}

    def apply(self, params: Params, idx: Any) -> Any:
        return ops.take(params["table"], idx, axis=0)


@dataclass(frozen=True)
class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` axes, then scale by gamma and shift by beta."""

    normalized_shape: int | tuple
    eps: float = 1e-5
    elementwise_affine: bool = True

    @property
    def _shape(self) -> tuple:
        return (self.normalized_shape,) if isinstance(self.normalized_shape, int) else tuple(self.normalized_shape)

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        if not self.elementwise_affine:
            return None
        return {"gamma": np.ones(self._shape, dtype), "beta": np.zeros(self._shape, dtype)}

    def apply(self, params: Params, x: Any) -> Any:
        axes = tuple(range(-len(self._shape), 0))
        if params is None:
            return ops.layer_norm(x, None, None, self.eps, axes)
        return ops.layer_norm(x, params["gamma"], params["beta"], self.eps, axes)


@dataclass(frozen=True)
class GRUCell(Module):
    """r = s(x Wir + bir + h Whr + bhr); z likewise; n = tanh(x Win + bin + r (h Whn + bhn));
    h' = (1 - z) n + z h.  Weights (in, 3H) and (H, 3H) with gates ordered r, z, n."""

    input_size: int
    hidden_size: int

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        u = I.uniform(1.0 / math.sqrt(self.hidden_size))
        H = self.hidden_size
        return {
            "w_ih": u(rng, (self.input_size, 3 * H), dtype),
            "w_hh": u(rng, (H, 3 * H), dtype),
            "b_ih": u(rng, (3 * H,), dtype),
            "b_hh": u(rng, (3 * H,), dtype),
        }

    def apply(self, params: Params, x: Any, h: Any) -> Any:
        gi = ops.add(ops.matmul(x, params["w_ih"]), params["b_ih"])
        gh = ops.add(ops.matmul(h, params["w_hh"]), params["b_hh"])
        ir, iz, in_ = ops.split(gi, 3, axis=-1)
        hr, hz, hn = ops.split(gh, 3, axis=-1)
        r = ops.sigmoid(ops.add(ir, hr))
        z = ops.sigmoid(ops.add(iz, hz))
        n = ops.tanh(ops.add(in_, ops.multiply(r, hn)))
        return ops.add(ops.multiply(ops.subtract(1.0, z), n), ops.multiply(z, h))

    def initial_state(self, batch: int, dtype: Any = np.float32) -> np.ndarray:
        return np.zeros((batch, self.hidden_size), dtype)


@dataclass(frozen=True)
class LSTMCell(Module):
    """Gates i, f, g, o from x W_ih + b_ih + h W_hh + b_hh; c' = f c + i g; h' = o tanh(c').
    ``apply(params, x, (h, c)) -> (h', c')``."""

    input_size: int
    hidden_size: int

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        u = I.uniform(1.0 / math.sqrt(self.hidden_size))
        H = self.hidden_size
        return {
            "w_ih": u(rng, (self.input_size, 4 * H), dtype),
            "w_hh": u(rng, (H, 4 * H), dtype),
            "b_ih": u(rng, (4 * H,), dtype),
            "b_hh": u(rng, (4 * H,), dtype),
        }

    def apply(self, params: Params, x: Any, state: tuple) -> tuple:
        h, c = state
        g = ops.add(
            ops.add(ops.matmul(x, params["w_ih"]), params["b_ih"]), ops.add(ops.matmul(h, params["w_hh"]), params["b_hh"])
        )
        i, f, gg, o = ops.split(g, 4, axis=-1)
        i, f, o = ops.sigmoid(i), ops.sigmoid(f), ops.sigmoid(o)
        c2 = ops.add(ops.multiply(f, c), ops.multiply(i, ops.tanh(gg)))
        h2 = ops.multiply(o, ops.tanh(c2))
        return h2, c2

    def initial_state(self, batch: int, dtype: Any = np.float32) -> tuple:
        z = np.zeros((batch, self.hidden_size), dtype)
        return z, z.copy()


@dataclass(frozen=True)
class Sequential(Module):
    """Layers applied in order; params is a list with one entry per layer (None if it has none).
    Plain functions (e.g. ``ops.relu``) are accepted as parameter-free layers."""

    layers: Sequence[Any] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        return [layer.init(rng, dtype) if isinstance(layer, Module) else None for layer in self.layers]

    def apply(self, params: Params, x: Any) -> Any:
        if len(params) != len(self.layers):
            raise ValueError(f"Sequential has {len(self.layers)} layers but params has {len(params)} entries")
        for layer, p in zip(self.layers, params):
            x = layer.apply(p, x) if isinstance(layer, Module) else layer(x)
        return x


@dataclass(frozen=True)
class Dropout(Module):
    """Inverted dropout (Srivastava et al., 2014; PyTorch's ``nn.Dropout``): ``apply(params, x, key)``
    zeroes each element with probability ``rate`` and scales the rest by ``1 / (1 - rate)``;
    ``key=None`` (evaluation) returns ``x`` unchanged.  The mask comes from
    ``engine.random.bernoulli(key, ...)``, so it is the same eagerly, under ``jit`` and ``vmap``."""

    rate: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"Dropout: rate must lie in [0, 1), got {self.rate}")

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        return None

    def apply(self, params: Params, x: Any, key: Any = None) -> Any:
        if key is None or self.rate == 0.0:
            return x
        keep = _random.bernoulli(key, 1.0 - self.rate, ops.shape(x))
        return ops.where(keep, ops.multiply(x, 1.0 / (1.0 - self.rate)), ops.zeros_like(x))


@dataclass(frozen=True)
class BatchNorm(Module):
    """Batch normalisation (Ioffe & Szegedy, 2015) over every axis but ``axis`` (the channels:
    PyTorch's BatchNorm1d on (N, C) / (N, C, L) and BatchNorm2d on NCHW).

    ``params = bn.init()`` holds ``gamma``/``beta``; ``state = bn.init_state()`` the running
    ``mean``/``var``.  ``y, state = bn.apply(params, x, state, train=True)`` normalises with the
    batch's statistics (biased variance) and returns the running statistics updated as PyTorch
    does (``(1 - momentum) * running + momentum * batch``, the variance unbiased);
    ``train=False`` normalises with the running statistics and returns ``state`` unchanged.
    """

    num_features: int
    eps: float = 1e-5
    momentum: float = 0.1
    affine: bool = True
    axis: int = 1

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        if not self.affine:
            return None
        return {"gamma": np.ones(self.num_features, dtype), "beta": np.zeros(self.num_features, dtype)}

    def init_state(self, dtype: Any = np.float32) -> dict:
        return {"mean": np.zeros(self.num_features, dtype), "var": np.ones(self.num_features, dtype)}

    def _bshape(self, nd: int) -> tuple:
        ax = self.axis % nd
        return tuple(self.num_features if i == ax else 1 for i in range(nd))

    def apply(self, params: Params, x: Any, state: dict, train: bool = False) -> tuple:
        nd = ops.ndim(x)
        ax = self.axis % nd
        if ops.shape(x)[ax] != self.num_features:
            raise ValueError(f"BatchNorm: expected {self.num_features} features on axis {ax}, got shape {ops.shape(x)}")
        bshape = self._bshape(nd)
        red = tuple(i for i in range(nd) if i != ax)
        if train:
            n = int(np.prod([ops.shape(x)[i] for i in red]))
            if n < 2:
                raise ValueError(f"BatchNorm: training needs more than one value per channel, got shape {ops.shape(x)}")
            mu = ops.mean(x, red)
            d = ops.subtract(x, ops.reshape(mu, bshape))
            var = ops.mean(ops.multiply(d, d), red)
            m = self.momentum
            new_state = {
                "mean": ops.add(ops.multiply(state["mean"], 1.0 - m), ops.multiply(ops.stop_gradient(mu), m)),
                "var": ops.add(ops.multiply(state["var"], 1.0 - m), ops.multiply(ops.stop_gradient(var), m * n / (n - 1))),
            }
        else:
            d = ops.subtract(x, ops.reshape(state["mean"], bshape))
            var = state["var"]
            new_state = state
        y = ops.multiply(d, ops.reshape(ops.rsqrt(ops.add(var, self.eps)), bshape))
        if params is not None:
            y = ops.add(ops.multiply(y, ops.reshape(params["gamma"], bshape)), ops.reshape(params["beta"], bshape))
        return y, new_state


@dataclass(frozen=True)
class GroupNorm(Module):
    """Group normalisation (Wu & He, 2018; PyTorch's ``nn.GroupNorm``): the C channels of an (N, C, ...)
    input are cut into ``num_groups`` groups; each example's group is normalised by its own mean and
    (biased) variance, then each channel is scaled by gamma and shifted by beta.  Composed of existing
    ops, so its gradients and batching come from theirs."""

    num_groups: int
    num_channels: int
    eps: float = 1e-5
    affine: bool = True

    def __post_init__(self) -> None:
        if self.num_groups < 1 or self.num_channels % self.num_groups:
            raise ValueError(f"GroupNorm: num_channels ({self.num_channels}) must be a positive multiple of "
                             f"num_groups ({self.num_groups})")

    def init(self, seed: Any = 0, dtype: Any = np.float32) -> Params:
        if not self.affine:
            return None
        return {"gamma": np.ones(self.num_channels, dtype), "beta": np.zeros(self.num_channels, dtype)}

    def apply(self, params: Params, x: Any) -> Any:
        sh = ops.shape(x)
        if len(sh) < 2 or sh[1] != self.num_channels:
            raise ValueError(f"GroupNorm: expected (N, {self.num_channels}, ...) input, got shape {sh}")
        g = self.num_groups
        z = ops.reshape(x, (sh[0], g, -1))
        mu = ops.mean(z, 2, keepdims=True)
        d = ops.subtract(z, mu)
        var = ops.mean(ops.multiply(d, d), 2, keepdims=True)
        y = ops.reshape(ops.multiply(d, ops.rsqrt(ops.add(var, self.eps))), sh)
        if params is None:
            return y
        bshape = (1, self.num_channels) + (1,) * (len(sh) - 2)
        return ops.add(ops.multiply(y, ops.reshape(params["gamma"], bshape)), ops.reshape(params["beta"], bshape))


@dataclass(frozen=True)
class LSTM(Module):
    """``num_layers`` stacked :class:`LSTMCell` layers over a (batch, time, features) sequence from zero
    states (PyTorch's ``nn.LSTM(batch_first=True)``); returns the last layer's hidden states
    (batch, time, hidden_size).  The time loop is one ``engine.scan`` per layer (``unroll=True``
    writes it as a Python loop of cells instead); params is a list with one cell's dict per layer."""

    input_size: int
    hidden_size: int
    num_layers: int = 1
    unroll: bool = False

    @property
    def cells(self) -> list[LSTMCell]:
        return [LSTMCell(self.input_size if i == 0 else self.hidden_size, self.hidden_size)
                for i in range(self.num_layers)]

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        return [cell.init(rng, dtype) for cell in self.cells]

    def apply(self, params: Params, x: Any) -> Any:
        h = ops.swapaxes(x, 0, 1)  # (time, batch, features): scan runs over the leading axis
        for cell, p in zip(self.cells, params):
            zero = np.zeros((ops.shape(h)[1], self.hidden_size), aval_of(h).dtype)
            if self.unroll:
                state, outs = (zero, zero), []
                for t in range(ops.shape(h)[0]):
                    state = cell.apply(p, h[t], state)
                    outs.append(state[0])
                h = ops.stack(outs, 0)
            else:
                def step(state, xt, cell=cell, p=p):
                    new = cell.apply(p, xt, state)
                    return new, new[0]

                _, h = _scan(step, (zero, zero), h)
        return ops.swapaxes(h, 0, 1)


@dataclass(frozen=True)
class MultiHeadSelfAttention(Module):
    """Scaled dot-product self-attention with ``num_heads`` heads (Vaswani et al., 2017) as PyTorch's
    ``nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)`` computes it with ``q = k = v = x``:
    one input projection ``w_qkv`` (embed_dim, 3 embed_dim) giving q, k, v in that order, softmax(q k^T /
    sqrt(head_dim) + mask) v per head, and the output projection ``w_out``.  ``mask`` is an additive
    (time, time) array (``-inf`` where a position may not attend), e.g. :func:`causal_mask`."""

    embed_dim: int
    num_heads: int

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.embed_dim % self.num_heads:
            raise ValueError(f"MultiHeadSelfAttention: embed_dim ({self.embed_dim}) must be a positive multiple of "
                             f"num_heads ({self.num_heads})")

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        e = self.embed_dim
        xavier = I.uniform(math.sqrt(6.0 / (e + 3 * e)))  # PyTorch: xavier_uniform_ on in_proj, zero biases
        return {"w_qkv": xavier(rng, (e, 3 * e), dtype), "b_qkv": np.zeros(3 * e, dtype),
                "w_out": I.lecun_uniform()(rng, (e, e), dtype), "b_out": np.zeros(e, dtype)}

    def apply(self, params: Params, x: Any, mask: Any = None) -> Any:
        b, t, e = ops.shape(x)
        nh = self.num_heads
        hd = e // nh
        qkv = ops.add(ops.matmul(x, params["w_qkv"]), params["b_qkv"])
        q, k, v = (ops.transpose(ops.reshape(z, (b, t, nh, hd)), (0, 2, 1, 3)) for z in ops.split(qkv, 3, axis=-1))
        scores = ops.multiply(ops.matmul(q, ops.swapaxes(k, -1, -2)), 1.0 / math.sqrt(hd))
        if mask is not None:
            scores = ops.add(scores, mask)
        att = ops.matmul(ops.softmax(scores, -1), v)  # (b, heads, t, head_dim)
        att = ops.reshape(ops.transpose(att, (0, 2, 1, 3)), (b, t, e))
        return ops.add(ops.matmul(att, params["w_out"]), params["b_out"])


def causal_mask(length: int, dtype: Any = np.float32) -> np.ndarray:
    """The additive mask letting position i attend to positions <= i (0 there, -inf above the diagonal)."""
    return np.triu(np.full((length, length), -np.inf, dtype), 1)


@dataclass(frozen=True)
class TransformerEncoderLayer(Module):
    """PyTorch's ``nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0, batch_first=True)``:
    post-norm ``x = LN1(x + SA(x)); x = LN2(x + W2 act(W1 x))`` (``norm_first=True``: pre-norm
    ``x = x + SA(LN1(x)); x = x + FF(LN2(x))``), activation ``relu`` or ``gelu``, no dropout."""

    d_model: int
    num_heads: int
    dim_feedforward: int
    activation: str = "relu"
    norm_first: bool = False
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"TransformerEncoderLayer: activation must be relu or gelu, got {self.activation!r}")

    def _parts(self):
        return (MultiHeadSelfAttention(self.d_model, self.num_heads), Linear(self.d_model, self.dim_feedforward),
                Linear(self.dim_feedforward, self.d_model), LayerNorm(self.d_model, self.eps),
                LayerNorm(self.d_model, self.eps))

    def init(self, seed: int | np.random.Generator = 0, dtype: Any = np.float32) -> Params:
        rng = as_rng(seed)
        names = ("attn", "ff1", "ff2", "norm1", "norm2")
        return {n: m.init(rng, dtype) for n, m in zip(names, self._parts())}

    def apply(self, params: Params, x: Any, mask: Any = None) -> Any:
        attn, ff1, ff2, n1, n2 = self._parts()
        act = ops.relu if self.activation == "relu" else ops.gelu

        def ff(z):
            return ff2.apply(params["ff2"], act(ff1.apply(params["ff1"], z)))

        if self.norm_first:
            x = ops.add(x, attn.apply(params["attn"], n1.apply(params["norm1"], x), mask))
            return ops.add(x, ff(n2.apply(params["norm2"], x)))
        x = n1.apply(params["norm1"], ops.add(x, attn.apply(params["attn"], x, mask)))
        return n2.apply(params["norm2"], ops.add(x, ff(x)))
