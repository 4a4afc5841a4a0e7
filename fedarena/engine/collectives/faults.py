"""Fault injection for groups: make one rank die in the middle of a collective (to check that the others fail
with :class:`~.transport.PeerFailure` instead of hanging)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from .communicator import Communicator


def die_during_all_reduce(comm: Communicator, victim: int, delay: float = 0.3, elements: int = 1 << 18,
                          iterations: int = 10_000, algorithm: str = "ring") -> float:
    """Every rank runs all-reduces in a loop; ``victim`` calls ``os._exit(17)`` from a timer thread ``delay``
    seconds in, i.e. while a collective is in flight. Survivors raise ``PeerFailure``; if the loop ever ends
    (it should not) the elapsed time is returned."""
    x = np.ones(elements, dtype=np.float32)
    comm.barrier()
    if comm.rank == victim:
        threading.Timer(delay, lambda: os._exit(17)).start()
    start = time.monotonic()
    for _ in range(iterations):
        comm.all_reduce(x, "sum", algorithm)
    return time.monotonic() - start
