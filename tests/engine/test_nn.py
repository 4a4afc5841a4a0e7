"""Layers vs PyTorch (float64), initializers, and parameter files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import initializers as I
from fedarena.engine import nn, ops


def _t(x):
    import torch

    return torch.tensor(np.asarray(x))


@pytest.mark.quick
def test_linear_and_mlp_match_torch():
    torch = pytest.importorskip("torch")
    mlp = nn.MLP([5, 7, 3], activation="relu")
    p = mlp.init(0, np.float64)
    x = np.random.default_rng(0).standard_normal((4, 5))
    tm = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)).double()
    with torch.no_grad():
        for i, layer in zip((0, 2), p):
            tm[i].weight.copy_(_t(layer["w"].T))
            tm[i].bias.copy_(_t(layer["b"]))
    np.testing.assert_allclose(mlp.apply(p, x), tm(_t(x)).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(engine.jit(mlp.apply)(p, x), tm(_t(x)).detach().numpy(), rtol=1e-12)


def test_cnn_layers_match_torch():
    torch = pytest.importorskip("torch")
    net = nn.Sequential(
        [nn.Conv2d(2, 4, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 3, 2, stride=2), nn.AvgPool2d(2, 1), nn.Flatten(), nn.Linear(3, 2)]
    )
    p = net.init(1, np.float64)
    tnet = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 3, 2, stride=2),
        torch.nn.AvgPool2d(2, 1), torch.nn.Flatten(), torch.nn.Linear(3, 2),
    ).double()
    with torch.no_grad():
        for i in (0, 3):
            tnet[i].weight.copy_(_t(p[i]["w"]))
            tnet[i].bias.copy_(_t(p[i]["b"]))
        tnet[6].weight.copy_(_t(p[6]["w"].T))
        tnet[6].bias.copy_(_t(p[6]["b"]))
    x = np.random.default_rng(1).standard_normal((2, 2, 8, 8))
    want = tnet(_t(x)).detach().numpy()
    np.testing.assert_allclose(net.apply(p, x), want, rtol=1e-10)
    np.testing.assert_allclose(engine.jit(net.apply)(p, x), want, rtol=1e-10)


def test_embedding_layernorm_match_torch():
    torch = pytest.importorskip("torch")
    emb = nn.Embedding(6, 4)
    ln = nn.LayerNorm(4)
    pe, pl = emb.init(0, np.float64), ln.init(0, np.float64)
    pl = {"gamma": pl["gamma"] + np.arange(4) * 0.1, "beta": pl["beta"] - 0.2}
    idx = np.array([[1, 5, 1], [0, 2, 3]])

    def f(pe, pl):
        return ops.sum(ln.apply(pl, emb.apply(pe, idx)) * np.arange(24.0).reshape(2, 3, 4))

    v, (ge, gl) = engine.value_and_grad(f, argnums=(0, 1))(pe, pl)
    te = torch.nn.Embedding(6, 4).double()
    tl = torch.nn.LayerNorm(4).double()
    with torch.no_grad():
        te.weight.copy_(_t(pe["table"]))
        tl.weight.copy_(_t(pl["gamma"]))
        tl.bias.copy_(_t(pl["beta"]))
    tv = (tl(te(torch.tensor(idx))) * torch.arange(24.0, dtype=torch.float64).reshape(2, 3, 4)).sum()
    tv.backward()
    np.testing.assert_allclose(v, tv.item(), rtol=1e-12)
    np.testing.assert_allclose(ge["table"], te.weight.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gl["gamma"], tl.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gl["beta"], tl.bias.grad.numpy(), rtol=1e-10)


def _copy_rnn(tcell, p):
    import torch

    with torch.no_grad():
        tcell.weight_ih.copy_(_t(p["w_ih"].T))
        tcell.weight_hh.copy_(_t(p["w_hh"].T))
        tcell.bias_ih.copy_(_t(p["b_ih"]))
        tcell.bias_hh.copy_(_t(p["b_hh"]))


def test_gru_and_lstm_cells_match_torch_with_gradients():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4))
    gru, lstm = nn.GRUCell(4, 5), nn.LSTMCell(4, 5)
    pg, pl = gru.init(0, np.float64), lstm.init(1, np.float64)
    h0, c0 = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    tg, tl = torch.nn.GRUCell(4, 5).double(), torch.nn.LSTMCell(4, 5).double()
    _copy_rnn(tg, pg)
    _copy_rnn(tl, pl)
    np.testing.assert_allclose(gru.apply(pg, x, h0), tg(_t(x), _t(h0)).detach().numpy(), rtol=1e-10)
    h1, c1 = lstm.apply(pl, x, (h0, c0))
    th, tc = tl(_t(x), (_t(h0), _t(c0)))
    np.testing.assert_allclose(h1, th.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(c1, tc.detach().numpy(), rtol=1e-10)

    def loss(p):  # two unrolled steps
        h = gru.apply(p, x, h0)
        return ops.sum(gru.apply(p, x * 0.5, h) ** 2)

    g = engine.jit(engine.grad(loss))(pg)
    th1 = tg(_t(x * 0.5), tg(_t(x), _t(h0)))
    (th1**2).sum().backward()
    np.testing.assert_allclose(g["w_ih"], tg.weight_ih.grad.numpy().T, rtol=1e-9)
    np.testing.assert_allclose(g["b_hh"], tg.bias_hh.grad.numpy(), rtol=1e-9)


def test_initializers_are_seeded_and_have_the_right_statistics():
    rng = np.random.default_rng
    a = I.orthogonal(2.0)(rng(0), (6, 4), np.float64)
    np.testing.assert_allclose(a.T @ a, 4.0 * np.eye(4), atol=1e-12)
    b = I.orthogonal()(rng(0), (3, 8), np.float64)
    np.testing.assert_allclose(b @ b.T, np.eye(3), atol=1e-12)
    c = I.orthogonal()(rng(0), (4, 2, 3, 3), np.float64).reshape(4, -1)
    np.testing.assert_allclose(c @ c.T, np.eye(4), atol=1e-12)
    np.testing.assert_array_equal(I.xavier_uniform()(rng(3), (50, 70)), I.xavier_uniform()(rng(3), (50, 70)))
    big = I.xavier_uniform()(rng(1), (300, 500), np.float64)
    bound = np.sqrt(6 / 800)
    assert np.abs(big).max() <= bound and np.abs(big).max() > 0.99 * bound
    np.testing.assert_allclose(big.var(), bound**2 / 3, rtol=0.02)
    he = I.kaiming_normal()(rng(2), (400, 300), np.float64)
    np.testing.assert_allclose(he.std(), np.sqrt(2 / 400), rtol=0.02)
    lin = nn.Linear(16, 8).init(5)
    assert lin["w"].dtype == np.float32 and np.abs(lin["w"]).max() <= 0.25 and np.abs(lin["b"]).max() <= 0.25
    assert not np.array_equal(nn.MLP([3, 4, 2]).init(0)[0]["w"], nn.MLP([3, 4, 2]).init(1)[0]["w"])
    np.testing.assert_array_equal(nn.MLP([3, 4, 2]).init(7)[1]["w"], nn.MLP([3, 4, 2]).init(7)[1]["w"])
    with pytest.raises(ValueError, match="unknown initializer"):
        I.get("magic")


def test_save_load_roundtrip_and_checks(tmp_path):
    params = {"body": nn.MLP([3, 4, 2]).init(0), "head": {"w": np.ones((2, 2), np.float64)}, "steps": np.full((), 3, np.int64)}
    path = tmp_path / "p.npz"
    engine.save_params(path, params, metadata={"round": 7})
    loaded, meta = engine.load_params(path, like=params, with_metadata=True)
    assert meta == {"round": 7}
    for a, b in zip(engine.tree_leaves(params), engine.tree_leaves(loaded)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    wrong_shape = {**params, "head": {"w": np.ones((3, 2))}}
    with pytest.raises(engine.ParamsFileError, match=r"head/w: shape \(2, 2\) in file, expected \(3, 2\)"):
        engine.load_params(path, like=wrong_shape)
    wrong_dtype = {**params, "head": {"w": np.ones((2, 2), np.float32)}}
    with pytest.raises(engine.ParamsFileError, match="head/w: dtype float64 in file, expected float32"):
        engine.load_params(path, like=wrong_dtype)
    with pytest.raises(engine.ParamsFileError, match=r"keys differ \(missing \['extra'\]"):
        engine.load_params(path, like={**params, "extra": np.ones(1)})


def test_load_rejects_corrupt_and_foreign_files(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(engine.ParamsFileError, match="not a readable parameter file"):
        engine.load_params(junk)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, a=np.ones(2))
    with pytest.raises(engine.ParamsFileError, match="missing __meta__"):
        engine.load_params(foreign)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, __meta__=np.frombuffer(b"{}", np.uint8), p0=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(engine.ParamsFileError):
        engine.load_params(pickled)  # object arrays need pickle, which is refused
    # metadata that lies about a shape
    good = tmp_path / "good.npz"
    engine.save_params(good, {"w": np.ones((2, 3))})
    with np.load(good) as z:
        meta = json.loads(z["__meta__"].tobytes())
    meta["leaves"]["p0"]["shape"] = [3, 2]
    tampered = tmp_path / "tampered.npz"
    np.savez(tampered, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), p0=np.ones((2, 3)))
    with pytest.raises(engine.ParamsFileError, match=r"parameter w: stored array has shape \(2, 3\)"):
        engine.load_params(tampered)
    assert zipfile.is_zipfile(good)
