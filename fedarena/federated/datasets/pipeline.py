"""The per-client data pipeline: clients read lazily from files on disk, mapped and prefetched per round.

After the data engine of the seed's MindData chapter (MindSpore's MindData: dataset operators -- read, map,
shuffle, batch -- run as a pipeline with parallel workers and a prefetch buffer, each stage profiled): here
the pipeline feeds federated clients instead of one model.

* **Index once.** A reader (:mod:`~fedarena.federated.datasets.leaf`, :mod:`~fedarena.federated.datasets.tff`,
  :mod:`~fedarena.federated.datasets.cifar`) scans its files once into a user -> (file, offset, count) index
  with every example's label, cached beside the data (:mod:`~fedarena.federated.datasets.index`).
* **Read and map per round, prefetched.** When a round's clients are known (the simulation's batch plans),
  :meth:`ClientSource.prepare` submits every selected client to a thread pool that reads its examples from
  disk and maps them: scaling to [0, 1] (CIFAR: per-channel standardisation with the data set's published
  means and standard deviations) and, for CIFAR, the standard augmentation -- zero padding of 4 pixels, a
  random 32x32 crop and a random horizontal flip (He et al. 2016, Sec. 4.2), drawn from a generator seeded by
  (seed, round, client). Training then gathers minibatches from the prepared clients while the pool is still
  reading the later ones.
* **Shuffle and batch** are the simulation's per-client batch plans
  (:func:`fedarena.federated.simulation.batch_plan`, seeded by seed, round and client), which index the
  global example numbering this module defines (user ``i`` owns ``start[i] .. start[i] + total[i] - 1``).
* **Per-stage timings.** Seconds spent reading, mapping (both summed over the pool's threads), waiting for a
  client not yet ready, and gathering batches are reported per round (:meth:`ClientSource.pop_timings`) and
  land in the run's metrics.

Memory holds one round's clients (their mapped examples are dropped at the next round) and the index (about
100 bytes a user and 8 an example: 107 MB for 1,000,000 users with 2,008,601 examples in
``benchmarks/fedsim_population.py``); the population's examples stay on disk.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from fedarena.federated.data import DataError, FederatedData, PartitionSpec

CIFAR_STATS = {
    # per-channel mean and standard deviation of the training images (commonly published values)
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
PIPELINE_DATASETS = ("leaf_femnist", "leaf_shakespeare", "tff_emnist", "tff_shakespeare", "tff_cifar100",
                     "tff_stackoverflow_nwp", "tff_stackoverflow_tag", "cifar10", "cifar100")


class Examples(Sequence):
    """Per client, the global indices of its examples: client ``i`` has ``start[i] .. start[i] + count[i] - 1``
    (formed on lookup, so a million clients cost two arrays, not a million)."""

    def __init__(self, start: np.ndarray, count: np.ndarray) -> None:
        self.start, self.count = np.asarray(start, np.int64), np.asarray(count, np.int64)

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Examples(self.start[i], self.count[i])
        s = int(self.start[i])
        return np.arange(s, s + int(self.count[i]), dtype=np.int64)

    def sizes(self) -> np.ndarray:
        return self.count.copy()


def augment_crop_flip(x: np.ndarray, rng: np.random.Generator, pad: int = 4) -> np.ndarray:
    """Random ``H x W`` crops of the zero-padded images ``x`` (n, C, H, W) and random horizontal flips."""
    n, C, H, W = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dy, dx = rng.integers(0, 2 * pad + 1, n), rng.integers(0, 2 * pad + 1, n)
    flip = rng.random(n) < 0.5
    out = np.empty_like(x)
    for k in range(n):
        img = p[k, :, dy[k]: dy[k] + H, dx[k]: dx[k] + W]
        out[k] = img[:, :, ::-1] if flip[k] else img
    return out


def make_map(dataset: str) -> Callable[[np.ndarray], np.ndarray]:
    """Raw examples -> float32 features (n, d): the normalisation of ``dataset``."""
    if dataset in ("cifar10", "cifar100", "tff_cifar100"):
        mean, std = CIFAR_STATS["cifar10" if dataset == "cifar10" else "cifar100"]
        m = np.array(mean, np.float32)[None, :, None, None]
        s = np.array(std, np.float32)[None, :, None, None]
        return lambda x: ((x.astype(np.float32) / 255.0 - m) / s).reshape(len(x), -1)
    return lambda x: np.asarray(x, np.float32).reshape(len(x), -1)


@dataclass
class _Stages:
    read_s: float = 0.0
    map_s: float = 0.0
    wait_s: float = 0.0
    gather_s: float = 0.0
    clients: int = 0
    examples: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ClientSource:
    """The examples of every client, read from disk on demand: ``source[idx]`` (any shape of global indices)
    gives float32 features ``(*idx.shape, d)``, as an in-memory feature matrix would. :meth:`prepare` starts the
    prefetch of one round's clients (with augmentation); a client not prepared is read synchronously, without
    augmentation (evaluation), and kept in a small LRU cache."""

    def __init__(self, reader: Any, index: Any, dataset: str, seed: int, threads: int = 2, augment: bool = False,
                 lru: int = 64) -> None:
        self.reader, self.index, self.seed = reader, index, seed
        self.start, self.total = index.start, index.total
        self.map = make_map(dataset)
        self.augment = augment and dataset in ("cifar10", "cifar100", "tff_cifar100")
        self.num_features = int(np.prod(reader.example_shape))
        self.shape = (int(self.total.sum()), self.num_features)
        self.dtype, self.ndim = np.dtype(np.float32), 2
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="fedarena-data")
        self._round: dict[int, Future] = {}
        self._lru: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lru_size = lru
        self._t = _Stages()

    def __len__(self) -> int:
        return self.shape[0]

    def _load(self, u: int, rnd: int | None) -> np.ndarray:
        t0 = time.perf_counter()
        raw, _ = self.reader.read(self.index, u)
        if len(raw) != self.total[u]:
            raise DataError("data.path", f"user {self.index.users[u]!r}: {len(raw)} examples read, the index says "
                            f"{int(self.total[u])} (files changed since they were indexed)")
        t1 = time.perf_counter()
        if rnd is not None and self.augment:
            raw = augment_crop_flip(raw, np.random.default_rng([self.seed, rnd, u, 0xDA7A]))
        x = self.map(raw)
        t2 = time.perf_counter()
        with self._t.lock:
            self._t.read_s += t1 - t0
            self._t.map_s += t2 - t1
            self._t.clients += 1
            self._t.examples += len(x)
        return x

    def prepare(self, rnd: int, users: Sequence[int]) -> None:
        """Drop the last round's clients and start reading ``users`` (positions) for round ``rnd``."""
        for f in self._round.values():
            f.cancel()
        self._round = {int(u): self._pool.submit(self._load, int(u), rnd) for u in users}

    def client(self, u: int) -> np.ndarray:
        """Client ``u``'s mapped examples (waiting for its prefetch, or read now)."""
        fut = self._round.get(u)
        if fut is not None:
            t0 = time.perf_counter()
            x = fut.result()
            self._t.wait_s += time.perf_counter() - t0
            return x
        x = self._lru.get(u)
        if x is None:
            x = self._lru[u] = self._load(u, None)
            if len(self._lru) > self._lru_size:
                self._lru.popitem(last=False)
        else:
            self._lru.move_to_end(u)
        return x

    def __getitem__(self, idx) -> np.ndarray:
        idx = np.asarray(idx, np.int64)
        flat = idx.reshape(-1)
        owner = np.searchsorted(self.start, flat, side="right") - 1
        out = np.empty((len(flat), self.num_features), np.float32)
        order = np.argsort(owner, kind="stable")
        bounds = np.flatnonzero(np.diff(owner[order])) + 1
        for grp in np.split(order, bounds) if len(order) else []:
            u = int(owner[grp[0]])
            x = self.client(u)
            t0 = time.perf_counter()
            out[grp] = x[flat[grp] - self.start[u]]
            self._t.gather_s += time.perf_counter() - t0
        return out.reshape(*idx.shape, self.num_features)

    def pop_timings(self) -> dict[str, float]:
        """The stage timings since the last call: ``data_read_s``, ``data_map_s`` (summed over the pool's
        threads), ``data_wait_s`` (training blocked on a client not yet read), ``data_gather_s``, and the
        clients and examples read."""
        t = self._t
        with t.lock:
            out = {"data_read_s": t.read_s, "data_map_s": t.map_s, "data_wait_s": t.wait_s,
                   "data_gather_s": t.gather_s, "data_clients_read": t.clients, "data_examples_read": t.examples}
            t.read_s = t.map_s = t.wait_s = t.gather_s = 0.0
            t.clients = t.examples = 0
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.reader.close()


