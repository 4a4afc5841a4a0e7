"""TFF's Stack Overflow read from files written by independent writers: h5py (the HDF5 layout), sqlite3 with
``tf.train.Example`` blobs serialized by protobuf's own library (the SQLite layout), plain text / json (the
word- and tag-count files). Checked: per-client counts, the 21-id next-word examples and labels written out by
hand, the bag-of-words and tag vectors, the vocabulary sizes, and one-line errors for damaged files (exit 2
through the CLI)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from fedarena.federated.data import DataError, DataSpec, PartitionSpec, load
from fedarena.federated.datasets import stackoverflow as so

h5py = pytest.importorskip("h5py")

WORDS = ["the", "is", "a", "to", ".", "how", "css", "i", "it", "in"]  # most frequent first
TAGS = {"css": 9, "android": 7, "sql": 5, "git": 2}
CLIENTS = {
    # client id: (train examples, test examples); an example: (tokens, title, tags)
    "00000001": ([("how is it", "css in a div", "css|html"),
                  (" ".join(["the"] * 21 + ["x"]), "t", "android")],  # 22 words
                 [("i . unknownword", "sql", "sql|css")]),
    "00000002": ([("a", "", "nothing-known")], []),
}


def _write_counts(folder, words=WORDS, tags=TAGS):
    (folder / so.WORD_COUNT_FILE).write_text("".join(f"{w} {len(words) + 5 - i}\n" for i, w in enumerate(words)))
    (folder / so.TAG_COUNT_FILE).write_text(json.dumps(tags))


def _write_h5(folder):
    for name, part in (("stackoverflow_train.h5", 0), ("stackoverflow_test.h5", 1)):
        with h5py.File(folder / name, "w") as f:
            for cid, splits in CLIENTS.items():
                ex = splits[part]
                if not ex:
                    continue
                g = f.create_group(f"examples/{cid}")
                for k, col in (("tokens", 0), ("title", 1), ("tags", 2)):
                    g.create_dataset(k, data=np.array([e[col].encode() for e in ex], dtype=object),
                                     dtype=h5py.string_dtype())
                g.create_dataset("score", data=np.arange(len(ex), dtype=np.int64))
                g.create_dataset("type", data=np.array([b"answer"] * len(ex), dtype=object),
                                 dtype=h5py.string_dtype())


def _example_class():
    """tf.train.Example built with protobuf's descriptor API (the same schema as TensorFlow's example.proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="fedarena_test_example.proto", package="tftest", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields, nested=()):
        m = fdp.message_type.add(name=name) if not nested else nested
        for fname, num, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = tname
        return m

    msg("BytesList", [("value", 1, F.TYPE_BYTES, F.LABEL_REPEATED, "")])
    msg("FloatList", [("value", 1, F.TYPE_FLOAT, F.LABEL_REPEATED, "")])
    msg("Int64List", [("value", 1, F.TYPE_INT64, F.LABEL_REPEATED, "")])
    feat = msg("Feature", [("bytes_list", 1, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".tftest.BytesList"),
                           ("float_list", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".tftest.FloatList"),
                           ("int64_list", 3, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".tftest.Int64List")])
    feat.oneof_decl.add(name="kind")
    for f in feat.field:
        f.oneof_index = 0
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    msg("", [("key", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""), ("value", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL,
                                                                ".tftest.Feature")], entry)
    features.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                       type_name=".tftest.Features.FeatureEntry")
    msg("Example", [("features", 1, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".tftest.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tftest.Example"))


def _serialize(Example, tokens, title, tags, score=3):
    e = Example()
    for k, v in (("tokens", tokens), ("title", title), ("tags", tags), ("type", "answer"),
                 ("creation_date", "2010-01-08 09:34:05 UTC")):
        e.features.feature[k].bytes_list.value.append(v.encode())
    e.features.feature["score"].int64_list.value.append(score)
    return e.SerializeToString()


def _write_sqlite(folder):
    Example = _example_class()
    con = sqlite3.connect(folder / "stackoverflow.sqlite")
    con.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)")
    con.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)")
    rows = []
    for cid, (train, test) in CLIENTS.items():
        for split, ex in (("train", train), ("test", test)):
            rows += [(split, cid, _serialize(Example, *e)) for e in ex]
            if ex:
                con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, len(ex)))
    rows.append(("heldout", "00000010", _serialize(Example, "a a", "b", "css")))  # another split: not read
    # rows: client 1's two train examples, its test example, client 2's, the held-out user's; written with client
    # 2's between client 1's train examples (a client's rows need not be contiguous)
    rows = [rows[0], rows[3], rows[1], rows[4], rows[2]]
    con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    return Example


