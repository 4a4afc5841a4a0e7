"""A learner whose parameters live on a parameter server running in the background of this process.

:func:`~fedarena.engine.distributed.parameter_server.run_parameter_server` runs on a group of threads
(``servers`` server ranks, ``workers`` worker ranks) for as long as the learner lives. The caller feeds
batches with :meth:`ParameterServerLearner.update`; each worker takes the next batch, computes a gradient on
the parameters it last pulled (``grad_fn(params, batch) -> (grads, metrics)``) and pushes it; the servers
step in the chosen mode (``sync``, ``threshold``, ``async``) and the newest parameters are published for
:meth:`weights`. ``update`` keeps at most ``workers`` batches in flight, so in ``sync`` mode a step is taken
once every worker holds a batch, and in ``threshold`` / ``async`` mode a slow worker does not hold back the
others. This is how an IMPALA learner uses the parameter server (``impala.parameter_server``).

The engine's tracing state is global, so every engine call of these threads (the workers' ``grad_fn``,
the servers' optimizer steps) runs under one lock: ranks overlap only outside it (the transport, waiting),
and a worker that is slow inside the engine holds the others back.
The point is the parameter server's semantics (quorum, staleness bounds, sharded optimizer state), not a
thread speed-up.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

import numpy as np

from fedarena import engine
from fedarena.engine.collectives import Communicator, PeerFailure
from fedarena.engine.collectives.threads import ThreadGroup

from .parameter_server import ParameterServerConfig, _shard_bounds, run_parameter_server

_IDLE_TIMEOUT_S = 24 * 3600.0
"""Transport timeout of the background group: a worker may wait for its next batch for as long as the caller
takes (evaluation, checkpoints); closing the learner aborts the group instead."""

_CLOSED = object()


class ParameterServerLearner:
    """``params``: initial pytree; ``grad_fn(params, batch) -> (grads, metrics)``; ``optimizer``: an engine
    optimizer each server applies to its flat shard; ``opt_state``/``version``: resume from a
    :meth:`state` (``opt_state`` is the list of shard states); ``lock_gradients=False`` lets the workers run
    ``grad_fn`` concurrently, for a ``grad_fn`` that makes no engine calls."""

    def __init__(self, params: Any, grad_fn: Callable[[Any, Any], tuple[Any, dict]], optimizer: Any,
                 config: ParameterServerConfig, workers: int, opt_state: list | None = None,
                 version: int = 0, lock_gradients: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        leaves, self._tree = engine.tree_flatten(params)
        self._shapes = [np.shape(x) for x in leaves]
        self._dtype = np.asarray(leaves[0]).dtype
        flat = np.concatenate([np.asarray(x, dtype=self._dtype).reshape(-1) for x in leaves])
        self._bounds = _shard_bounds(flat.size, config.servers)
        if opt_state is not None and len(opt_state) != config.servers:
            raise ValueError(f"opt_state: expected {config.servers} shard states, got {len(opt_state)}")
        self.config, self.workers, self.grad_fn, self.optimizer = config, int(workers), grad_fn, optimizer
        self._lock = threading.Condition()
        self._engine_lock = threading.Lock()
        self._gradient_guard: Any = self._engine_lock if lock_gradients else contextlib.nullcontext()
        self._flat = flat
        self._shard_versions = [int(version)] * config.servers
        self._shard_states: list[Any] = (list(opt_state) if opt_state is not None else
                                         [optimizer.init(flat[a:b].copy())
                                          for a, b in zip(self._bounds[:-1], self._bounds[1:])])
        self._params = params
        self._inbox: queue.Queue = queue.Queue()
        self._in_flight = 0
        self._metrics: dict[str, float] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._group = ThreadGroup(config.servers + self.workers)
        # effectively unbounded: the group must outlive any number of pushes; the learner is closed explicitly
        cfg = ParameterServerConfig(config.mode, config.servers, config.threshold, config.staleness, 2 ** 62)
        initial_states = list(self._shard_states)
        self._threads = [threading.Thread(target=self._rank, args=(r, cfg, params, initial_states, int(version)),
                                          daemon=True, name=f"ps-rank-{r}")
                         for r in range(config.servers + self.workers)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ ranks
    def _rank(self, rank: int, cfg: ParameterServerConfig, params: Any, states: list, version: int) -> None:
        comm = Communicator(self._group.transport(rank, _IDLE_TIMEOUT_S))
        state = states[rank] if rank < cfg.servers else None
        try:
            run_parameter_server(comm, cfg, params, self._gradient, self.optimizer, state, version, self._publish,
                                 self._engine_lock)
        except PeerFailure:
            if not self._closed:
                self._fail(RuntimeError(f"parameter server rank {rank}: a peer failed"))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller by update()
            self._fail(exc)
            self._group.abort(f"rank {rank} raised {type(exc).__name__}: {exc}")

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
            self._lock.notify_all()

    def _publish(self, rank: int, version: int, shard: np.ndarray, opt_state: Any) -> None:
        with self._lock:
            self._flat[self._bounds[rank]:self._bounds[rank + 1]] = shard
            self._shard_versions[rank] = int(version)
            self._shard_states[rank] = engine.tree_map(np.copy, opt_state)
            self._params = None  # unflattened lazily by weights()

    def _gradient(self, params: Any, worker: int, push: int) -> Any:
        if push > 0:  # this worker's previous batch has been applied or dropped
            with self._lock:
                self._in_flight -= 1
                self._lock.notify_all()
        batch = self._inbox.get()
        if batch is _CLOSED:
            raise PeerFailure("closed")
        with self._gradient_guard:
            grads, metrics = self.grad_fn(params, batch)
        with self._lock:
            self._metrics = {k: float(v) for k, v in metrics.items()}
        return grads

    # ------------------------------------------------------------------ caller
    @property
    def version(self) -> int:
        """The parameter version: the fewest steps any shard has made."""
        with self._lock:
            return min(self._shard_versions)

    @property
    def params(self) -> Any:
        return self.weights()[1]

    @property
    def opt_state(self) -> list:
        with self._lock:
            return list(self._shard_states)

    def weights(self) -> tuple[int, Any]:
        """(version, parameters) as last published by the servers."""
        with self._lock:
            if self._params is None:
                parts, off = [], 0
                for shape in self._shapes:
                    size = int(np.prod(shape, dtype=np.int64))
                    parts.append(self._flat[off:off + size].reshape(shape).copy())
                    off += size
                self._params = engine.tree_unflatten(self._tree, parts)
            return min(self._shard_versions), self._params

    def update(self, batch: Any) -> dict[str, float]:
        """Hand one batch to the workers; block while ``workers`` batches are already in flight. Returns the
        metrics of the newest gradient computed so far and the number of batches in flight."""
        with self._lock:
            while self._in_flight >= self.workers and self._error is None:
                self._lock.wait()
            if self._error is not None:
                raise RuntimeError(f"parameter server failed: {type(self._error).__name__}: {self._error}"
                               ) from self._error
            self._in_flight += 1
            self._inbox.put(batch)
            return dict(self._metrics, ps_in_flight=float(self._in_flight))

    def drain(self, timeout: float = 60.0) -> None:
        """Block until every batch handed over has been applied or dropped."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._in_flight == 0 or self._error is not None, timeout):
                raise TimeoutError(f"drain: {self._in_flight} batches still in flight after {timeout:g} s")
            if self._error is not None:
                raise RuntimeError(f"parameter server failed: {type(self._error).__name__}: {self._error}"
                               ) from self._error

    def close(self) -> None:
        """Stop the servers and workers (batches still in flight are discarded)."""
        if self._closed:
            return
        self._closed = True
        for _ in range(self.workers):
            self._inbox.put(_CLOSED)
        self._group.abort("learner closed")
        for t in self._threads:
            t.join(timeout=10)