@dataclass(frozen=True)
class StreamedData(FederatedData):
    """A :class:`FederatedData` whose ``x`` is a :class:`ClientSource` and whose test set is held apart."""

    test_arrays: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 0), np.float32), np.zeros(0, np.int64))
    files: tuple = ()

    def test_set(self) -> tuple[np.ndarray, np.ndarray]:
        return self.test_arrays


def open_reader(spec: Any, seed: int):
    """The reader of ``spec.dataset`` on ``spec.path``."""
    from pathlib import Path

    from fedarena.federated.datasets import cifar, leaf, stackoverflow, tff

    name = spec.dataset
    path = Path(spec.path)
    if not spec.path or not path.exists():
        raise DataError("data.path", f"{spec.path}: no such file or directory")
    if name.startswith("tff_stackoverflow_"):
        return stackoverflow.StackOverflowReader(path, name.removeprefix("tff_stackoverflow_"),
                                                 getattr(spec, "vocab_path", ""))
    if name.startswith("leaf_"):
        return leaf.LeafReader(path, name.removeprefix("leaf_"))
    if name.startswith("tff_"):
        return tff.TFFReader(path, name.removeprefix("tff_"), spec.label)
    return cifar.CifarReader(path, name, spec.partition, seed, spec.label)


def index_of(reader: Any, spec: Any) -> Any:
    """The reader's index, from the cache when its files are unchanged (CIFAR's split is recomputed: it is a
    seeded partition of 60,000 labels, not a scan)."""
    from fedarena.federated.datasets import cifar, index

    if isinstance(reader, cifar.CifarReader):
        return reader.scan()
    kind = "-".join([type(reader).__name__, getattr(reader, "task", ""), getattr(reader, "label", ""),
                     getattr(reader, "index_version", "")])  # a reader whose counts changed: not the old index
    path, stats = index.cache_path(list(reader.files) + list(getattr(reader, "vocab_files", [])), kind, "",
                                   spec.cache_dir)
    ix = index.load_cached(path, stats)
    if ix is None:
        ix = reader.scan()
        try:
            index.save(path, stats, ix)
        except OSError:
            pass  # a read-only cache folder: the index is rebuilt next time
    return ix


