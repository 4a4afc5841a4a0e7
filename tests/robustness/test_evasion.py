"""FGSM and PGD on engine models equal an independent PyTorch autograd implementation on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedarena.engine import nn
from fedarena.robustness.attacks import PGDConfig, fgsm, input_gradient, pgd, random_start


def _engine_mlp():
    model = nn.MLP([12, 16, 5], activation="tanh")
    params = [{k: v.astype(np.float64) for k, v in layer.items()} for layer in model.init(3)]
    return model, params


def _torch_mlp(params):
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)).double()
    with torch.no_grad():
        for layer, p in zip([net[0], net[2]], params):
            layer.weight.copy_(torch.from_numpy(p["w"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p["b"]))
    return net


def _engine_cnn():
    model = nn.Sequential([nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)])
    params = model.init(5, dtype=np.float64)
    return model, params


def _torch_cnn(params):
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(48, 4)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(params[0]["w"]))
        net[0].bias.copy_(torch.from_numpy(params[0]["b"]))
        net[3].weight.copy_(torch.from_numpy(params[3]["w"].T.copy()))
        net[3].bias.copy_(torch.from_numpy(params[3]["b"]))
    return net


def _torch_grad(net, x, y):
    xt = torch.from_numpy(x).requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(net(xt), torch.from_numpy(y), reduction="sum")
    (g,) = torch.autograd.grad(loss, xt)
    return g.numpy()


def _torch_fgsm(net, x, y, eps):
    return np.clip(x + eps * np.sign(_torch_grad(net, x, y)), 0.0, 1.0)


def _torch_pgd(net, x, y, eps, alpha, steps, norm, delta0):
    """Written from Madry et al. 2018 with torch tensors and autograd, independently of fedarena's attack."""
    xt = torch.from_numpy(x)
    adv = torch.clamp(xt + torch.from_numpy(delta0), 0.0, 1.0)
    for _ in range(steps):
        adv = adv.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(net(adv), torch.from_numpy(y), reduction="sum")
        (g,) = torch.autograd.grad(loss, adv)
        with torch.no_grad():
            if norm == "linf":
                adv = adv + alpha * g.sign()
                delta = torch.clamp(adv - xt, -eps, eps)
            else:
                gn = g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (g.dim() - 1))
                adv = adv + alpha * g / gn
                d = adv - xt
                dn = d.flatten(1).norm(dim=1).view(-1, *[1] * (d.dim() - 1))
                delta = d * torch.clamp(eps / dn.clamp_min(1e-12), max=1.0)
            adv = torch.clamp(xt + delta, 0.0, 1.0)
    return adv.detach().numpy()


@pytest.fixture(params=["mlp", "cnn"])
def models(request):
    rng = np.random.default_rng(0)
    if request.param == "mlp":
        model, params = _engine_mlp()
        net = _torch_mlp(params)
        x = rng.random((20, 12))
        y = rng.integers(0, 5, 20)
    else:
        model, params = _engine_cnn()
        net = _torch_cnn(params)
        x = rng.random((6, 1, 6, 6))
        y = rng.integers(0, 4, 6)
    return model, params, net, x, y


@pytest.mark.quick
def test_fgsm_equals_torch(models):
    model, params, net, x, y = models
    g = input_gradient(model.apply)
    np.testing.assert_allclose(g(params, x, y), _torch_grad(net, x, y), atol=1e-10)
    for eps in (0.05, 0.3):
        ours = fgsm(g, params, x, y, eps)
        np.testing.assert_allclose(ours, _torch_fgsm(net, x, y, eps), atol=1e-5)
        assert np.max(np.abs(ours - x)) <= eps + 1e-12


@pytest.mark.parametrize("norm,eps,alpha", [("linf", 0.1, 0.03), ("l2", 0.8, 0.25)])
def test_pgd_equals_torch(models, norm, eps, alpha):
    model, params, net, x, y = models
    g = input_gradient(model.apply)
    delta0 = random_start(x.shape, eps, norm, seed=7, dtype=x.dtype)
    cfg = PGDConfig(epsilon=eps, step_size=alpha, steps=6, norm=norm)
    ours = pgd(g, params, x, y, cfg, start=delta0)
    ref = _torch_pgd(net, x, y, eps, alpha, 6, norm, delta0)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    flat = (ours - x).reshape(len(x), -1)
    size = np.abs(flat).max(axis=1) if norm == "linf" else np.linalg.norm(flat, axis=1)
    assert np.all(size <= eps + 1e-9)
    # the seeded start is what pgd draws itself: same seed, same adversarial examples
    np.testing.assert_array_equal(pgd(g, params, x, y, cfg, seed=7), ours)


def test_pgd_raises_the_loss_more_than_fgsm_and_the_start_is_in_the_ball():
    model, params = _engine_mlp()
    rng = np.random.default_rng(1)
    x, y = rng.random((40, 12)), rng.integers(0, 5, 40)
    net = _torch_mlp(params)

    def loss(a):
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(net(torch.from_numpy(a)), torch.from_numpy(y)))

    g = input_gradient(model.apply)
    assert loss(pgd(g, params, x, y, PGDConfig(0.1, 0.02, 20))) > loss(fgsm(g, params, x, y, 0.1)) > loss(x)
    d = random_start((500, 3), 1.0, "l2", seed=0)
    r = np.linalg.norm(d, axis=1)
    assert r.max() <= 1.0 and abs(np.mean(r ** 3 <= 0.5) - 0.5) < 0.08  # uniform in the ball: P(r^d <= 1/2) = 1/2


def test_bad_budget_is_named():
    with pytest.raises(ValueError, match="norm"):
        PGDConfig(0.1, 0.01, 3, norm="l1")
    with pytest.raises(ValueError, match="epsilon"):
        PGDConfig(-0.1, 0.01, 3)
    with pytest.raises(ValueError, match="steps"):
        PGDConfig(0.1, 0.01, 0)
