"""A conformance check of a communicator: every collective and algorithm against a numpy reference.

Run by every rank of a group (all with the same ``seed``): each rank can regenerate every other rank's input
from the seed, computes the expected result with plain numpy (``np.add`` / ``np.multiply`` / ``np.maximum`` /
``np.minimum`` / ``np.bitwise_and`` / ``_or`` / ``_xor`` folded over the ranks' arrays, ``np.stack``, indexing) and compares exactly. Inputs are small integers cast to
the dtype under test, so floating sums are exact and any difference is a bug, not round-off. This is the
correctness pass NCCL-tests runs with ``-c``; the tests run it over every transport.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

import numpy as np

from .communicator import BITWISE, Communicator
from .cost_model import ALGORITHMS
from .launch import make_transport

DTYPES: tuple[str, ...] = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                           "float16", "float32", "float64", "complex64", "complex128")
SHAPES: tuple[tuple[int, ...], ...] = ((0,), (), (7,), (3, 5), (2, 0, 3))
_REF = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum, "band": np.bitwise_and,
        "bor": np.bitwise_or, "bxor": np.bitwise_xor}


class ConformanceError(AssertionError):
    """A collective returned something other than the numpy reference."""


def _input(seed: int, case: int, rank: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, case, rank])
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    lo = 0 if dtype.kind == "u" else -4
    values = rng.integers(lo, 5, size=shape)
    if dtype.kind == "c":
        return (values + 1j * rng.integers(lo, 5, size=shape)).astype(dtype)
    return values.astype(dtype)


def _expect(got: np.ndarray | None, want: np.ndarray, what: str, approx: bool = False) -> None:
    if got is None:
        raise ConformanceError(f"{what}: returned None")
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ConformanceError(f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")
    ok = np.allclose(got, want, rtol=1e-6, atol=0) if approx else np.array_equal(got, want)
    if not ok:
        raise ConformanceError(f"{what}: values differ from the numpy reference")


def run_conformance(comm: Communicator, seed: int = 0, dtypes: Iterable[str] = DTYPES,
                    shapes: Sequence[tuple[int, ...]] = SHAPES, reductions: Sequence[str] = ("sum", "max", "min"),
                    roots: Sequence[int] | None = None) -> int:
    """Check every collective, algorithm, op, dtype and shape on ``comm``; returns the number of checks.
    ``reductions`` (besides ``mean``, checked on float and complex dtypes; complex arrays take ``sum`` and
    ``prod``, the bitwise ops integer and boolean arrays only) and ``roots`` (default: the first and the last
    rank) choose the table."""
    n, me = comm.world_size, comm.rank
    checks = 0
    case = 0
    for dtype_name in dtypes:
        dtype = np.dtype(dtype_name)
        for shape in shapes:
            case += 1
            xs = [_input(seed, case, r, shape, dtype) for r in range(n)]
            blocks = [_input(seed, case + 10_000, r, (n,) + shape, dtype) for r in range(n)]
            tag = f"rank {me}, {dtype}{list(shape)}, world {n}"
            ops = [op for op in reductions if (dtype.kind != "c" or op in ("sum", "prod"))
                   and (op not in BITWISE or dtype.kind in "biu")] or ["sum"]
            for alg in ALGORITHMS["all_reduce"]:
                for op in ops:
                    _expect(comm.all_reduce(xs[me], op, alg), functools.reduce(_REF[op], xs),
                            f"all_reduce[{alg}, {op}] {tag}")
                    checks += 1
                if dtype.kind in "fc":
                    _expect(comm.all_reduce(xs[me], "mean", alg), np.mean(np.stack(xs), axis=0).astype(dtype),
                            f"all_reduce[{alg}, mean] {tag}", approx=True)
                    checks += 1
            for alg in ALGORITHMS["reduce_scatter"]:
                for op in ops:
                    _expect(comm.reduce_scatter(blocks[me], op, alg), functools.reduce(_REF[op], blocks)[me],
                            f"reduce_scatter[{alg}, {op}] {tag}")
                    checks += 1
            for alg in ALGORITHMS["all_gather"]:
                _expect(comm.all_gather(xs[me], alg), np.stack(xs), f"all_gather[{alg}] {tag}")
                checks += 1
            for root in (sorted({0, n - 1}) if roots is None else [r % n for r in roots]):
                for alg in ALGORITHMS["broadcast"]:
                    _expect(comm.broadcast(xs[me], root, alg), xs[root], f"broadcast[{alg}, root {root}] {tag}")
                    checks += 1
                for alg in ALGORITHMS["reduce"]:
                    got = comm.reduce(xs[me], ops[-1], root, alg)
                    if me == root:
                        _expect(got, functools.reduce(_REF[ops[-1]], xs), f"reduce[{alg}, root {root}] {tag}")
                    elif got is not None:
                        raise ConformanceError(f"reduce[{alg}] {tag}: a non-root rank got a result")
                    checks += 1
                for alg in ALGORITHMS["gather"]:
                    got = comm.gather(xs[me], root, alg)
                    if me == root:
                        _expect(got, np.stack(xs), f"gather[{alg}, root {root}] {tag}")
                    checks += 1
                for alg in ALGORITHMS["scatter"]:
                    got = comm.scatter(blocks[root] if me == root else None, root, alg)
                    _expect(got, blocks[root][me], f"scatter[{alg}, root {root}] {tag}")
                    checks += 1
            comm.barrier()
    return checks


def run_conformance_for_sizes(comm: Communicator, kind: str, specs: dict[int, dict], timeout: float = 30.0,
                              comm_options: dict | None = None, **kwargs) -> dict[int, int]:
    """:func:`run_conformance` on ``comm`` and then on smaller groups of its first ranks, one per entry of
    ``specs`` (world size -> the :func:`.launch.group_spec` of that group), so one set of rank processes checks
    several world sizes. Returns the number of checks per world size (on ranks inside each group)."""

    done = {comm.world_size: run_conformance(comm, **kwargs)}
    for size, spec in sorted(specs.items()):
        if comm.rank < size:
            sub = Communicator(make_transport(kind, comm.rank, size, spec, timeout), **(comm_options or {}))
            try:
                done[size] = run_conformance(sub, **kwargs)
            finally:
                sub.close()
        comm.barrier()
    return done
