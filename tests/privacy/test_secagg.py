"""Secure aggregation (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020): exact sums under dropouts at every
stage, aborts below the threshold, uniformity of masked vectors, rejection of hostile messages."""

import dataclasses

import numpy as np
import pytest
from scipy import stats

from fedarena.privacy.secagg import (
    InsufficientSurvivorsError,
    ProtocolError,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    decode,
    encode,
    quantize,
    secure_aggregate,
)
from fedarena.privacy.secagg.messages import AdvertiseKeys, MaskedInput, ShareBroadcast, UnmaskRequest, UnmaskShares

D = 16


def make_inputs(n, d=D, seed=0):
    rng = np.random.default_rng(seed)
    return {u: rng.uniform(-1.2, 1.2, size=d) for u in range(1, n + 1)}


def expected_sum(inputs, survivors, cfg):
    acc = np.zeros(cfg.dimension, dtype=np.int64)
    for u in survivors:
        acc += quantize(inputs[u], cfg.clip, cfg.scale, cfg.modulus_bits)
    return (acc % (1 << cfg.modulus_bits)).astype(np.uint32)


def check_round(n, t, dropouts, neighbours=None, d=D, bits=24):
    cfg = SecAggConfig(dimension=d, threshold=t, clip=1.0, scale=2.0**10, modulus_bits=bits, num_neighbours=neighbours)
    inputs = make_inputs(n, d, seed=n + t)
    rep = secure_aggregate(inputs, cfg, dropouts=dropouts)
    gone = set().union(*dropouts.values()) if dropouts else set()
    before_masked = set(dropouts.get("advertise_keys", ())) | set(dropouts.get("share_keys", ())) | set(
        dropouts.get("masked_input", ()))
    survivors = sorted(set(inputs) - before_masked)
    assert rep.result.survivors == tuple(survivors)
    np.testing.assert_array_equal(rep.result.total, expected_sum(inputs, survivors, cfg))
    # the float reading is the clipped sum up to rounding
    clipped = sum(np.clip(inputs[u], -1, 1) for u in survivors)
    np.testing.assert_allclose(rep.result.values, clipped, atol=len(survivors) * 0.5 / cfg.scale + 1e-12)
    return rep, gone


STAGES = ["advertise_keys", "share_keys", "masked_input", "unmask"]


@pytest.mark.parametrize("stage", STAGES)
def test_n3_one_dropout_at_each_stage(stage):
    check_round(3, 2, {stage: {2}})


@pytest.mark.parametrize("stage", STAGES)
def test_n10_max_dropouts_at_each_stage(stage):
    check_round(10, 6, {stage: {1, 4, 7, 10}})  # n - t = 4


def test_n10_dropouts_spread_over_stages_and_no_dropout():
    check_round(10, 6, {"advertise_keys": {3}, "share_keys": {5}, "masked_input": {6}, "unmask": {9}})
    check_round(10, 6, {})


def test_n100_secagg_max_dropouts():
    drops = {"advertise_keys": set(range(1, 11)), "share_keys": set(range(11, 21)),
             "masked_input": set(range(21, 36)), "unmask": set(range(36, 50))}  # 49 = n - t
    check_round(100, 51, drops, d=8)


def test_n100_secagg_plus_ten_percent_dropout():
    rep, _ = check_round(100, 6, {"masked_input": set(range(5, 100, 10))}, neighbours=10, d=64)
    # SecAgg+ clients talk to their neighbours only: upload is far below SecAgg's n - 1 ciphertexts
    assert max(rep.bytes_sent.values()) < 64 * 4 + 10 * 200 + 1000


def test_secagg_plus_dropouts_at_each_stage_n10():
    for stage in STAGES:
        check_round(10, 3, {stage: {2}}, neighbours=4)


@pytest.mark.parametrize("n,t,drops", [
    (3, 2, {"advertise_keys": {1, 2}}),
    (10, 6, {"share_keys": {1, 2, 3, 4, 5}}),
    (10, 6, {"masked_input": {1, 2, 3}, "share_keys": {4, 5}}),
    (10, 6, {"masked_input": {1, 2}, "unmask": {3, 4, 5}}),
])
def test_fewer_than_t_survivors_aborts_without_result(n, t, drops):
    cfg = SecAggConfig(dimension=D, threshold=t, scale=2.0**10, modulus_bits=24)
    with pytest.raises(InsufficientSurvivorsError, match="threshold is 6|threshold is 2") as info:
        secure_aggregate(make_inputs(n), cfg, dropouts=drops)
    assert "no aggregate is released" in str(info.value)


def test_aborted_server_releases_nothing_and_accepts_nothing():
    cfg = SecAggConfig(dimension=D, threshold=4, scale=2.0**10, modulus_bits=24)
    inputs = make_inputs(5)
    server = SecAggServer(cfg, 7, inputs)
    clients = {u: SecAggClient(u, cfg, 7) for u in inputs}
    for u in inputs:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in inputs:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    for u in (1, 2, 3):  # only 3 < t masked inputs arrive
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    with pytest.raises(InsufficientSurvivorsError, match="3 clients sent masked inputs"):
        server.close_stage()
    assert server.stage_name == "aborted"
    with pytest.raises(ProtocolError, match="aborted"):
        server.close_stage()
    with pytest.raises(ProtocolError, match="aborted"):
        server.receive(clients[4].masked_input(sb[4], inputs[4]))


