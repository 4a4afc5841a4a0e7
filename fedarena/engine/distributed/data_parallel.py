"""Synchronous data parallelism: N replicas, each computes gradients on its shard of a batch, the gradients
are flattened into buckets and all-reduced (mean), and every replica applies the same update.

As in PyTorch DDP (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB 2020): leaves are packed into buckets of at most ``bucket_bytes`` in reverse order (the order the
backward pass produces them), one all-reduce per bucket. With ``overlap=True`` the buckets are all-reduced on
a communication thread while the next bucket is being packed and finished buckets unpacked. The engine
compiles the whole backward pass into one graph, so the all-reduce starts when the gradients are complete;
it does not overlap with the backward computation itself.

Because every all-reduce algorithm here gives bit-identical results on all ranks and the update is a
deterministic function of (parameters, optimizer state, gradients), the replicas' parameters stay identical
after every step. With equal shards and a loss that is a mean over the batch, the mean of the shard gradients
is the full-batch gradient, so N learners reproduce one learner on the concatenated batch up to float
round-off.

:class:`DataParallelLearner` is called like an engine train step, ``(params, opt_state, batch) ->
(params, opt_state, aux)``: the caller is rank 0, which scatters the batch (a mapping of arrays, split on the
leading axis) to ranks 1..N-1 running in threads or processes.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from fedarena import engine
from fedarena.engine.collectives import Communicator, ThreadGroup

_STEP, _STOP, _CHECK = 1, 0, 2


@dataclass(frozen=True)
class ReplicaStep:
    """One replica's pieces of a train step. ``grad(params, batch) -> (grads, aux)``; ``apply(params,
    opt_state, grads) -> (params, opt_state, aux)``; ``params`` / ``opt_state``: initial values (the pytree
    structure the other replicas receive values into)."""

    grad: Callable[[Any, Any], tuple[Any, Mapping[str, Any]]]
    apply: Callable[[Any, Any, Any], tuple[Any, Any, Mapping[str, Any]]]
    params: Any
    opt_state: Any


class GradientBuckets:
    """Packs gradient leaves into same-dtype buckets of at most ``bucket_bytes`` (reverse leaf order) and
    all-reduces them (mean) over a communicator."""

    def __init__(self, leaves: list[np.ndarray], bucket_bytes: int = 4 << 20) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes: must be positive, got {bucket_bytes}")
        self.shapes = [np.shape(x) for x in leaves]
        self.dtypes = [np.asarray(x).dtype for x in leaves]
        self.buckets: list[list[int]] = []
        current: list[int] = []
        size = 0
        for i in reversed(range(len(leaves))):
            nbytes = int(np.prod(self.shapes[i], dtype=np.int64)) * self.dtypes[i].itemsize
            if current and (size + nbytes > bucket_bytes or self.dtypes[current[0]] != self.dtypes[i]):
                self.buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            self.buckets.append(current)

    def _pack(self, leaves: list[Any], bucket: list[int]) -> np.ndarray:
        return np.concatenate([np.asarray(leaves[i], dtype=self.dtypes[i]).reshape(-1) for i in bucket])

    def _unpack(self, flat: np.ndarray, bucket: list[int], out: list[Any]) -> None:
        offset = 0
        for i in bucket:
            size = int(np.prod(self.shapes[i], dtype=np.int64))
            out[i] = flat[offset:offset + size].reshape(self.shapes[i])
            offset += size

    def all_reduce(self, comm: Communicator, leaves: list[Any], overlap: bool = False) -> list[Any]:
        if [np.shape(x) for x in leaves] != self.shapes:
            raise ValueError("grads: the gradient leaves do not match the bucket layout (shapes changed)")
        out: list[Any] = [None] * len(leaves)
        if not overlap:
            for bucket in self.buckets:
                self._unpack(comm.all_reduce(self._pack(leaves, bucket), "mean"), bucket, out)
            return out
        todo: queue.Queue = queue.Queue()
        done: queue.Queue = queue.Queue()

        def communicate() -> None:
            try:
                while (item := todo.get()) is not None:
                    done.put((item[0], comm.all_reduce(item[1], "mean")))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                done.put((None, exc))

        thread = threading.Thread(target=communicate, daemon=True)
        thread.start()
        for k, bucket in enumerate(self.buckets):
            todo.put((k, self._pack(leaves, bucket)))
        todo.put(None)
        for _ in self.buckets:
            k, reduced = done.get()
            if k is None:
                thread.join()
                raise reduced
            self._unpack(reduced, self.buckets[k], out)
        thread.join()
        return out


def _aux_keys(aux: Mapping[str, Any]) -> list[str]:
    return sorted(aux)


def data_parallel_step(comm: Communicator, replica: ReplicaStep, params: Any, opt_state: Any, shard: Any,
                       bucket_bytes: int = 4 << 20, overlap: bool = False,
                       lock: threading.Lock | None = None) -> tuple[Any, Any, dict[str, float]]:
    """One SPMD step on this rank's ``shard``: gradients, bucketed mean all-reduce, update. Returns the new
    parameters and optimizer state (identical on every rank) and the aux values of the gradient pass averaged
    over ranks, merged with the update's aux."""
    guard = lock or _NoLock()
    with guard:
        grads, aux = replica.grad(params, shard)
    leaves, tree = engine.tree_flatten(grads)
    leaves = [np.asarray(x) for x in leaves]
    reduced = GradientBuckets(leaves, bucket_bytes).all_reduce(comm, leaves, overlap)
    with guard:
        params, opt_state, aux2 = replica.apply(params, opt_state, engine.tree_unflatten(tree, reduced))
    keys = _aux_keys(aux)
    values = comm.all_reduce(np.array([float(aux[k]) for k in keys], dtype=np.float64), "mean", "ring")
    merged = {k: float(v) for k, v in zip(keys, values)}
    merged.update({k: float(v) for k, v in aux2.items()})
    return params, opt_state, merged


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def params_digest(params: Any, opt_state: Any) -> np.ndarray:
    """SHA-256 of the parameter and optimizer-state bytes, as 32 uint8 values."""
    h = hashlib.sha256()
    for leaf in engine.tree_flatten((params, opt_state))[0]:
        h.update(np.ascontiguousarray(leaf).tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8).copy()


