"""The per-client index of a data set on disk: user -> (file, offset, length, count), built once and cached.

A reader scans its files once and records, for every user (client), where its examples lie and how many there
are, plus every example's label (so that label histograms and held-out evaluation need no second scan). The
index is saved as one ``.npz`` beside the data (``<data folder>/.fedarena_index/``) or, when that folder is
not writable, in a cache folder (``data.cache_dir``, default ``~/.cache/fedarena/data``). A saved index is
used only while every file it was built from still has the size and modification time it had then; otherwise
it is rebuilt. This is the index-once step of the seed's MindData pipeline (Huawei MindSpore's data engine);
the per-round reading and mapping are :mod:`fedarena.federated.datasets.pipeline`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedarena.federated.data import DataError

INDEX_VERSION = 1


@dataclass
class ClientIndex:
    """Where every user's examples are: record ``i`` of ``users`` has ``count[i]`` examples located by
    ``(file[i], offset[i], length[i])`` per part (LEAF: the file and the record's byte offset and length; TFF:
    the file, whose group ``examples/<user>`` holds them; CIFAR: the start in the partition's record order),
    of which the last
    ``held[i]`` are the user's own held-out (test-split) examples; ``labels`` holds all examples' labels in
    user order (user ``i`` from ``start[i]``)."""

    users: np.ndarray  # (U,) str
    file: np.ndarray  # (U, P) int32, -1 = no part
    offset: np.ndarray  # (U, P) int64
    length: np.ndarray  # (U, P) int64
    count: np.ndarray  # (U, P) int64 examples of each part
    held: np.ndarray  # (U,) int64 examples of the test split (the last ones of the user)
    labels: np.ndarray  # (N,) int64

    @property
    def total(self) -> np.ndarray:
        return self.count.sum(1)

    @property
    def start(self) -> np.ndarray:
        t = self.total
        return np.concatenate([[0], np.cumsum(t)[:-1]]).astype(np.int64)


def _fingerprint(files: list[Path], extra: str) -> tuple[str, np.ndarray]:
    stats = np.array([[f.stat().st_size, f.stat().st_mtime_ns] for f in files], np.int64).reshape(-1, 2)
    key = hashlib.sha256((extra + "|" + "|".join(str(f.resolve()) for f in files)).encode()).hexdigest()[:16]
    return key, stats


def cache_path(files: list[Path], kind: str, extra: str, cache_dir: str = "") -> tuple[Path, np.ndarray]:
    """The index file of ``files`` read as ``kind``: beside the data when writable, else in ``cache_dir``."""
    key, stats = _fingerprint(files, f"{kind}|{extra}|{INDEX_VERSION}")
    name = f"{kind}-{key}.npz"
    beside = files[0].parent / ".fedarena_index"
    if not cache_dir:
        if (beside.is_dir() and os.access(beside, os.W_OK)) or os.access(files[0].parent, os.W_OK):
            return beside / name, stats
        cache_dir = str(Path.home() / ".cache" / "fedarena" / "data")
    return Path(cache_dir) / name, stats


def load_cached(path: Path, stats: np.ndarray) -> ClientIndex | None:
    """The saved index at ``path`` if its files are unchanged, else None."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["stats"].shape != stats.shape or not np.array_equal(z["stats"], stats):
                return None
            return ClientIndex(z["users"], z["file_id"], z["offset"], z["length"], z["count"], z["held"], z["labels"])
    except (OSError, ValueError, KeyError):
        return None  # a damaged cache is rebuilt, never trusted


def save(path: Path, stats: np.ndarray, ix: ClientIndex) -> None:
    """Write the index atomically (a temporary file renamed), so a killed run leaves no half index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, stats=stats, users=ix.users, file_id=ix.file, offset=ix.offset, length=ix.length, count=ix.count,
                 held=ix.held, labels=ix.labels)
    os.replace(tmp, path)


class IndexBuilder:
    """Collects user records during a reader's scan; parts ``0..P-1`` are e.g. a user's train and test files."""

    def __init__(self, parts: int = 1) -> None:
        self.parts = parts
        self.pos: dict[str, int] = {}
        self.rows: list[list[tuple[int, int, int, int]]] = []
        self.labels: list[list[np.ndarray]] = []

    def add(self, user: str, part: int, file: int, offset: int, length: int, labels: np.ndarray) -> None:
        i = self.pos.get(user)
        if i is None:
            i = self.pos[user] = len(self.rows)
            self.rows.append([(-1, 0, 0, 0)] * self.parts)
            self.labels.append([np.zeros(0, np.int64)] * self.parts)
        self.rows[i][part] = (file, offset, length, len(labels))
        self.labels[i][part] = np.asarray(labels, np.int64)

    def build(self, held_part: int | None = None) -> ClientIndex:
        U, P = len(self.rows), self.parts
        a = np.array(self.rows, np.int64).reshape(U, P, 4)
        users = np.array(list(self.pos), dtype=str) if U else np.zeros(0, str)
        count = a[:, :, 3]
        held = count[:, held_part] if held_part is not None else np.zeros(U, np.int64)
        labels = np.concatenate([x for parts in self.labels for x in parts]) if U else np.zeros(0, np.int64)
        return ClientIndex(users, a[:, :, 0].astype(np.int32), a[:, :, 1], a[:, :, 2], count, held.astype(np.int64),
                           labels.astype(np.int64))

    def build_checked(self, source: object, held_part: int | None = None, empty: str = "no clients",
                      who: str = "client") -> ClientIndex:
        """:meth:`build`, refusing (``DataError`` on ``data.path``, naming ``source``) an index without users and
        a user without training examples (part 0)."""
        ix = self.build(held_part)
        if len(ix.users) == 0:
            raise DataError("data.path", f"{source}: {empty}")
        bad = np.flatnonzero(ix.count[:, 0] == 0)
        if len(bad):
            raise DataError("data.path", f"{source}: {who} {ix.users[bad[0]]!r} has no training examples")
        return ix
