"""Optimizers and schedules vs PyTorch / closed forms; MLP and CNN trained 10 Adam steps in
fedarena and PyTorch from identical initial parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedarena import engine
from fedarena.engine import nn, ops, optim


def _quadratic_problem(dtype):
    rng = np.random.default_rng(0)
    params = {"a": rng.standard_normal((3, 2)).astype(dtype), "b": rng.standard_normal(2).astype(dtype)}
    x = rng.standard_normal((5, 3)).astype(dtype)
    y = rng.standard_normal((5, 2)).astype(dtype)
    return params, x, y


def _loss(p, x, y):
    return ops.mean((ops.tanh(x @ p["a"]) + p["b"] - y) ** 2)


def _torch_run(torch_opt_fn, params, x, y, steps, clip=None):
    import torch

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch_opt_fn([tp["a"], tp["b"]])
    tx, ty = torch.tensor(x), torch.tensor(y)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((torch.tanh(tx @ tp["a"]) + tp["b"] - ty) ** 2).mean()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([tp["a"], tp["b"]], clip)
        opt.step()
    return {k: v.detach().numpy() for k, v in tp.items()}


OPTIMIZERS = [
    ("sgd", lambda: optim.sgd(0.1), lambda t: lambda ps: t.optim.SGD(ps, lr=0.1)),
    ("momentum", lambda: optim.sgd(0.1, momentum=0.9), lambda t: lambda ps: t.optim.SGD(ps, lr=0.1, momentum=0.9)),
    ("nesterov", lambda: optim.sgd(0.05, momentum=0.8, nesterov=True, weight_decay=0.01), lambda t: lambda ps: t.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("adam", lambda: optim.adam(0.05), lambda t: lambda ps: t.optim.Adam(ps, lr=0.05)),
    ("adam_l2", lambda: optim.adam(0.05, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1), lambda t: lambda ps: t.optim.Adam(ps, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", lambda: optim.adamw(0.05, weight_decay=0.1), lambda t: lambda ps: t.optim.AdamW(ps, lr=0.05, weight_decay=0.1)),
    ("adam_per_leaf", lambda: optim.adam(0.05, fused=False), lambda t: lambda ps: t.optim.Adam(ps, lr=0.05)),
    ("adamw_per_leaf", lambda: optim.adamw(0.05, weight_decay=0.1, fused=False), lambda t: lambda ps: t.optim.AdamW(ps, lr=0.05, weight_decay=0.1)),
    ("rmsprop", lambda: optim.rmsprop(0.01), lambda t: lambda ps: t.optim.RMSprop(ps, lr=0.01)),
    ("rmsprop_centered_momentum", lambda: optim.rmsprop(0.01, centered=True, momentum=0.5), lambda t: lambda ps: t.optim.RMSprop(ps, lr=0.01, centered=True, momentum=0.5)),
]


@pytest.mark.parametrize("name,ours,theirs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_optimizer_matches_torch(name, ours, theirs):
    torch = pytest.importorskip("torch")
    params, x, y = _quadratic_problem(np.float64)
    opt = ours()
    state = opt.init(params)

    @engine.jit
    def step(p, s, x, y):
        g = engine.grad(_loss)(p, x, y)
        return opt.update(g, s, p)

    p = params
    for _ in range(6):
        p, state = step(p, state, x, y)
    want = _torch_run(theirs(torch), params, x, y, 6)
    for k in ("a", "b"):
        np.testing.assert_allclose(p[k], want[k], rtol=1e-9, atol=1e-12)
    assert int(state["count"]) == 6
    if name.startswith("adam"):
        flat = not name.endswith("per_leaf")
        assert isinstance(state["mu"], np.ndarray) == flat and isinstance(state["nu"], np.ndarray) == flat


@pytest.mark.parametrize("name,ours,theirs", [o for o in OPTIMIZERS if o[0] in ("adam", "adam_l2", "adamw")], ids=["adam", "adam_l2", "adamw"])
def test_adam_buckets_layout_matches_torch(name, ours, theirs, monkeypatch):
    """A "large" model under fused="auto": small leaves share one vector, large ones stay apart."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(optim, "FUSE_MAX_ELEMENTS", 4)
    monkeypatch.setattr(optim, "SMALL_LEAF_ELEMENTS", 2)
    params, x, y = _quadratic_problem(np.float64)  # "a": 6 elements (large), "b": 2 (small)
    opt = ours()
    state = opt.init(params)
    assert [np.shape(m) for m in state["mu"]] == [(2,), (3, 2)] and [np.shape(v) for v in state["nu"]] == [(2,), (3, 2)]

    @engine.jit
    def step(p, s, x, y):
        return opt.update(engine.grad(_loss)(p, x, y), s, p)

    p = params
    for _ in range(6):
        p, state = step(p, state, x, y)
    want = _torch_run(theirs(torch), params, x, y, 6)
    for k in ("a", "b"):
        np.testing.assert_allclose(p[k], want[k], rtol=1e-9, atol=1e-12)
    assert [np.shape(m) for m in state["mu"]] == [(2,), (3, 2)]


