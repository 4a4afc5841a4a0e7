"""PyTorch twins of the :mod:`fedarena.engine.models` models: the same modules built from ``torch.nn``, with
``load(params, dtype)`` copying an engine parameter tree in and ``grads()`` returning torch's gradients in the
engine tree's layout (shared by tests/engine/test_models_vs_torch.py and tests/federated/test_fl_models.py)."""

from __future__ import annotations

import numpy as np
import torch

from fedarena.engine import models

tnn = torch.nn


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
                "conv2": {"w": self.conv2.weight.grad, "b": self.conv2.bias.grad}, "fc": _lg(self.fc),
                "out": _lg(self.out)}


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
