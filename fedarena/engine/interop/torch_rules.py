"""Engine rules for the nodes of a ``torch.fx`` graph: one table for leaf modules, one for functions,
one for tensor methods.

Every rule is written with engine ops (``fedarena.engine.ops``), so a converted model runs eagerly on
numpy arrays and traces under ``jit``/``grad``/``vmap`` like any engine function. Function and method
rules take PyTorch's own signatures (argument names, defaults, keywords), so a keyword the engine does
not support fails as a ``TypeError`` naming it, and a supported argument with an unsupported value
raises :class:`Unsupported` with the reason. A module rule is ``prepare(module) -> apply(get, *args)``:
``prepare`` checks the module's configuration when the model is converted, ``apply`` runs it, reading
the module's tensors by their local names (``get("weight")``) from the parameters of the call.

PyTorch's layer formulas are the reference (``torch.nn`` documentation): ``Linear`` is
``x W^T + b`` with ``W`` stored (out, in); ``BatchNorm`` in eval mode is
``(x - running_mean) / sqrt(running_var + eps) * weight + bias`` over channel axis 1; ``LayerNorm``
normalises the trailing ``normalized_shape`` axes with the biased variance; ``GELU`` is exact (erf)
or the tanh approximation; ``AvgPool2d`` counts padded zeros (``count_include_pad=True``).
``GRUCell``/``LSTMCell`` store ``weight_ih`` (gates x in) with the gates ordered r, z, n / i, f, g, o and run
the engine's own cells (:class:`fedarena.engine.nn.GRUCell`, :class:`~fedarena.engine.nn.LSTMCell`) on the
transposed weights. Scaled dot-product attention (Vaswani et al., 2017, "Attention is all you need") is
``softmax(q k^T * scale + mask) v`` with ``scale = 1/sqrt(d)``; ``F.scaled_dot_product_attention``'s boolean
mask marks the pairs that take part, ``nn.MultiheadAttention``'s boolean ``attn_mask`` and
``key_padding_mask`` the pairs that do not (a float mask is added in both). ``MultiheadAttention`` projects
with ``in_proj_weight`` (or ``q/k/v_proj_weight`` when key and value sizes differ), splits ``num_heads``
heads, attends, and projects with ``out_proj``; its weights are the heads' average unless
``average_attn_weights=False``.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np

from .. import nn as engine_nn
from .. import ops

Rule = Callable[..., Any]


class Unsupported(Exception):
    """A node the engine cannot run as configured (the converter adds the node's name and path)."""


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _shape_arg(args: tuple) -> tuple:
    """``x.view(2, -1)`` and ``x.view((2, -1))`` both give ``(2, -1)``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _axes(dim: Any) -> Any:
    return tuple(dim) if isinstance(dim, (tuple, list)) else dim


def _no_dtype(dtype: Any) -> None:
    if dtype is not None:
        raise Unsupported(f"dtype={dtype} is not supported (cast the result instead)")


# ============================================================================ shared layer arithmetic


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    y = ops.matmul(x, ops.transpose(weight))
    return y if bias is None else y + bias


def _same_padding(kernel: tuple, dilation: tuple) -> tuple:
    """PyTorch's ``padding="same"``: total ``d (k - 1)`` per axis, the odd one on the right."""
    return tuple(((d * (k - 1)) // 2, d * (k - 1) - (d * (k - 1)) // 2) for k, d in zip(kernel, dilation))


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:
    """``torch.nn.functional.conv2d``: NCHW input (or CHW), OIHW weight, zero padding (an int, a pair,
    ``"valid"`` or ``"same"``); ``groups > 1`` runs one engine convolution per group of channels."""
    stride, dilation = _pair(stride), _pair(dilation)
    unbatched = len(x.shape) == 3
    if unbatched:
        x = ops.expand_dims(x, 0)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            (t, b), (lft, r) = _same_padding(tuple(weight.shape[2:]), dilation)
            if (t, lft) != (b, r):
                x = ops.pad(x, [(0, 0), (0, 0), (t, b), (lft, r)])
                padding = (0, 0)
            else:
                padding = (t, lft)
        else:
            raise Unsupported(f"padding={padding!r}: expected an int, a pair, 'valid' or 'same'")
    padding = _pair(padding)
    groups = int(groups)
    if groups == 1:
        y = ops.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, bias=bias)
    else:
        if x.shape[1] % groups or weight.shape[0] % groups:
            raise Unsupported(f"groups={groups} does not divide the {x.shape[1]} input / {weight.shape[0]} "
                              "output channels")
        xs, ws = ops.split(x, groups, axis=1), ops.split(weight, groups, axis=0)
        bs = ops.split(bias, groups, axis=0) if bias is not None else [None] * groups
        y = ops.concatenate([ops.conv2d(xg, wg, stride=stride, padding=padding, dilation=dilation, bias=bg)
                             for xg, wg, bg in zip(xs, ws, bs)], axis=1)
    return ops.squeeze(y, 0) if unbatched else y


def conv1d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:
    """``torch.nn.functional.conv1d`` as a 2-d convolution over a height-1 image."""
    one = lambda v: v[0] if isinstance(v, (tuple, list)) else v  # noqa: E731
    unbatched = len(x.shape) == 2
    if unbatched:
        x = ops.expand_dims(x, 0)
    pad = padding if isinstance(padding, str) else (0, int(one(padding)))
    y = conv2d(ops.expand_dims(x, 2), ops.expand_dims(weight, 2), bias, (1, int(one(stride))), pad,
               (1, int(one(dilation))), groups)
    y = ops.squeeze(y, 2)
    return ops.squeeze(y, 0) if unbatched else y


def _channel_shape(x: Any) -> tuple:
    return (1, x.shape[1]) + (1,) * (len(x.shape) - 2)


def batch_norm_eval(x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> Any:
    shape = _channel_shape(x)
    y = (x - ops.reshape(mean, shape)) * ops.rsqrt(ops.reshape(var, shape) + eps)
    if weight is not None:
        y = y * ops.reshape(weight, shape)
    if bias is not None:
        y = y + ops.reshape(bias, shape)
    return y


def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    k = len(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else 1
    return ops.layer_norm(x, weight, bias, eps=eps, axis=tuple(range(-k, 0)))


def _check_max_pool(dilation: Any, ceil_mode: bool, return_indices: bool) -> None:
    if _pair(dilation) != (1, 1) or ceil_mode or return_indices:
        raise Unsupported("max pooling with dilation, ceil_mode or return_indices is not supported")


def _check_avg_pool(ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> None:
    if ceil_mode or not count_include_pad or divisor_override is not None:
        raise Unsupported("average pooling supports only ceil_mode=False, count_include_pad=True and "
                          "divisor_override=None")


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    _check_max_pool(dilation, ceil_mode, return_indices)
    return ops.max_pool2d(x, kernel_size, stride if stride not in (None, (), []) else None, padding)


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: Any = None) -> Any:
    _check_avg_pool(ceil_mode, count_include_pad, divisor_override)
    return ops.avg_pool2d(x, kernel_size, stride if stride not in (None, (), []) else None, padding)


def adaptive_avg_pool2d(x: Any, output_size: Any) -> Any:
    """Exact when each output cell averages an equal block: (1, 1), or sizes dividing the input's."""
    oh, ow = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    h, w = x.shape[-2:]
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    if (oh, ow) == (1, 1):
        return ops.mean(x, axis=(-2, -1), keepdims=True)
    if h % oh or w % ow:
        raise Unsupported(f"adaptive average pooling from {h}x{w} to {oh}x{ow} needs sizes that divide the input's")
    k = (h // oh, w // ow)
    return ops.avg_pool2d(x, k, k, 0)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    shape = tuple(x.shape)
    if not shape:
        return ops.reshape(x, (1,))
    s, e = start_dim % len(shape), end_dim % len(shape)
    return ops.reshape(x, shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:])


def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    if training and p > 0:
        raise Unsupported("dropout in training mode is random; convert the model in eval mode (module.eval())")
    return x


def gelu(x: Any, approximate: str = "none") -> Any:
    return ops.gelu(x, approximate=approximate)


def silu(x: Any, inplace: bool = False) -> Any:
    return x * ops.sigmoid(x)


def relu(x: Any, inplace: bool = False) -> Any:
    return ops.relu(x)


def relu6(x: Any, inplace: bool = False) -> Any:
    return ops.clip(x, 0.0, 6.0)


def leaky_relu(x: Any, negative_slope: float = 0.01, inplace: bool = False) -> Any:
    return ops.leaky_relu(x, negative_slope)


def softmax(x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    _no_dtype(dtype)
    if dim is None:
        raise Unsupported("softmax without dim (give dim explicitly)")
    return ops.softmax(x, axis=dim)


def log_softmax(x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    _no_dtype(dtype)
    if dim is None:
        raise Unsupported("log_softmax without dim (give dim explicitly)")
    return ops.log_softmax(x, axis=dim)


def embedding(indices: Any, weight: Any) -> Any:
    return ops.take(weight, indices, axis=0)


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    """``F.scaled_dot_product_attention``: ``(..., L, E) x (..., S, E) x (..., S, Ev) -> (..., L, Ev)``."""
    if dropout_p:
        raise Unsupported("dropout_p > 0 is random; pass dropout_p=0.0 (evaluation)")
    if enable_gqa:
        raise Unsupported("enable_gqa=True (grouped-query attention) is not supported")
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        if attn_mask is not None:
            raise Unsupported("is_causal=True together with attn_mask (PyTorch refuses it too)")
        attn_mask = np.tril(np.ones((L, S), dtype=bool))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    scores = ops.matmul(query, ops.swapaxes(key, -1, -2)) * scale
    if attn_mask is not None:
        if np.dtype(attn_mask.dtype) == np.bool_:
            scores = ops.where(attn_mask, scores, -np.inf)  # True: takes part
        else:
            scores = scores + attn_mask
    return ops.matmul(ops.softmax(scores, axis=-1), value)


def _cell_state(x: Any, hidden: int) -> np.ndarray:
    return np.zeros(tuple(x.shape[:-1]) + (hidden,), dtype=x.dtype)


# ============================================================================ leaf modules


def _cell_params(get: Any, gates: int, hidden: int, dtype: Any) -> dict:
    """The engine cell's parameters (weights (in, gates H)) from PyTorch's ((gates H, in)), zero biases when
    the module has none."""
    params = {"w_ih": ops.transpose(get("weight_ih")), "w_hh": ops.transpose(get("weight_hh"))}
    for name in ("b_ih", "b_hh"):
        b = get(name.replace("b_", "bias_"))
        params[name] = np.zeros(gates * hidden, dtype=dtype) if b is None else b
    return params


def _prepare_gru_cell(m: Any) -> Rule:
    cell = engine_nn.GRUCell(int(m.input_size), int(m.hidden_size))

    def apply(get: Any, x: Any, hx: Any = None) -> Any:
        h = _cell_state(x, cell.hidden_size) if hx is None else hx
        return cell.apply(_cell_params(get, 3, cell.hidden_size, x.dtype), x, h)
    return apply


def _prepare_lstm_cell(m: Any) -> Rule:
    cell = engine_nn.LSTMCell(int(m.input_size), int(m.hidden_size))

    def apply(get: Any, x: Any, hx: Any = None) -> Any:
        if hx is None:
            hx = (_cell_state(x, cell.hidden_size), _cell_state(x, cell.hidden_size))
        return tuple(cell.apply(_cell_params(get, 4, cell.hidden_size, x.dtype), x, tuple(hx)))
    return apply


def _heads(x: Any, n: int, heads: int) -> Any:
    """(n, L, E) -> (n, heads, L, E / heads)."""
    L, E = x.shape[-2], x.shape[-1]
    return ops.transpose(ops.reshape(x, (n, L, heads, E // heads)), (0, 2, 1, 3))


def _prepare_multihead_attention(m: Any) -> Rule:
    if m.bias_k is not None or m.add_zero_attn:
        raise Unsupported("MultiheadAttention with add_bias_kv or add_zero_attn is not supported")
    if m.training and m.dropout > 0:
        raise Unsupported("MultiheadAttention dropout in training mode is random; convert the model in eval mode "
                          "(module.eval())")
    E, heads, batch_first, same = int(m.embed_dim), int(m.num_heads), bool(m.batch_first), bool(m._qkv_same_embed_dim)

    def apply(get: Any, query: Any, key: Any, value: Any, key_padding_mask: Any = None, need_weights: bool = True,
              attn_mask: Any = None, average_attn_weights: bool = True, is_causal: bool = False) -> Any:
        if is_causal and attn_mask is None:
            raise Unsupported("is_causal=True needs attn_mask (PyTorch's hint; pass the causal mask)")
        unbatched = len(query.shape) == 2
        if unbatched:
            query, key, value = (ops.expand_dims(t, 0) for t in (query, key, value))
        elif not batch_first:
            query, key, value = (ops.swapaxes(t, 0, 1) for t in (query, key, value))
        n = query.shape[0]
        b = get("in_proj_bias")
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if same:
            w = get("in_proj_weight")
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = get("q_proj_weight"), get("k_proj_weight"), get("v_proj_weight")
        q, k, v = (_heads(linear(t, wt, bt), n, heads) for t, wt, bt in ((query, wq, bq), (key, wk, bk), (value, wv, bv)))
        L, S = q.shape[2], k.shape[2]
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(E // heads))  # (n, heads, L, S)
        for mask, shape in ((attn_mask, None), (key_padding_mask, (n, 1, 1, S))):
            if mask is None:
                continue
            if shape is None:  # (L, S) or (n * heads, L, S)
                shape = (1, 1, L, S) if len(mask.shape) == 2 else (n, heads, L, S)
            mask = ops.reshape(mask, shape) if hasattr(mask, "shape") and not isinstance(mask, np.ndarray) \
                else np.reshape(mask, shape)
            if np.dtype(mask.dtype) == np.bool_:
                scores = ops.where(mask, -np.inf, scores)  # True: left out
            else:
                scores = scores + mask
        weights = ops.softmax(scores, axis=-1)
        out = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (n, L, E))
        out = linear(out, get("out_proj.weight"), get("out_proj.bias"))
        if unbatched:
            out = ops.squeeze(out, 0)
        elif not batch_first:
            out = ops.swapaxes(out, 0, 1)
        if not need_weights:
            return out, None
        w_out = ops.mean(weights, axis=1) if average_attn_weights else weights
        return out, (ops.squeeze(w_out, 0) if unbatched else w_out)
    return apply




def _activation(fn: Callable[[Any], Any]) -> Rule:
    return lambda m: (lambda get, x: fn(x))


def _prepare_linear(m: Any) -> Rule:
    return lambda get, x: linear(x, get("weight"), get("bias"))


def _prepare_conv(conv: Callable) -> Rule:
    def prepare(m: Any) -> Rule:
        if m.padding_mode != "zeros":
            raise Unsupported(f"padding_mode={m.padding_mode!r} (only 'zeros' is supported)")
        return lambda get, x: conv(x, get("weight"), get("bias"), m.stride, m.padding, m.dilation, m.groups)
    return prepare


def _prepare_batch_norm(m: Any) -> Rule:
    if m.training:
        raise Unsupported("batch norm in training mode uses batch statistics; convert the model in eval mode "
                          "(module.eval())")
    if m.running_mean is None:
        raise Unsupported("batch norm without running statistics (track_running_stats=False) is not supported")
    eps = float(m.eps)
    return lambda get, x: batch_norm_eval(x, get("running_mean"), get("running_var"), get("weight"), get("bias"), eps)


def _prepare_layer_norm(m: Any) -> Rule:
    shape, eps = tuple(m.normalized_shape), float(m.eps)
    return lambda get, x: layer_norm(x, shape, get("weight"), get("bias"), eps)


def _prepare_dropout(m: Any) -> Rule:
    if m.training and m.p > 0:
        raise Unsupported("dropout in training mode is random; convert the model in eval mode (module.eval())")
    return lambda get, x: x


def _prepare_embedding(m: Any) -> Rule:
    if m.max_norm is not None or m.scale_grad_by_freq:
        raise Unsupported("embedding with max_norm or scale_grad_by_freq is not supported")
    return lambda get, idx: embedding(idx, get("weight"))


def _prepare_max_pool(m: Any) -> Rule:
    _check_max_pool(m.dilation, m.ceil_mode, m.return_indices)
    return lambda get, x: max_pool2d(x, m.kernel_size, m.stride, m.padding)


def _prepare_avg_pool(m: Any) -> Rule:
    _check_avg_pool(m.ceil_mode, m.count_include_pad, m.divisor_override)
    return lambda get, x: avg_pool2d(x, m.kernel_size, m.stride, m.padding)


def module_rules(torch: Any) -> dict[type, Rule]:
    """``{torch.nn layer class: prepare}`` for the leaf modules ``torch.fx`` leaves in a graph."""
    nn = torch.nn
    return {
        nn.Linear: _prepare_linear,
        nn.Conv1d: _prepare_conv(conv1d),
        nn.Conv2d: _prepare_conv(conv2d),
        nn.BatchNorm1d: _prepare_batch_norm,
        nn.BatchNorm2d: _prepare_batch_norm,
        nn.LayerNorm: _prepare_layer_norm,
        nn.ReLU: _activation(ops.relu),
        nn.ReLU6: _activation(relu6),
        nn.Tanh: _activation(ops.tanh),
        nn.Sigmoid: _activation(ops.sigmoid),
        nn.SiLU: _activation(silu),
        nn.GELU: lambda m: (lambda get, x: ops.gelu(x, approximate=m.approximate)),
        nn.LeakyReLU: lambda m: (lambda get, x: ops.leaky_relu(x, float(m.negative_slope))),
        nn.Softmax: lambda m: (lambda get, x: softmax(x, m.dim)),
        nn.LogSoftmax: lambda m: (lambda get, x: log_softmax(x, m.dim)),
        nn.MaxPool2d: _prepare_max_pool,
        nn.AvgPool2d: _prepare_avg_pool,
        nn.AdaptiveAvgPool2d: lambda m: (lambda get, x: adaptive_avg_pool2d(x, m.output_size)),
        nn.Flatten: lambda m: (lambda get, x: flatten(x, m.start_dim, m.end_dim)),
        nn.Dropout: _prepare_dropout,
        nn.Identity: lambda m: (lambda get, x: x),
        nn.Embedding: _prepare_embedding,
        nn.GRUCell: _prepare_gru_cell,
        nn.LSTMCell: _prepare_lstm_cell,
        nn.MultiheadAttention: _prepare_multihead_attention,
    }


# ============================================================================ functions and methods


def _add(input: Any, other: Any, *, alpha: Any = 1) -> Any:
    return input + (other if alpha == 1 else other * alpha)


def _sub(input: Any, other: Any, *, alpha: Any = 1) -> Any:
    return input - (other if alpha == 1 else other * alpha)


def _div(input: Any, other: Any, *, rounding_mode: Any = None) -> Any:
    if rounding_mode is None:
        return input / other
    if rounding_mode == "floor":
        return ops.floor_divide(input, other)
    raise Unsupported(f"rounding_mode={rounding_mode!r} (only None and 'floor' are supported)")


def _reduction(fn: Callable) -> Rule:
    def rule(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
        _no_dtype(dtype)
        return fn(input, axis=_axes(dim), keepdims=keepdim)
    return rule


def _cat(tensors: Any, dim: int = 0) -> Any:
    return ops.concatenate(list(tensors), axis=dim)


def _stack(tensors: Any, dim: int = 0) -> Any:
    return ops.stack(list(tensors), axis=dim)


def _squeeze(input: Any, dim: Any = None) -> Any:
    if dim is None:
        return ops.squeeze(input)
    dims = [d % len(input.shape) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
    keep = tuple(d for d in dims if input.shape[d] == 1)  # PyTorch ignores dims whose size is not 1
    return ops.squeeze(input, keep) if keep else input


def _unsqueeze(input: Any, dim: int) -> Any:
    return ops.expand_dims(input, dim)


def _transpose(input: Any, dim0: int, dim1: int) -> Any:
    return ops.swapaxes(input, dim0, dim1)


def _permute(input: Any, *dims: Any) -> Any:
    return ops.transpose(input, _shape_arg(dims))


def _reshape(input: Any, *shape: Any) -> Any:
    return ops.reshape(input, _shape_arg(shape))


def _t(input: Any) -> Any:
    return ops.transpose(input) if len(input.shape) == 2 else input


def _size(input: Any, dim: Any = None) -> Any:
    return tuple(input.shape) if dim is None else input.shape[dim]


def _getattr(obj: Any, name: str) -> Any:
    if name == "shape":
        return tuple(obj.shape)
    if name == "ndim":
        return len(obj.shape)
    if name == "T":
        return ops.transpose(obj)
    raise Unsupported(f"attribute {name!r} of a tensor (only shape, ndim and T)")


def _unary(fn: Callable) -> Rule:
    return lambda input: fn(input)


_OPERATORS: dict[Any, Rule] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.truediv: operator.truediv, operator.floordiv: operator.floordiv, operator.neg: operator.neg,
    operator.matmul: operator.matmul, operator.pow: operator.pow, operator.getitem: operator.getitem,
    getattr: _getattr,
}


def function_rules(torch: Any) -> dict[Any, Rule]:
    """``{call_function target: rule}`` for Python operators, ``torch.*`` and ``torch.nn.functional.*``."""
    F = torch.nn.functional
    rules: dict[Any, Rule] = dict(_OPERATORS)
    rules.update({
        torch.add: _add, torch.sub: _sub, torch.subtract: _sub, torch.mul: lambda input, other: input * other,
        torch.multiply: lambda input, other: input * other, torch.div: _div, torch.divide: _div,
        torch.neg: _unary(ops.negative), torch.matmul: ops.matmul, torch.mm: ops.matmul, torch.bmm: ops.matmul,
        torch.relu: _unary(ops.relu), torch.tanh: _unary(ops.tanh), torch.sigmoid: _unary(ops.sigmoid),
        torch.exp: _unary(ops.exp), torch.log: _unary(ops.log), torch.sqrt: _unary(ops.sqrt),
        torch.rsqrt: _unary(ops.rsqrt), torch.abs: _unary(ops.abs), torch.sin: _unary(ops.sin),
        torch.cos: _unary(ops.cos), torch.square: _unary(ops.square),
        torch.flatten: flatten, torch.cat: _cat, torch.concat: _cat, torch.concatenate: _cat, torch.stack: _stack,
        torch.reshape: lambda input, shape: ops.reshape(input, tuple(shape)),
        torch.permute: lambda input, dims: ops.transpose(input, tuple(dims)),
        torch.transpose: _transpose, torch.swapaxes: _transpose, torch.unsqueeze: _unsqueeze,
        torch.squeeze: _squeeze, torch.mean: _reduction(ops.mean), torch.sum: _reduction(ops.sum),
        torch.softmax: softmax, torch.log_softmax: log_softmax,
        F.relu: relu, F.relu6: relu6, F.gelu: gelu, F.silu: silu, F.leaky_relu: leaky_relu,
        F.tanh: _unary(ops.tanh), F.sigmoid: _unary(ops.sigmoid), F.softmax: softmax, F.log_softmax: log_softmax,
        F.dropout: dropout, F.linear: linear, F.conv1d: conv1d, F.conv2d: conv2d, F.layer_norm: layer_norm,
        F.max_pool2d: max_pool2d, F.avg_pool2d: avg_pool2d, F.adaptive_avg_pool2d: adaptive_avg_pool2d,
        F.embedding: lambda input, weight, padding_idx=None: embedding(input, weight),
        F.scaled_dot_product_attention: scaled_dot_product_attention,
    })
    return rules


METHOD_RULES: dict[str, Rule] = {
    "view": _reshape, "reshape": _reshape, "flatten": flatten, "permute": _permute, "transpose": _transpose,
    "t": _t, "contiguous": lambda input, *a, **k: input, "size": _size, "dim": lambda input: len(input.shape),
    "mean": _reduction(ops.mean), "sum": _reduction(ops.sum), "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "relu": _unary(ops.relu), "tanh": _unary(ops.tanh), "sigmoid": _unary(ops.sigmoid), "exp": _unary(ops.exp),
    "log": _unary(ops.log), "sqrt": _unary(ops.sqrt), "abs": _unary(ops.abs), "neg": _unary(ops.negative),
    "add": _add, "sub": _sub, "mul": lambda input, other: input * other, "div": _div, "matmul": ops.matmul,
    "softmax": softmax, "log_softmax": log_softmax,
}
"""``{Tensor method name: rule}``; the tensor is the rule's first argument."""
