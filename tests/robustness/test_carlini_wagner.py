"""CW-L2 on an engine model against the same algorithm written with torch autograd and torch.optim.Adam."""

from __future__ import annotations

import numpy as np
import torch

from fedarena.engine import nn
from fedarena.robustness.carlini_wagner import CWConfig, carlini_wagner_l2


def _torch_cw(net, x, y, cfg: CWConfig, num_classes):
    """Carlini and Wagner 2017, untargeted L2, written independently with torch tensors."""
    xt = torch.from_numpy(x)
    onehot = torch.nn.functional.one_hot(torch.from_numpy(y), num_classes).double()
    n = len(x)
    w0 = torch.atanh(torch.clamp(2 * xt - 1, -1 + 1e-6, 1 - 1e-6))
    const = torch.full((n,), cfg.initial_const, dtype=torch.float64)
    lower, upper = torch.zeros(n, dtype=torch.float64), torch.full((n,), 1e10, dtype=torch.float64)
    best_l2 = torch.full((n,), float("inf"), dtype=torch.float64)
    best_adv = xt.clone()
    for _ in range(cfg.binary_search_steps):
        w = w0.clone().requires_grad_(True)
        opt = torch.optim.Adam([w], lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
        found = torch.zeros(n, dtype=torch.bool)
        for _ in range(cfg.steps):
            adv = (torch.tanh(w) + 1) / 2
            z = net(adv)
            margin = (z * onehot).sum(1) - (z - 1e4 * onehot).max(1).values
            loss = (((adv - xt) ** 2).flatten(1).sum(1) + const * torch.clamp(margin, min=-cfg.kappa)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                adv = (torch.tanh(w) + 1) / 2
                z = net(adv)
                margin = (z * onehot).sum(1) - (z - 1e4 * onehot).max(1).values
                ok = (margin < 0) & (-margin >= cfg.kappa)
                l2 = (adv - xt).flatten(1).norm(dim=1)
                better = ok & (l2 < best_l2)
                best_l2[better] = l2[better]
                best_adv[better] = adv[better]
                found |= ok
        upper = torch.where(found, torch.minimum(upper, const), upper)
        lower = torch.where(found, lower, torch.maximum(lower, const))
        const = torch.where(upper < 1e9, (lower + upper) / 2, const * 10)
    success = torch.isfinite(best_l2)
    return best_adv.numpy(), success.numpy(), torch.where(success, best_l2, torch.zeros_like(best_l2)).numpy()


def test_cw_matches_the_torch_reference():
    model = nn.MLP([10, 16, 4], activation="tanh")
    params = model.init(2, dtype=np.float64)
    net = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    with torch.no_grad():
        for layer, p in zip([net[0], net[2]], params):
            layer.weight.copy_(torch.from_numpy(p["w"].T.copy()))
            layer.bias.copy_(torch.from_numpy(p["b"]))
    rng = np.random.default_rng(0)
    x = rng.random((16, 10))
    with torch.no_grad():
        y = net(torch.from_numpy(x)).argmax(1).numpy()  # attack the model's own predictions
    cfg = CWConfig(steps=40, binary_search_steps=3, initial_const=0.5, learning_rate=0.05)
    ours = carlini_wagner_l2(model.apply, params, x, y, cfg)
    ref_adv, ref_ok, ref_l2 = _torch_cw(net, x, y, cfg, 4)
    assert ours.success_rate >= ref_ok.mean() and ours.success_rate > 0.5
    assert ours.mean_l2 <= ref_l2[ref_ok].mean() + 1e-6
    np.testing.assert_array_equal(ours.success, ref_ok)
    np.testing.assert_allclose(ours.l2, ref_l2, atol=1e-5)
    np.testing.assert_allclose(ours.adversarial, ref_adv, atol=1e-5)
    # every success really is misclassified, within the box, and at the reported distance
    with torch.no_grad():
        pred = net(torch.from_numpy(ours.adversarial)).argmax(1).numpy()
    assert np.all(pred[ours.success] != y[ours.success])
    assert ours.adversarial.min() >= 0 and ours.adversarial.max() <= 1
    np.testing.assert_allclose(np.linalg.norm(ours.adversarial - x, axis=1)[ours.success], ours.l2[ours.success])
