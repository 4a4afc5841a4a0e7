"""The alpha-beta (latency-bandwidth, Hockney 1994) cost model of each algorithm as implemented here.

A message of ``m`` bytes costs ``alpha + m * beta``. For every collective and algorithm, ``coefficients``
returns ``(a, b)`` with predicted time ``T = a * alpha + b * beta``: ``a`` counts the messages on the critical
path (chunked transfers count one message per chunk, as the schedules in :mod:`.algorithms` send them) and
``b`` the bytes on it; for the pipelined tree and chain schedules the counts are the usual
``(depth + chunks - 1)`` pipeline approximation, with the fan-out of a binary-tree node. ``nbytes`` is the NCCL-tests "size": the all-reduce / broadcast / reduce buffer, the
full all-gather output, the full reduce-scatter input, the full gather output / scatter input. The
communicator picks the algorithm with the smallest prediction (``choose``); :func:`fit` finds ``alpha`` and
``beta`` from measured times by non-negative least squares on these coefficients (relative error, so small and
large messages weigh alike), as ``benchmarks/collectives.py`` and ``benchmarks/auto_parallel.py`` do, and
:data:`NETWORKS` holds the constants of interconnects this machine does not have, for predictions on paper.
"""

from __future__ import annotations

import math

import numpy as np

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "halving_doubling"),
    "reduce_scatter": ("ring", "tree", "halving_doubling"),
    "all_gather": ("ring", "tree", "halving_doubling"),
    "broadcast": ("tree", "ring"),
    "reduce": ("tree", "ring"),
    "gather": ("tree", "linear"),
    "scatter": ("tree", "linear"),
}


def _msgs(nbytes: float, chunk_bytes: int) -> int:
    return max(1, math.ceil(nbytes / chunk_bytes)) if nbytes > 0 else 0


def _pipelined(depth: int, nbytes: float, chunk_bytes: int, fanout: int) -> tuple[float, float]:
    """A chunked pipeline of ``depth`` hops where a node sends or receives ``fanout`` messages per chunk."""
    c = _msgs(nbytes, chunk_bytes)
    if depth == 0 or c == 0:
        return 0.0, 0.0
    slots = depth + c - 1
    return float(slots * fanout), slots * fanout * nbytes / c


def coefficients(collective: str, algorithm: str, nbytes: float, n: int, chunk_bytes: int) -> tuple[float, float]:
    if n == 1:
        return 0.0, 0.0
    N = float(nbytes)
    depth = int(math.log2(n))  # height of the binary heap over n ranks
    fan = 2 if n > 2 else 1
    p = 1 << (n.bit_length() - 1)
    folded = p != n
    log_p = int(math.log2(p))
    key = (collective, algorithm)
    if key == ("all_reduce", "ring"):
        return 2 * (n - 1) * _msgs(N / n, chunk_bytes), 2 * (n - 1) / n * N
    if key == ("all_reduce", "halving_doubling"):
        a = 2 * sum(_msgs(N / 2 ** k, chunk_bytes) for k in range(1, log_p + 1))
        b = 2 * (p - 1) / p * N
        if folded:
            a, b = a + 2 * _msgs(N, chunk_bytes), b + 2 * N
        return float(a), b
    if key == ("all_reduce", "tree"):
        a, b = _pipelined(depth, N, chunk_bytes, fan)
        return 2 * a, 2 * b
    if key in (("broadcast", "tree"), ("reduce", "tree")):
        return _pipelined(depth, N, chunk_bytes, fan)
    if key in (("broadcast", "ring"), ("reduce", "ring")):
        return _pipelined(n - 1, N, chunk_bytes, 1)
    if key in (("all_gather", "ring"), ("reduce_scatter", "ring")):
        return float((n - 1) * _msgs(N / n, chunk_bytes)), (n - 1) / n * N
    if key in (("all_gather", "halving_doubling"), ("reduce_scatter", "halving_doubling")):
        a = sum(_msgs(N / 2 ** k, chunk_bytes) for k in range(1, log_p + 1))
        b = (p - 1) / p * N
        if folded:  # fold one side (a block or the whole buffer) and unfold the other
            a, b = a + _msgs(N, chunk_bytes) + _msgs(N / n, chunk_bytes), b + N + N / n
        return float(a), b
    if key in (("gather", "linear"), ("scatter", "linear")):
        return float(n - 1), (n - 1) / n * N
    if key in (("gather", "tree"), ("scatter", "tree")):
        return float(fan * depth), (n - 1) / n * N
    if key == ("all_gather", "tree"):
        a, b = _pipelined(depth, N, chunk_bytes, fan)
        return a + fan * depth, b + (n - 1) / n * N
    if key == ("reduce_scatter", "tree"):
        a, b = _pipelined(depth, N, chunk_bytes, fan)
        return a + fan * depth, b + (n - 1) / n * N
    raise ValueError(f"algorithm: {algorithm!r} is not an algorithm of {collective} "
                     f"(choose from {', '.join(ALGORITHMS.get(collective, ()))})")


def predict(collective: str, algorithm: str, nbytes: float, n: int, alpha: float, beta: float,
            chunk_bytes: int) -> float:
    a, b = coefficients(collective, algorithm, nbytes, n, chunk_bytes)
    return a * alpha + b * beta


def choose(collective: str, nbytes: float, n: int, alpha: float, beta: float, chunk_bytes: int) -> str:
    """The algorithm with the smallest predicted time (ties go to the first listed in ``ALGORITHMS``)."""
    options = ALGORITHMS[collective]
    return min(options, key=lambda alg: predict(collective, alg, nbytes, n, alpha, beta, chunk_bytes))


NETWORKS: dict[str, tuple[float, float]] = {
    "nvlink": (5e-6, 1.0 / 25e9),  # NVLink 2 between a pair of GPUs: ~25 GB/s a direction, a few us per message
    "10gbe": (30e-6, 1.0 / 1.25e9),  # 10 Gigabit Ethernet with TCP: 1.25 GB/s, tens of us per message
}
"""``(alpha, beta)`` of named interconnects: nominal link bandwidths and typical per-message latencies, stated
here rather than measured (this machine has neither)."""


def fit(collective: str, algorithm: str, n: int, sizes: list[float], times: list[float],
        chunk_bytes: int) -> tuple[float, float]:
    """``(alpha, beta) >= 0`` minimising the relative error of ``a * alpha + b * beta`` against ``times``
    measured for messages of ``sizes`` bytes with ``algorithm`` on ``n`` ranks."""
    from scipy.optimize import nnls

    rows = np.array([coefficients(collective, algorithm, s, n, chunk_bytes) for s in sizes], dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if rows.shape[0] < 2 or np.any(t <= 0):
        raise ValueError("times: need at least two positive measurements to fit alpha and beta")
    solution, _ = nnls(rows / t[:, None], np.ones_like(t))
    return float(solution[0]), float(solution[1])
