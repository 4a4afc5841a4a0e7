"""TensorFlow Federated's HDF5 client data read per client (``tff.simulation.datasets``' ``.h5`` files).

TFF's HDF5 layout: a group ``examples`` holding one group per client id, which holds one dataset per feature,
all of the same length (the client's examples). The tasks read here:

* EMNIST / FEMNIST (``fed_emnist_train.h5``, ``fed_emnist_test.h5``, and the ``_digitsonly`` variants):
  ``pixels`` (n, 28, 28) float32 and ``label`` (n,) integers (62 classes; 10 for digits only); EMNIST's
  writers (Cohen et al. 2017) as clients, as in Reddi et al. (ICLR 2021, "Adaptive Federated Optimization").
* Shakespeare (``shakespeare_train.h5``, ``shakespeare_test.h5``): ``snippets`` (n,) byte strings, a speaking
  role's lines. As TFF's preprocessing that Reddi et al. use: the vocabulary is TFF's 86 characters plus four
  special ids -- pad 0, characters 1..86, out-of-vocabulary 87, beginning 88 and end 89 (90 classes); each
  snippet becomes ``[beginning] + its characters + [end]``, padded with 0 to a multiple of 81 and cut into
  examples of ``T + 1 = 81`` ids (the language models of :mod:`fedarena.federated.models` read the first 80
  and predict each next id); an example's label is its last non-pad id.
* CIFAR-100 (``fed_cifar100_train.h5``, ``fed_cifar100_test.h5``): ``image`` (n, 32, 32, 3) uint8 with
  ``label`` (fine, 100 classes) and ``coarse_label`` (20 classes) -- the Pachinko-allocation partition of
  Reddi et al. (500 train clients of 100 images).

A train file and its test file (same client ids; the test examples become the client's held-out data) are
found in ``data.path`` by name. Every client's counts and labels go into the index once
(:mod:`fedarena.federated.datasets.index`); a round reads only its clients' datasets.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from fedarena.federated.data import DataError
from fedarena.federated.datasets.index import ClientIndex, IndexBuilder

SEQ_LEN = 80
"""characters a Shakespeare example's model reads (an example holds ``SEQ_LEN + 1`` ids)"""
CHAR_VOCAB = "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
"""TFF's Shakespeare characters, in TFF's order (id = position + 1)"""
PAD, OOV, BOS, EOS = 0, len(CHAR_VOCAB) + 1, len(CHAR_VOCAB) + 2, len(CHAR_VOCAB) + 3
_LUT = np.full(256, OOV, np.int64)
_LUT[np.frombuffer(CHAR_VOCAB.encode("ascii"), np.uint8)] = np.arange(1, len(CHAR_VOCAB) + 1)

TASKS = {
    # task: (file stem, feature dataset, example shape, classes)
    "emnist": ("fed_emnist", "pixels", (1, 28, 28), 62),
    "shakespeare": ("shakespeare", "snippets", (SEQ_LEN + 1,), EOS + 1),
    "cifar100": ("fed_cifar100", "image", (3, 32, 32), 100),
}


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        from fedarena.platform.errors import MissingDependencyError

        raise MissingDependencyError("data.path: TFF HDF5 files need h5py (pip install h5py)") from None
    return h5py


def _find(path: Path, stem: str) -> tuple[Path, Path | None]:
    if path.is_file():
        return path, None
    for prefix in (stem, f"{stem}_digitsonly"):
        tr, te = path / f"{prefix}_train.h5", path / f"{prefix}_test.h5"
        if tr.is_file():
            return tr, (te if te.is_file() else None)
    raise DataError("data.path", f"{path}: no {stem}_train.h5 (TFF HDF5 layout)")


def snippet_examples(snippets) -> tuple[np.ndarray, np.ndarray]:
    """The (n, 81) id examples of a client's snippets (see the module doc) and their labels (last non-pad ids)."""
    rows = []
    for s in snippets:
        ids = np.concatenate([[BOS], _LUT[np.frombuffer(bytes(s), np.uint8)], [EOS]])
        ids = np.concatenate([ids, np.zeros(-len(ids) % (SEQ_LEN + 1), np.int64)])
        rows.append(ids.reshape(-1, SEQ_LEN + 1))
    x = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, SEQ_LEN + 1), np.int64)
    return x, x[np.arange(len(x)), (x != PAD).sum(1) - 1]


