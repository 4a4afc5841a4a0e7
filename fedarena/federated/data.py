"""Federated data: seeded partitioners of a labelled data set over clients, and local data sets.

Partitioners (each returns one sorted index array per client; every example is assigned exactly once):

* ``iid`` -- a uniform random permutation cut into near-equal parts.
* ``dirichlet`` -- label skew after Hsu, Qi & Brown (2019): for every class c, client shares
  ``p_c ~ Dir(alpha 1_K)`` and the class's examples are dealt out in those proportions; draws are
  repeated (at most ``max_tries``) until every client holds at least ``min_examples``.
* ``shards`` -- McMahan et al. (AISTATS 2017)'s pathological non-IID split: the examples sorted by
  label are cut into ``K * k`` single-label shards and every client gets ``k`` shards of ``k``
  *different* labels (shards are dealt round robin from the label-sorted list, so two shards of one
  client are ``K`` places apart and cannot share a label when no label has more than ``K`` shards).
* ``quantity`` -- quantity skew (Li et al., "Federated Learning on Non-IID Data Silos", ICDE 2022):
  client sizes proportional to ``q ~ Dir(beta 1_K)``, examples drawn IID.

Data sets, none downloaded: scikit-learn's digits (1797 8x8 images, 10 classes) and breast cancer
(569 x 30, 2 classes, standardised); the FedProx Synthetic(alpha, beta) generator (Li et al., MLSys
2020, Sec. 5.1, after Shamir et al. 2014), naturally split by device; LEAF JSON files (FEMNIST,
Shakespeare; Caldas et al. 2018; each file parsed whole) and MNIST IDX files read from a local path. The
data sets read per client from large files (TFF HDF5, LEAF JSON per user, CIFAR binary) are
:mod:`fedarena.federated.datasets`.

A :class:`FederatedData` holds one feature matrix and label vector and, per client, index arrays of
its training and held-out examples (held-out data per client, for per-client evaluation), plus a
global test set. Bad input raises :class:`DataError` naming the config field.
"""

from __future__ import annotations

import gzip
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

PartitionName = Literal["iid", "dirichlet", "shards", "quantity"]
PARTITIONS = ("iid", "dirichlet", "shards", "quantity")

# LEAF's Shakespeare vocabulary (leaf/models/utils/language_utils.py, ALL_LETTERS): 80 characters.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


class DataError(ValueError):
    """Bad data input; ``str(e)`` is ``"<field>: <reason>"``. A user error (CLI exit 2,
    :mod:`fedarena.platform.errors`) also when raised mid-run, by a file read lazily."""

    user_error = True

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# ----------------------------------------------------------------------------- partitioners


def _check_nonempty(parts: list[np.ndarray], where: str) -> list[np.ndarray]:
    for i, p in enumerate(parts):
        if len(p) == 0:
            raise DataError(where, f"client {i} gets no examples; use fewer clients or a different split")
    return parts


def partition_iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if num_clients > n:
        raise DataError("partition.num_clients", f"{num_clients} clients for {n} examples leaves a client empty")
    return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]


def partition_dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                        min_examples: int = 1, max_tries: int = 100) -> list[np.ndarray]:
    if not alpha > 0:
        raise DataError("partition.alpha", f"must be > 0, got {alpha}")
    if num_clients * min_examples > len(labels):
        raise DataError("partition.num_clients", f"{num_clients} clients x {min_examples} examples exceed "
                        f"{len(labels)} examples")
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(p) for p in out) >= min_examples:
            return out
    raise DataError("partition.alpha", f"no Dirichlet({alpha}) split gave every one of {num_clients} clients "
                    f">= {min_examples} examples in {max_tries} draws (raise alpha or lower num_clients)")