def _broadcast_tree(comm: Communicator, tree: Any) -> Any:
    leaves, treedef = engine.tree_flatten(tree)
    return engine.tree_unflatten(treedef, [comm.broadcast(np.asarray(x), 0) for x in leaves])


def _split(batch: Mapping[str, Any], n: int) -> tuple[list[str], list[np.ndarray]]:
    keys = sorted(batch)
    fields = []
    for k in keys:
        a = np.asarray(batch[k])
        if a.ndim == 0 or a.shape[0] % n:
            raise ValueError(f"batch.{k}: leading axis {a.shape[:1]} does not split evenly over {n} learners")
        fields.append(a.reshape((n, a.shape[0] // n) + a.shape[1:]))
    return keys, fields


class _Replica:
    """The loop every rank runs: receive a command from rank 0, do it."""

    def __init__(self, comm: Communicator, make_replica: Callable[[], ReplicaStep], bucket_bytes: int,
                 overlap: bool, lock: threading.Lock | None) -> None:
        self.comm, self.lock, self.overlap = comm, lock, overlap
        with (lock or _NoLock()):
            self.replica = make_replica()
        self.params, self.opt_state = self.replica.params, self.replica.opt_state
        self.bucket_bytes = bucket_bytes

    def step(self, control: np.ndarray, keys: list[str] | None, fields: list[np.ndarray] | None) -> tuple:
        comm = self.comm
        control = comm.broadcast(control, 0)
        if control[0] == _STOP:
            return ("stop",)
        if control[0] == _CHECK:
            digests = comm.gather(params_digest(self.params, self.opt_state), 0)
            return ("check", digests)
        if control[1]:  # rank 0's parameters changed outside the learner: resynchronise
            self.params = _broadcast_tree(comm, self.params)
            self.opt_state = _broadcast_tree(comm, self.opt_state)
        names = comm.broadcast(np.frombuffer("\0".join(keys).encode(), dtype=np.uint8) if comm.rank == 0
                               else np.zeros(int(control[2]), dtype=np.uint8), 0)
        keys = bytes(names).decode().split("\0") if len(names) else []
        shard = {k: comm.scatter(fields[i] if comm.rank == 0 else None, 0) for i, k in enumerate(keys)}
        self.params, self.opt_state, aux = data_parallel_step(comm, self.replica, self.params, self.opt_state,
                                                              shard, self.bucket_bytes, self.overlap, self.lock)
        return ("step", aux)

    def serve(self) -> None:
        try:
            while self.step(np.zeros(4, np.int64), None, None)[0] != "stop":
                pass
        except BaseException as exc:  # a replica that fails stops the group instead of leaving rank 0 waiting
            self.comm.transport.abort(f"learner replica {self.comm.rank} failed: {type(exc).__name__}: {exc}")
            raise


def _thread_worker(comm: Communicator, make_replica: Callable[[], ReplicaStep], bucket_bytes: int, overlap: bool,
                   lock: threading.Lock) -> None:
    try:
        replica = _Replica(comm, make_replica, bucket_bytes, overlap, lock)
    except BaseException as exc:  # noqa: BLE001 - rank 0 gets PeerFailure instead of waiting for the timeout
        comm.transport.abort(f"building learner replica {comm.rank} failed: {type(exc).__name__}: {exc}")
        return
    try:
        replica.serve()
    except BaseException:  # noqa: BLE001 - serve() aborted the group; rank 0 raises the error
        return


def _process_worker(comm: Communicator, make_replica: Callable[[], ReplicaStep], bucket_bytes: int,
                    overlap: bool) -> None:
    _Replica(comm, make_replica, bucket_bytes, overlap, None).serve()


class DataParallelLearner:
    """A train step ``(params, opt_state, batch) -> (params, opt_state, aux)`` run by ``learners`` replicas.

    ``make_replica()`` builds one replica's :class:`ReplicaStep` (called once per rank, in that rank's thread
    or process, so it must be picklable for ``transport="tcp"`` / ``"shm"``). ``transport``: ``"threads"``
    (ranks 1..N-1 are threads of this process; engine calls are serialised by a lock, since tracing is not
    thread-safe, so only communication runs in parallel), ``"tcp"`` or ``"shm"`` (ranks 1..N-1 are processes
    started here). Call :meth:`close` when done.
    """

    def __init__(self, make_replica: Callable[[], ReplicaStep], learners: int, transport: str = "threads",
                 bucket_bytes: int = 4 << 20, overlap: bool = True, timeout: float = 120.0) -> None:
        if learners < 1:
            raise ValueError(f"learners: must be >= 1, got {learners}")
        if transport not in ("threads", "tcp", "shm"):
            raise ValueError(f"transport: {transport!r} is not one of threads, tcp, shm")
        self.learners, self.transport = learners, transport
        self._threads: list[threading.Thread] = []
        self._procs: list[Any] = []
        self._last: Any = None
        self._closed = False
        lock = threading.Lock() if transport == "threads" else None
        if transport == "threads":
            group = ThreadGroup(learners)
            comm0 = Communicator(group.transport(0, timeout))
            for rank in range(1, learners):
                comm = Communicator(group.transport(rank, timeout))
                t = threading.Thread(target=_thread_worker, args=(comm, make_replica, bucket_bytes, overlap, lock),
                                     daemon=True)
                t.start()
                self._threads.append(t)
        else:
            from fedarena.engine.collectives.launch import group_spec, make_transport, start_ranks

            spec = group_spec(transport)
            self._procs = start_ranks(learners, transport, _process_worker,
                                      (make_replica, bucket_bytes, overlap), spec, timeout, first_rank=1)
            comm0 = Communicator(make_transport(transport, 0, learners, spec, timeout))
        self.comm = comm0
        self._rank0 = _Replica(comm0, make_replica, bucket_bytes, overlap, lock)

    def __call__(self, params: Any, opt_state: Any, batch: Mapping[str, Any]) -> tuple[Any, Any, dict]:
        keys, fields = _split(batch, self.learners)
        resync = self._last is None or params is not self._last[0] or opt_state is not self._last[1]
        names = "\0".join(keys).encode()
        if resync:
            self._rank0.params, self._rank0.opt_state = params, opt_state
        control = np.array([_STEP, int(resync), len(names), 0], dtype=np.int64)
        if self._closed:
            raise RuntimeError("DataParallelLearner: closed (a replica failed or close() was called)")
        try:
            _, aux = self._rank0.step(control, keys, fields)
        except BaseException as exc:
            self.comm.transport.abort(f"learner rank 0 failed: {type(exc).__name__}: {exc}")
            self._shutdown()
            raise
        self._last = (self._rank0.params, self._rank0.opt_state)
        return self._rank0.params, self._rank0.opt_state, aux

    def replica_digests(self) -> np.ndarray:
        """SHA-256 of every replica's parameters and optimizer state, one row per rank."""
        return self._rank0.step(np.array([_CHECK, 0, 0, 0], dtype=np.int64), None, None)[1]

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._rank0.step(np.array([_STOP, 0, 0, 0], dtype=np.int64), None, None)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        for t in self._threads:
            t.join(10)
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        self.comm.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
