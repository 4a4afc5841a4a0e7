"""The cost of a sharded program on one rank: compute time of each equation on its local blocks, the
alpha-beta time of the redistributions between them (``collectives.cost_model``), and the peak memory a rank
holds (the cost model of MindSpore's auto-parallel strategy search: computation, communication and memory per
device; Su et al. 2021, and the operator cost model of Wang et al., EuroSys 2019).

Compute time is ``op_time + flops * flop_time + bytes * byte_time`` (a matmul's multiply-adds, every other
primitive's bytes read and written): a roofline with a fixed per-call overhead, its constants measured on the
machine by :func:`calibrate`. An equation that touches at most ``cache_bytes`` streams from the cache at
``cache_byte_time`` a byte, a larger one from memory at ``byte_time`` (the two rates differ several-fold on this
host, and a head of a million classes updates arrays of tens of MiB where a small model's fit in the cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..collectives import cost_model
from ..core.ir import ShapedArray


@dataclass(frozen=True)
class CostModel:
    """Machine constants: ``alpha`` (s per message), ``beta`` (s per byte), ``chunk_bytes`` of the transport;
    ``op_time`` (s per primitive call), ``flop_time`` (s per multiply-add pair, i.e. per 2 flops counted as
    2), ``byte_time`` (s per byte an elementwise/shape primitive touches, streamed from memory),
    ``cache_bytes`` and ``cache_byte_time`` (the bytes an equation may touch and still run from the cache, and
    its rate there; ``cache_bytes=0``: one rate for every size)."""

    alpha: float = 60e-6
    beta: float = 1.0 / 1.5e9
    chunk_bytes: int = 1 << 20
    op_time: float = 5e-6
    flop_time: float = 1.0 / 20e9
    byte_time: float = 1.0 / 4e9
    cache_bytes: int = 0
    cache_byte_time: float = 1.0 / 4e9

    def compute_time(self, prim_name: str, in_shapes: Sequence[tuple], out_shape: tuple, itemsize: int,
                     in_itemsizes: Sequence[int] = ()) -> float:
        out_size = int(np.prod(out_shape, dtype=np.int64))
        if prim_name == "matmul" and len(in_shapes) == 2:
            k = in_shapes[0][-1]
            return self.op_time + 2.0 * out_size * k * self.flop_time
        sizes = in_itemsizes or [itemsize] * len(in_shapes)
        nbytes = out_size * itemsize + sum(int(np.prod(s, dtype=np.int64)) * b for s, b in zip(in_shapes, sizes))
        return self.op_time + nbytes * (self.cache_byte_time if nbytes <= self.cache_bytes else self.byte_time)

    def collective_time(self, collective: str, nbytes: float, n: int) -> float:
        alg = cost_model.choose(collective, nbytes, n, self.alpha, self.beta, self.chunk_bytes)
        return cost_model.predict(collective, alg, nbytes, n, self.alpha, self.beta, self.chunk_bytes)

    def with_transport(self, alpha: float, beta: float) -> "CostModel":
        return replace(self, alpha=float(alpha), beta=float(beta))


def _timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls: on a shared machine the median carries the load the program will
    run under, where the best time would describe an idle machine."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _add_rate(elements: int, op: float, repeats: int) -> float:
    """Seconds per byte touched by ``np.add(a, a, out)`` over ``elements`` float32 numbers."""
    a = np.ones(elements, np.float32)
    out = np.empty_like(a)
    np.add(a, a, out)
    return max(_timed(lambda: np.add(a, a, out), repeats) - op, 1e-12) / (3.0 * a.nbytes)


def calibrate(base: CostModel | None = None, repeats: int = 7) -> CostModel:
    """Measure ``op_time`` (a tiny ufunc call), ``flop_time`` (a 512^3 float32 product), ``byte_time`` (an add
    over 32 MiB), ``cache_byte_time`` (an add over 256 KiB) and ``cache_bytes`` (the most bytes an add of 256 KiB
    to 32 MiB operands touched at a rate nearer the cache's than memory's, by geometric mean) on this machine
    and return ``base`` with them (the transport's ``alpha``/``beta`` are fitted to timed collectives by
    ``collectives.cost_model.fit``)."""
    base = base or CostModel()
    tiny = np.ones(8, np.float32)
    op = _timed(lambda: np.add(tiny, tiny), repeats * 20)
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    mm = _timed(lambda: a @ a, repeats)
    sizes = [1 << k for k in range(16, 24)]  # float32 elements: 256 KiB .. 32 MiB an operand
    rates = [_add_rate(m, op, repeats) for m in sizes]
    cache, memory = rates[0], rates[-1]
    split = float(np.sqrt(cache * memory))
    fast = [3 * 4 * m for m, r in zip(sizes, rates) if r <= split]
    return replace(base, op_time=op, flop_time=max(mm - op, 1e-9) / (2.0 * 512 ** 3), byte_time=memory,
                   cache_byte_time=min(cache, memory), cache_bytes=max(fast) if fast and cache < memory else 0)


def nbytes(aval: ShapedArray) -> int:
    return aval.size * aval.dtype.itemsize


__all__ = ["CostModel", "calibrate", "nbytes"]