def _first(ix: Any, k: int) -> Any:
    from fedarena.federated.datasets.index import ClientIndex

    n = int(ix.total[:k].sum())
    return ClientIndex(ix.users[:k], ix.file[:k], ix.offset[:k], ix.length[:k], ix.count[:k], ix.held[:k],
                       ix.labels[:n])


def load(spec: Any, seed: int) -> StreamedData:
    """The federated data set of a ``data.path`` pipeline data set (``spec``: a
    :class:`fedarena.federated.data.DataSpec`): the first ``partition.num_clients`` users of the index (CIFAR:
    that many clients of the partition), each user's test split (or the last ``held_out_fraction`` of its
    examples) held out, and a global test set -- CIFAR's test file, else the held-out examples of the first
    ``test_clients`` users."""
    reader = open_reader(spec, seed)
    try:
        ix = index_of(reader, spec)
        K = spec.partition.num_clients
        if len(ix.users) < K:
            raise DataError("partition.num_clients", f"{K} clients asked, {spec.path} has {len(ix.users)} users")
        ix = _first(ix, K)
        total = ix.total
        held = np.where(ix.held > 0, ix.held,
                        np.minimum((spec.held_out_fraction * total).astype(np.int64), total - 1))
        start = ix.start
        train = Examples(start, total - held)
        held_out = Examples(start + total - held, held)
        source = ClientSource(reader, ix, spec.dataset, seed, spec.prefetch_threads, spec.augment)
    except BaseException:
        reader.close()
        raise
    test = getattr(reader, "test_set", lambda: None)()
    if test is not None:
        tx, ty = source.map(test[0]), test[1]
    else:
        users = np.flatnonzero(held > 0)[: spec.test_clients]
        idx = np.concatenate([held_out[int(u)] for u in users]) if len(users) else np.zeros(0, np.int64)
        tx, ty = (source[idx], ix.labels[idx]) if len(idx) else (np.zeros((0, source.num_features), np.float32),
                                                                 np.zeros(0, np.int64))
    return StreamedData(source, ix.labels, train, held_out, np.zeros(0, np.int64), int(reader.num_classes),
                        spec.dataset, test_arrays=(tx, np.asarray(ty, np.int64)),
                        files=tuple(reader.files) + tuple(getattr(reader, "vocab_files", ())))
