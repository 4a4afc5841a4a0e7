"""Readers of data sets on disk (fedarena.federated.datasets) against files written by independent writers:
json (LEAF), h5py (TFF's HDF5 client data), struct (CIFAR's binary records)."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from fedarena.federated.data import LEAF_LETTERS, DataError, DataSpec, PartitionSpec, load
from fedarena.federated.datasets.pipeline import Examples, augment_crop_flip

h5py = pytest.importorskip("h5py")


def _femnist_users(rng, sizes):
    return {f"f{i:04d}": {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
            for i, n in enumerate(sizes)}


def _write_leaf(path, users):
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(users)
    path.write_text(json.dumps({"users": names, "num_samples": [len(users[u]["y"]) for u in names],
                                "user_data": users}))


def _spec(dataset, path, k, **kw):
    return DataSpec(dataset=dataset, path=str(path), partition=PartitionSpec(num_clients=k), **kw)


def test_leaf_femnist_per_user_counts_shapes_labels_and_test_split(tmp_path):
    rng = np.random.default_rng(0)
    a, b = _femnist_users(rng, [3, 5]), _femnist_users(rng, [4, 2, 6])
    b = {k.replace("f", "g"): v for k, v in b.items()}
    test = {u: _femnist_users(rng, [2])["f0000"] for u in list(a) + list(b)}
    _write_leaf(tmp_path / "train" / "a.json", a)
    _write_leaf(tmp_path / "train" / "b.json", b)
    _write_leaf(tmp_path / "test" / "t.json", test)
    d = load(_spec("leaf_femnist", tmp_path, 5), seed=0)
    users = {**a, **b}
    assert d.num_clients == 5 and d.num_classes == 62 and d.num_features == 784
    for i, u in enumerate(users):
        x, y = d.client(i)
        np.testing.assert_allclose(x, np.array(users[u]["x"], np.float32))
        np.testing.assert_array_equal(y, users[u]["y"])
        xh, yh = d.client_held_out(i)
        np.testing.assert_allclose(xh, np.array(test[u]["x"], np.float32))
        np.testing.assert_array_equal(yh, test[u]["y"])
    # the index is cached beside the data and reused; a changed file is re-indexed
    cached = list((tmp_path / "train" / ".fedarena_index").glob("*.npz"))
    assert len(cached) == 1
    b["g0000"]["y"][0] = (b["g0000"]["y"][0] + 1) % 62
    _write_leaf(tmp_path / "train" / "b.json", b)
    d2 = load(_spec("leaf_femnist", tmp_path, 5), seed=0)
    assert d2.client(2)[1][0] == b["g0000"]["y"][0]


def test_leaf_shakespeare_next_character_vocabulary(tmp_path):
    text = "To be, or not to be: that is the question!\nWhether 'tis nobler in the mind to suffer [x]"
    rng = np.random.default_rng(1)
    xs, ys = [], []
    for _ in range(7):
        j = int(rng.integers(80, len(text)))
        xs.append(text[j - 80: j])
        ys.append(text[j])
    _write_leaf(tmp_path / "s.json", {"THE_KING": {"x": xs[:4], "y": ys[:4]}, "HAMLET": {"x": xs[4:], "y": ys[4:]}})
    d = load(_spec("leaf_shakespeare", tmp_path / "s.json", 2, held_out_fraction=0.0), seed=0)
    # the language models' layout: 81 ids (the 80 characters, then the next one), id 0 the pad
    assert len(LEAF_LETTERS) == 80 and d.num_classes == 81 and d.num_features == 81
    x, y = d.client(1)
    assert "".join(LEAF_LETTERS[int(c) - 1] for c in x[0]) == xs[4] + ys[4]
    assert [LEAF_LETTERS[int(c) - 1] for c in y] == ys[4:]
    np.testing.assert_array_equal(x[:, -1], y)


def _leaf_error(tmp_path, content, dataset="leaf_femnist"):
    f = tmp_path / "bad.json"
    f.write_text(content) if isinstance(content, str) else f.write_bytes(content)
    with pytest.raises(DataError) as e:
        load(_spec(dataset, f, 1), seed=0)
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and msg.startswith("data.path: ")
    return msg


def test_leaf_truncated_and_inconsistent_files_one_line(tmp_path):
    good = json.dumps({"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[0.5] * 784], "y": [3]}}})
    assert "truncated" in _leaf_error(tmp_path, good[: len(good) // 2])
    assert "truncated" in _leaf_error(tmp_path, good[:-1])
    assert "num_samples says 2" in _leaf_error(tmp_path, good.replace('"num_samples": [1]', '"num_samples": [2]'))
    assert "differ" in _leaf_error(tmp_path, good.replace('"users": ["u"]', '"users": ["v"]'))
    assert "784" in _leaf_error(tmp_path, good.replace("[[0.5, ", "[["))  # a row of 783 values
    assert "vocabulary" in _leaf_error(
        tmp_path, json.dumps({"users": ["u"], "user_data": {"u": {"x": ["a" * 80], "y": ["\u00e9"]}}}),
        "leaf_shakespeare")


def _tff(path, clients, features):
    with h5py.File(path, "w") as f:
        ex = f.create_group("examples")
        for cid, feats in clients.items():
            g = ex.create_group(cid)
            for k in features:
                g.create_dataset(k, data=feats[k])


def test_tff_emnist_train_and_test_files(tmp_path):
    rng = np.random.default_rng(2)
    sizes = {"f0000_14": 5, "f0001_41": 3, "f0002_07": 9}
    tr = {c: {"pixels": rng.random((n, 28, 28), np.float32), "label": rng.integers(0, 62, n).astype(np.int32)}
          for c, n in sizes.items()}
    te = {c: {"pixels": rng.random((2, 28, 28), np.float32), "label": rng.integers(0, 62, 2).astype(np.int32)}
          for c in sizes}
    _tff(tmp_path / "fed_emnist_train.h5", tr, ("pixels", "label"))
    _tff(tmp_path / "fed_emnist_test.h5", te, ("pixels", "label"))
    d = load(_spec("tff_emnist", tmp_path, 3), seed=0)
    assert d.num_classes == 62 and d.num_features == 784
    with h5py.File(tmp_path / "fed_emnist_train.h5", "r") as f:
        order = list(f["examples"])  # the file's client order
    for i, c in enumerate(order):
        x, y = d.client(i)
        np.testing.assert_array_equal(x, tr[c]["pixels"].reshape(-1, 784))
        np.testing.assert_array_equal(y, tr[c]["label"])
        np.testing.assert_array_equal(d.client_held_out(i)[1], te[c]["label"])
    assert len(d.test_set()[1]) == 6


def test_tff_cifar100_fine_and_coarse_labels(tmp_path):
    rng = np.random.default_rng(3)
    cl = {str(i): {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                   "label": rng.integers(0, 100, n), "coarse_label": rng.integers(0, 20, n)}
          for i, n in enumerate([4, 6])}
    _tff(tmp_path / "fed_cifar100_train.h5", cl, ("image", "label", "coarse_label"))
    fine = load(_spec("tff_cifar100", tmp_path, 2, held_out_fraction=0.0), seed=0)
    coarse = load(_spec("tff_cifar100", tmp_path, 2, held_out_fraction=0.0, label="coarse"), seed=0)
    assert fine.num_classes == 100 and coarse.num_classes == 20 and fine.num_features == 3072
    np.testing.assert_array_equal(fine.client(1)[1], cl["1"]["label"])
    np.testing.assert_array_equal(coarse.client(1)[1], cl["1"]["coarse_label"])
    # evaluation reads are not augmented: CHW pixels, standardised with CIFAR-100's channel statistics
    mean, std = np.array([0.5071, 0.4865, 0.4409]), np.array([0.2673, 0.2564, 0.2762])
    want = ((cl["0"]["image"] / 255.0 - mean) / std).transpose(0, 3, 1, 2).reshape(4, -1)
    np.testing.assert_allclose(fine.client(0)[0], want, rtol=1e-5, atol=1e-5)


def test_tff_shakespeare_snippets(tmp_path):
    sn = {"THE_TRAGEDY_OF_KING_LEAR_KENT": np.array([b"I have years on my back", b" forty-eight.$"], dtype=object),
          "ROMEO": np.array([b"But soft!"], dtype=object)}
    with h5py.File(tmp_path / "shakespeare_train.h5", "w") as f:
        for c, s in sn.items():
            f.create_dataset(f"examples/{c}/snippets", data=s, dtype=h5py.string_dtype())
    d = load(_spec("tff_shakespeare", tmp_path, 2, held_out_fraction=0.0), seed=0)
    # TFF's vocabulary (as typed in TFF's preprocessing): pad 0, 86 characters, oov 87, bos 88, eos 89
    vocab = "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
    assert len(vocab) == 86 and d.num_classes == 90 and d.num_features == 81
    with h5py.File(tmp_path / "shakespeare_train.h5", "r") as f:
        order = list(f["examples"])  # the file's client order
    x, y = d.client(order.index("THE_TRAGEDY_OF_KING_LEAR_KENT"))

    def ids(s):  # each snippet: bos, characters, eos, padded to a multiple of 81
        out = [88] + [vocab.index(c) + 1 if c in vocab else 87 for c in s] + [89]
        return out + [0] * (-len(out) % 81)

    want = np.array(ids("I have years on my back") + ids(" forty-eight.$")).reshape(-1, 81)
    assert x.shape == (2, 81)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(y, [89, 89])  # the last non-pad id of each example
    long = "a" * 170  # 172 ids: three examples, the last holding 10 ids
    (tmp_path / "long").mkdir()
    with h5py.File(tmp_path / "long" / "shakespeare_train.h5", "w") as f:
        f.create_dataset("examples/LONG/snippets", data=np.array([long.encode()], dtype=object),
                         dtype=h5py.string_dtype())
    x3, y3 = load(_spec("tff_shakespeare", tmp_path / "long", 1, held_out_fraction=0.0), seed=0).client(0)
    assert x3.shape == (3, 81) and (x3[2, 10:] == 0).all() and list(y3) == [vocab.index("a") + 1] * 2 + [89]


def test_tff_corrupt_and_malformed_files(tmp_path):
    f = tmp_path / "fed_emnist_train.h5"
    _tff(f, {"a": {"pixels": np.zeros((3, 28, 28), np.float32), "label": np.zeros(3, np.int32)}}, ("pixels", "label"))
    raw = f.read_bytes()
    for content, word in ((raw[: len(raw) // 3], "HDF5"), (b"not hdf5 at all" * 100, "HDF5")):
        f.write_bytes(content)
        with pytest.raises(DataError) as e:
            load(_spec("tff_emnist", tmp_path, 1), seed=0)
        assert str(f) in str(e.value) and word in str(e.value) and "\n" not in str(e.value)
    _tff(f, {"a": {"pixels": np.zeros((3, 28, 27), np.float32), "label": np.zeros(3, np.int32)}}, ("pixels", "label"))
    with pytest.raises(DataError, match="expected"):
        load(_spec("tff_emnist", tmp_path, 1), seed=0)


def _cifar10_bin(path, labels, rng):
    imgs = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
    path.write_bytes(b"".join(struct.pack("B", int(lab)) + img.tobytes() for lab, img in zip(labels, imgs)))
    return imgs


def test_cifar10_binary_partition_and_test_file(tmp_path):
    rng = np.random.default_rng(4)
    labels = [rng.integers(0, 10, 30), rng.integers(0, 10, 20)]
    imgs = [_cifar10_bin(tmp_path / f"data_batch_{k + 1}.bin", labels[k], rng) for k in range(2)]
    test_imgs = _cifar10_bin(tmp_path / "test_batch.bin", rng.integers(0, 10, 8), rng)
    d = load(_spec("cifar10", tmp_path, 5, held_out_fraction=0.0, augment=False), seed=0)
    allimg, alllab = np.concatenate(imgs), np.concatenate(labels)
    mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
    seen = []
    for i in range(5):
        x, y = d.client(i)
        raw = (x.reshape(-1, 3, 1024) * std[None, :, None] + mean[None, :, None]) * 255
        rec = np.rint(raw).reshape(-1, 3072).astype(np.uint8)
        for r, lab in zip(rec, y):  # every example is one of the file's records, with its label
            k = int(np.flatnonzero((allimg == r).all(1))[0])
            assert alllab[k] == lab
            seen.append(k)
    assert sorted(seen) == list(range(50))
    assert d.test_set()[0].shape == (8, 3072) and len(test_imgs) == 8


def test_cifar100_binary_and_errors(tmp_path):
    rng = np.random.default_rng(5)
    coarse, fine = rng.integers(0, 20, 12), rng.integers(0, 100, 12)
    img = rng.integers(0, 256, (12, 3072), dtype=np.uint8)
    (tmp_path / "train.bin").write_bytes(b"".join(struct.pack("BB", c, f) + i.tobytes()
                                                  for c, f, i in zip(coarse, fine, img)))
    d = load(_spec("cifar100", tmp_path, 3, held_out_fraction=0.0), seed=0)
    assert d.num_classes == 100 and sorted(d.y.tolist()) == sorted(fine.tolist())
    dc = load(_spec("cifar100", tmp_path, 3, held_out_fraction=0.0, label="coarse"), seed=0)
    assert dc.num_classes == 20 and sorted(dc.y.tolist()) == sorted(coarse.tolist())
    f = tmp_path / "train.bin"
    f.write_bytes(f.read_bytes()[:-100])  # truncated
    with pytest.raises(DataError, match="not a whole number of 3074-byte") as e:
        load(_spec("cifar100", tmp_path, 3), seed=0)
    assert str(f) in str(e.value)
    f.write_bytes(struct.pack("BB", 3, 140) + bytes(3072))
    with pytest.raises(DataError, match="label 140 outside 0..99"):
        load(_spec("cifar100", tmp_path, 1), seed=0)


def test_cifar_python_pickle_version_refused(tmp_path):
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({"data": [], "labels": []}))
    with pytest.raises(DataError, match="pickled") as e:
        load(_spec("cifar10", tmp_path, 1), seed=0)
    assert str(tmp_path / "data_batch_1") in str(e.value)


def test_augment_is_a_crop_of_the_padded_image_maybe_flipped():
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (20, 3, 8, 8), dtype=np.uint8)
    out = augment_crop_flip(x, np.random.default_rng(0))
    flips = 0
    for a, b in zip(x, out):
        p = np.pad(a, ((0, 0), (4, 4), (4, 4)))
        found = [(dy, dx, fl) for dy in range(9) for dx in range(9) for fl in (0, 1)
                 if np.array_equal(b, p[:, dy: dy + 8, dx: dx + 8][:, :, ::-1] if fl else p[:, dy: dy + 8, dx: dx + 8])]
        assert found
        flips += all(f[2] for f in found)
    assert 0 < flips < 20
    np.testing.assert_array_equal(out, augment_crop_flip(x, np.random.default_rng(0)))


def test_examples_sequence_is_lazy_ranges():
    e = Examples(np.array([0, 5, 7]), np.array([5, 2, 4]))
    assert len(e) == 3 and e[1].tolist() == [5, 6] and e[1:][1].tolist() == [7, 8, 9, 10]
