"""The model zoo (:mod:`fedarena.engine.models`) against PyTorch: the same module built in torch with the
engine's weights copied in gives the same logits and the same gradients (of a random linear function of
the logits, with respect to every parameter and, for images, the input), in float64 to rtol 1e-8 and in
float32 to rtol 1e-5 (each tensor compared relative to its own largest entry as well, ``atol = rtol *
max|ref|``). Sizes are tiny; the full-size models are checked by parameter count against the published
counts."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

from fedarena import engine  # noqa: E402
from fedarena.engine import models, nn  # noqa: E402

TOL = {np.float64: 1e-8, np.float32: 1e-5}


def _t(a, dtype):
    return torch.tensor(np.asarray(a), dtype=torch.float64 if dtype == np.float64 else torch.float32)


def _lin(tl: "tnn.Linear", p: dict, dtype) -> None:
    tl.weight.copy_(_t(p["w"], dtype).T)
    if "b" in p:
        tl.bias.copy_(_t(p["b"], dtype))


def _norm(tn, p: dict, dtype) -> None:
    tn.weight.copy_(_t(p["gamma"], dtype))
    tn.bias.copy_(_t(p["beta"], dtype))


# ----------------------------------------------------------------------------- torch twins


class TorchResNetGN(tnn.Module):
    def __init__(self, m: models.ResNetGN):
        super().__init__()
        w0, g = m.widths[0], m.groups
        k = 7 if m.stem == "imagenet" else 3
        self.m = m
        self.stem_conv = tnn.Conv2d(m.in_channels, w0, k, 2 if m.stem == "imagenet" else 1, k // 2, bias=False)
        self.stem_norm = tnn.GroupNorm(g, w0)
        self.blocks = tnn.ModuleList()
        for name, cin, cout, stride in m._plan():
            b = tnn.Module()
            b.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            b.norm1 = tnn.GroupNorm(g, cout)
            b.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            b.norm2 = tnn.GroupNorm(g, cout)
            b.down = (tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.GroupNorm(g, cout))
                      if stride != 1 or cin != cout else None)
            self.blocks.append(b)
        self.fc = tnn.Linear(m.widths[-1], m.num_classes)

    def forward(self, x):
        z = torch.relu(self.stem_norm(self.stem_conv(x)))
        if self.m.stem == "imagenet":
            z = torch.nn.functional.max_pool2d(z, 3, 2, 1)
        for b in self.blocks:
            h = b.norm2(b.conv2(torch.relu(b.norm1(b.conv1(z)))))
            z = torch.relu(h + (b.down(z) if b.down is not None else z))
        return self.fc(z.mean((2, 3)))

    def load(self, p, dtype):
        self.stem_conv.weight.copy_(_t(p["stem"]["conv"]["w"], dtype))
        _norm(self.stem_norm, p["stem"]["norm"], dtype)
        flat = [blk for s in range(len(self.m.blocks)) for blk in p[f"layer{s + 1}"]]
        for b, q in zip(self.blocks, flat):
            b.conv1.weight.copy_(_t(q["conv1"]["w"], dtype))
            b.conv2.weight.copy_(_t(q["conv2"]["w"], dtype))
            _norm(b.norm1, q["norm1"], dtype)
            _norm(b.norm2, q["norm2"], dtype)
            if b.down is not None:
                b.down[0].weight.copy_(_t(q["down_conv"]["w"], dtype))
                _norm(b.down[1], q["down_norm"], dtype)
        _lin(self.fc, p["fc"], dtype)

    def grads(self):
        g = {"stem": {"conv": {"w": self.stem_conv.weight.grad}, "norm": _ng(self.stem_norm)}}
        i = 0
        for s, n in enumerate(self.m.blocks):
            for _ in range(n):
                b = self.blocks[i]
                q = {"conv1": {"w": b.conv1.weight.grad}, "norm1": _ng(b.norm1), "conv2": {"w": b.conv2.weight.grad},
                     "norm2": _ng(b.norm2)}
                if b.down is not None:
                    q["down_conv"] = {"w": b.down[0].weight.grad}
                    q["down_norm"] = _ng(b.down[1])
                g.setdefault(f"layer{s + 1}", []).append(q)
                i += 1
        g["fc"] = _lg(self.fc)
        return g


def _ng(tn):
    return {"gamma": tn.weight.grad, "beta": tn.bias.grad}


def _lg(tl):
    return {"w": tl.weight.grad.T, "b": tl.bias.grad}


class TorchEmnistCNN(tnn.Module):
    def __init__(self, m: models.EmnistCNN):
        super().__init__()
        self.conv1, self.conv2 = tnn.Conv2d(m.image[0], m.channels[0], 3), tnn.Conv2d(m.channels[0], m.channels[1], 3)
        self.fc, self.out = tnn.Linear(m.flat_features, m.hidden), tnn.Linear(m.hidden, m.num_classes)

    def forward(self, x):
        z = torch.nn.functional.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        return self.out(torch.relu(self.fc(z.flatten(1))))

    def load(self, p, dtype):
        for name in ("conv1", "conv2"):
            getattr(self, name).weight.copy_(_t(p[name]["w"], dtype))
            getattr(self, name).bias.copy_(_t(p[name]["b"], dtype))
        _lin(self.fc, p["fc"], dtype)
        _lin(self.out, p["out"], dtype)

    def grads(self):
        return {"conv1": {"w": self.conv1.weight.grad, "b": self.conv1.bias.grad},
                "conv2": {"w": self.conv2.weight.grad, "b": self.conv2.bias.grad}, "fc": _lg(self.fc), "out": _lg(self.out)}


class TorchRecurrentLM(tnn.Module):
    def __init__(self, m: models.RecurrentLM):
        super().__init__()
        self.m = m
        self.emb = tnn.Embedding(m.vocab_size, m.embed_dim)
        self.lstm = tnn.LSTM(m.embed_dim, m.hidden_size, m.num_layers, batch_first=True)
        self.proj = tnn.Linear(m.hidden_size, m.projection) if m.projection else None
        self.out = tnn.Linear(m.projection or m.hidden_size, m.vocab_size)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        return self.out(self.proj(h) if self.proj is not None else h)

    def load(self, p, dtype):
        self.emb.weight.copy_(_t(p["embedding"]["table"], dtype))
        for i, c in enumerate(p["lstm"]):
            for k in ("w_ih", "w_hh"):
                getattr(self.lstm, f"weight_{k[2:]}_l{i}").copy_(_t(c[k], dtype).T)
            for k in ("b_ih", "b_hh"):
                getattr(self.lstm, f"bias_{k[2:]}_l{i}").copy_(_t(c[k], dtype))
        if self.proj is not None:
            _lin(self.proj, p["projection"], dtype)
        _lin(self.out, p["out"], dtype)

    def grads(self):
        L = self.lstm
        g = {"embedding": {"table": self.emb.weight.grad},
             "lstm": [{"w_ih": getattr(L, f"weight_ih_l{i}").grad.T, "w_hh": getattr(L, f"weight_hh_l{i}").grad.T,
                       "b_ih": getattr(L, f"bias_ih_l{i}").grad, "b_hh": getattr(L, f"bias_hh_l{i}").grad}
                      for i in range(self.m.num_layers)]}
        if self.proj is not None:
            g["projection"] = _lg(self.proj)
        g["out"] = _lg(self.out)
        return g


class TorchTransformerLM(tnn.Module):
    def __init__(self, m: models.TransformerLM):
        super().__init__()
        self.m = m
        self.tok, self.pos = tnn.Embedding(m.vocab_size, m.d_model), tnn.Embedding(m.max_len, m.d_model)
        self.layers = tnn.ModuleList(tnn.TransformerEncoderLayer(m.d_model, m.num_heads, m.dim_feedforward, dropout=0.0,
                                                                 batch_first=True) for _ in range(m.num_layers))
        self.out = tnn.Linear(m.d_model, m.vocab_size)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf"), dtype=h.dtype), 1) if self.m.causal else None
        for layer in self.layers:
            h = layer(h, src_mask=mask)
        return self.out(h)

    def load(self, p, dtype):
        self.tok.weight.copy_(_t(p["token"]["table"], dtype))
        self.pos.weight.copy_(_t(p["position"]["table"], dtype))
        for layer, q in zip(self.layers, p["layers"]):
            a = layer.self_attn
            a.in_proj_weight.copy_(_t(q["attn"]["w_qkv"], dtype).T)
            a.in_proj_bias.copy_(_t(q["attn"]["b_qkv"], dtype))
            a.out_proj.weight.copy_(_t(q["attn"]["w_out"], dtype).T)
            a.out_proj.bias.copy_(_t(q["attn"]["b_out"], dtype))
            _lin(layer.linear1, q["ff1"], dtype)
            _lin(layer.linear2, q["ff2"], dtype)
            _norm(layer.norm1, q["norm1"], dtype)
            _norm(layer.norm2, q["norm2"], dtype)
        _lin(self.out, p["out"], dtype)

    def grads(self):
        g = {"token": {"table": self.tok.weight.grad}, "position": {"table": self.pos.weight.grad}, "layers": []}
        for layer in self.layers:
            a = layer.self_attn
            g["layers"].append({"attn": {"w_qkv": a.in_proj_weight.grad.T, "b_qkv": a.in_proj_bias.grad,
                                         "w_out": a.out_proj.weight.grad.T, "b_out": a.out_proj.bias.grad},
                                "ff1": _lg(layer.linear1), "ff2": _lg(layer.linear2), "norm1": _ng(layer.norm1),
                                "norm2": _ng(layer.norm2)})
        g["out"] = _lg(self.out)
        return g


# ----------------------------------------------------------------------------- the comparison


def _close(a, b, rtol, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs torch {b.shape}"
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-30), err_msg=what)


def _compare(m, twin_cls, x, dtype, image: bool):
    rtol = TOL[dtype]
    params = m.init(np.random.default_rng(0), dtype)
    twin = twin_cls(m)
    twin = twin.double() if dtype == np.float64 else twin.float()
    with torch.no_grad():
        twin.load(params, dtype)
    xin = np.asarray(x, dtype) if image else np.asarray(x, np.int64)
    out = np.asarray(engine.jit(m.apply)(params, xin))
    cot = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)

    def f(p, xx):
        return (m.apply(p, xx) * cot).sum()

    tx = _t(xin, dtype).requires_grad_(True) if image else torch.tensor(xin)
    tout = twin(tx)
    _close(out, tout.detach().numpy(), rtol, "logits")
    (tout * _t(cot, dtype)).sum().backward()
    if image:
        gp, gx = engine.jit(engine.grad(f, argnums=(0, 1)))(params, xin)
        _close(gx, tx.grad.numpy(), rtol, "d/dx")
    else:
        gp = engine.jit(engine.grad(f))(params, xin)
    ref = twin.grads()
    leaves, tree = engine.tree_flatten(gp)
    ref_leaves, ref_tree = engine.tree_flatten(ref)
    assert len(leaves) == len(ref_leaves), f"{len(leaves)} gradients vs torch's {len(ref_leaves)}"
    assert tree == ref_tree
    for i, (a, b) in enumerate(zip(leaves, ref_leaves)):
        _close(a, b.detach().numpy(), rtol, f"gradient leaf {i}")


DTYPES = [np.float64, np.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_resnet_gn_matches_torch(dtype, stem):
    m = models.ResNetGN(5, blocks=(1, 2), widths=(4, 8), in_channels=3, groups=2, stem=stem)
    x = np.random.default_rng(2).standard_normal((2, 3, 12, 12))
    _compare(m, TorchResNetGN, x, dtype, image=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_emnist_cnn_matches_torch(dtype):
    m = models.EmnistCNN(7, image=(1, 10, 10), channels=(3, 4), hidden=6)
    x = np.random.default_rng(3).standard_normal((3, 1, 10, 10))
    _compare(m, TorchEmnistCNN, x, dtype, image=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["char", "word"])
def test_lstm_lms_match_torch(dtype, kind):
    m = (models.RecurrentLM(11, 3, 5, num_layers=2) if kind == "char" else
         models.RecurrentLM(13, 4, 6, num_layers=1, projection=3))
    tokens = np.random.default_rng(4).integers(0, m.vocab_size, (3, 6))
    _compare(m, TorchRecurrentLM, tokens, dtype, image=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_transformer_lm_matches_torch(dtype, causal):
    m = models.TransformerLM(9, d_model=8, num_heads=2, dim_feedforward=12, num_layers=2, max_len=8, causal=causal)
    tokens = np.random.default_rng(5).integers(0, 9, (2, 5))
    _compare(m, TorchTransformerLM, tokens, dtype, image=False)


def test_unrolled_lstm_equals_scanned():
    a, b = models.RecurrentLM(7, 3, 4, 2), models.RecurrentLM(7, 3, 4, 2, unroll=True)
    p = a.init(0, np.float64)
    tokens = np.random.default_rng(6).integers(0, 7, (2, 5))
    np.testing.assert_allclose(np.asarray(a.apply(p, tokens)), np.asarray(b.apply(p, tokens)), rtol=1e-12)


def _count(p) -> int:
    return sum(int(np.size(v)) for v in engine.tree_leaves(p))


def test_full_size_parameter_counts():
    # torchvision's resnet18 has 11,689,512 parameters for 1,000 classes; 100 classes drop 900 x 513 of the head
    assert _count(models.resnet18_gn(100).init(0)) == 11_689_512 - 900 * 513
    # the TFF EMNIST CNN of Reddi et al. (Keras summary: 1,206,590)
    assert _count(models.EmnistCNN().init(0)) == 1_206_590
    # Keras LSTMs have one bias of 4H per layer, PyTorch's (and ours) two: 4H more per layer
    assert _count(models.word_lstm().init(0)) == 4_050_748 + 4 * 670
    so = TorchRecurrentLM(models.word_lstm())
    assert sum(p.numel() for p in so.parameters()) == 4_050_748 + 4 * 670
    sh = TorchRecurrentLM(models.char_lstm())
    assert _count(models.char_lstm().init(0)) == sum(p.numel() for p in sh.parameters())
    assert models.char_lstm().vocab_size == 90


def test_group_norm_rejects_bad_groups():
    with pytest.raises(ValueError, match="multiple of num_groups"):
        nn.GroupNorm(3, 8)
