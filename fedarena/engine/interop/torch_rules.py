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
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

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


# ============================================================================ leaf modules


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
