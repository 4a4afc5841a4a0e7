"""Compression codecs (exact sizes, decoding, unbiasedness), DP-FedAvg (accountant vs Opacus, secure noise),
SecAgg in simulation (exact sum with dropouts), heterogeneity and failure injection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedarena.federated import compression as cz
from fedarena.federated import simulation as sim
from fedarena.federated import stages
from fedarena.federated import strategy as st
from fedarena.privacy.dp_fedavg import DPFedAvgMechanism, secure_standard_normal


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_quantize_codec_size_and_unbiased(bits):
    v = np.random.default_rng(0).standard_normal(1001)
    c = cz.Codec("quantize", bits)
    data = c.encode(v, np.random.default_rng(1))
    assert len(data) == 8 + math.ceil(1001 * bits / 8)
    dec = c.decode(data, 1001)
    step = (v.max() - v.min()) / (2 ** bits - 1)
    assert np.all(np.abs(dec - v) <= step * (1 + 1e-5) + 1e-6)
    mean = np.mean([c.decode(c.encode(v, np.random.default_rng(s)), 1001) for s in range(400)], axis=0)
    assert np.abs(mean - v).max() < 5 * step / math.sqrt(400) + 1e-5


def test_topk_codecs_keep_the_largest_entries_with_exact_sizes():
    v = np.random.default_rng(0).standard_normal(3000)
    c = cz.Codec("topk", fraction=0.01)
    data = c.encode(v, np.random.default_rng(0))
    assert len(data) == 4 + 30 * 2 + 30 * 4  # count, uint16 indices, float32 values
    dec = c.decode(data, 3000)
    keep = np.argsort(-np.abs(v))[:30]
    np.testing.assert_allclose(dec[keep], v[keep].astype(np.float32))
    assert np.count_nonzero(dec) == 30
    big = cz.Codec("topk", fraction=1e-4).encode(np.arange(70000.0), np.random.default_rng(0))
    assert len(big) == 4 + 7 * 4 + 7 * 4  # uint32 indices above 65536 entries
    tq = cz.Codec("topk_quantize", bits=8, fraction=0.01)
    assert len(tq.encode(v, np.random.default_rng(0))) == 4 + 60 + 8 + 30
    with pytest.raises(ValueError, match="update"):
        c.decode(data[:-1], 3000)


def test_error_feedback_sends_what_topk_dropped_later():
    up = cz.UploadCompression(cz.Codec("topk", fraction=0.5), error_feedback=True)
    d = {"w": np.array([4.0, 1.0, 3.0, 2.0])}
    first, n = up("a", d, np.random.default_rng(0))
    second, _ = up("a", {"w": np.zeros(4)}, np.random.default_rng(0))
    np.testing.assert_allclose(first["w"], [4, 0, 3, 0])
    np.testing.assert_allclose(second["w"], [0, 1, 0, 2])  # the residual
    assert n == 4 + 2 * 2 + 2 * 4


def test_broadcast_tracks_the_clients_copy():
    b = cz.Broadcast(cz.Codec("quantize", 8))
    p0 = {"w": np.zeros(5, np.float32)}
    ref, n0 = b.broadcast(p0, 3)
    assert n0 == 0  # the initial model comes from the seed
    p1 = {"w": np.array([0.1, -0.2, 0.3, 0.0, 0.05])}
    ref, n1 = b.broadcast(p1, 3)
    assert n1 == 3 * (8 + 5)
    assert np.abs(ref["w"] - p1["w"]).max() <= 0.5 / 255 + 1e-6


def test_dp_fedavg_epsilon_matches_opacus_rdp():
    rdp_mod = pytest.importorskip("opacus.accountants.analysis.rdp")
    for q, z, rounds in [(0.01, 1.1, 100), (0.1, 0.8, 50), (0.05, 2.0, 1000)]:
        mech = DPFedAvgMechanism(clip_norm=1.0, noise_multiplier=z, sample_rate=q, num_clients=1000, delta=1e-5)
        orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
        rdp = rdp_mod.compute_rdp(q=q, noise_multiplier=z, steps=rounds, orders=orders)
        eps, _ = rdp_mod.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
        assert mech.epsilon(rounds) == pytest.approx(eps, rel=1e-6)


def test_dp_fedavg_noise_is_secure_by_default_and_seeded_on_request():
    z = secure_standard_normal(200_000)
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    m = DPFedAvgMechanism(1.0, 1.0, 0.1, 10)
    assert not np.array_equal(m.noise(10, 1), m.noise(10, 1))
    s = DPFedAvgMechanism(1.0, 1.0, 0.1, 10, seed=3)
    np.testing.assert_array_equal(s.noise(10, 1), s.noise(10, 1))


def test_dp_fedavg_stage_clips_and_divides_by_expected_clients():
    m = DPFedAvgMechanism(clip_norm=1.0, noise_multiplier=0.0, sample_rate=0.5, num_clients=4)
    dp = stages.DPFedAvg(st.FedAvg(), m)
    s0 = dp.init_state({"w": np.zeros(2)})
    ups = [st.ClientUpdate("a", {"w": np.array([3.0, 4.0])}, 1), st.ClientUpdate("b", {"w": np.array([0.1, 0.0])}, 9)]
    s1 = dp.aggregate(s0, ups, 4)
    np.testing.assert_allclose(s1.params["w"], (np.array([0.6, 0.8]) + [0.1, 0.0]) / 2.0)
    sel = dp.select(1, [f"c{i}" for i in range(2000)], 0)
    assert 900 < len(sel) < 1100  # Poisson sampling, rate 0.5
    assert dp.evaluate(10, np.array([0.5]))["dp_epsilon"] == m.epsilon(10)


def test_secagg_stage_gives_the_exact_sum_with_dropouts():
    from fedarena.privacy.secagg.quantization import quantize

    rng = np.random.default_rng(0)
    inputs = {u: rng.uniform(-0.1, 0.1, 20) for u in range(1, 31)}
    # SecAgg+ with 6 neighbours: 7 share holders per secret, t = 4, so any m - t = 3 dropouts leave every secret
    # rebuildable whatever graph the server draws (its seed comes from os.urandom). The dropouts are drawn from the
    # stage's seed; seed 3 drops 2 clients. (Seed 1 dropped 4, and about 2% of graphs then put 3 of them among a
    # dropped client's 6 neighbours, leaving 3 shares: an abort that depended on the draw, not on the load.)
    stage = stages.SecureAggregation(None, neighbours=6, dropout=0.1, seed=3)
    rep = stage.secure_sum(inputs, 1)
    surv = rep.result.survivors
    assert 30 - len(surv) == 2  # the drawn dropouts (at most m - t = 3)
    scale = stage.secagg_config(30, 20).scale  # the runtime's fixed point: scale rounded to a multiple of W
    assert scale == 1000 * (2 ** 20 // 1000)
    want = sum(quantize(inputs[u], 1.0, scale, 32).astype(np.uint64) for u in surv) % 2 ** 32
    np.testing.assert_array_equal(rep.result.total, want.astype(np.uint32))


def test_secagg_round_equals_fedavg_over_survivors():
    ups = [st.ClientUpdate(f"c{i}", {"w": np.random.default_rng(i).uniform(-0.05, 0.05, 6)}, 5 + i)
           for i in range(6)]
    s0 = st.FedAvg().init_state({"w": np.zeros(6)})
    sec = stages.SecureAggregation(st.FedAvg(), dropout=0.0)
    got = sec.aggregate(s0, ups, 6).params["w"]
    want = st.FedAvg().aggregate(s0, ups, 6).params["w"]
    # fixed point: each of the n inputs is rounded to 1/scale, so the sums are off by <= n / (2 scale) and the
    # mean by about n / (scale * sum of weights) at most
    wsum = sum(u.num_examples for u in ups) / sec.weight_scale
    bound = len(ups) / (sec.scale * wsum)
    np.testing.assert_allclose(got, want, atol=bound)
    assert np.abs(got - want).max() > 0  # really quantized, not a bypass


def _tiny(n_clients=20, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 30, n_clients)
    x = rng.standard_normal((sizes.sum(), 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    off = np.cumsum([0, *sizes])
    return x, y, [np.arange(off[i], off[i + 1]) for i in range(n_clients)], [f"c{i}" for i in range(n_clients)]


def test_stragglers_dropped_or_partial_work_kept():
    x, y, train, ids = _tiny()
    het = dict(speed_mean=1.0, speed_sigma=1.0, window_s=3.0)
    fit = st.FitConfig(2, 4, 0.1, prox_mu=0.1)
    rec = {}
    for partial in (False, True):
        s = sim.Simulation(sim.BatchedMLP((4, 2)), st.FedAvg(fit, clients_per_round=10), x, y, train, ids, 2,
                           heterogeneity=sim.Heterogeneity(**het, partial_work=partial))
        _, recs = s.run(1)
        rec[partial] = recs[0]
        allowed = {c: math.floor(3.0 * s.speeds[s._pos[c]]) for c in recs[0].selected}
        full = {c: s._full_steps(c, 1, fit) for c in recs[0].selected}
        want = [c for c in recs[0].selected if (allowed[c] >= full[c] if not partial else allowed[c] >= 1)]
        assert recs[0].reporting == want
    assert len(rec[True].reporting) > len(rec[False].reporting)
    assert rec[False].metrics["stragglers"] == rec[True].metrics["stragglers"] > 0


def test_dropout_per_stage_and_availability():
    x, y, train, ids = _tiny(40)
    s = sim.Simulation(sim.BatchedMLP((4, 2)), st.FedAvg(st.FitConfig(1, 4, 0.1), clients_per_round=20), x, y, train,
                       ids, 2, heterogeneity=sim.Heterogeneity(availability=0.6, drop_before_training=0.2,
                                                               drop_after_training=0.2, drop_upload=0.2))
    _, recs = s.run(20)
    avail = np.mean([r.metrics["available"] for r in recs])
    rep = np.mean([r.metrics["reporting"] / r.metrics["selected"] for r in recs])
    assert 0.5 * 40 < avail < 0.7 * 40
    assert 0.8 ** 3 - 0.12 < rep < 0.8 ** 3 + 0.12


def test_sign_flip_adversaries_upload_minus_s_delta():
    x, y, train, ids = _tiny(10)
    captured = {}

    def upload(cid, delta, rng):
        captured[cid] = delta
        return sim.dense_upload(cid, delta, rng)

    base = sim.Simulation(sim.BatchedMLP((4, 2)), st.FedAvg(st.FitConfig(1, 4, 0.1)), x, y, train, ids, 2,
                          upload=upload)
    base.run(1)
    clean = dict(captured)
    bad = sim.Simulation(sim.BatchedMLP((4, 2)), st.FedAvg(st.FitConfig(1, 4, 0.1)), x, y, train, ids, 2,
                         upload=upload, heterogeneity=sim.Heterogeneity(adversary_fraction=0.3, adversary_scale=4.0))
    bad.run(1)
    assert len(bad.adversaries) == 3
    for c in ids:
        f = -4.0 if c in bad.adversaries else 1.0
        np.testing.assert_allclose(captured[c]["l0.w"], f * clean[c]["l0.w"], rtol=1e-6)


def test_signds_upload_is_the_runtime_codec_with_equal_weights():
    from fedarena.privacy.signds import SignDSConfig, signds_report

    delta = {"a": np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32),
             "b": np.random.default_rng(1).standard_normal(7).astype(np.float32)}
    up = stages.SignDSUpload(k=5, h=3, epsilon=2.0, lr=0.1)
    dec, nbytes = up("c0", delta, np.random.default_rng(3))
    rep = signds_report(stages.flatten(delta), SignDSConfig(d=27, k=5, h=3, epsilon=2.0), np.random.default_rng(3))
    flat = np.concatenate([dec["a"].ravel(), dec["b"].ravel()])
    assert np.count_nonzero(flat) == 3 and set(np.flatnonzero(flat)) == set(rep.indices.tolist())
    assert np.allclose(np.abs(flat[flat != 0]), 0.1) and nbytes == len(rep.to_bytes())
    assert up.equal_weight


def test_ldp_cumulative_epsilon_composes_in_rdp():
    from fedarena.federated.config import LDPConfig, SimPrivacyConfig
    from fedarena.federated.fedsim_experiment import FedSimConfig, ldp_cumulative_epsilon
    from fedarena.privacy.ldp import GaussianMechanism

    cfg = FedSimConfig(kind="fedsim", privacy=SimPrivacyConfig(ldp=LDPConfig(epsilon=1.0, delta=1e-5, clip_norm=1.0)))
    m = GaussianMechanism(1.0, 1e-5, 1.0)
    # one release: the RDP curve of a Gaussian with multiplier s is alpha / (2 s^2); closed-form conversion
    s = m.sigma / m.sensitivity
    orders = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
    for uploads in (1, 10):
        rdp = uploads * orders / (2 * s * s)
        eps = rdp - (np.log(1e-5) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
        assert ldp_cumulative_epsilon(cfg, uploads) == pytest.approx(float(eps.min()), rel=1e-6)
    assert ldp_cumulative_epsilon(cfg, 10) < 10 * 1.0


def test_step_schedules():
    from fedarena.federated.fedsim_experiment import StepSchedule

    lin = StepSchedule("linear", 2, 5, 1.0)
    assert [lin.steps(r, None) for r in range(1, 7)] == [2, 3, 4, 5, 5, 5]
    div = StepSchedule("divergence", 1, 8, 1.0)
    got = [div.steps(1, None), div.steps(2, 0.1), div.steps(3, 0.2), div.steps(4, 5.0), div.steps(5, 0.1)]
    assert got == [1, 2, 4, 2, 4]


def test_secagg_round_without_enough_shares_is_abandoned_not_crashed():
    ups = [st.ClientUpdate(f"c{i}", {"w": np.full(3, 0.01 * i)}, 5) for i in range(5)]
    s0 = st.FedAvg().init_state({"w": np.zeros(3)})
    sec = stages.SecureAggregation(st.FedAvg(), threshold=1.0, dropout=0.5, seed=0)  # every share needed
    s1 = sec.aggregate(s0, ups, 5)
    assert sec.last_report["secagg_aborted"] == 1 and s1.round == 2
    np.testing.assert_array_equal(s1.params["w"], s0.params["w"])


def test_linear_is_false_for_dp_fedavg_and_secagg_and_forwarded_by_other_wrappers():
    """``linear`` means the aggregate is the server step of the updates' partial sum (the runtime's servers may
    pre-aggregate): a forwarding wrapper keeps FedAvg's True and its partial path equals its aggregate; DP-FedAvg
    (clips each update) and SecAgg (masks each update) report False whatever their inner strategy and refuse a
    partial sum."""
    from dataclasses import dataclass
    from typing import Any

    from fedarena.federated.wrappers import DPFedAvg, SecureAggregation, StrategyWrapper

    @dataclass
    class Forwarding(StrategyWrapper):
        inner: Any

    ups = [st.ClientUpdate(f"c{i}", {"w": np.random.default_rng(i).uniform(-0.05, 0.05, 6)}, 5 + i) for i in range(4)]
    s0 = st.FedAvg().init_state({"w": np.zeros(6)})
    fwd = Forwarding(st.FedAvg())
    assert fwd.linear and st.FedAvg().linear
    total = st.PartialAggregate()
    for u in ups:
        total.add(u.client_id, u.delta, u.num_examples)
    np.testing.assert_allclose(fwd.aggregate_partial(s0, total).params["w"], fwd.aggregate(s0, ups, 4).params["w"])
    mech = DPFedAvgMechanism(clip_norm=0.1, noise_multiplier=0.0, sample_rate=0.5, num_clients=4, seed=0)
    for w in (DPFedAvg(st.FedAvg(), mech), SecureAggregation(st.FedAvg()), Forwarding(DPFedAvg(st.FedAvg(), mech))):
        assert w.linear is False
        with pytest.raises(ValueError, match="partial sum"):
            w.aggregate_partial(s0, total)


def test_the_scheduler_runs_secure_rounds_only_through_the_wrapper_around_a_linear_strategy(tmp_path):
    from fedarena.federated import auth
    from fedarena.federated.protocol import RoundConfig
    from fedarena.federated.scheduler import RoundPolicy, Scheduler
    from fedarena.federated.wrappers import SecureAggregation

    params = {"w": np.zeros(3)}
    secure_policy = RoundPolicy(clients_per_round=4, round_config=RoundConfig(secagg=True))
    sched = Scheduler(secure_policy, params, auth.new_secret(), tmp_path / "a.fl")
    assert isinstance(sched.strategy, SecureAggregation) and not sched.collect  # no delta ever reaches it
    with pytest.raises(ValueError, match="secure rounds run the SecureAggregation wrapper"):
        Scheduler(secure_policy, params, auth.new_secret(), tmp_path / "b.fl", strategy=st.FedAvg())
    with pytest.raises(ValueError, match="inner strategy must be linear"):
        Scheduler(RoundPolicy(clients_per_round=4), params, auth.new_secret(), tmp_path / "c.fl",
                  strategy=SecureAggregation(st.RobustAggregate(rule="median")))
    with pytest.raises(ValueError, match="strategy.secagg_scale: 3 clients x"):  # checked as the policy's own config
        Scheduler(RoundPolicy(clients_per_round=4), params, auth.new_secret(), tmp_path / "d.fl",
                  strategy=SecureAggregation(st.FedAvg(), scale=2.0 ** 30))
    steps = Scheduler(RoundPolicy(clients_per_round=4), params, auth.new_secret(), tmp_path / "e.fl",
                      strategy=st.FedAvg(st.FitConfig(lr=0.3, local_steps=5)))
    with pytest.raises(ValueError, match="configure: round 1 asks for 5 local steps"):  # the round is abandoned
        steps._round_config(1)
    fit = Scheduler(RoundPolicy(clients_per_round=4), params, auth.new_secret(), tmp_path / "f.fl",
                    strategy=st.FedAvg(st.FitConfig(epochs=3, batch_size=7, lr=0.3, prox_mu=0.01)))
    cfg = fit._round_config(1)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.prox_mu, cfg.secagg) == (3, 7, 0.3, 0.01, False)
