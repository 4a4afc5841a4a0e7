"""engine.from_torch on GRU/LSTM cells, nn.MultiheadAttention and F.scaled_dot_product_attention against
PyTorch's own forward pass and autograd gradients (w.r.t. every parameter and every floating input), in
float64 (relative 1e-10) and float32 (relative 1e-5 of each array's scale)."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import ops
from fedarena.engine.interop import TorchConversionError

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


class GRUStep(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.cell = nn.GRUCell(5, 7, bias=bias)

    def forward(self, x, h):
        return self.cell(x, h)


class GRUFromZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(5, 7)

    def forward(self, x):
        return self.cell(x)


class LSTMStep(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.cell = nn.LSTMCell(5, 6, bias=bias)
        self.head = nn.Linear(6, 2)

    def forward(self, x, h, c):
        state = self.cell(x, (h, c))
        state = self.cell(x * 0.5, state)  # two steps through the same weights
        return self.head(state[0]), state[1]


class LSTMFromZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(5, 6)

    def forward(self, x):
        return self.cell(x)[0]


class SelfAttention(nn.Module):
    def __init__(self, batch_first, need_weights=True, average=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.need_weights, self.average = need_weights, average

    def forward(self, x, mask, pad):
        out, w = self.attn(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=self.need_weights,
                           average_attn_weights=self.average)
        return (out, w) if self.need_weights else out


class CrossAttention(nn.Module):
    """Key and value sizes that differ from the embedding (separate q/k/v projections), no bias."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(6, 3, kdim=4, vdim=5, bias=False)

    def forward(self, q, k, v):
        out, w = self.attn(q, k, v)
        return out, w


class SDPA(nn.Module):
    def __init__(self, causal=False, scale=None):
        super().__init__()
        self.causal, self.scale = causal, scale

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale)


def _randn(rng, shape, dtype):
    return torch.tensor(rng.normal(size=shape), dtype=dtype)


def _check(module, inputs, dtype):
    """Forward and gradients of a random linear functional of the outputs, engine (jit) vs torch."""
    module = module.eval().to(dtype)
    fn, params = engine.from_torch(module, tuple(inputs))
    tol = TOL[dtype]
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    outs = module(*leaves)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    rng = np.random.default_rng(5)
    cts = [rng.normal(size=tuple(o.shape)) for o in outs]
    torch_loss = sum((o * torch.tensor(c, dtype=dtype)).sum() for o, c in zip(outs, cts))
    torch_loss.backward()
    float_pos = [i for i, t in enumerate(inputs) if t.is_floating_point()]
    arrays = [t.numpy() for t in inputs]

    def objective(p, floats):
        xs = list(arrays)
        for i, f in zip(float_pos, floats):
            xs[i] = f
        got = fn(p, *xs)
        got = list(got) if isinstance(got, tuple) else [got]
        return sum(ops.sum(o * c.astype(o.dtype)) for o, c in zip(got, cts))

    got = fn(params, *arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    for o, t in zip(got, outs):
        ref = t.detach().numpy()
        assert o.dtype == ref.dtype and o.shape == ref.shape
        np.testing.assert_allclose(o, ref, rtol=tol, atol=tol * (1 + np.abs(ref).max()))
    g_params, g_in = engine.jit(engine.grad(objective, argnums=(0, 1)))(params, [arrays[i] for i in float_pos])
    named = dict(module.named_parameters())
    assert set(fn.parameter_names) == set(named)
    for name, tp in named.items():
        ref = tp.grad.numpy()
        np.testing.assert_allclose(g_params[name], ref, rtol=tol, atol=tol * (1 + np.abs(ref).max()), err_msg=name)
    for g, i in zip(g_in, float_pos):
        ref = leaves[i].grad.numpy()
        np.testing.assert_allclose(g, ref, rtol=tol, atol=tol * (1 + np.abs(ref).max()), err_msg=f"input {i}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gru_and_lstm_cells_match_torch(dtype):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    _check(GRUStep(), [_randn(rng, (3, 5), dtype), _randn(rng, (3, 7), dtype)], dtype)
    _check(GRUStep(bias=False), [_randn(rng, (5,), dtype), _randn(rng, (7,), dtype)], dtype)  # unbatched
    _check(GRUFromZero(), [_randn(rng, (4, 5), dtype)], dtype)  # hx=None: zeros
    _check(LSTMStep(), [_randn(rng, (3, 5), dtype), _randn(rng, (3, 6), dtype), _randn(rng, (3, 6), dtype)], dtype)
    _check(LSTMStep(bias=False), [_randn(rng, (2, 5), dtype), _randn(rng, (2, 6), dtype),
                                  _randn(rng, (2, 6), dtype)], dtype)
    _check(LSTMFromZero(), [_randn(rng, (4, 5), dtype)], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multihead_attention_matches_torch(dtype):
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    n, L = 2, 5
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)  # True: left out
    pad = torch.tensor([[False] * L, [False] * (L - 2) + [True] * 2])
    x_bf = _randn(rng, (n, L, 8), dtype)
    _check(SelfAttention(batch_first=True), [x_bf, causal, pad], dtype)
    float_mask = _randn(rng, (L, L), dtype)
    _check(SelfAttention(batch_first=False, average=False), [_randn(rng, (L, n, 8), dtype), float_mask,
                                                              _randn(rng, (n, L), dtype)], dtype)
    per_head = torch.tensor(rng.random((n * 2, L, L)) < 0.3) & ~torch.eye(L, dtype=torch.bool)
    _check(SelfAttention(batch_first=True, need_weights=False), [x_bf, per_head, pad], dtype)
    _check(CrossAttention(), [_randn(rng, (4, n, 6), dtype), _randn(rng, (3, n, 4), dtype),
                              _randn(rng, (3, n, 5), dtype)], dtype)
    _check(CrossAttention(), [_randn(rng, (4, 6), dtype), _randn(rng, (3, 4), dtype),
                              _randn(rng, (3, 5), dtype)], dtype)  # unbatched


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scaled_dot_product_attention_matches_torch(dtype):
    rng = np.random.default_rng(2)
    q, k, v = _randn(rng, (2, 3, 4, 8), dtype), _randn(rng, (2, 3, 6, 8), dtype), _randn(rng, (2, 3, 6, 5), dtype)
    _check(SDPA(), [q, k, v], dtype)
    keep = torch.tensor(rng.random((4, 6)) < 0.7) | torch.eye(4, 6, dtype=torch.bool)  # True: takes part
    _check(SDPA(scale=0.3), [q, k, v, keep], dtype)
    _check(SDPA(), [q, k, v, _randn(rng, (2, 1, 4, 6), dtype)], dtype)
    q2 = _randn(rng, (3, 6, 8), dtype)
    _check(SDPA(causal=True), [q2, _randn(rng, (3, 6, 8), dtype), _randn(rng, (3, 6, 8), dtype)], dtype)


def test_unsupported_attention_configurations_are_named():
    class BiasKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 2, add_bias_kv=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    with pytest.raises(TorchConversionError, match="attn.*add_bias_kv"):
        engine.from_torch(BiasKV().eval(), torch.ones(3, 1, 4))

    class Dropped(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    with pytest.raises(TorchConversionError, match="dropout_p > 0"):
        engine.from_torch(Dropped(), torch.ones(1, 3, 4))