def test_client_refuses_to_unmask_below_threshold_or_both_shares():
    cfg = SecAggConfig(dimension=D, threshold=3, scale=2.0**10, modulus_bits=24)
    inputs = make_inputs(4)
    server = SecAggServer(cfg, 1, inputs)
    clients = {u: SecAggClient(u, cfg, 1) for u in inputs}
    for u in inputs:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in inputs:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    for u in inputs:
        server.receive(clients[u].masked_input(sb[u], inputs[u]))
    with pytest.raises(InsufficientSurvivorsError, match="refusing"):
        clients[1].unmask(UnmaskRequest(1, 1, (1, 2), (3, 4)))
    with pytest.raises(ProtocolError, match="both"):
        clients[1].unmask(UnmaskRequest(1, 1, (1, 2, 3, 4), (4,)))
    with pytest.raises(ProtocolError, match="neither"):
        clients[1].unmask(UnmaskRequest(1, 1, (1, 2, 3), ()))
    # a legitimate request still works afterwards, and only once
    um = server.close_stage()
    reply = clients[1].unmask(um[1])
    assert set(reply.seed_shares) == {1, 2, 3, 4} and not reply.key_shares
    with pytest.raises(ProtocolError, match="stage"):
        clients[1].unmask(um[1])


def test_masked_vector_alone_is_uniform():
    d, bits = 40_000, 16
    cfg = SecAggConfig(dimension=d, threshold=2, clip=1.0, scale=2.0**6, modulus_bits=bits)
    x = np.full(d, 0.5)  # a constant input: completely non-uniform before masking
    server = SecAggServer(cfg, 0, [1, 2, 3])
    clients = {u: SecAggClient(u, cfg, 0) for u in (1, 2, 3)}
    for u in clients:
        server.receive(clients[u].advertise_keys())
    kb = server.close_stage()
    for u in clients:
        server.receive(clients[u].share_keys(kb[u]))
    sb = server.close_stage()
    y = clients[1].masked_input(sb[1], x).masked
    assert int(y.max()) < 2**bits
    counts = np.bincount(y >> (bits - 8), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-6
    assert stats.kstest(y / 2**bits, "uniform").pvalue > 1e-6
    # the test has power: the unmasked quantized input fails it
    q = quantize(x, 1.0, cfg.scale, bits)
    assert stats.chisquare(np.bincount(q >> (bits - 8), minlength=256)).pvalue < 1e-12


# -- hostile messages ---------------------------------------------------------------------------------------


class Round:
    """Drives 5 clients by hand so the tests can inject messages between stages."""

    def __init__(self, n=5, t=3, round_id=11, d=D):
        self.cfg = SecAggConfig(dimension=d, threshold=t, scale=2.0**10, modulus_bits=24)
        self.inputs = make_inputs(n, d)
        self.server = SecAggServer(self.cfg, round_id, self.inputs)
        self.clients = {u: SecAggClient(u, self.cfg, round_id) for u in self.inputs}
        self.round_id = round_id

    def send(self, msg):
        self.server.receive(encode(msg))

    def finish(self, from_stage=0, msgs=None, tamper_shares=None):
        s, c = self.server, self.clients
        if from_stage <= 0:
            for u in c:
                self.send(c[u].advertise_keys())
            msgs = s.close_stage()
        if from_stage <= 1:
            for u in msgs:
                self.send(c[u].share_keys(decode(encode(msgs[u]))))
            msgs = s.close_stage()
            if tamper_shares:
                msgs = tamper_shares(msgs)
        if from_stage <= 2:
            for u in msgs:
                self.send(c[u].masked_input(msgs[u], self.inputs[u]))
            msgs = s.close_stage()
        for u in msgs:
            self.send(c[u].unmask(msgs[u]))
        res = s.close_stage()
        np.testing.assert_array_equal(res.total, expected_sum(self.inputs, res.survivors, self.cfg))
        return res


def test_honest_round_via_wire():
    res = Round().finish()
    assert res.survivors == (1, 2, 3, 4, 5)


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0", "trailing"),
    (lambda b: b"XYZ" + b[3:], "magic"),
    (lambda b: b[:4] + bytes([99]) + b[5:], "unknown message type"),
    (lambda b: b[:3] + bytes([1]) + b[4:], "version"),
    (lambda b: b[:6], "header"),
])
def test_malformed_bytes_rejected_and_round_continues(mutate, match):
    r = Round()
    good = r.clients[1].advertise_keys()
    with pytest.raises(ProtocolError, match=match):
        r.server.receive(mutate(encode(good)))
    r.server.receive(encode(good))
    for u in (2, 3, 4, 5):
        r.send(r.clients[u].advertise_keys())
    r.finish(from_stage=1, msgs=r.server.close_stage())


