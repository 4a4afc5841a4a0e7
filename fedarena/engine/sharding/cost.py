"""The cost of a sharded program on one rank: compute time of each equation on its local blocks, the
alpha-beta time of the redistributions between them (``collectives.cost_model``), and the peak memory a rank
holds (the cost model of MindSpore's auto-parallel strategy search: computation, communication and memory per
device; Su et al. 2021, and the operator cost model of Wang et al., EuroSys 2019).

Compute time is ``op_time + flops * flop_time + bytes * byte_time`` (a matmul's multiply-adds, every other
primitive's bytes read and written): a roofline with a fixed per-call overhead, its constants measured on the
machine by :func:`calibrate`. The rate a byte streams at depends on how many bytes the equation touches
(caches): ``byte_curve`` holds measured ``(bytes touched, seconds per byte)`` points, interpolated in log
bytes and held flat beyond its ends (on this host the rate falls several-fold between arrays that fit in the
cache and arrays of tens of MiB, which a head of a million classes updates and a small model never does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..collectives import cost_model
from ..core.ir import ShapedArray
from ..jit import jit


@dataclass(frozen=True)
class CostModel:
    """Machine constants: ``alpha`` (s per message), ``beta`` (s per byte), ``chunk_bytes`` of the transport;
    ``op_time`` (s per primitive call), ``flop_time`` (s per multiply-add pair, i.e. per 2 flops counted as
    2), ``byte_time`` (s per byte an elementwise/shape primitive touches), ``byte_curve`` (``(bytes
    touched, s per byte)`` points ascending in bytes: the rate by an equation's size, replacing ``byte_time``
    when given), ``segment_time`` (s per call of a compiled segment: ``engine.jit``'s dispatch; recorded, not
    added to predictions: a measured segment call includes it, the analytic model counts ``op_time`` per
    equation) and
    ``host_time`` (s of the executor's Python per item of a rank's schedule, segment or host step, and per
    call, besides the item's own work)."""

    alpha: float = 60e-6
    beta: float = 1.0 / 1.5e9
    chunk_bytes: int = 1 << 20
    op_time: float = 5e-6
    flop_time: float = 1.0 / 20e9
    byte_time: float = 1.0 / 4e9
    byte_curve: tuple = ()
    segment_time: float = 20e-6
    host_time: float = 5e-6

    def compute_time(self, prim_name: str, in_shapes: Sequence[tuple], out_shape: tuple, itemsize: int,
                     in_itemsizes: Sequence[int] = ()) -> float:
        out_size = int(np.prod(out_shape, dtype=np.int64))
        if prim_name == "matmul" and len(in_shapes) == 2:
            k = in_shapes[0][-1]
            return self.op_time + 2.0 * out_size * k * self.flop_time
        sizes = in_itemsizes or [itemsize] * len(in_shapes)
        nbytes = out_size * itemsize + sum(int(np.prod(s, dtype=np.int64)) * b for s, b in zip(in_shapes, sizes))
        return self.op_time + nbytes * self.byte_rate(nbytes)

    def byte_rate(self, nbytes: float) -> float:
        """Seconds per byte of an equation touching ``nbytes``."""
        if not self.byte_curve:
            return self.byte_time
        xs = np.log([max(b, 1.0) for b, _ in self.byte_curve])
        return float(np.interp(np.log(max(nbytes, 1.0)), xs, [r for _, r in self.byte_curve]))

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
    """Measure ``op_time`` (a tiny ufunc call), ``flop_time`` (a 512^3 float32 product), ``byte_curve`` (adds
    over float32 operands of 256 KiB to 64 MiB, by the bytes each touches), ``byte_time`` (its largest
    point), ``segment_time`` (a jitted one-add function's call less the add) and ``host_time`` (a tiny slice
    made contiguous) on this machine and return ``base`` with them (the transport's ``alpha``/``beta`` are fitted to
    timed collectives by ``collectives.cost_model.fit``)."""
    base = base or CostModel()
    tiny = np.ones(8, np.float32)
    op = _timed(lambda: np.add(tiny, tiny), repeats * 20)
    one = jit(lambda a: a + 1.0)
    one(tiny)
    segment = max(_timed(lambda: one(tiny), repeats * 20) - op, 0.0)
    host = _timed(lambda: np.asarray(np.ascontiguousarray(np.split(tiny, 2)[0])), repeats * 20)
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    mm = _timed(lambda: a @ a, repeats)
    sizes = [1 << k for k in range(16, 25)]  # float32 elements: 256 KiB .. 64 MiB an operand
    curve = tuple((3 * 4 * m, _add_rate(m, op, repeats)) for m in sizes)
    return replace(base, op_time=op, flop_time=max(mm - op, 1e-9) / (2.0 * 512 ** 3), byte_time=curve[-1][1],
                   byte_curve=curve, segment_time=segment, host_time=host)


def sample(aval: ShapedArray, rng: np.random.Generator) -> np.ndarray:
    """An array of ``aval``'s type to time a program on: floats in [0.5, 1.5) (valid under logarithms, square
    roots and divisions, never denormal), integers and booleans zero (a valid index)."""
    if aval.dtype.kind == "f":
        return (0.5 + rng.random(aval.shape)).astype(aval.dtype)
    return np.zeros(aval.shape, aval.dtype)


def profile_segments(program, repeats: int = 3, seconds: float = 0.25, seed: int = 0) -> list[float]:
    """Median seconds of each compiled segment of ``program``'s local schedule (``program.local_program``),
    each run alone on arrays of its local types: the measured compute of a plan, as Alpa profiles each
    compiled stage on its mesh (Zheng et al., OSDI 2022) and FlexFlow's simulator measures each operator
    (Jia et al., SysML 2019). Compiles the segments (once per program); each is timed at least ``repeats``
    times and until ``seconds`` have passed (at most 50 runs), so that on a loaded host the median of a short
    segment is not one descheduled run."""
    rng = np.random.default_rng(seed)
    out = []
    for seg in program.local_program.segments:
        args = [sample(v.aval, rng) for v in seg.graph.invars]
        seg(*args)  # compile, first touch of its buffers
        out.append(timed_median(lambda: seg(*args), repeats, seconds))
        del args
    return out


def timed_median(fn, repeats: int, seconds: float, most: int = 50) -> float:
    """Median seconds of at least ``repeats`` calls of ``fn``, more until ``seconds`` have passed (at most
    ``most``)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < seconds and len(times) < most):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def nbytes(aval: ShapedArray) -> int:
    return aval.size * aval.dtype.itemsize


__all__ = ["CostModel", "calibrate", "nbytes", "profile_segments", "sample", "timed_median"]