def _spec(dataset, path, k=2, **kw):
    return DataSpec(dataset=dataset, path=str(path), partition=PartitionSpec(num_clients=k), held_out_fraction=0.0,
                    **kw)


# the next-word examples, written out: pad 0, words 1..10 in WORDS order, oov 11, bos 12, eos 13
W = {w: i + 1 for i, w in enumerate(WORDS)}
OOV, BOS, EOS = 11, 12, 13
NWP_1 = [[BOS, W["how"], W["is"], W["it"], EOS] + [0] * 16,
         [BOS] + [W["the"]] * 20]  # 22 words: cut to 20, no end token
NWP_1_TEST = [[BOS, W["i"], W["."], OOV, EOS] + [0] * 16]
NWP_2 = [[BOS, W["a"], EOS] + [0] * 18]


@pytest.fixture(params=["hdf5", "sqlite"])
def so_folder(request, tmp_path):
    _write_counts(tmp_path)
    (_write_h5 if request.param == "hdf5" else _write_sqlite)(tmp_path)
    return tmp_path


def test_next_word_examples_counts_labels_and_vocabulary(so_folder):
    d = load(_spec("tff_stackoverflow_nwp", so_folder), seed=0)
    assert d.num_clients == 2 and d.num_classes == len(WORDS) + 4 and d.num_features == 21
    users = list(d.x.index.users)
    i1, i2 = users.index("00000001"), users.index("00000002")
    x, y = d.client(i1)
    np.testing.assert_array_equal(x, np.array(NWP_1, np.float32))
    np.testing.assert_array_equal(y, [EOS, W["the"]])  # the last non-pad id
    xh, yh = d.client_held_out(i1)
    np.testing.assert_array_equal(xh, np.array(NWP_1_TEST, np.float32))
    np.testing.assert_array_equal(yh, [EOS])
    np.testing.assert_array_equal(d.client(i2)[0], np.array(NWP_2, np.float32))
    assert len(d.client_held_out(i2)[1]) == 0
    # the global test set: the held-out (test-split) examples
    np.testing.assert_array_equal(d.test_set()[0], np.array(NWP_1_TEST, np.float32))


def test_tag_prediction_bag_of_words_and_tags(so_folder):
    d = load(_spec("tff_stackoverflow_tag", so_folder), seed=0)
    assert d.num_classes == len(TAGS) and d.num_features == len(WORDS) + len(TAGS)
    i1 = list(d.x.index.users).index("00000001")
    x, y = d.client(i1)
    tags = ["css", "android", "sql", "git"]  # by count
    words = "how is it css in a div".split()
    bag = np.zeros(len(WORDS))
    for w in words:
        if w in W:
            bag[W[w] - 1] += 1
    np.testing.assert_allclose(x[0, :10], bag / len(words), rtol=1e-6)
    np.testing.assert_array_equal(x[0, 10:], [1, 0, 0, 0])  # css; html is not among the tags
    np.testing.assert_allclose(x[1, :10], np.eye(10)[0] * 21 / 23, rtol=1e-6)  # 21 of 23 words are "the"
    np.testing.assert_array_equal(x[1, 10:], [0, 1, 0, 0])
    np.testing.assert_array_equal(y, [tags.index("css"), tags.index("android")])
    xh, yh = d.client_held_out(i1)
    np.testing.assert_array_equal(xh[0, 10:], [1, 0, 1, 0]) and np.testing.assert_array_equal(yh, [0])


def test_standard_vocabulary_sizes(tmp_path):
    words = [f"w{i}" for i in range(10_050)]
    tags = {f"t{i}": 10_000 - i for i in range(600)}
    _write_counts(tmp_path, words, tags)
    _write_h5(tmp_path)
    nwp = so.StackOverflowReader(tmp_path, "nwp")
    assert nwp.vocab.size == 10_000 and nwp.num_classes == 10_004 and nwp.example_shape == (21,)
    assert (nwp.vocab.oov, nwp.vocab.bos, nwp.vocab.eos) == (10_001, 10_002, 10_003)
    assert nwp.vocab.words["w0"] == 1 and "w10000" not in nwp.vocab.words
    tag = so.StackOverflowReader(tmp_path, "tag")
    assert tag.num_classes == 500 and tag.example_shape == (10_500,) and tag.vocab.tags["t499"] == 499
    # a word-count file elsewhere (data.vocab_path)
    other = tmp_path / "vocab"
    other.mkdir()
    (other / "counts.txt").write_text("zebra 5\nthe 3\n")
    r = so.StackOverflowReader(tmp_path, "nwp", str(other / "counts.txt"))
    assert r.vocab.words == {"zebra": 1, "the": 2} and r.num_classes == 6


