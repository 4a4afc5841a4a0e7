"""The Reddi et al. 2021 table configs (experiments/reddi_*.yaml) run: each one for 2 rounds on small files written
in the data set's real format (h5py: TFF's EMNIST, Shakespeare, CIFAR-100 and Stack Overflow HDF5 layouts), with
the paper's architecture shrunk by overrides, every algorithm column (FedAvg, FedAdagrad, FedAdam, FedYogi,
FedProx, SCAFFOLD) trained and evaluated (the language models' every-token accuracies reported too); the
scaled-down config and its data generator too."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import fedarena

h5py = pytest.importorskip("h5py")

ROOT = pathlib.Path(__file__).parents[2]
COLUMNS = ["FedAvg", "FedAdagrad", "FedAdam", "FedYogi", "FedProx", "SCAFFOLD"]


def _h5(path, clients):
    with h5py.File(path, "w") as f:
        for cid, feats in clients.items():
            for k, v in feats.items():
                kw = {"dtype": h5py.string_dtype()} if v.dtype == object else {}
                f.create_dataset(f"examples/{cid}/{k}", data=v, **kw)


def _emnist(folder, rng):
    for split, n in (("train", 6), ("test", 2)):
        _h5(folder / f"fed_emnist_{split}.h5", {f"w{i}": {"pixels": rng.random((n, 28, 28)).astype(np.float32),
                                                          "label": rng.integers(0, 62, n).astype(np.int32)}
                                               for i in range(3)})
    return {"base.model.widths": [2, 2], "base.model.units": 4}


def _shakespeare(folder, rng):
    text = b"To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer"
    for split in ("train", "test"):
        _h5(folder / f"shakespeare_{split}.h5",
            {r: {"snippets": np.array([text[int(rng.integers(0, 40)):] for _ in range(2)], dtype=object)}
             for r in ("KING", "FOOL", "KENT")})
    return {"base.model.embed_dim": 2, "base.model.units": 3, "base.model.num_layers": 1}


def _stackoverflow(folder, rng):
    words = "the a is to . how i it in css".split()
    (folder / "stackoverflow.word_count").write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(words)))
    for split in ("train", "test"):
        clients = {}
        for u in range(3):
            sents = [" ".join(rng.choice(words + ["zzz"], int(rng.integers(3, 25)))) for _ in range(4)]
            clients[f"{u:08d}"] = {k: np.array([s.encode() for s in v], dtype=object) for k, v in
                                   {"tokens": sents, "title": ["t"] * 4, "tags": ["css"] * 4,
                                    "type": ["answer"] * 4}.items()}
        _h5(folder / f"stackoverflow_{split}.h5", clients)
    return {"base.model.embed_dim": 2, "base.model.units": 3}


def _cifar100(folder, rng):
    for split, n in (("train", 4), ("test", 2)):
        _h5(folder / f"fed_cifar100_{split}.h5", {str(i): {"image": rng.integers(0, 256, (n, 32, 32, 3), np.uint8),
                                                          "label": rng.integers(0, 100, n).astype(np.int64),
                                                          "coarse_label": rng.integers(0, 20, n).astype(np.int64)}
                                                 for i in range(3)})
    return {"base.model.widths": [2, 2, 2, 2]}


@pytest.mark.parametrize("name, write", [("reddi_emnist_cr", _emnist), ("reddi_shakespeare", _shakespeare),
                                         ("reddi_stackoverflow_nwp", _stackoverflow), ("reddi_cifar100", _cifar100)])
def test_table_config_runs_two_rounds_on_files_of_the_real_format(tmp_path, name, write):
    data = tmp_path / "data"
    data.mkdir()
    shrink = write(data, np.random.default_rng(0))
    res = fedarena.run(ROOT / "experiments" / f"{name}.yaml",
                       {"base.data.path": str(data), "base.data.num_clients": 3, "base.rounds": 2,
                        "base.clients.per_round": 2, "base.evaluation.every": 1, **shrink}, out=tmp_path / "run")
    tokens = {"reddi_shakespeare": ["test_token_acc"],
              "reddi_stackoverflow_nwp": ["test_token_acc", "test_token_acc_with_oov_eos"]}.get(name, [])
    for col in COLUMNS:
        acc = res.summary[f"test_acc[{col}]"]
        assert 0.0 <= acc <= 1.0, (col, acc)
        for k in tokens:  # the language models' every-token accuracy (the paper's measure) beside it
            assert 0.0 <= res.summary[f"{k}[{col}]"] <= 1.0, (col, k)
        assert res.summary[f"bytes_up[{col}]"] > 0
    assert not any(k.startswith("test_token_acc") for k in res.summary) or tokens
    table = (tmp_path / "run" / "report" / "sweep_table.md").read_text()  # the report shows the paper's measure
    assert ("every-token" in table) == bool(tokens), table.splitlines()[0]


def test_sweep_closes_each_columns_data_source(tmp_path, monkeypatch):
    """Each column of a sweep reads its own lazily read population; the sweep closes it (its prefetch threads
    stop) before the next column starts, so columns do not pile up threads and their buffers."""
    from fedarena.federated.datasets.pipeline import ClientSource

    data = tmp_path / "data"
    data.mkdir()
    shrink = _emnist(data, np.random.default_rng(0))
    opened, close = [], ClientSource.close
    monkeypatch.setattr(ClientSource, "close", lambda self: (opened.append(self), close(self))[1])
    fedarena.run(ROOT / "experiments" / "reddi_emnist_cr.yaml",
                 {"base.data.path": str(data), "base.data.num_clients": 3, "base.rounds": 1,
                  "base.clients.per_round": 2, "base.evaluation.every": 1, **shrink}, out=tmp_path / "run")
    assert len(opened) == len(COLUMNS) and len({id(s) for s in opened}) == len(COLUMNS)
    assert all(s._pool._shutdown for s in opened)
