"""Ranks as threads of one process: one FIFO queue per ordered pair of ranks (for tests and in-process groups).

The receiver reads the sender's buffer directly (no copy on send); the send completes when the receiver has
consumed it. ``run_threads`` runs one function per rank and aborts the group when any rank raises.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from .framing import check_matches
from .transport import contiguous, PeerFailure, Reduction, Request, Transport

_POLL = 0.05


class _Message(Request):
    def __init__(self, array: np.ndarray, group: "ThreadGroup", dst: int, timeout: float) -> None:
        self.array = array
        self.consumed = threading.Event()
        self.group, self.dst, self.timeout = group, dst, timeout

    def wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.consumed.wait(_POLL):
            self.group.check_abort()
            if time.monotonic() > deadline:
                raise PeerFailure(f"send to rank {self.dst} timed out after {self.timeout:g} s "
                                  "(the peer did not receive)")


class ThreadGroup:
    """The shared state of one in-process group: a queue per (src, dst) and an abort flag."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.queues = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size) if s != d}
        self._abort = threading.Event()
        self._reason = ""

    def abort(self, reason: str) -> None:
        if not self._abort.is_set():
            self._reason = reason
            self._abort.set()

    def check_abort(self) -> None:
        if self._abort.is_set():
            raise PeerFailure(f"group aborted: {self._reason}")

    def transport(self, rank: int, timeout: float = 30.0) -> "ThreadTransport":
        return ThreadTransport(self, rank, timeout)


class ThreadTransport(Transport):
    alpha = 20e-6
    beta = 1.0 / 5e9

    def __init__(self, group: ThreadGroup, rank: int, timeout: float = 30.0) -> None:
        super().__init__(rank, group.world_size, timeout)
        self.group = group

    def isend(self, dst: int, array: np.ndarray) -> Request:
        self._check_peer(dst)
        self.group.check_abort()
        msg = _Message(contiguous(array), self.group, dst, self.timeout)
        self.group.queues[(self.rank, dst)].put(msg)
        return msg

    def _next(self, src: int) -> _Message:
        self._check_peer(src)
        q = self.group.queues[(src, self.rank)]
        deadline = time.monotonic() + self.timeout
        while True:
            self.group.check_abort()
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise PeerFailure(f"rank {self.rank}: no message from rank {src} within {self.timeout:g} s "
                                      "(peer failed or stopped)") from None

    def recv_into(self, src: int, out: np.ndarray) -> None:
        msg = self._next(src)
        try:
            check_matches(msg.array.dtype, msg.array.shape, out, src)
            np.copyto(out, msg.array)
        finally:
            msg.consumed.set()

    def recv(self, src: int) -> np.ndarray:
        msg = self._next(src)
        try:
            return msg.array.copy()
        finally:
            msg.consumed.set()

    def recv_reduce(self, src: int, acc: np.ndarray, op: Reduction) -> None:
        msg = self._next(src)
        try:
            check_matches(msg.array.dtype, msg.array.shape, acc, src)
            op(acc, msg.array, out=acc)
        finally:
            msg.consumed.set()

    def abort(self, reason: str) -> None:
        self.group.abort(f"rank {self.rank}: {reason}")

    def close(self) -> None:
        return None


def run_threads(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 30.0,
                **comm_options: Any) -> list[Any]:
    """Run ``fn(communicator, *args)`` on ``world_size`` threads; return the per-rank results in rank order.

    A rank that raises aborts the group (the others fail fast with :class:`PeerFailure`); the first error
    raised by a rank is re-raised here.
    """
    from .communicator import Communicator

    group = ThreadGroup(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        comm = Communicator(group.transport(rank, timeout), **comm_options)
        try:
            results[rank] = fn(comm, *args)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors[rank] = exc
            group.abort(f"rank {rank} raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = [e for e in errors if e is not None and not isinstance(e, PeerFailure)] or [e for e in errors if e]
    if first:
        raise first[0]
    return results
