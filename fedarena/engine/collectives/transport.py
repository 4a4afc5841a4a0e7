"""The point-to-point layer every collective algorithm is written against, and its errors.

A transport connects ``world_size`` ranks. Messages between one ordered pair of ranks arrive in the order they
were sent (FIFO per pair, no tags): the algorithms in :mod:`.algorithms` are deterministic schedules, so both
ends always agree on which message comes next. ``isend`` returns at once; the array must not be modified until
the returned request's ``wait()`` returns. Every blocking wait is bounded by ``timeout`` seconds; a peer that
dies or stops answering surfaces as :class:`PeerFailure` on the waiting rank, and a rank that sees a failure
tells every other rank (``abort``), so no rank hangs.
"""

from __future__ import annotations

import abc
from typing import Callable

import numpy as np

Reduction = Callable[..., np.ndarray]


class CollectiveError(RuntimeError):
    """A collective could not complete."""


class PeerFailure(CollectiveError):
    """A peer rank died, closed its connection, timed out, or aborted the group."""


class Request(abc.ABC):
    """An outstanding send."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Block until the send buffer may be reused; raise :class:`PeerFailure` if the send failed."""


class DoneRequest(Request):
    def wait(self) -> None:
        return None


class Transport(abc.ABC):
    """Ordered point-to-point messages of numpy arrays between ``world_size`` ranks.

    ``alpha`` (seconds per message) and ``beta`` (seconds per byte) are the transport's alpha-beta cost model
    parameters, used by the communicator's size-based algorithm choice; the defaults are rough per-transport
    values and ``benchmarks/collectives.py`` fits measured ones.
    """

    alpha: float = 50e-6
    beta: float = 1.0 / 1e9

    def __init__(self, rank: int, world_size: int, timeout: float) -> None:
        if world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: {rank} is not in [0, {world_size})")
        if timeout <= 0:
            raise ValueError(f"timeout: must be positive, got {timeout}")
        self.rank = rank
        self.world_size = world_size
        self.timeout = float(timeout)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"rank {self.rank}: invalid peer {peer} (world_size {self.world_size})")

    @abc.abstractmethod
    def isend(self, dst: int, array: np.ndarray) -> Request:
        """Start sending a C-contiguous ``array`` to ``dst``."""

    @abc.abstractmethod
    def recv_into(self, src: int, out: np.ndarray) -> None:
        """Receive the next message from ``src`` into the C-contiguous ``out`` (dtype and shape must match)."""

    @abc.abstractmethod
    def recv(self, src: int) -> np.ndarray:
        """Receive the next message from ``src`` into a new array of the dtype and shape its header names."""

    def recv_reduce(self, src: int, acc: np.ndarray, op: Reduction) -> None:
        """``acc = op(acc, message)`` for the next message from ``src``; transports that can read the payload in
        place (shared memory, threads) override this to reduce without an intermediate copy."""
        scratch = np.empty_like(acc)
        self.recv_into(src, scratch)
        op(acc, scratch, out=acc)

    def send(self, dst: int, array: np.ndarray) -> None:
        self.isend(dst, array).wait()

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """Tell every peer that this rank gives up (best effort), so their waits fail fast."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and buffers."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def contiguous(array: object) -> np.ndarray:
    """``array`` as a C-contiguous ndarray, copied only when needed (0-d arrays stay 0-d)."""
    a = np.asarray(array)
    return a if a.flags.c_contiguous else a.copy(order="C")