def test_unknown_duplicate_replayed_wrong_round_rejected():
    r = Round()
    c, s = r.clients, r.server
    adv = {u: c[u].advertise_keys() for u in c}
    r.send(adv[1])
    with pytest.raises(ProtocolError, match="duplicate"):
        r.send(adv[1])
    with pytest.raises(ProtocolError, match="unknown"):
        r.send(dataclasses.replace(adv[2], client_id=99))
    with pytest.raises(ProtocolError, match="round_id"):
        r.send(dataclasses.replace(adv[2], round_id=r.round_id - 1))
    with pytest.raises(ProtocolError, match="c_pk"):
        s.receive(AdvertiseKeys(r.round_id, 2, b"short", adv[2].s_pk))
    for u in (2, 3, 4, 5):
        r.send(adv[u])
    kb = s.close_stage()
    with pytest.raises(ProtocolError, match="unexpected in stage"):  # replay of a stage-0 message in stage 1
        r.send(adv[3])
    with pytest.raises(ProtocolError, match="round_id"):  # client side: a stale broadcast
        c[1].share_keys(dataclasses.replace(kb[1], round_id=r.round_id + 1))
    with pytest.raises(ProtocolError, match="recipient"):
        c[1].share_keys(kb[2])
    sk = {u: c[u].share_keys(kb[u]) for u in c}
    bad = dict(sk[1].ciphertexts)
    bad.pop(2)
    with pytest.raises(ProtocolError, match="missing"):
        s.receive(dataclasses.replace(sk[1], ciphertexts=bad))
    bad = dict(sk[1].ciphertexts)
    bad[2] = bad[2][:-1]
    with pytest.raises(ProtocolError, match="bytes, expected"):
        s.receive(dataclasses.replace(sk[1], ciphertexts=bad))
    for u in c:
        r.send(sk[u])
    with pytest.raises(ProtocolError, match="duplicate"):
        r.send(sk[4])
    sb = s.close_stage()
    mi = {u: c[u].masked_input(sb[u], r.inputs[u]) for u in c}
    with pytest.raises(ProtocolError, match="expected 16"):
        s.receive(MaskedInput(r.round_id, 1, np.zeros(15, np.uint32)))
    with pytest.raises(ProtocolError, match=r"2\^24"):
        s.receive(MaskedInput(r.round_id, 1, np.full(16, 2**24, np.uint32)))
    for u in c:
        r.send(mi[u])
    um = s.close_stage()
    with pytest.raises(ProtocolError, match="not dropped"):
        s.receive(UnmaskShares(r.round_id, 1, {}, {2: np.zeros(32, np.uint16)}))
    r.finish(from_stage=3, msgs=um)


def test_tampered_and_misaddressed_shares_fail_authentication_round_continues():
    r = Round(n=6, t=4)

    def tamper(msgs):
        out = dict(msgs)
        cts = dict(out[2].ciphertexts)
        ct = bytearray(cts[1])
        ct[20] ^= 1  # flip one bit of client 1's share for client 2
        cts[1] = bytes(ct)
        cts[3] = out[4].ciphertexts[3]  # a share for client 4, re-addressed to client 2
        out[2] = ShareBroadcast(msgs[2].round_id, 2, cts)
        return out

    res = r.finish(tamper_shares=tamper)
    errs = r.clients[2].state.share_errors
    assert set(errs) == {1, 3}
    assert all("authentication failed" in e for e in errs.values())
    assert res.survivors == (1, 2, 3, 4, 5, 6)


def test_config_validation():
    with pytest.raises(ValueError, match="num_neighbours"):
        SecAggConfig(dimension=4, threshold=2, num_neighbours=3)
    with pytest.raises(ValueError, match="threshold"):
        SecAggConfig(dimension=4, threshold=6, num_neighbours=4)
    with pytest.raises(ValueError, match="modulus_bits"):
        SecAggServer(SecAggConfig(dimension=4, threshold=2, clip=1.0, scale=2.0**16, modulus_bits=16), 0, range(1, 5))
    with pytest.raises(ValueError, match="threshold"):
        SecAggServer(SecAggConfig(dimension=4, threshold=5), 0, range(1, 5))
    with pytest.raises(ValueError, match="dimension"):
        SecAggConfig(dimension=0, threshold=2)


def test_secagg_plus_aborts_when_a_neighbourhood_lacks_shares():
    # ring of degree 2: each mask seed has 3 holders (the client and its two neighbours) and needs all 3;
    # a survivor that does not answer the unmasking request leaves its own seed and the seeds of its two
    # (randomly drawn) neighbours with 2 shares each: 3 secrets, the lowest-numbered of them named first
    cfg = SecAggConfig(dimension=D, threshold=3, scale=2.0**10, modulus_bits=24, num_neighbours=2)
    with pytest.raises(InsufficientSurvivorsError,
                       match=r"mask seed b_u of client \d+ has 2 shares, threshold is 3 \(3 secrets cannot be rebuilt\)"):
        secure_aggregate(make_inputs(10), cfg, dropouts={"unmask": {4}})
