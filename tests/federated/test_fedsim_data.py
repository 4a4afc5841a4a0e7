"""Partitioners (label histograms, determinism, exact cover) and the local data sets (LEAF JSON, MNIST IDX)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedarena.federated import data as fd


def _labels(n=2000, k=10, seed=0):
    return np.random.default_rng(seed).integers(0, k, n)


def _exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))


@pytest.mark.parametrize("spec", [fd.PartitionSpec("iid", 37), fd.PartitionSpec("dirichlet", 20, alpha=0.3),
                                  fd.PartitionSpec("shards", 50, shards_per_client=2),
                                  fd.PartitionSpec("quantity", 25, beta=0.8)])
def test_every_example_once_and_deterministic(spec):
    y = _labels()
    a = fd.partition(y, spec, np.random.default_rng(5))
    b = fd.partition(y, spec, np.random.default_rng(5))
    c = fd.partition(y, spec, np.random.default_rng(6))
    _exact_cover(a, len(y))
    assert len(a) == spec.num_clients and all(len(p) > 0 for p in a)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


@pytest.mark.quick
@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_give_exactly_k_labels(k):
    y = _labels(3000)
    parts = fd.partition_shards(y, 100, k, np.random.default_rng(0))
    h = fd.label_histogram(y, parts, 10)
    assert ((h > 0).sum(1) == k).all()
    _exact_cover(parts, len(y))


def test_dirichlet_concentration_controls_label_skew():
    """Mean per-client share of the client's most common label: E[max of Dir(alpha)] grows as alpha shrinks;
    for alpha -> inf the split is IID (share ~ 1/K + noise). Checked against a Monte Carlo of Dir(alpha 1_K)
    class proportions normalised per client (the quantity the partitioner induces)."""
    y = np.repeat(np.arange(10), 500)
    rng = np.random.default_rng(1)
    top = {}
    for alpha in (0.1, 1.0, 100.0):
        parts = fd.partition_dirichlet(y, 20, alpha, rng)
        h = fd.label_histogram(y, parts, 10).astype(float)
        top[alpha] = float((h.max(1) / h.sum(1)).mean())
        # oracle: the same construction on proportions only (columns ~ Dir(alpha 1_20), rows renormalised)
        sims = []
        for _ in range(200):
            p = rng.dirichlet(np.full(20, alpha), size=10).T  # (clients, classes)
            q = p / p.sum(1, keepdims=True)
            sims.append((q.max(1)).mean())
        assert abs(top[alpha] - np.mean(sims)) < 0.08, (alpha, top[alpha], np.mean(sims))
    assert top[0.1] > top[1.0] > top[100.0]
    assert top[100.0] < 0.2


def test_quantity_skew_sizes_follow_dirichlet_but_labels_iid():
    y = _labels(5000)
    parts = fd.partition_quantity(len(y), 10, 0.5, np.random.default_rng(2))
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() > 3 * sizes.min()
    big = parts[int(sizes.argmax())]
    share = np.bincount(y[big], minlength=10) / len(big)
    assert np.abs(share - 0.1).max() < 0.05


def test_empty_client_is_an_error_naming_the_field():
    with pytest.raises(fd.DataError, match="partition.num_clients"):
        fd.partition(_labels(30), fd.PartitionSpec("iid", 31), np.random.default_rng(0))
    with pytest.raises(fd.DataError, match="partition.alpha"):
        fd.partition_dirichlet(_labels(30), 29, 0.01, np.random.default_rng(0), min_examples=1, max_tries=3)


def test_federate_digits_held_out_per_client_and_histogram_figure(tmp_path):
    d = fd.load(fd.DataSpec("digits", partition=fd.PartitionSpec("shards", 20, shards_per_client=2)), 0)
    assert d.num_clients == 20 and d.num_classes == 10
    _exact_cover(d.train + d.held_out + [d.test], len(d.y))
    assert all(len(h) > 0 for h in d.held_out)
    h = fd.label_histogram(d.y, d.train, 10)
    png = fd.plot_label_histogram(h, tmp_path / "hist.png")
    assert (tmp_path / "hist.png").stat().st_size > 1000 and png.endswith("hist.png")


def test_breast_cancer_is_standardised():
    x, y = fd.load_breast_cancer()
    assert x.shape == (569, 30) and set(np.unique(y)) == {0, 1}
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(0), 1, atol=1e-4)


def test_synthetic_fedprox_generator_structure():
    d = fd.synthetic_fedprox(0.0, 0.0, 50, 0, size_mean=2.0, size_sigma=0.5, size_min=5)
    d2 = fd.synthetic_fedprox(0.0, 0.0, 50, 0, size_mean=2.0, size_sigma=0.5, size_min=5)
    assert np.array_equal(d.x, d2.x) and np.array_equal(d.y, d2.y)
    assert d.num_clients == 50 and d.num_features == 60 and (d.sizes() >= 4).all()
    # Sigma_jj = j^-1.2: the spread around each device's mean v_k shrinks with the coordinate index
    own = np.concatenate([d.x[np.r_[t, h]] - d.x[np.r_[t, h]].mean(0) for t, h in zip(d.train, d.held_out)])
    var = own.var(0)
    ratio = var[0] / var[59]
    assert 0.5 * 60 ** 1.2 < ratio < 2 * 60 ** 1.2
    # beta controls how far device means are apart: larger beta, larger spread of device means
    wide = fd.synthetic_fedprox(0.0, 4.0, 50, 0, size_mean=2.0, size_sigma=0.5, size_min=5)
    spread = lambda dd: np.var([dd.x[t].mean() for t in dd.train])  # noqa: E731
    assert spread(wide) > 2 * spread(d)


def _leaf_doc(users, rng, dim=6):
    return {"users": users, "num_samples": [3] * len(users),
            "user_data": {u: {"x": rng.random((3, dim)).tolist(), "y": rng.integers(0, 4, 3).tolist()} for u in users}}


def test_leaf_json_train_test_folders(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    tr, te = _leaf_doc(["f_a", "f_b"], rng), _leaf_doc(["f_a", "f_b"], rng)
    (tmp_path / "train" / "all.json").write_text(json.dumps(tr))
    (tmp_path / "test" / "all.json").write_text(json.dumps(te))
    d = fd.load_leaf(tmp_path)
    assert d.num_clients == 2 and d.num_features == 6
    np.testing.assert_allclose(d.client(1)[0], np.asarray(tr["user_data"]["f_b"]["x"], np.float32))
    np.testing.assert_array_equal(d.client_held_out(0)[1], te["user_data"]["f_a"]["y"])


def test_leaf_shakespeare_strings_become_one_hot_contexts(tmp_path):
    doc = {"users": ["u"], "num_samples": [2],
           "user_data": {"u": {"x": ["To be, or not to be", "that is the question"], "y": ["!", "?"]}}}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    d = fd.load_leaf(tmp_path / "s.json", char_context=4, held_out_fraction=0.0)
    assert d.num_features == 4 * 80
    x, y = d.client(0)
    assert (x.sum(1) == 4).all()
    L = fd.LEAF_LETTERS
    assert list(y) == [L.index("!"), L.index("?")]
    assert x[0, 3 * 80 + L.index("e")] == 1 and x[1, 0 * 80 + L.index("t")] == 1  # "o be"[-1] / "tion"[0]


def test_corrupt_and_missing_leaf_name_the_field(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(fd.DataError, match=r"^data\.path: .*not a valid LEAF JSON"):
        fd.load_leaf(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text(json.dumps({"users": ["a"], "user_data": {"a": {"x": [[1.0]], "y": []}}}))
    with pytest.raises(fd.DataError, match="data.path"):
        fd.load_leaf(tmp_path / "odd.json")
    with pytest.raises(fd.DataError, match="data.path: .*no such file"):
        fd.load_leaf(tmp_path / "missing")


def test_mnist_idx_round_trip_and_bad_magic(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (30, 28, 28)).astype(np.uint8)
    labs = rng.integers(0, 10, 30).astype(np.uint8)
    fd.write_idx(tmp_path / "train-images-idx3-ubyte", imgs)
    fd.write_idx(tmp_path / "train-labels-idx1-ubyte", labs)
    import gzip

    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(
        bytes([0, 0, 8, 3]) + np.array([5, 28, 28], ">u4").tobytes() + imgs[:5].tobytes()))
    fd.write_idx(tmp_path / "t10k-labels-idx1-ubyte", labs[:5])
    xtr, ytr, xte, yte = fd.load_mnist_idx(tmp_path)
    np.testing.assert_allclose(xtr, imgs.reshape(30, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ytr, labs)
    assert xte.shape == (5, 784) and list(yte) == list(labs[:5])
    d = fd.load(fd.DataSpec("mnist", path=str(tmp_path), partition=fd.PartitionSpec("iid", 3)), 0)
    assert d.num_clients == 3 and len(d.test) == 5
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x09\x01" + b"\x00" * 8)
    with pytest.raises(fd.DataError, match="data.path: .*magic"):
        fd.load_mnist_idx(tmp_path)