def test_adam_on_a_single_large_array():
    """Parameters that are one bare array above FUSE_MAX_ELEMENTS (per-leaf layout of one leaf)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((257, 256))  # more than FUSE_MAX_ELEMENTS, and not flat
    target = rng.standard_normal(w.shape)
    opt = optim.adam(0.1)
    step = engine.jit(lambda p, s: opt.update(engine.grad(lambda q: ops.sum((q - target) ** 2))(p), s, p))
    p, s = w, opt.init(w)
    for _ in range(3):
        p, s = step(p, s)
    tw = torch.tensor(w, requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.1)
    for _ in range(3):
        topt.zero_grad()
        ((tw - torch.tensor(target)) ** 2).sum().backward()
        topt.step()
    np.testing.assert_allclose(p, tw.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.quick
def test_global_norm_clipping_matches_torch():
    torch = pytest.importorskip("torch")
    params, x, y = _quadratic_problem(np.float64)
    opt = optim.sgd(0.5, max_grad_norm=0.05)
    state = opt.init(params)
    p = params
    for _ in range(4):
        p, state = opt.update(engine.grad(_loss)(p, x, y), state, p)  # eager path
    want = _torch_run(lambda ps: torch.optim.SGD(ps, lr=0.5), params, x, y, 4, clip=0.05)
    for k in ("a", "b"):
        np.testing.assert_allclose(p[k], want[k], rtol=1e-10)
    g = {"u": np.array([3.0, 4.0]), "v": np.array([12.0])}
    clipped, norm = optim.clip_by_global_norm(g, 6.5)
    assert float(norm) == pytest.approx(13.0)
    np.testing.assert_allclose(clipped["u"], np.array([3.0, 4.0]) * 6.5 / (13 + 1e-6))
    unclipped, _ = optim.clip_by_global_norm(g, 100.0)
    np.testing.assert_allclose(unclipped["v"], [12.0])


@pytest.mark.quick
def test_schedules_closed_forms():
    lin = optim.linear(1.0, 0.0, 10)
    cos = optim.cosine(2.0, 8, alpha=0.1)
    wu = optim.warmup(4, 1.0, after=optim.linear(1.0, 0.5, 10))
    for t in [0, 3, 4, 7, 10, 15]:
        assert float(lin(np.int64(t))) == pytest.approx(1.0 - min(t, 10) / 10)
        assert float(cos(np.int64(t))) == pytest.approx(2.0 * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * min(t, 8) / 8)) + 0.1))
        want = t / 4 if t < 4 else 1.0 - 0.5 * min(t - 4, 10) / 10
        assert float(wu(np.int64(t))) == pytest.approx(want)
    # a schedule inside a jitted step follows the optimizer's step count
    opt = optim.sgd(optim.linear(0.1, 0.0, 4))
    p = {"w": np.ones(2)}
    s = opt.init(p)
    step = engine.jit(lambda p, s: opt.update({"w": np.ones(2)}, s, p))
    for _ in range(6):
        p, s = step(p, s)
    np.testing.assert_allclose(p["w"], 1 - (0.1 + 0.075 + 0.05 + 0.025))


def _torch_adam_run(tmodel, x, y, loss_kind, steps, lr):
    import torch

    opt = torch.optim.Adam(tmodel.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        out = tmodel(torch.tensor(x))
        if loss_kind == "ce":
            loss = torch.nn.functional.cross_entropy(out, torch.tensor(y))
        else:
            loss = torch.nn.functional.mse_loss(out, torch.tensor(y))
        loss.backward()
        opt.step()
    return float(loss.detach())


def _train_ours(model, params, x, y, loss_kind, steps, lr):
    opt = optim.adam(lr)

    def loss_fn(p, x, y):
        out = model.apply(p, x)
        return ops.cross_entropy(out, y) if loss_kind == "ce" else ops.mse(out, y)

    @engine.jit
    def step(p, s, x, y):
        loss, g = engine.value_and_grad(loss_fn)(p, x, y)
        p, s = opt.update(g, s, p)
        return p, s, loss

    s = opt.init(params)
    for _ in range(steps):
        params, s, loss = step(params, s, x, y)
    return params, float(loss)


def _rel_err(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float32, 1e-4)], ids=["float64", "float32"])
def test_mlp_ten_adam_steps_match_torch(dtype, tol):
    torch = pytest.importorskip("torch")
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    model = nn.MLP([6, 16, 16, 3], activation="tanh")
    params = model.init(0, dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 6)).astype(dtype)
    y = rng.integers(0, 3, 32)
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(tdt)
    with torch.no_grad():
        for i, p in zip((0, 2, 4), params):
            tmodel[i].weight.copy_(torch.tensor(p["w"].T))
            tmodel[i].bias.copy_(torch.tensor(p["b"]))
    new, loss = _train_ours(model, params, x, y, "ce", 10, 0.01)
    tloss = _torch_adam_run(tmodel, x, y, "ce", 10, 0.01)
    assert loss == pytest.approx(tloss, rel=tol)
    for i, p in zip((0, 2, 4), new):
        assert p["w"].dtype == dtype
        assert _rel_err(p["w"], tmodel[i].weight.detach().numpy().T) < tol
        assert _rel_err(p["b"], tmodel[i].bias.detach().numpy()) < tol
    assert _rel_err(new[0]["w"], params[0]["w"]) > 100 * tol  # the parameters did move


def _load_into_torch(torch, tmodel, params, convs, linears):
    """Copy our Sequential's parameters into the same-layout torch Sequential (Linear weights
    are stored transposed in torch)."""
    with torch.no_grad():
        for i in convs + linears:
            w = params[i]["w"].T if i in linears else params[i]["w"]
            tmodel[i].weight.copy_(torch.tensor(w))
            tmodel[i].bias.copy_(torch.tensor(params[i]["b"]))


def _assert_same_params(new, tmodel, convs, linears, tol):
    for i in convs + linears:
        w = tmodel[i].weight.detach().numpy()
        assert _rel_err(new[i]["w"], w.T if i in linears else w) < tol
        assert _rel_err(new[i]["b"], tmodel[i].bias.detach().numpy()) < tol


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float32, 1e-4)], ids=["float64", "float32"])
def test_cnn_ten_adam_steps_match_torch(dtype, tol):
    torch = pytest.importorskip("torch")
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    model = nn.Sequential([
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, stride=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 10), nn.Tanh(), nn.Linear(10, 4),
    ])
    params = model.init(3, dtype)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 1, 10, 10)).astype(dtype)
    y = rng.integers(0, 4, 8)
    tmodel = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 6, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(24, 10), torch.nn.Tanh(), torch.nn.Linear(10, 4),
    ).to(tdt)
    _load_into_torch(torch, tmodel, params, convs=(0, 3), linears=(6, 8))
    new, loss = _train_ours(model, params, x, y, "ce", 10, 0.01)
    tloss = _torch_adam_run(tmodel, x, y, "ce", 10, 0.01)
    assert loss == pytest.approx(tloss, rel=tol)
    _assert_same_params(new, tmodel, convs=(0, 3), linears=(6, 8), tol=tol)
    assert _rel_err(new[0]["w"], params[0]["w"]) > 100 * tol


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float32, 1e-4)], ids=["float64", "float32"])
def test_strided_cnn_ten_adam_steps_match_torch_with_bucketed_state(dtype, tol, monkeypatch):
    """The benchmark's CNN shape, smaller: a phase-plane strided conv with bias in the GEMM, and
    Adam's "buckets" state (FUSE_MAX_ELEMENTS lowered so this model counts as large)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(optim, "FUSE_MAX_ELEMENTS", 1000)
    monkeypatch.setattr(optim, "SMALL_LEAF_ELEMENTS", 300)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    model = nn.Sequential([
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 6 * 6, 10), nn.ReLU(), nn.Linear(10, 4),
    ])
    params = model.init(5, dtype)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 1, 12, 12)).astype(dtype)
    y = rng.integers(0, 4, 8)
    tmodel = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 6, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(216, 10), torch.nn.ReLU(), torch.nn.Linear(10, 4),
    ).to(tdt)
    _load_into_torch(torch, tmodel, params, convs=(0, 2), linears=(5, 7))
    state = optim.adam(0.01).init(params)
    assert isinstance(state["mu"], list) and len(state["mu"]) == 2  # small leaves + the 216x10 weight
    new, loss = _train_ours(model, params, x, y, "ce", 10, 0.01)
    tloss = _torch_adam_run(tmodel, x, y, "ce", 10, 0.01)
    assert loss == pytest.approx(tloss, rel=tol)
    _assert_same_params(new, tmodel, convs=(0, 2), linears=(5, 7), tol=tol)
    assert _rel_err(new[2]["w"], params[2]["w"]) > 100 * tol


def test_adam_rejects_a_state_of_another_layout_with_a_clear_error(monkeypatch):
    big = {"w": np.zeros((300, 300), np.float32), "b": np.zeros(300, np.float32)}  # 90k params: "buckets"
    opt = optim.adam(1e-3)
    grads = engine.tree_map(np.ones_like, big)
    old_tree_state = {"count": np.zeros((), np.int64), "mu": engine.tree_map(np.zeros_like, big), "nu": engine.tree_map(np.zeros_like, big)}
    with pytest.raises(ValueError, match="'mu' has moment arrays of shapes .* need a list of .*layout 'buckets'"):
        opt.update(grads, old_tree_state, big)
    small = {"w": np.zeros((3, 4), np.float32)}
    with pytest.raises(ValueError, match="another model"):
        opt.update({"w": np.ones((3, 4), np.float32)}, opt.init({"w": np.zeros((5, 4), np.float32)}), small)
    with pytest.raises(ValueError, match="'count', 'mu', 'nu'"):
        opt.update({"w": np.ones((3, 4), np.float32)}, {"mu": 0}, small)
    new_p, _ = opt.update(grads, opt.init(big), big)  # the right state still works
    assert new_p["w"].shape == (300, 300)