def _error(dataset, path, **kw):
    with pytest.raises(DataError) as e:
        load(_spec(dataset, path, 1, **kw), seed=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.")
    return msg


def test_damaged_files_one_line_naming_the_file(tmp_path):
    _write_counts(tmp_path)
    _write_h5(tmp_path)
    f = tmp_path / "stackoverflow_train.h5"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 3])
    assert str(f) in _error("tff_stackoverflow_nwp", tmp_path) and "HDF5" in _error("tff_stackoverflow_nwp", tmp_path)
    f.unlink()
    (tmp_path / "stackoverflow_test.h5").unlink()
    _write_sqlite(tmp_path)
    db = tmp_path / "stackoverflow.sqlite"
    con = sqlite3.connect(db)
    con.execute("UPDATE examples SET serialized_example_proto = ? WHERE rowid = 1", (b"\x0a\xff\xff\xff\x7f\x01",))
    con.commit()
    con.close()
    msg = _error("tff_stackoverflow_nwp", tmp_path)
    assert str(db) in msg and "tf.train.Example" in msg
    db.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)  # a header and nothing else
    assert str(db) in _error("tff_stackoverflow_nwp", tmp_path)
    db.write_bytes(b"")
    sqlite3.connect(db).close()
    assert "examples" in _error("tff_stackoverflow_nwp", tmp_path)
    (tmp_path / so.WORD_COUNT_FILE).write_text("the\n")
    db.unlink()
    _write_h5(tmp_path)
    assert "line 1" in _error("tff_stackoverflow_nwp", tmp_path) and so.WORD_COUNT_FILE in \
        _error("tff_stackoverflow_nwp", tmp_path)
    (tmp_path / so.WORD_COUNT_FILE).unlink()
    assert "data.vocab_path" in _error("tff_stackoverflow_nwp", tmp_path)
    _write_counts(tmp_path)
    (tmp_path / so.TAG_COUNT_FILE).write_text("{not json")
    assert so.TAG_COUNT_FILE in _error("tff_stackoverflow_tag", tmp_path)


def test_cli_exit_status_2_on_a_truncated_file(tmp_path):
    _write_counts(tmp_path)
    _write_h5(tmp_path)
    f = tmp_path / "stackoverflow_train.h5"
    f.write_bytes(f.read_bytes()[:2000])
    p = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "run", "experiments/reddi_stackoverflow_nwp.yaml",
                        "--set", f"base.data.path={tmp_path}", "--set", "base.rounds=1", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert str(f) in lines[-1] and "HDF5" in lines[-1]


def test_parse_example_reads_every_value_kind():
    Example = _example_class()
    e = Example()
    e.features.feature["b"].bytes_list.value.extend([b"x", b"yz"])
    e.features.feature["i"].int64_list.value.extend([3, -2, 1 << 40])
    e.features.feature["f"].float_list.value.extend([0.5, -1.25])
    got = so.parse_example(e.SerializeToString())
    assert got == {"b": [b"x", b"yz"], "i": [3, -2, 1 << 40], "f": [0.5, -1.25]}
    with pytest.raises(so.ProtoError):
        so.parse_example(e.SerializeToString()[:-3])


def test_training_split_is_cut_to_the_first_1000_examples(tmp_path):
    """The authors' max_elements_per_user: a user's first 1,000 training sentences (file order), its test split
    whole; the cap is part of the index's cache key."""
    _write_counts(tmp_path)
    n_train, n_test = so.MAX_TRAIN_EXAMPLES + 3, 1005
    sentences = [" ".join(WORDS[: 1 + i % len(WORDS)]) for i in range(n_train)]
    with h5py.File(tmp_path / "stackoverflow_train.h5", "w") as f:
        f.create_dataset("examples/00000001/tokens", data=np.array([s.encode() for s in sentences], dtype=object),
                         dtype=h5py.string_dtype())
    with h5py.File(tmp_path / "stackoverflow_test.h5", "w") as f:
        f.create_dataset("examples/00000001/tokens", data=np.array([b"how is it"] * n_test, dtype=object),
                         dtype=h5py.string_dtype())
    spec = DataSpec(dataset="tff_stackoverflow_nwp", path=str(tmp_path), partition=PartitionSpec(num_clients=1),
                    cache_dir=str(tmp_path / "cache"))
    d = load(spec, seed=0)
    assert len(d.train[0]) == 1000 and len(d.held_out[0]) == n_test
    x, _ = d.client(0)
    vocab = so.Vocab(WORDS, None)
    np.testing.assert_array_equal(x.astype(np.int64), np.stack([vocab.sentence(s.encode()) for s in sentences[:1000]]))
    assert so.StackOverflowReader.index_version == "train1000"
    d.x.close()
