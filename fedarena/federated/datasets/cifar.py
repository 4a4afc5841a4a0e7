"""CIFAR-10 / CIFAR-100 in their binary version (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny
Images"; the layout of https://www.cs.toronto.edu/~kriz/cifar.html), memory-mapped.

CIFAR-10: ``data_batch_1.bin`` .. ``data_batch_5.bin`` and ``test_batch.bin``, records of 3073 bytes (a label
byte 0..9, then 3072 pixel bytes: the 1024 red, 1024 green and 1024 blue values of a 32x32 image, row-major).
CIFAR-100: ``train.bin`` and ``test.bin``, records of 3074 bytes (coarse label 0..19, fine label 0..99, 3072
pixel bytes). A file whose size is not a whole number of records, or a label out of range, is refused with
the file named. The python version (``data_batch_1`` without ``.bin``, ``cifar-10-batches-py``) is pickled
and is refused: unpickling a file runs whatever code it holds.

The files hold no users: the training records are split over ``data.num_clients`` clients by one of the
partitioners of :mod:`fedarena.federated.data`; the test file is the global test set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedarena.federated.data import DataError, PartitionSpec, partition
from fedarena.federated.datasets.index import ClientIndex

PIXELS = 3 * 32 * 32


def refuse_pickle(path: Path) -> None:
    """Raise on CIFAR's python (pickled) version in ``path``."""
    for name in ("data_batch_1", "train", "cifar-10-batches-py", "cifar-100-python"):
        f = path / name
        if f.exists():
            raise DataError("data.path", f"{f}: the python (pickled) CIFAR version is refused, since unpickling runs "
                            "code from the file; use the binary version (data_batch_*.bin / train.bin)")


def _records(f: Path, size: int, label_bytes: int, classes: tuple[int, ...]) -> np.memmap:
    n, rest = divmod(f.stat().st_size, size)
    if rest or n == 0:
        raise DataError("data.path", f"{f}: {f.stat().st_size} bytes is not a whole number of {size}-byte CIFAR "
                        "records (truncated or not CIFAR binary)")
    rec = np.memmap(f, np.uint8, "r", shape=(n, size))
    for j, k in enumerate(classes[:label_bytes]):
        lab = np.asarray(rec[:, j])
        if lab.max() >= k:
            bad = int(np.argmax(lab >= k))
            raise DataError("data.path", f"{f}: record {bad} has label {int(lab[bad])} outside 0..{k - 1} "
                            "(corrupt, or CIFAR-10/100 files mixed up)")
    return rec


class CifarReader:
    """The binary CIFAR files of ``path`` split over clients; :meth:`read` gives a client's uint8 images."""

    def __init__(self, path: str | Path, which: str, spec: PartitionSpec, seed: int, label: str = "fine") -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise DataError("data.path", f"{path}: CIFAR binary files are read from a folder")
        if which == "cifar10":
            train = sorted(self.path.glob("data_batch_*.bin"))
            test = [self.path / "test_batch.bin"]
            size, lbytes, classes, self.num_classes = 3073, 1, (10,), 10
            self._label_col = 0
        else:
            train, test = [self.path / "train.bin"], [self.path / "test.bin"]
            size, lbytes, classes = 3074, 2, (20, 100)
            self.num_classes, self._label_col = (20, 0) if label == "coarse" else (100, 1)
        if not train or not train[0].is_file():
            refuse_pickle(self.path)
            raise DataError("data.path", f"{path}: no {'data_batch_*.bin' if which == 'cifar10' else 'train.bin'} "
                            "(CIFAR binary version)")
        self.files = train + [t for t in test if t.is_file()]
        self._train = [_records(f, size, lbytes, classes) for f in train]
        self._test = [_records(t, size, lbytes, classes) for t in test if t.is_file()]
        self._offsets = np.cumsum([0] + [len(r) for r in self._train])
        self.label_bytes = lbytes
        self.example_shape = (3, 32, 32)
        self.spec, self.seed = spec, seed

    def _rows(self, idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx), self._train[0].shape[1]), np.uint8)
        f = np.searchsorted(self._offsets, idx, side="right") - 1
        for k in np.unique(f):
            sel = f == k
            out[sel] = self._train[k][idx[sel] - self._offsets[k]]
        return out

    def scan(self) -> ClientIndex:
        labels = np.concatenate([np.asarray(r[:, self._label_col], np.int64) for r in self._train])
        parts = partition(labels, self.spec, np.random.default_rng([self.seed, 11]))
        self.order = np.concatenate(parts).astype(np.int64)
        count = np.array([len(p) for p in parts], np.int64)
        start = np.concatenate([[0], np.cumsum(count)[:-1]])
        U = len(parts)
        return ClientIndex(np.array([f"c{i}" for i in range(U)]), np.zeros((U, 1), np.int32), start[:, None],
                           np.zeros((U, 1), np.int64), count[:, None], np.zeros(U, np.int64), labels[self.order])

    def read(self, ix: ClientIndex, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``u``'s uint8 (n, 3, 32, 32) images and labels."""
        s, n = int(ix.offset[u, 0]), int(ix.count[u, 0])
        rows = self._rows(self.order[s: s + n])
        return self._split(rows)

    def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (rows[:, self.label_bytes:].reshape(-1, 3, 32, 32), rows[:, self._label_col].astype(np.int64))

    def test_set(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self._test:
            return None
        return self._split(np.concatenate([np.asarray(r) for r in self._test]))

    def close(self) -> None:
        self._train, self._test = [], []
