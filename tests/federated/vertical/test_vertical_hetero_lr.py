"""Hetero LR: equals a plaintext Taylor-LR oracle, 2-party == 3-party, AUC vs centralized LR after PSI."""

import math

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score

from fedarena.federated.vertical import hetero_lr as H
from fedarena.federated.vertical import psi
from fedarena.federated.vertical.messages import ProtocolError
from fedarena.federated.vertical.partition import standardize, train_test_rows, vertical_partition


def _plain_taylor(xa, y, xb, cfg, taylor=True):
    """Independent plaintext reference with the same public batch order."""
    xa1 = np.hstack([xa, np.ones((len(xa), 1))])
    ta, tb = np.zeros(xa1.shape[1]), np.zeros(xb.shape[1])
    losses = []
    for epoch in range(1, cfg.epochs + 1):
        ls, ws = [], []
        for idx in H._batches(len(xa), cfg, epoch):
            u = xa1[idx] @ ta + xb[idx] @ tb
            ys = 2.0 * y[idx] - 1
            d = (u / 4 - ys / 2) if taylor else (1 / (1 + np.exp(-u)) - y[idx])
            ls.append(np.mean(math.log(2) - ys * u / 2 + u * u / 8))
            ws.append(len(idx))
            ra = cfg.l2 * ta
            ra[-1] = 0
            ta = ta - cfg.learning_rate * (xa1[idx].T @ d / len(idx) + ra)
            tb = tb - cfg.learning_rate * (xb[idx].T @ d / len(idx) + cfg.l2 * tb)
        losses.append(np.average(ls, weights=ws))
    return ta, tb, losses


@pytest.fixture(scope="module")
def small():
    x, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    rows = rng.choice(len(x), 96, replace=False)
    x = (x[rows] - x.mean(0)) / x.std(0)
    return x[:, :12], y[rows], x[:, 12:]


def test_three_party_matches_plaintext_taylor_oracle_and_two_party(small):
    xa, y, xb = small
    cfg = H.HeteroLRConfig(epochs=2, batch_size=32, learning_rate=0.2, key_bits=1024, allow_insecure_keys=True)
    ta, tb, losses = _plain_taylor(xa, y, xb, cfg)
    runs = {}
    for coord in (True, False):
        m = H.HeteroLR(xa, y, xb, cfg, coordinator=coord)
        reps = [m.train_epoch() for _ in range(cfg.epochs)]
        runs[coord] = (m.a.state.theta, m.b.state.theta, [r.loss for r in reps], reps)
        np.testing.assert_allclose(m.a.state.theta, ta, atol=1e-6)
        np.testing.assert_allclose(m.b.state.theta, tb, atol=1e-6)
        np.testing.assert_allclose([r.loss for r in reps], losses, atol=1e-7)
        assert all(r.bytes > 0 and r.seconds["crypto"] > 0 for r in reps)
    # the two protocols compute identical fixed-point integers, hence identical models
    assert np.array_equal(runs[True][0], runs[False][0]) and np.array_equal(runs[True][1], runs[False][1])
    assert runs[True][2] == runs[False][2]


def test_breast_cancer_after_psi_auc_close_to_centralized():
    x, y = load_breast_cancer(return_X_y=True)
    a, b = vertical_partition(x, y, features_a=15, shared_fraction=0.8, seed=1)
    assert len(set(a.ids) & set(b.ids)) == round(0.8 * len(x))
    ra, rb = psi.intersect(a.ids, b.ids, key_bits=1024, workers=1, allow_insecure_keys=True)
    assert set(ra.ids) == set(a.ids) & set(b.ids)
    xa, ya, xb = a.x[ra.indices], a.y[ra.indices], b.x[rb.indices]
    train, test = train_test_rows(len(xa), 0.25, seed=1)
    xa, xb = standardize(xa, train), standardize(xb, train)
    cfg = H.HeteroLRConfig(epochs=3, batch_size=64, learning_rate=0.1, key_bits=1024, allow_insecure_keys=True)
    # the two-party protocol computes the same model as the coordinated one (tested above) and its
    # encryptions are cheaper (each party encrypts under its own key, with CRT)
    m = H.HeteroLR(xa[train], ya[train], xb[train], cfg, coordinator=False)
    for _ in range(cfg.epochs):
        m.train_epoch()
    # joint inference on the held-out rows: A's rows and B's rows of the same users
    m.a.x = np.hstack([xa, np.ones((len(xa), 1))])
    m.b.x = xb
    auc_vfl = roc_auc_score(ya[test], m.predict(test))
    # centralized LR on the joined data: true log-loss gradient, same batches, l2, epochs
    ca, cb, _ = _plain_taylor(xa[train], ya[train], xb[train], cfg, taylor=False)
    u = np.hstack([xa[test], np.ones((len(test), 1))]) @ ca + xb[test] @ cb
    auc_central = roc_auc_score(ya[test], u)
    assert auc_vfl > 0.97
    assert abs(auc_vfl - auc_central) <= 0.01


def test_malformed_messages_are_rejected(small):
    xa, y, xb = small
    cfg = H.HeteroLRConfig(epochs=1, batch_size=16, key_bits=1024, allow_insecure_keys=True)
    m = H.HeteroLR(xa, y, xb, cfg)
    with pytest.raises(ProtocolError, match="vlr.batch.indices"):
        m.b.receive_batch(H.BatchMsg(1, 0, np.array([0, 500])))
    with pytest.raises(ProtocolError, match="vlr.batch.indices"):
        m.b.receive_batch(H.BatchMsg(1, 0, np.array([1, 1])))
    m.a.batch(1, 0, np.arange(4))
    m.b.receive_batch(H.BatchMsg(1, 0, np.arange(4)))
    fwd = m.b.forward()
    with pytest.raises(ProtocolError, match="vlr.forward.count"):
        m.a.receive_forward(H.ForwardMsg(3, fwd.frac_bits, fwd.u, fwd.u2))
    with pytest.raises(ProtocolError, match=r"vlr.forward.u\b|vlr.forward.u:"):
        m.a.receive_forward(H.ForwardMsg(4, fwd.frac_bits, fwd.u[:-1], fwd.u2))
    with pytest.raises(ProtocolError, match="vfl.masked.ciphertexts"):
        m.c.decryptor.decrypt(H.MaskedMsg(40, 120, 1, b""))
    with pytest.raises(ProtocolError, match="vfl.public_key.bits"):
        H.read_public_key(H.PublicKeyMsg(512, bytes(64)), min_bits=1024)
    with pytest.raises(ProtocolError, match="vlr.scores.scores"):
        m.a.scores(np.arange(3), H.ScoresMsg(np.array([1.0, np.nan, 0.0])))
    with pytest.raises(ValueError, match="hetero_lr.value_bits"):
        H.HeteroLRConfig(key_bits=512, value_bits=300, allow_insecure_keys=True)
