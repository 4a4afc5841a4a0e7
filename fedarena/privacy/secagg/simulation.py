"""Run one secure-aggregation round in-process: the same client and server objects a network transport drives,
with every message passed through the wire format, optional dropouts at each stage, and per-party compute time
and bytes. Used by the federated simulator, the tests and ``benchmarks/secagg.py``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from fedarena.privacy.secagg.client import SecAggClient
from fedarena.privacy.secagg.messages import decode, encode
from fedarena.privacy.secagg.protocol import SecAggConfig
from fedarena.privacy.secagg.server import AggregateResult, SecAggServer

DROP_STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask")


@dataclass
class RoundReport:
    """Outcome and cost of one simulated round."""

    result: AggregateResult
    server_seconds: float
    client_seconds: dict[int, float] = field(default_factory=dict)
    bytes_sent: dict[int, int] = field(default_factory=dict)  # client -> bytes uploaded
    bytes_received: dict[int, int] = field(default_factory=dict)  # client -> bytes downloaded


def secure_aggregate(inputs: dict[int, np.ndarray], config: SecAggConfig, *, round_id: int = 0,
                     dropouts: dict[str, set[int]] | None = None, wire: bool = True,
                     clock=time.perf_counter) -> RoundReport:
    """Aggregate ``inputs`` (client id -> float vector) with SecAgg / SecAgg+.

    ``dropouts[stage]`` is the set of clients that go silent instead of sending their message of ``stage``
    (one of :data:`DROP_STAGES`; ``consistency_check`` only matters with ``config.consistency_check``). With ``wire=True`` every message is encoded to bytes and decoded on the
    other side (sizes are counted either way). ``clock`` times the parties (wall clock by default;
    ``time.process_time`` gives CPU time on a shared machine)."""
    dropouts = {k: set(v) for k, v in (dropouts or {}).items()}
    unknown = set(dropouts) - set(DROP_STAGES)
    if unknown:
        raise ValueError(f"dropouts: unknown stages {sorted(unknown)}; use {DROP_STAGES}")
    server = SecAggServer(config, round_id, inputs)
    clients = {u: SecAggClient(u, config, round_id) for u in inputs}
    ctime: dict[int, float] = defaultdict(float)
    sent: dict[int, int] = defaultdict(int)
    recv: dict[int, int] = defaultdict(int)
    stime = 0.0

    def deliver_up(u: int, msg) -> None:
        nonlocal stime
        data = encode(msg)
        sent[u] += len(data)
        t0 = clock()
        server.receive(data if wire else msg)
        stime += clock() - t0

    def close():
        nonlocal stime
        t0 = clock()
        out = server.close_stage()
        stime += clock() - t0
        return out

    def down(u: int, msg):
        data = encode(msg)
        recv[u] += len(data)
        return decode(data) if wire else msg

    def timed(u: int, fn, *args):
        t0 = clock()
        out = fn(*args)
        ctime[u] += clock() - t0
        return out

    active = [u for u in clients if u not in dropouts.get("advertise_keys", ())]
    for u in active:
        deliver_up(u, timed(u, clients[u].advertise_keys))
    stage_msgs = close()
    active = [u for u in stage_msgs if u not in dropouts.get("share_keys", ())]
    for u in active:
        m = down(u, stage_msgs[u])
        deliver_up(u, timed(u, clients[u].share_keys, m))
    stage_msgs = close()
    active = [u for u in stage_msgs if u not in dropouts.get("masked_input", ())]
    for u in active:
        m = down(u, stage_msgs[u])
        deliver_up(u, timed(u, clients[u].masked_input, m, inputs[u]))
    stage_msgs = close()
    if config.consistency_check:
        active = [u for u in stage_msgs if u not in dropouts.get("consistency_check", ())]
        for u in active:
            m = down(u, stage_msgs[u])
            deliver_up(u, timed(u, clients[u].consistency, m))
        stage_msgs = close()
    active = [u for u in stage_msgs if u not in dropouts.get("unmask", ())]
    for u in active:
        m = down(u, stage_msgs[u])
        deliver_up(u, timed(u, clients[u].unmask, m))
    result = close()
    return RoundReport(result, stime, dict(ctime), dict(sent), dict(recv))
