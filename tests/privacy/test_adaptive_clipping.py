"""Adaptive clipping by quantile (Andrew et al. 2021): the clip tracks the target quantile of log-normal norms with
the count noise on, the adjusted noise multiplier keeps the round a Gaussian mechanism of multiplier z (checked
against the RDP and PLD accountants and by brute force over client contributions), and fedsim runs it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from fedarena.privacy.accountant import rdp_sampled_gaussian
from fedarena.privacy.adaptive_clipping import QuantileClipper, update_noise_multiplier
from fedarena.privacy.dp_fedavg import DPFedAvgMechanism
from fedarena.privacy.pld import PLDAccountant


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_tracks_target_quantile_of_lognormal_norms(gamma, seed):
    # N clients sampled with rate q; norms ~ LogNormal(0, 1), so the fraction below C is Phi(log C) exactly
    rng = np.random.default_rng(seed)
    n, q = 1000, 0.1
    clipper = QuantileClipper(0.1, q * n, target_quantile=gamma, seed=seed)  # sigma_b = m / 20 = 5: noise on
    assert clipper.count_stddev == pytest.approx(5.0)
    fractions = []
    for r in range(300):
        clipper.update(rng.lognormal(0.0, 1.0, rng.binomial(n, q)), r)
        if r >= 200:  # converged from C = 0.1 (about 0.01 of the norms below it)
            fractions.append(special.ndtr(math.log(clipper.clip_norm)))
    fractions = np.array(fractions)
    assert np.all(np.abs(fractions - gamma) <= 0.05)
    assert abs(fractions.mean() - gamma) <= 0.02


def test_clip_moves_the_right_way():
    c = QuantileClipper(1.0, 10, target_quantile=0.5, learning_rate=0.2, count_stddev=1e-9, seed=0)
    c.update(np.full(10, 0.5), 0)  # all unclipped: b_bar = 1, C shrinks by exp(-0.2 * 0.5)
    assert c.clip_norm == pytest.approx(math.exp(-0.1), rel=1e-6)
    c.update(np.full(10, 5.0), 1)  # all clipped: b_bar = 0, C grows by exp(0.1)
    assert c.clip_norm == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("z,sigma_b", [(1.0, 5.0), (0.8, 0.5), (2.0, 1.1)])
def test_adjusted_multiplier_composes_to_z(z, sigma_b):
    z_delta = update_noise_multiplier(z, sigma_b)
    assert z_delta > z
    # brute force: every client contribution (clipped update of norm <= C, centred bit +-1/2), each part divided
    # by its noise std, has L2 norm at most 1 / z, attained by a full-norm update
    rng = np.random.default_rng(0)
    clip = 0.7
    u = rng.normal(size=(2000, 5))
    u *= (clip * rng.random(2000) ** 0.2 / np.linalg.norm(u, axis=1))[:, None]
    bit = rng.integers(0, 2, 2000) - 0.5
    scaled = np.hypot(np.linalg.norm(u, axis=1) / (z_delta * clip), bit / sigma_b)
    assert scaled.max() <= 1 / z * (1 + 1e-12)
    assert np.hypot(1 / z_delta, 0.5 / sigma_b) == pytest.approx(1 / z, rel=1e-12)
    # RDP of the two Gaussian releases (unsampled) adds up to the Gaussian of multiplier z at every order
    orders = [1.5, 2.0, 8.0, 32.0]
    both = rdp_sampled_gaussian(1.0, z_delta, 1, orders) + rdp_sampled_gaussian(1.0, 2 * sigma_b, 1, orders)
    np.testing.assert_allclose(both, rdp_sampled_gaussian(1.0, z, 1, orders), rtol=1e-12)
    # the PLD accountant agrees: the two releases composed cost what one release at z costs
    pair, one = PLDAccountant(), PLDAccountant()
    pair.step(z_delta, 1.0)
    pair.step(2 * sigma_b, 1.0)
    one.step(z, 1.0)
    assert pair.epsilon(1e-5) == pytest.approx(one.epsilon(1e-5), rel=1e-3)


def test_adjusted_multiplier_refuses_too_little_count_noise():
    with pytest.raises(ValueError, match="clip_count_stddev"):
        update_noise_multiplier(1.0, 0.5)


def test_mechanism_noise_uses_z_delta_and_accountant_charges_z():
    z, q, n, d = 1.0, 0.1, 1000, 200_000
    clipper = QuantileClipper(0.5, q * n, count_stddev=2.0, seed=1)
    mech = DPFedAvgMechanism(0.5, z, q, n, seed=3, accountant="pld", clipper=clipper)
    z_delta = update_noise_multiplier(z, 2.0)
    out = mech.noisy_mean([], d, round_id=1)  # no updates: only the noise, divided by q N
    assert np.std(out * q * n) == pytest.approx(z_delta * 0.5, rel=0.01)
    plain = DPFedAvgMechanism(0.5, z, q, n, accountant="pld")
    assert mech.epsilon(5) == pytest.approx(plain.epsilon(5))  # charged at z, not at z_delta
    eps = mech.epsilons(5)
    assert eps["pld"] == mech.epsilon(5) and eps["pld"] < eps["rdp"]


def test_mechanism_clips_with_the_current_clip_and_adapts():
    clipper = QuantileClipper(1.0, 4, target_quantile=0.5, count_stddev=1.0, seed=0)
    mech = DPFedAvgMechanism(1.0, 0.5, 0.5, 8, seed=0, clipper=clipper)
    updates = [np.full(4, 3.0)] * 4  # norm 6: all clipped to 1
    before = mech.current_clip
    noise = mech.noise(4, 1) / 4  # the seeded draw of round 1 at the current clip
    mean = mech.noisy_mean(updates, 4, 1)
    np.testing.assert_allclose(mean - noise, 4 * np.full(4, 0.5) / 4)  # four clipped updates of norm 1 over q N
    assert mech.current_clip != before


def test_fedsim_runs_adaptive_clip_with_pld_accountant(tmp_path):
    from fedarena.platform.runs import execute, read_metrics

    cfg = {"kind": "fedsim", "rounds": 3,
           "data": {"dataset": "breast_cancer", "num_clients": 12, "partition": "dirichlet", "alpha": 1.0},
           "model": {"hidden": []}, "clients": {"per_round": 0, "lr": 0.05},
           "upload": {"codec": "dense"}, "download": {"codec": "dense"}, "evaluation": {},
           "privacy": {"seed": 5, "dp": {"noise_multiplier": 1.0, "sample_rate": 0.5, "clip_norm": 0.5,
                                         "accountant": "pld", "adaptive_clip": True, "clip_count_stddev": 1.0}}}
    summary = execute(cfg, out=tmp_path / "a", quiet=True, report=False)
    rows = read_metrics(tmp_path / "a")
    rdp, pld = DPFedAvgMechanism(0.5, 1.0, 0.5, 12).epsilons(3).values()
    assert rows[-1]["dp_epsilon_rdp"] == pytest.approx(rdp) and rows[-1]["dp_epsilon_pld"] == pytest.approx(pld)
    assert rows[-1]["dp_epsilon"] == pytest.approx(pld) and pld < rdp
    assert summary["dp_epsilon_pld"] == pytest.approx(pld)
    assert len({r["dp_clip_norm"] for r in rows}) == 3  # the clip moved every round


def test_too_little_count_noise_is_a_one_line_config_error(tmp_path, capsys):
    from fedarena.platform.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("kind: fedsim\nrounds: 1\nclients: {per_round: 0}\n"
                   "privacy:\n  dp: {noise_multiplier: 1.0, adaptive_clip: true}\n")  # q N / 20 = 0.5: too little
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fedarena: error: privacy.dp.clip_count_stddev:"), err