class TFFReader:
    """One TFF HDF5 task; :meth:`read` returns a client's examples (train, then test split) and labels."""

    def __init__(self, path: str | Path, task: str, label: str = "fine") -> None:
        if task not in TASKS:
            raise DataError("data.dataset", f"unknown TFF task {task!r}")
        self.task, self.label = task, label
        stem, self.feature, self.example_shape, self.num_classes = TASKS[task]
        if task == "cifar100" and label == "coarse":
            self.num_classes = 20
        self.path = Path(path)
        train, test = _find(self.path, stem)
        self.files = [train] + ([test] if test else [])
        if task == "emnist" and "digitsonly" in train.name:
            self.num_classes = 10
        self._h5 = _h5py()
        self._open: list = []
        self._lock = threading.Lock()  # h5py serialises calls anyway; the lock keeps reads whole

    def _file(self, fid: int):
        while len(self._open) <= fid:
            f = self.files[len(self._open)]
            try:
                self._open.append(self._h5.File(f, "r"))
            except OSError as e:
                raise DataError("data.path", f"{f}: not a readable HDF5 file ({str(e).split('(')[0].strip()})") \
                    from None
        return self._open[fid]

    def _label_key(self) -> str:
        return "coarse_label" if self.task == "cifar100" and self.label == "coarse" else "label"

    def _client(self, fid: int, cid: str):
        f = self.files[fid]
        try:
            return self._file(fid)["examples"][cid]
        except KeyError:
            raise DataError("data.path", f"{f}: no group examples/{cid}") from None

    def scan(self) -> ClientIndex:
        f = self.files[0]
        try:
            return self._scan()
        except DataError:
            raise
        except (OSError, RuntimeError, ValueError, TypeError) as e:  # a damaged file deep inside h5py
            raise DataError("data.path", f"{f}: unreadable HDF5 ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None

    def _scan(self) -> ClientIndex:
        b = IndexBuilder(parts=2)
        for fid, f in enumerate(self.files):
            h = self._file(fid)
            if "examples" not in h:
                raise DataError("data.path", f"{f}: no 'examples' group (not TFF's HDF5 client-data layout)")
            for cid in h["examples"]:
                g = h["examples"][cid]
                try:
                    if self.task == "shakespeare":
                        labels = snippet_examples(np.asarray(g["snippets"][()]).reshape(-1))[1]
                    else:
                        feats, lab = g[self.feature], g[self._label_key()]
                        labels = np.asarray(lab[()], np.int64).reshape(-1)
                        want = {"emnist": (28, 28), "cifar100": (32, 32, 3)}[self.task]
                        if feats.shape != (len(labels), *want):
                            raise DataError("data.path", f"{f}: client {cid!r}: {self.feature} has shape "
                                            f"{feats.shape}, expected ({len(labels)}, {', '.join(map(str, want))})")
                except KeyError as e:
                    raise DataError("data.path", f"{f}: client {cid!r} lacks dataset {e}") from None
                except OSError as e:
                    raise DataError("data.path", f"{f}: client {cid!r}: unreadable ({str(e).split('(')[0].strip()})") \
                        from None
                if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
                    raise DataError("data.path", f"{f}: client {cid!r}: label {int(labels.max())} outside "
                                    f"0..{self.num_classes - 1}")
                b.add(str(cid), fid, fid, 0, 0, labels)
        ix = b.build_checked(self.files[0], held_part=1 if len(self.files) > 1 else None,
                             empty="no clients under 'examples'", who="client")
        return ix

    def read(self, ix: ClientIndex, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``u``'s examples: float32 (n, 1, 28, 28) pixels, uint8 (n, 3, 32, 32) images, or int64 (n, 81)
        character ids; and labels."""
        xs, ys = [], []
        cid = str(ix.users[u])
        for p in range(ix.file.shape[1]):
            fid = int(ix.file[u, p])
            if fid < 0:
                continue
            try:
                with self._lock:
                    g = self._client(fid, cid)
                    if self.task == "shakespeare":
                        x, y = snippet_examples(np.asarray(g["snippets"][()]).reshape(-1))
                    else:
                        x, y = g[self.feature][()], np.asarray(g[self._label_key()][()], np.int64).reshape(-1)
            except OSError as e:
                raise DataError("data.path", f"{self.files[fid]}: client {cid!r}: unreadable "
                                f"({str(e).split('(')[0].strip()})") from None
            if self.task == "emnist":
                x = np.asarray(x, np.float32).reshape(-1, 1, 28, 28)
            elif self.task == "cifar100":
                x = np.ascontiguousarray(np.asarray(x, np.uint8).transpose(0, 3, 1, 2))
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def close(self) -> None:
        for h in self._open:
            h.close()
        self._open.clear()
