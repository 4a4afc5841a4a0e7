"""Attacks on DP-SGD's randomness and released statistics (issue 17, finding 7).

The attacker holds the shipped YAML (and so the seed) and the run's metrics. With seeded sampling it
recomputed every Poisson batch (and the noise) of the run; with per-step statistics of the training data
in the metrics it read private information the accountant never charged for.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedarena.engine import nn, ops
from fedarena.platform.checkpoint import load_newest_valid
from fedarena.platform.runs import execute, read_metrics
from fedarena.privacy.dpsgd import DPSGD, DPSGDConfig, poisson_batch

SHORT = ["epsilon_budget=0.4", "epochs=0.15", "eval_every=2", "checkpoint.every=1"]  # the shipped config, 3-4 steps


def _final_params(run_dir):
    step, state = load_newest_valid(run_dir / "checkpoints")
    return step, state["experiment"]["params"]


def _flat(tree):
    if isinstance(tree, dict):
        return np.concatenate([_flat(tree[k]) for k in sorted(tree)])
    if isinstance(tree, (list, tuple)):
        return np.concatenate([_flat(t) for t in tree])
    return np.asarray(tree, dtype=np.float64).ravel()


def test_shipped_config_run_cannot_be_recomputed_from_the_yaml(tmp_path):
    victim = execute("experiments/dpsgd_digits.yaml", overrides=SHORT, out=tmp_path / "victim", quiet=True,
                     report=False)
    attacker = execute("experiments/dpsgd_digits.yaml", overrides=SHORT, out=tmp_path / "attacker", quiet=True,
                       report=False)
    assert victim["steps"] == attacker["steps"] >= 2
    # the attacker's re-run with the same public config (same seed) does not reproduce the victim's model:
    # batches and noise did not come from the seed
    sv, pv = _final_params(tmp_path / "victim")
    sa, pa = _final_params(tmp_path / "attacker")
    assert sv == sa
    assert not np.array_equal(_flat(pv), _flat(pa))
    # nothing computed on the training data is in the metrics: only epsilon and held-out accuracy
    private = {"loss", "batch_size", "clipped_fraction", "mean_grad_norm"}
    for row in read_metrics(tmp_path / "victim"):
        assert not private & set(row), row
    # and the seed-derived Poisson batch of step 1 (what the attacker recomputes) is not what DP-SGD draws by default
    n, q = 1437, 64 / 1437
    seeded = poisson_batch(np.random.default_rng([0, 1]), n, q)
    assert not any(np.array_equal(seeded, poisson_batch(None, n, q)) for _ in range(3))
    assert victim["insecure_seeded_noise"] is False


def test_seeded_noise_needs_the_loud_explicit_switch():
    mlp = nn.MLP([4, 3], activation="tanh")
    params = mlp.init(0, dtype=np.float64)
    x, y = np.zeros((0, 4)), np.zeros(0, np.int64)

    def loss_fn(p, xb, yb):
        return ops.cross_entropy(mlp.apply(p, xb), yb)

    dp = DPSGD(loss_fn, DPSGDConfig(1.0, 1.0, 0.1), 100)
    with pytest.raises(ValueError, match="insecure_seeded_noise"):
        dp.noisy_gradient(params, x, y, np.random.default_rng(0))
    a, _ = dp.noisy_gradient(params, x, y)
    b, _ = dp.noisy_gradient(params, x, y)
    assert not np.array_equal(_flat(a), _flat(b))  # fresh noise every call
    with pytest.warns(UserWarning, match="insecure_seeded_noise is on"):
        seeded = DPSGD(loss_fn, DPSGDConfig(1.0, 1.0, 0.1, insecure_seeded_noise=True), 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g1, _ = seeded.noisy_gradient(params, x, y, np.random.default_rng(5))
        g2, _ = seeded.noisy_gradient(params, x, y, np.random.default_rng(5))
    assert np.array_equal(_flat(g1), _flat(g2))  # reproducible, as asked for


def test_secure_gaussian_and_uniform_have_the_right_distribution():
    from scipy import stats

    from fedarena.privacy.dpsgd import SecureRandom

    r = SecureRandom()
    z = r.normal(0.0, 2.0, size=(200, 100))
    assert z.shape == (200, 100)
    assert stats.kstest(z.ravel() / 2.0, "norm").pvalue > 1e-4
    u = r.random(20000)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-4