def partition_shards(labels: np.ndarray, num_clients: int, shards_per_client: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    classes, counts = np.unique(labels, return_counts=True)
    k, K = shards_per_client, num_clients
    if not 1 <= k <= len(classes):
        raise DataError("partition.shards_per_client", f"must lie in 1..{len(classes)} (the number of labels), got {k}")
    total = K * k
    # shards per label proportional to its count (largest remainder), at least one each label while possible
    raw = counts / counts.sum() * total
    per = np.floor(raw).astype(np.int64)
    for j in np.argsort(-(raw - per))[: total - per.sum()]:
        per[j] += 1
    if per.max() > K:
        raise DataError("partition.shards_per_client", f"label {classes[per.argmax()]} would need {per.max()} shards "
                        f"but only {K} clients can hold one each; use fewer shards per client")
    if np.any(per > counts):
        raise DataError("partition.num_clients", f"{total} shards exceed the examples of some label")
    order = rng.permutation(len(classes))  # which label comes first in the dealt list
    shards: list[np.ndarray] = []
    for j in order:
        idx = rng.permutation(np.flatnonzero(labels == classes[j]))
        shards.extend(np.array_split(idx, per[j]))
    slot = rng.permutation(K)  # client i takes positions slot[i], slot[i] + K, ...
    parts = [np.sort(np.concatenate([shards[slot[i] + K * t] for t in range(k)])).astype(np.int64) for i in range(K)]
    return _check_nonempty(parts, "partition.num_clients")


def partition_quantity(n: int, num_clients: int, beta: float, rng: np.random.Generator,
                       min_examples: int = 1, max_tries: int = 100) -> list[np.ndarray]:
    if not beta > 0:
        raise DataError("partition.beta", f"must be > 0, got {beta}")
    if num_clients * min_examples > n:
        raise DataError("partition.num_clients", f"{num_clients} clients x {min_examples} examples exceed {n} examples")
    for _ in range(max_tries):
        q = rng.dirichlet(np.full(num_clients, beta))
        cuts = (np.cumsum(q)[:-1] * n).astype(np.int64)
        parts = [np.sort(p).astype(np.int64) for p in np.split(rng.permutation(n), cuts)]
        if min(len(p) for p in parts) >= min_examples:
            return parts
    raise DataError("partition.beta", f"no Dirichlet({beta}) size split gave every one of {num_clients} clients "
                    f">= {min_examples} examples in {max_tries} draws (raise beta or lower num_clients)")


@dataclass(frozen=True)
class PartitionSpec:
    name: str = "iid"
    num_clients: int = 100
    alpha: float = 0.5
    """Dirichlet label-skew concentration"""
    shards_per_client: int = 2
    beta: float = 0.5
    """Dirichlet concentration of the client sizes (quantity skew)"""
    min_examples: int = 1

    def __post_init__(self) -> None:
        if self.name not in PARTITIONS:
            raise DataError("partition.name", f"unknown '{self.name}' (one of {', '.join(PARTITIONS)})")
        if self.num_clients < 1:
            raise DataError("partition.num_clients", f"must be >= 1, got {self.num_clients}")
        if self.min_examples < 1:
            raise DataError("partition.min_examples", f"must be >= 1, got {self.min_examples}")


def partition(labels: np.ndarray, spec: PartitionSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``range(len(labels))`` over ``spec.num_clients`` clients by ``spec.name``."""
    n = len(labels)
    if spec.name == "iid":
        parts = partition_iid(n, spec.num_clients, rng)
    elif spec.name == "dirichlet":
        parts = partition_dirichlet(labels, spec.num_clients, spec.alpha, rng, spec.min_examples)
    elif spec.name == "shards":
        parts = partition_shards(labels, spec.num_clients, spec.shards_per_client, rng)
    else:
        parts = partition_quantity(n, spec.num_clients, spec.beta, rng, spec.min_examples)
    return _check_nonempty(parts, "partition.num_clients")


def label_histogram(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """``H[i, c]`` = examples of class c held by client i."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]) if len(parts) else \
        np.zeros((0, num_classes), np.int64)


def plot_label_histogram(hist: np.ndarray, path: str | Path, title: str = "", max_clients: int = 50) -> str:
    """Stacked bars of every client's label counts (first ``max_clients`` clients)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = hist[:max_clients]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    bottom = np.zeros(len(h))
    cmap = plt.get_cmap("tab10" if h.shape[1] <= 10 else "tab20")
    for c in range(h.shape[1]):
        ax.bar(np.arange(len(h)), h[:, c], bottom=bottom, color=cmap(c % cmap.N), width=0.85, label=str(c))
        bottom += h[:, c]
    ax.set_xlabel(f"client (first {len(h)} of {len(hist)})" if len(h) < len(hist) else f"client (all {len(h)})")
    ax.set_ylabel("training examples")
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set_title(title or "label histogram per client")
    if h.shape[1] <= 20:
        ax.legend(title="label", fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


# ----------------------------------------------------------------------------- the federated data set


@dataclass(frozen=True)
class FederatedData:
    """Features ``x`` (N, d) float32 and labels ``y`` (N,) int64 shared by every client, indexed per client."""

    x: np.ndarray
    y: np.ndarray
    train: list[np.ndarray]
    """per client: indices of its training examples"""
    held_out: list[np.ndarray]
    """per client: indices of its held-out (evaluation) examples; may be empty for a client"""
    test: np.ndarray
    """indices of the global test set"""
    num_classes: int
    name: str = ""

    @property
    def num_clients(self) -> int:
        return len(self.train)

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.train[i]
        return self.x[idx], self.y[idx]

    def client_held_out(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.held_out[i]
        return self.x[idx], self.y[idx]

    def test_set(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self.test], self.y[self.test]

    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.train], np.int64)


def _split_held_out(parts: list[np.ndarray], fraction: float, rng: np.random.Generator
                    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Move ``floor(fraction * n_i)`` random examples of each client into its held-out set (>= 1 kept for training)."""
    train, held = [], []
    for p in parts:
        m = min(int(fraction * len(p)), len(p) - 1)
        perm = rng.permutation(p)
        held.append(np.sort(perm[:m]))
        train.append(np.sort(perm[m:]))
    return train, held


def federate(x: np.ndarray, y: np.ndarray, spec: PartitionSpec, seed: int, *, test_fraction: float = 0.2,
             held_out_fraction: float = 0.2, name: str = "") -> FederatedData:
    """Global train/test split, then ``spec``'s partition of the training part, then per-client held-out data."""
    if not 0 < test_fraction < 1:
        raise DataError("data.test_fraction", f"must lie in (0, 1), got {test_fraction}")
    if not 0 <= held_out_fraction < 1:
        raise DataError("data.held_out_fraction", f"must lie in [0, 1), got {held_out_fraction}")
    rng = np.random.default_rng([seed, 11])
    order = rng.permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test_idx, train_idx = np.sort(order[:n_test]), order[n_test:]
    parts = partition(y[train_idx], spec, rng)
    parts = [train_idx[p] for p in parts]
    train, held = _split_held_out(parts, held_out_fraction, rng)
    return FederatedData(np.ascontiguousarray(x, np.float32), np.asarray(y, np.int64), train, held, test_idx,
                         int(y.max()) + 1, name)


# ----------------------------------------------------------------------------- data sets


def _sklearn_file(name: str) -> Path | None:
    """``sklearn/datasets/data/<name>``, a data file scikit-learn ships, found without importing scikit-learn
    (importing it, which pulls in scipy.stats and more, takes longer than a small simulation); None when absent."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / name
    return path if path.is_file() else None


def _sklearn_table(name: str, skip: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Features (float64) and integer labels of a scikit-learn CSV whose last column is the label (the format
    of its ``load_digits`` / ``load_breast_cancer`` files), or None when the file is not where it is expected."""
    path = _sklearn_file(name)
    if path is None:
        return None
    raw = np.loadtxt(path, delimiter=",", skiprows=skip, dtype=np.float64)  # a .gz file is decompressed
    return raw[:, :-1], raw[:, -1].astype(np.int64)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1797 x 64), pixels scaled to [0, 1]; read from the file scikit-learn ships."""
    table = _sklearn_table("digits.csv.gz", 0)
    if table is None:  # another layout of the package: its own loader
        from sklearn.datasets import load_digits as _ld

        d = _ld()
        table = d.data, d.target
    x, y = table
    return (x / 16.0).astype(np.float32), np.asarray(y, np.int64)


def load_breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's Wisconsin breast cancer (569 x 30), each feature standardised to mean 0, std 1; read from
    the file scikit-learn ships (its first line is a header: rows, columns, class names)."""
    table = _sklearn_table("breast_cancer.csv", 1)
    if table is None:
        from sklearn.datasets import load_breast_cancer as _lb

        d = _lb()
        table = d.data, d.target
    x, y = table
    x = (x - x.mean(0)) / x.std(0)
    return x.astype(np.float32), np.asarray(y, np.int64)


def synthetic_fedprox(alpha: float, beta: float, num_clients: int, seed: int, *, num_features: int = 60,
                      num_classes: int = 10, size_mean: float = 4.0, size_sigma: float = 2.0, size_min: int = 50,
                      size_max: int = 0, held_out_fraction: float = 0.2) -> FederatedData:
    """FedProx's Synthetic(alpha, beta) (Li et al. 2020, Sec. 5.1): device k has ``u_k ~ N(0, alpha)``,
    ``W_k, b_k ~ N(u_k, 1)``, ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)``; ``x ~ N(v_k, Sigma)`` with
    ``Sigma_jj = j^-1.2``; ``y = argmax softmax(W_k x + b_k)``. Examples per device
    ``floor(lognormal(size_mean, size_sigma)) + size_min`` (the paper's generator uses 4, 2, 50),
    capped at ``size_max`` when > 0. Held-out examples are taken from each device's own data; the
    global test set is the union of the held-out sets."""
    if alpha < 0 or beta < 0:
        raise DataError("data.alpha" if alpha < 0 else "data.beta", "must be >= 0")
    if num_clients < 1:
        raise DataError("data.num_clients", f"must be >= 1, got {num_clients}")
    rng = np.random.default_rng([seed, 23])
    sizes = (np.floor(rng.lognormal(size_mean, size_sigma, num_clients)) + size_min).astype(np.int64)
    if size_max > 0:
        sizes = np.minimum(sizes, size_max)
    if sizes.min() < 1:
        raise DataError("data.size_min", "every device needs at least one example")
    u = rng.normal(0.0, np.sqrt(alpha), num_clients)
    bk = rng.normal(0.0, np.sqrt(beta), num_clients)
    W = rng.normal(u[:, None, None], 1.0, (num_clients, num_features, num_classes))
    b = rng.normal(u[:, None], 1.0, (num_clients, num_classes))
    v = rng.normal(bk[:, None], 1.0, (num_clients, num_features))
    sd = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)
    owner = np.repeat(np.arange(num_clients), sizes)
    x = v[owner] + rng.standard_normal((len(owner), num_features)) * sd
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    y = np.empty(len(owner), np.int64)
    for k in range(num_clients):
        lo, hi = offsets[k], offsets[k + 1]
        y[lo:hi] = (x[lo:hi] @ W[k] + b[k]).argmax(1)
    parts = [np.arange(offsets[i], offsets[i + 1]) for i in range(num_clients)]
    train, held = _split_held_out(parts, held_out_fraction, rng)
    test = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    return FederatedData(x.astype(np.float32), y, train, held, test, num_classes, f"synthetic({alpha},{beta})")


