"""A parameter server: the flattened parameters are split into shards held by server ranks; worker ranks
pull parameters, compute gradients and push them; each server applies an optimizer to its shard.

Modes (Dean et al., "Large scale distributed deep networks", NIPS 2012; Li et al., "Scaling distributed
machine learning with the parameter server", OSDI 2014; the backup-worker synchronous variant of Chen et al.,
"Revisiting distributed synchronous SGD", 2016):

- ``sync``: a step waits for a gradient from every worker, computed on the current parameters;
- ``threshold``: a step is taken as soon as ``ceil(threshold * workers)`` gradients have arrived; a late
  gradient whose parameters are more than ``staleness`` versions old is dropped (``staleness=0`` drops every
  late gradient), otherwise it counts towards the next step;
- ``async``: every gradient is applied on arrival unless it is more than ``staleness`` versions old.

One rule covers all three: a server keeps the gradients accepted for its next step and steps when it holds
``quorum`` of them (``sync``: all workers, ``threshold``: the fraction, ``async``: one); a worker's push is
answered with the shard's parameters once its gradient has been applied or dropped, so a worker whose
gradient waits for a quorum waits with it. Messages are two arrays each way: worker -> server
``int64[kind, version]`` then the gradient shard; server -> worker ``int64[version, stop]`` then the parameter
shard. Ranks ``0 .. servers-1`` are servers, the rest workers, in one communicator.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine import optim
from fedarena.engine.collectives import Communicator, PeerFailure

MODES = ("sync", "threshold", "async")
_PUSH, _DONE = 1, 0


@dataclass(frozen=True)
class ParameterServerConfig:
    """``mode``: sync, threshold or async; ``servers``: how many ranks hold shards; ``threshold``: the fraction
    of workers a threshold step waits for; ``staleness``: the largest version lag of an applied gradient
    (threshold and async); ``steps``: the workers stop once any shard has made this many steps (shards step
    independently, so in threshold and async mode the others may have made fewer)."""

    mode: str = "sync"
    servers: int = 1
    threshold: float = 0.9
    staleness: int = 0
    steps: int = 100

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.servers < 1:
            raise ValueError(f"servers: must be >= 1, got {self.servers}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold: must be in (0, 1], got {self.threshold}")
        if self.staleness < 0:
            raise ValueError(f"staleness: must be >= 0, got {self.staleness}")
        if self.steps < 1:
            raise ValueError(f"steps: must be >= 1, got {self.steps}")

    def quorum(self, workers: int) -> int:
        if self.mode == "sync":
            return workers
        if self.mode == "async":
            return 1
        return max(1, math.ceil(self.threshold * workers - 1e-9))

    def bound(self) -> int:
        return 0 if self.mode == "sync" else self.staleness


@dataclass
class ServerShard:
    """What a server did: its final shard, the workers whose gradients made each step, the drops."""

    params: np.ndarray
    version: int = 0
    step_workers: list[tuple[int, ...]] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    dropped: dict[int, int] = field(default_factory=dict)
    applied: dict[int, int] = field(default_factory=dict)
    max_applied_staleness: int = 0


def _shard_bounds(size: int, servers: int) -> list[int]:
    return [size * i // servers for i in range(servers + 1)]


def _serve(comm: Communicator, cfg: ParameterServerConfig, shard: np.ndarray, optimizer: Any,
           opt_state: Any = None, version: int = 0, monitor: Callable[..., None] | None = None,
           lock: Any = None) -> ServerShard:
    tr = comm.transport
    guard = lock if lock is not None else contextlib.nullcontext()
    workers = list(range(cfg.servers, comm.world_size))
    inbox: queue.Queue = queue.Queue()

    def listen(src: int) -> None:
        try:
            while True:
                head = tr.recv(src)
                if int(head[0]) == _DONE:
                    inbox.put((src, _DONE, 0, None))
                    return
                inbox.put((src, _PUSH, int(head[1]), tr.recv(src)))
        except BaseException as exc:  # noqa: BLE001 - handed to the server loop
            inbox.put((src, -1, 0, exc))

    for w in workers:
        threading.Thread(target=listen, args=(w,), daemon=True).start()
    state = optimizer.init(shard) if opt_state is None else opt_state
    update = engine.jit(optimizer.update)
    out = ServerShard(shard.copy(), version=int(version))
    reqs = []

    def reply(w: int) -> None:
        stop = int(out.version >= cfg.steps)
        reqs.append(tr.isend(w, np.array([out.version, stop], dtype=np.int64)))
        reqs.append(tr.isend(w, out.params.copy()))

    for w in workers:
        reply(w)
    alive = set(workers)
    pending: list[tuple[int, np.ndarray]] = []
    bound = cfg.bound()
    start = time.monotonic()
    while alive:
        src, kind, version, grad = inbox.get()
        if kind == -1:
            raise PeerFailure(f"server rank {comm.rank}: worker {src} failed: {grad}")
        if kind == _DONE:
            alive.discard(src)
        elif out.version >= cfg.steps:
            reply(src)
        elif out.version - version > bound:
            out.dropped[src] = out.dropped.get(src, 0) + 1
            reply(src)
        else:
            pending.append((src, grad))
            out.max_applied_staleness = max(out.max_applied_staleness, out.version - version)
        if pending and len(pending) >= min(cfg.quorum(len(workers)), len(alive)):
            mean = np.mean(np.stack([g for _, g in pending]), axis=0).astype(out.params.dtype)
            with guard:
                params, state = update(mean, state, out.params)
            out.params = np.asarray(params)
            out.version += 1
            out.step_workers.append(tuple(sorted(w for w, _ in pending)))
            out.step_times.append(time.monotonic() - start)
            if monitor is not None:
                monitor(comm.rank, out.version, out.params, state)
            for w, _ in pending:
                out.applied[w] = out.applied.get(w, 0) + 1
                reply(w)
            pending = []
        if len(reqs) > 64:
            for r in reqs:
                r.wait()
            reqs = []
    for r in reqs:
        r.wait()
    return out


@dataclass
class WorkerLog:
    pushes: int = 0
    versions: list[tuple[int, ...]] = field(default_factory=list)


def _work(comm: Communicator, cfg: ParameterServerConfig, template: Any,
          gradient: Callable[[Any, int, int], Any]) -> WorkerLog:
    tr = comm.transport
    leaves, tree = engine.tree_flatten(template)
    shapes = [np.shape(x) for x in leaves]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    bounds = _shard_bounds(sum(sizes), cfg.servers)
    log = WorkerLog()
    flat = np.empty(sum(sizes), dtype=np.asarray(leaves[0]).dtype if leaves else np.float32)
    versions = [0] * cfg.servers

    def pull() -> bool:
        stop = False
        for s in range(cfg.servers):
            head = tr.recv(s)
            tr.recv_into(s, flat[bounds[s]:bounds[s + 1]])
            versions[s] = int(head[0])
            stop = stop or bool(head[1])
        return stop

    def unflat(vec: np.ndarray) -> Any:
        parts, off = [], 0
        for shape, size in zip(shapes, sizes):
            parts.append(vec[off:off + size].reshape(shape).copy())
            off += size
        return engine.tree_unflatten(tree, parts)

    stop = pull()
    while not stop:
        grads = gradient(unflat(flat), comm.rank - cfg.servers, log.pushes)
        g = np.concatenate([np.asarray(x, dtype=flat.dtype).reshape(-1) for x in engine.tree_flatten(grads)[0]])
        reqs = []
        for s in range(cfg.servers):
            reqs.append(tr.isend(s, np.array([_PUSH, versions[s]], dtype=np.int64)))
            reqs.append(tr.isend(s, g[bounds[s]:bounds[s + 1]]))
        log.versions.append(tuple(versions))
        log.pushes += 1
        for r in reqs:
            r.wait()
        stop = pull()
    for s in range(cfg.servers):
        tr.send(s, np.array([_DONE, 0], dtype=np.int64))
    return log


def run_parameter_server(comm: Communicator, cfg: ParameterServerConfig, params: Any,
                         gradient: Callable[[Any, int, int], Any],
                         optimizer: Any = None, opt_state: Any = None, version: int = 0,
                         monitor: Callable[..., None] | None = None,
                         lock: Any = None) -> ServerShard | WorkerLog:
    """This rank's part: a server (rank < ``cfg.servers``) returns its :class:`ServerShard`, a worker its
    :class:`WorkerLog`. ``params``: the initial parameter pytree (the same on every rank); ``gradient(params,
    worker_index, push_index)`` returns a gradient pytree of the same structure; ``optimizer``: an engine
    optimizer applied by each server to its flat shard (default ``optim.sgd(0.1)``). A server may resume from
    ``opt_state`` (its shard's optimizer state) at ``version``; ``monitor(rank, version, shard, opt_state)``
    is called on a server after each of its steps (the arrays are the server's own: copy what you keep).
    ``lock``: held around the server's optimizer step; ranks that are threads of one process must share one
    (the engine's tracing state is global, so its calls from several threads must not interleave)."""
    if comm.world_size <= cfg.servers:
        raise ValueError(f"servers: {cfg.servers} servers leave no workers in a group of {comm.world_size}")
    if comm.rank >= cfg.servers:
        return _work(comm, cfg, params, gradient)
    leaves = engine.tree_flatten(params)[0]
    flat = np.concatenate([np.asarray(x).reshape(-1) for x in leaves])
    bounds = _shard_bounds(flat.size, cfg.servers)
    return _serve(comm, cfg, flat[bounds[comm.rank]:bounds[comm.rank + 1]].copy(), optimizer or optim.sgd(0.1),
                  opt_state, version, monitor, lock)
