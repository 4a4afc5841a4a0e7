"""Ranks as Ray actors: messages are actor calls, large payloads go through Ray's object store.

Each rank is a threaded actor (:class:`RayRank`) with a mailbox; ``isend`` calls the destination's ``deliver``
with a per-pair sequence number (threaded actors may run calls out of order, so the mailbox restores the
order). Payloads of at least ``inline_bytes`` are ``ray.put`` into the object store and only their reference
travels; the receiver fetches it when it consumes the message (zero-copy, read-only, on the same node). A
waiting rank pings the peer it waits for every ``probe_interval`` seconds: a dead actor surfaces as
:class:`PeerFailure` at once instead of after the full ``timeout``.

``RayGroup(world_size)`` creates the actors (``num_cpus=0`` each, so a group fits a small Ray instance) and
``group.run(fn, *args)`` runs ``fn(communicator, *args)`` on every rank.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from .framing import check_matches
from .transport import PeerFailure, Reduction, Request, Transport, contiguous


class _Mailbox:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: dict[tuple[int, int], Any] = {}
        self.aborted = ""

    def put(self, src: int, seq: int, payload: Any) -> None:
        with self.cond:
            self.items[(src, seq)] = payload
            self.cond.notify_all()

    def abort(self, reason: str) -> None:
        with self.cond:
            if not self.aborted:
                self.aborted = reason or "aborted"
            self.cond.notify_all()


class _RaySend(Request):
    def __init__(self, ref: Any, owner: "RayTransport", dst: int) -> None:
        self.ref, self.owner, self.dst = ref, owner, dst

    def wait(self) -> None:
        import ray

        try:
            ray.get(self.ref, timeout=self.owner.timeout)
        except ray.exceptions.GetTimeoutError:
            raise PeerFailure(f"rank {self.owner.rank}: delivery to rank {self.dst} timed out") from None
        except ray.exceptions.RayError as exc:
            raise PeerFailure(f"rank {self.owner.rank}: rank {self.dst} failed: {type(exc).__name__}") from None


class RayTransport(Transport):
    alpha = 500e-6
    beta = 1.0 / 1e9

    def __init__(self, rank: int, world_size: int, peers: list[Any], mailbox: _Mailbox, timeout: float = 30.0,
                 inline_bytes: int = 100 * 1024, probe_interval: float = 0.5) -> None:
        super().__init__(rank, world_size, timeout)
        self.peers, self.mailbox = peers, mailbox
        self.inline_bytes, self.probe_interval = inline_bytes, probe_interval
        self._sent = [0] * world_size
        self._received = [0] * world_size

    def isend(self, dst: int, array: np.ndarray) -> Request:
        import ray

        self._check_peer(dst)
        a = contiguous(array)
        payload: Any = [ray.put(a)] if a.nbytes >= self.inline_bytes else a.copy()
        seq = self._sent[dst]
        self._sent[dst] += 1
        return _RaySend(self.peers[dst].deliver.remote(self.rank, seq, payload), self, dst)

    def _take(self, src: int) -> np.ndarray:
        import ray

        self._check_peer(src)
        key = (src, self._received[src])
        box = self.mailbox
        deadline = time.monotonic() + self.timeout
        next_probe = time.monotonic() + self.probe_interval
        with box.cond:
            while key not in box.items:
                if box.aborted:
                    raise PeerFailure(f"rank {self.rank}: group aborted: {box.aborted}")
                now = time.monotonic()
                if now > deadline:
                    raise PeerFailure(f"rank {self.rank}: no message from rank {src} within {self.timeout:g} s")
                if now > next_probe:
                    box.cond.release()
                    try:
                        ray.get(self.peers[src].ping.remote(), timeout=self.timeout)
                    except ray.exceptions.RayError as exc:
                        raise PeerFailure(f"rank {self.rank}: rank {src} died ({type(exc).__name__})") from None
                    finally:
                        box.cond.acquire()
                    next_probe = time.monotonic() + self.probe_interval
                    continue
                box.cond.wait(min(0.05, self.probe_interval))
            payload = box.items.pop(key)
        self._received[src] += 1
        if isinstance(payload, list):
            payload = ray.get(payload[0], timeout=self.timeout)
        return payload

    def recv_into(self, src: int, out: np.ndarray) -> None:
        msg = self._take(src)
        check_matches(msg.dtype, msg.shape, out, src)
        np.copyto(out, msg)

    def recv(self, src: int) -> np.ndarray:
        return np.array(self._take(src))

    def recv_reduce(self, src: int, acc: np.ndarray, op: Reduction) -> None:
        msg = self._take(src)
        check_matches(msg.dtype, msg.shape, acc, src)
        op(acc, msg, out=acc)

    def abort(self, reason: str) -> None:
        text = f"rank {self.rank}: {reason}"
        self.mailbox.abort(text)
        for peer, handle in enumerate(self.peers):
            if peer != self.rank:
                try:
                    handle.abort.remote(text)
                except Exception:  # noqa: BLE001 - a dead peer cannot be told
                    pass

    def close(self) -> None:
        return None


class RayRank:
    """One rank of a :class:`RayGroup` (wrapped by ``ray.remote`` there)."""

    def __init__(self, rank: int, world_size: int, timeout: float, comm_options: dict[str, Any]) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.comm_options = comm_options
        self.mailbox = _Mailbox()
        self.comm: Any = None

    def connect(self, peers: list[Any]) -> int:
        """Join the group of ``peers`` (this actor is ``peers[self.rank]``), with a fresh mailbox."""
        from .communicator import Communicator

        self.world_size = len(peers)
        self.mailbox = _Mailbox()
        self.comm = Communicator(RayTransport(self.rank, self.world_size, peers, self.mailbox, self.timeout),
                                 **self.comm_options)
        return self.rank

    def deliver(self, src: int, seq: int, payload: Any) -> None:
        self.mailbox.put(src, seq, payload)

    def ping(self) -> int:
        return self.rank

    def abort(self, reason: str) -> None:
        self.mailbox.abort(reason)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.comm, *args)


class RayGroup:
    """``world_size`` :class:`RayRank` actors connected to each other (Ray must already be initialised)."""

    def __init__(self, world_size: int, timeout: float = 30.0, comm_options: dict[str, Any] | None = None,
                 max_concurrency: int = 8) -> None:
        import ray

        actor = ray.remote(num_cpus=0, max_concurrency=max_concurrency)(RayRank)
        self.all_actors = [actor.remote(r, world_size, timeout, comm_options or {}) for r in range(world_size)]
        self.timeout = timeout
        self.actors: list[Any] = []
        self.resize(world_size)

    def resize(self, world_size: int) -> None:
        """Regroup the first ``world_size`` actors (no rank may be inside a collective)."""
        import ray

        if not 1 <= world_size <= len(self.all_actors):
            raise ValueError(f"world_size: {world_size} is not in [1, {len(self.all_actors)}]")
        self.actors = self.all_actors[:world_size]
        ray.get([a.connect.remote(self.actors) for a in self.actors], timeout=120)

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        import ray

        return ray.get([a.run.remote(fn, *args) for a in self.actors])

    def submit(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Start ``fn`` on every rank; the object references of the results."""
        return [a.run.remote(fn, *args) for a in self.actors]

    def shutdown(self) -> None:
        import ray

        for a in self.all_actors:
            ray.kill(a)
        self.actors, self.all_actors = [], []