def leaf_files(path: Path) -> tuple[list[Path], list[Path]]:
    """(train files, test files) of a LEAF file or folder (``train/*.json`` and ``test/*.json``, or ``*.json``)."""
    if path.is_file():
        return [path], []
    train = sorted((path / "train").glob("*.json")) if (path / "train").is_dir() else sorted(path.glob("*.json"))
    test = sorted((path / "test").glob("*.json")) if (path / "test").is_dir() else []
    if not train:
        raise DataError("data.path", f"{path}: no LEAF .json files (expected *.json or train/*.json)")
    return train, test


def _leaf_read(files: list[Path], kind: str) -> dict[str, tuple[list, list]]:
    users: dict[str, tuple[list, list]] = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError("data.path", f"{f}: not a valid LEAF JSON file ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("users"), list) or not isinstance(doc.get("user_data"), dict):
            raise DataError("data.path", f"{f}: not a LEAF file (needs 'users' list and 'user_data' map)")
        for u in doc["users"]:
            rec = doc["user_data"].get(u)
            if not isinstance(rec, dict) or not isinstance(rec.get("x"), list) or not isinstance(rec.get("y"), list) \
                    or len(rec["x"]) != len(rec["y"]):
                raise DataError("data.path", f"{f}: user {u!r} has no equal-length 'x' and 'y' lists")
            xs, ys = users.setdefault(str(u), ([], []))
            xs.extend(rec["x"])
            ys.extend(rec["y"])
    return users


def _leaf_features(xs: list, ys: list, where: str, char_context: int) -> tuple[np.ndarray, np.ndarray]:
    if xs and isinstance(xs[0], str):  # Shakespeare: 80-character context -> next character
        lut = {c: i for i, c in enumerate(LEAF_LETTERS)}
        try:
            idx = np.array([[lut[c] for c in s[-char_context:].rjust(char_context, " ")] for s in xs], np.int64)
            y = np.array([lut[c] for c in ys], np.int64)
        except (KeyError, TypeError) as e:
            raise DataError("data.path", f"{where}: character {e} outside LEAF's vocabulary") from None
        x = np.zeros((len(xs), char_context * len(LEAF_LETTERS)), np.float32)
        rows = np.repeat(np.arange(len(xs)), char_context)
        x[rows, (np.arange(char_context) * len(LEAF_LETTERS))[None, :].repeat(len(xs), 0).ravel() + idx.ravel()] = 1.0
        return x, y
    try:
        x = np.asarray(xs, np.float32)
        y = np.asarray(ys, np.int64)
    except (ValueError, TypeError) as e:
        raise DataError("data.path", f"{where}: features are not equal-length numeric rows ({e})") from None
    if x.ndim != 2 or y.ndim != 1 or not np.isfinite(x).all():
        raise DataError("data.path", f"{where}: expected numeric rows x (n, d) and integer labels y (n,)")
    return x, y


def load_leaf(path: str | Path, *, held_out_fraction: float = 0.2, seed: int = 0, char_context: int = 10,
              max_clients: int = 0) -> FederatedData:
    """LEAF JSON (``{"users", "num_samples", "user_data": {user: {"x", "y"}}}``), one client per user.

    ``path`` is one file, a folder of ``*.json``, or a LEAF folder with ``train/`` and ``test/``
    (then each user's held-out data is its test split). FEMNIST rows are used as given (784 floats);
    Shakespeare contexts become one-hot vectors of their last ``char_context`` characters over
    LEAF's 80-letter vocabulary, labels the index of the next character."""
    p = Path(path)
    if not str(path) or not p.exists():
        raise DataError("data.path", f"{path}: no such file or directory")
    train_files, test_files = leaf_files(p)
    train_users = _leaf_read(train_files, "train")
    test_users = _leaf_read(test_files, "test") if test_files else {}
    names = sorted(train_users)
    if max_clients > 0:
        names = names[:max_clients]
    if not names:
        raise DataError("data.path", f"{path}: no users")
    xs, ys, train, held = [], [], [], []
    rng = np.random.default_rng([seed, 31])
    offset = 0
    for u in names:
        x, y = _leaf_features(*train_users[u], f"{path} user {u!r}", char_context)
        if len(x) == 0:
            raise DataError("data.path", f"{path}: user {u!r} has no examples")
        if u in test_users:
            xt, yt = _leaf_features(*test_users[u], f"{path} user {u!r} (test)", char_context)
            train.append(np.arange(offset, offset + len(x)))
            held.append(np.arange(offset + len(x), offset + len(x) + len(xt)))
            x, y = np.concatenate([x, xt]), np.concatenate([y, yt])
        else:
            tr, he = _split_held_out([np.arange(offset, offset + len(x))], held_out_fraction, rng)
            train.append(tr[0])
            held.append(he[0])
        xs.append(x)
        ys.append(y)
        offset += len(x)
    dims = {x.shape[1] for x in xs}
    if len(dims) != 1:
        raise DataError("data.path", f"{path}: users have different feature sizes {sorted(dims)}")
    X, Y = np.concatenate(xs), np.concatenate(ys)
    if Y.min() < 0:
        raise DataError("data.path", f"{path}: negative label {int(Y.min())}")
    test = np.sort(np.concatenate(held))
    return FederatedData(X, Y, train, held, test, int(Y.max()) + 1, "leaf")


def _read_idx(path: Path) -> np.ndarray:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError("data.path", f"{path}: cannot read ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError("data.path", f"{path}: not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError("data.path", f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4: 4 + 4 * ndim])
    body = raw[4 + 4 * ndim:]
    if len(body) != int(np.prod(shape)):
        raise DataError("data.path", f"{path}: {len(body)} data bytes for shape {shape}")
    return np.frombuffer(body, np.uint8).reshape(shape)


def load_mnist_idx(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST from IDX files in folder ``path`` (``train-images-idx3-ubyte`` etc., optionally ``.gz``):
    returns ``(x_train, y_train, x_test, y_test)``, pixels scaled to [0, 1] and flattened."""
    p = Path(path)
    if not str(path) or not p.is_dir():
        raise DataError("data.path", f"{path}: no such directory")

    def find(stem: str) -> Path:
        for cand in (p / stem, p / f"{stem}.gz", p / stem.replace("-idx", ".idx")):
            if cand.exists():
                return cand
        raise DataError("data.path", f"{path}: missing {stem}[.gz]")

    out = []
    for split in ("train", "t10k"):
        img = _read_idx(find(f"{split}-images-idx3-ubyte"))
        lab = _read_idx(find(f"{split}-labels-idx1-ubyte"))
        if img.ndim != 3 or lab.ndim != 1 or len(img) != len(lab):
            raise DataError("data.path", f"{path}: {split} images {img.shape} and labels {lab.shape} do not match")
        out += [(img.reshape(len(img), -1) / 255.0).astype(np.float32), lab.astype(np.int64)]
    return out[0], out[1], out[2], out[3]


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array in IDX format (used by tests to make small MNIST-format files)."""
    a = np.ascontiguousarray(array, np.uint8)
    Path(path).write_bytes(bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes())


@dataclass(frozen=True)
class DataSpec:
    """Which data set and how it is split over clients."""

    dataset: str = "digits"
    """digits, breast_cancer, synthetic, leaf, mnist"""
    path: str = ""
    """local file or folder (leaf, mnist)"""
    partition: PartitionSpec = PartitionSpec()
    test_fraction: float = 0.2
    held_out_fraction: float = 0.2
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    synthetic_size_mean: float = 4.0
    synthetic_size_sigma: float = 2.0
    synthetic_size_min: int = 50
    synthetic_size_max: int = 0
    char_context: int = 10
    label: str = "fine"
    """CIFAR-100: fine (100 classes) or coarse (20) labels"""
    cache_dir: str = ""
    """where a data set's index is cached when its folder is read-only ("" = ~/.cache/fedarena/data)"""
    prefetch_threads: int = 2
    augment: bool = True
    """CIFAR: random crop (padding 4) and horizontal flip of the training examples"""
    test_clients: int = 200
    vocab_path: str = ""
    """Stack Overflow: the word-count file ("" = stackoverflow.word_count beside the data)"""

    def __post_init__(self) -> None:
        from fedarena.federated.datasets.pipeline import PIPELINE_DATASETS

        known = ("digits", "breast_cancer", "synthetic", "leaf", "mnist") + PIPELINE_DATASETS
        if self.dataset not in known:
            raise DataError("data.dataset", f"unknown '{self.dataset}' ({', '.join(known)})")
        if self.dataset in ("leaf", "mnist") + PIPELINE_DATASETS and not self.path:
            raise DataError("data.path", f"dataset '{self.dataset}' is read from a local path; set data.path")


def load(spec: DataSpec, seed: int) -> FederatedData:
    """Build the federated data set of ``spec`` (deterministic in ``seed``); the data sets read lazily from
    ``spec.path`` come from :func:`fedarena.federated.datasets.load`."""
    from fedarena.federated.datasets.pipeline import PIPELINE_DATASETS

    if spec.dataset in PIPELINE_DATASETS:
        from fedarena.federated import datasets

        return datasets.load(spec, seed)
    if spec.dataset == "synthetic":
        return synthetic_fedprox(spec.synthetic_alpha, spec.synthetic_beta, spec.partition.num_clients, seed,
                                 size_mean=spec.synthetic_size_mean, size_sigma=spec.synthetic_size_sigma,
                                 size_min=spec.synthetic_size_min, size_max=spec.synthetic_size_max,
                                 held_out_fraction=spec.held_out_fraction)
    if spec.dataset == "leaf":
        d = load_leaf(spec.path, held_out_fraction=spec.held_out_fraction, seed=seed, char_context=spec.char_context,
                      max_clients=spec.partition.num_clients)
        if d.num_clients < spec.partition.num_clients:
            raise DataError("partition.num_clients", f"{spec.partition.num_clients} clients asked, the LEAF data has "
                            f"{d.num_clients} users")
        return d
    if spec.dataset == "mnist":
        xtr, ytr, xte, yte = load_mnist_idx(spec.path)
        x, y = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
        rng = np.random.default_rng([seed, 11])
        parts = [p for p in partition(ytr, spec.partition, rng)]
        train, held = _split_held_out(parts, spec.held_out_fraction, rng)
        return FederatedData(x, y, train, held, np.arange(len(xtr), len(x)), int(y.max()) + 1, "mnist")
    x, y = load_digits() if spec.dataset == "digits" else load_breast_cancer()
    return federate(x, y, spec.partition, seed, test_fraction=spec.test_fraction,
                    held_out_fraction=spec.held_out_fraction, name=spec.dataset)
