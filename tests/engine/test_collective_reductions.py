"""The product and bitwise reductions of the collectives against numpy, over every transport."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

from fedarena.engine.collectives import Communicator, ThreadGroup, run_threads
from fedarena.engine.collectives.conformance import run_conformance
from fedarena.engine.collectives.launch import group_spec, make_transport

NEW_OPS = ("prod", "band", "bor", "bxor")
INT_DTYPES = ("bool", "int8", "uint8", "int32", "uint64", "int64")


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_threads_prod_and_bitwise_equal_numpy(world_size):
    dtypes = INT_DTYPES + ("float16", "float64", "complex64")  # prod on floats and complex, bitwise skipped
    checks = run_threads(world_size, run_conformance, world_size, dtypes, ((0,), (7,), (3, 5)), NEW_OPS,
                         chunk_bytes=64)
    assert len(set(checks)) == 1 and checks[0] > 100


def _ranks_in_threads(kind, world_size, fn):
    """``fn(comm)`` on every rank of a real ``kind`` transport (sockets / shared-memory rings), the ranks as
    threads of this process (the cross-process runs of these transports are in tests/distributed)."""
    spec = group_spec(kind)
    results, errors = [None] * world_size, []

    def rank(r):
        try:
            comm = Communicator(make_transport(kind, r, world_size, spec, 30.0), chunk_bytes=64)
            try:
                results[r] = fn(comm)
            finally:
                comm.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


@pytest.mark.parametrize("kind", ["shm", "tcp"])
def test_tcp_and_shm_transports_prod_and_bitwise_equal_numpy(kind):
    check = functools.partial(run_conformance, seed=7, dtypes=("bool", "int8", "uint64", "float32"), shapes=((3, 5),),
                              reductions=NEW_OPS, roots=(-1,))
    counts = _ranks_in_threads(kind, 3, check)
    assert len(set(counts)) == 1 and counts[0] > 40


@pytest.mark.slow  # starts the shared Ray session (about 20 s on the loaded 2-core machine)
def test_ray_transport_prod_and_bitwise_equal_numpy(ray_session):
    from fedarena.engine.collectives.ray_actors import RayGroup

    group = RayGroup(2, timeout=30)
    try:
        checks = group.run(run_conformance, 2, ("int32", "uint8", "float64"), ((3, 5),), NEW_OPS, (-1,))
    finally:
        group.shutdown()
    assert len(set(checks)) == 1 and checks[0] > 20


def test_large_integer_all_reduce_by_every_op_and_algorithm():
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 1 << 62, size=10_007, dtype=np.int64) for _ in range(3)]
    for op, ref in (("band", np.bitwise_and), ("bor", np.bitwise_or), ("bxor", np.bitwise_xor), ("prod", np.multiply)):
        for algorithm in ("ring", "tree", "halving_doubling"):
            out = run_threads(3, lambda c, op=op, a=algorithm: c.all_reduce(xs[c.rank], op, a), chunk_bytes=4096)
            want = functools.reduce(ref, xs)  # int64 products wrap around as in numpy
            assert all(np.array_equal(o, want) for o in out), (op, algorithm)


def test_bitwise_reduction_of_floats_is_refused_in_one_line():
    group = ThreadGroup(1)
    comm = Communicator(group.transport(0))
    with pytest.raises(ValueError, match=r"^op: 'bxor' is a bitwise reduction, for integer or boolean arrays; got float32$"):
        comm.all_reduce(np.ones(3, np.float32), "bxor")
    with pytest.raises(ValueError, match="'bnot' is not a reduction"):
        comm.all_reduce(np.ones(3, np.int32), "bnot")
    np.testing.assert_array_equal(comm.all_reduce(np.array([3, 5]), "band"), [3, 5])


def test_shm_waits_use_the_futex_system_call_on_linux():
    import platform
    import sys

    from fedarena.engine.collectives import shm

    if not (sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64", "aarch64")):
        pytest.skip("the futex path is for Linux on x86-64 and AArch64")
    assert shm._FUTEX is not None  # otherwise waits fall back to sleeping
    wait, wake = shm._FUTEX
    word = np.zeros(1, dtype=np.uint64)
    word[0] = (1 << 32) + 7  # only the low 32 bits are the futex word
    wait(word.ctypes.data, 8, 30.0)  # the word does not hold 8: returns at once instead of blocking 30 s
    wake(word.ctypes.data)  # no waiter: a no-op
