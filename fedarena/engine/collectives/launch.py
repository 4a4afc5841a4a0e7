"""Start one process per rank on this host and connect them with the TCP or shared-memory transport.

``spawn(4, "tcp", fn, args)`` runs ``fn(communicator, *args)`` in 4 fresh processes (``multiprocessing``
spawn context; ``fn`` must be importable by name) and returns each rank's result, or its error. The group
secret (TCP) and segment name (shared memory) come from ``secrets``; they reach the children through the
spawn pipe, never the network.
"""

from __future__ import annotations

import multiprocessing as mp
import secrets
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

TRANSPORTS = ("tcp", "shm")


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    exitcode: int | None = None


class RankError(RuntimeError):
    """At least one rank process failed; ``outcomes`` has every rank's result."""

    def __init__(self, outcomes: list[RankOutcome]) -> None:
        self.outcomes = outcomes
        bad = [o for o in outcomes if not o.ok]
        super().__init__("; ".join(f"rank {o.rank}: {o.error.strip().splitlines()[-1] if o.error else 'failed'}"
                                   for o in bad))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_transport(kind: str, rank: int, world_size: int, spec: dict[str, Any], timeout: float) -> Any:
    if kind == "tcp":
        from .tcp import TCPTransport
        return TCPTransport(rank, world_size, tuple(spec["master"]), spec["secret"], timeout=timeout)
    if kind == "shm":
        from .shm import SharedMemoryTransport
        return SharedMemoryTransport(rank, world_size, spec["name"], timeout=timeout,
                                     capacity=spec.get("capacity", 4 << 20))
    raise ValueError(f"transport: {kind!r} is not a process transport (choose from {', '.join(TRANSPORTS)})")


def group_spec(kind: str) -> dict[str, Any]:
    if kind == "tcp":
        return {"master": ("127.0.0.1", free_port()), "secret": secrets.token_bytes(32)}
    if kind == "shm":
        return {"name": "fa" + secrets.token_hex(6)}
    raise ValueError(f"transport: {kind!r} is not a process transport (choose from {', '.join(TRANSPORTS)})")


def _rank_main(kind: str, rank: int, world_size: int, spec: dict[str, Any], timeout: float,
               comm_options: dict[str, Any], fn: Callable[..., Any], args: tuple, conn: Any) -> None:
    from .communicator import Communicator

    transport = None
    try:
        transport = make_transport(kind, rank, world_size, spec, timeout)
        comm = Communicator(transport, **comm_options)
        result = fn(comm, *args)
        if conn is not None:
            conn.send(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        if transport is not None:
            transport.abort(f"{type(exc).__name__}: {exc}")
        if conn is not None:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        else:
            raise
    finally:
        if transport is not None:
            transport.close()
        if conn is not None:
            conn.close()


def start_ranks(world_size: int, kind: str, fn: Callable[..., Any], args: tuple, spec: dict[str, Any],
                timeout: float = 30.0, first_rank: int = 0, comm_options: dict[str, Any] | None = None) -> list[Any]:
    """Start ranks ``first_rank .. world_size-1`` as daemon processes running ``fn(comm, *args)`` and return
    the processes at once (the caller runs the lower ranks itself, e.g. rank 0 of a learner group)."""
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(first_rank, world_size):
        p = ctx.Process(target=_rank_main, args=(kind, rank, world_size, spec, timeout, comm_options or {}, fn,
                                                 args, None), daemon=True)
        p.start()
        procs.append(p)
    return procs


def spawn(world_size: int, kind: str, fn: Callable[..., Any], args: tuple = (), timeout: float = 30.0,
          comm_options: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
          raise_on_error: bool = True, join_timeout: float | None = None) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` processes; the list of results in rank order (or, with
    ``raise_on_error=False``, the :class:`RankOutcome` of each rank). ``join_timeout`` bounds the whole run
    (default: three times ``timeout`` plus start-up); ranks still running then are killed."""
    ctx = mp.get_context("spawn")
    spec = dict(spec or group_spec(kind))
    procs, pipes = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, args=(kind, rank, world_size, spec, timeout, comm_options or {}, fn,
                                                 args, child), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        pipes.append(parent)
    deadline = time.monotonic() + (join_timeout if join_timeout is not None else 3 * timeout + 60)
    outcomes: list[RankOutcome | None] = [None] * world_size
    while any(o is None for o in outcomes):
        for rank, (p, conn) in enumerate(zip(procs, pipes)):
            if outcomes[rank] is not None:
                continue
            if conn.poll(0.02):
                try:
                    status, payload = conn.recv()
                except EOFError:
                    p.join(1.0)
                    outcomes[rank] = RankOutcome(rank, False, error=f"exited with code {p.exitcode}",
                                                 exitcode=p.exitcode)
                    continue
                p.join(5.0)
                outcomes[rank] = (RankOutcome(rank, True, payload, exitcode=p.exitcode) if status == "ok"
                                  else RankOutcome(rank, False, error=payload, exitcode=p.exitcode))
            elif not p.is_alive() and not conn.poll(0):
                outcomes[rank] = RankOutcome(rank, False, error=f"exited with code {p.exitcode} without a result",
                                             exitcode=p.exitcode)
        if time.monotonic() > deadline:
            for rank, p in enumerate(procs):
                if outcomes[rank] is None:
                    p.kill()
                    p.join(5.0)
                    outcomes[rank] = RankOutcome(rank, False, error="still running at the deadline; killed")
    done = [o for o in outcomes if o is not None]
    if not raise_on_error:
        return done
    if not all(o.ok for o in done):
        raise RankError(done)
    return [o.value for o in done]
