"""Collectives against numpy references over every transport, determinism, failure detection, authentication."""

from __future__ import annotations

import functools
import socket
import struct
import threading

import numpy as np
import pytest

from fedarena.engine.collectives import (ALGORITHMS, Communicator, FramingError, PeerFailure, ThreadGroup, choose,
                                         coefficients, run_threads)
from fedarena.engine.collectives import framing
from fedarena.engine.collectives.conformance import DTYPES, run_conformance, run_conformance_for_sizes
from fedarena.engine.collectives.faults import die_during_all_reduce
from fedarena.engine.collectives.launch import group_spec, spawn

# over processes: every dtype on a zero-length array (gather/scatter and barrier then send empty messages)
# and on an odd-sized 3x5 array
PROCESS_SHAPES = ((0,), (3, 5))


@pytest.mark.parametrize("world_size", range(1, 9))
def test_threads_every_collective_and_algorithm_equals_numpy(world_size):
    shapes = ((0,), (), (7,), (3, 5), (2, 0, 3)) if world_size <= 4 else ((0,), (7,), (3, 5))
    checks = run_threads(world_size, run_conformance, world_size, DTYPES, shapes, chunk_bytes=64)
    assert len(set(checks)) == 1 and checks[0] > 100


@pytest.mark.quick
@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
def test_float_all_reduce_is_deterministic_identical_on_every_rank_and_close_to_float64(algorithm):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(10_001).astype(np.float32) for _ in range(5)]
    run = lambda: run_threads(5, lambda c: c.all_reduce(xs[c.rank], "sum", algorithm), chunk_bytes=4096)  # noqa
    first, second = run(), run()
    for r in first + second:
        assert r.tobytes() == first[0].tobytes()  # bit-identical on every rank and across runs
    np.testing.assert_allclose(first[0], np.sum(np.stack(xs).astype(np.float64), axis=0), rtol=1e-5, atol=1e-5)


def test_large_chunked_messages_every_algorithm():
    rng = np.random.default_rng(1)
    n = 6
    xs = [rng.integers(-9, 9, size=(257, 129)).astype(np.float64) for _ in range(n)]
    for alg in ALGORITHMS["all_reduce"]:
        out = run_threads(n, lambda c: c.all_reduce(xs[c.rank], "max", alg), chunk_bytes=1024)
        assert all(np.array_equal(o, functools.reduce(np.maximum, xs)) for o in out)
    for alg in ALGORITHMS["reduce_scatter"]:
        blocks = [np.stack([x] * n) for x in xs]
        out = run_threads(n, lambda c: c.reduce_scatter(blocks[c.rank], "sum", alg), chunk_bytes=1024)
        assert all(np.array_equal(o, sum(xs)) for o in out)


def test_mismatched_shapes_and_bad_arguments_are_named():
    with pytest.raises(FramingError, match="expected float32"):
        run_threads(2, lambda c: c.all_reduce(np.zeros(4 + c.rank, np.float32), algorithm="ring"), timeout=5)
    with pytest.raises(ValueError, match="algorithm: 'bogus'"):
        run_threads(2, lambda c: c.all_reduce(np.zeros(3), algorithm="bogus"))
    with pytest.raises(ValueError, match="op: 'avg'"):
        run_threads(2, lambda c: c.all_reduce(np.zeros(3), "avg"))
    with pytest.raises(ValueError, match="root: 5"):
        run_threads(2, lambda c: c.broadcast(np.zeros(3), root=5))


def test_a_raising_thread_rank_makes_the_others_fail_fast():
    group = ThreadGroup(3)
    errors = []

    def body(rank):
        comm = Communicator(group.transport(rank, timeout=60))
        try:
            if rank == 2:
                raise RuntimeError("boom")
            comm.all_reduce(np.ones(10))
        except PeerFailure as exc:
            errors.append(str(exc))
        except RuntimeError:
            group.abort("rank 2 raised")

    threads = [threading.Thread(target=body, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 2 and all("aborted" in e for e in errors)


def test_cost_model_closed_forms_and_size_based_choice():
    n, N = 4, 1 << 20
    a, b = coefficients("all_reduce", "ring", N, n, chunk_bytes=1 << 30)
    assert (a, b) == (2 * (n - 1), 2 * (n - 1) / n * N)  # Patarasuk & Yuan: 2(n-1) steps of N/n bytes
    a, b = coefficients("all_reduce", "halving_doubling", N, 8, chunk_bytes=1 << 30)
    assert (a, b) == (2 * 3, 2 * 7 / 8 * N)  # Rabenseifner: 2 log2 p steps, 2 (p-1)/p N bytes
    # small messages are latency-bound (log steps win), large ones bandwidth-bound (ring's 2(n-1)/n wins
    # over the extra fold traffic of halving-doubling at a non-power-of-two size)
    assert choose("all_reduce", 64, 8, alpha=50e-6, beta=1e-9, chunk_bytes=1 << 20) == "halving_doubling"
    assert choose("all_reduce", 64 << 20, 6, alpha=50e-6, beta=1e-9, chunk_bytes=1 << 20) == "ring"


# ------------------------------------------------------------------------------------------ process transports


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_process_transports_equal_numpy_for_world_sizes_2_to_4(kind):
    # one set of 4 rank processes; ranks 0-2 and 0-1 then form groups of 3 and 2 over fresh transports
    options = {"chunk_bytes": 4096}
    specs = {3: group_spec(kind), 2: group_spec(kind)}
    check = functools.partial(run_conformance_for_sizes, seed=4, dtypes=DTYPES, shapes=PROCESS_SHAPES)
    per_rank = spawn(4, kind, check, (kind, specs, 30.0, options), timeout=30, comm_options=options)
    for size in (2, 3, 4):
        counts = [done[size] for done in per_rank if size in done]
        assert len(counts) == size and len(set(counts)) == 1 and counts[0] > 100


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_killing_a_rank_mid_collective_fails_every_other_rank(kind):
    outcomes = spawn(3, kind, die_during_all_reduce, (1, 0.5), timeout=8, raise_on_error=False, join_timeout=60)
    victim, survivors = outcomes[1], [outcomes[0], outcomes[2]]
    assert not victim.ok and victim.exitcode == 17
    for o in survivors:
        assert not o.ok and "PeerFailure" in o.error, o.error  # a clear error, not a hang or a kill at the deadline


def _auth_client(address, secret):
    from fedarena.engine.collectives.tcp import _authenticate_connector

    sock = socket.create_connection(address, timeout=5)
    try:
        _authenticate_connector(sock, secret, 1, 2)
    finally:
        sock.close()


def test_tcp_rejects_a_wrong_secret_and_keeps_listening():
    from fedarena.engine.collectives.tcp import TCPTransport

    spec = group_spec("tcp")
    result = {}

    def rank0():
        try:
            result["t"] = TCPTransport(0, 2, spec["master"], spec["secret"], timeout=10)
        except BaseException as exc:  # noqa: BLE001
            result["err"] = exc

    t = threading.Thread(target=rank0)
    t.start()
    import time

    time.sleep(0.3)
    with pytest.raises((PermissionError, ConnectionError, OSError)):
        _auth_client(spec["master"], b"x" * 32)  # the listener drops us after the failed MAC
    rank1 = TCPTransport(1, 2, spec["master"], spec["secret"], timeout=10)  # the real peer still gets in
    t.join(10)
    assert "t" in result, result
    comm0, comm1 = Communicator(result["t"]), Communicator(rank1)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault(0, comm0.all_reduce(np.arange(5.0))))
    th.start()
    out[1] = comm1.all_reduce(np.arange(5.0) * 2)
    th.join(10)
    assert np.array_equal(out[0], np.arange(5.0) * 3) and np.array_equal(out[1], out[0])
    comm0.close(), comm1.close()


@pytest.mark.quick
def test_framing_rejects_hostile_headers():
    good = framing.encode_header(np.zeros((2, 3), np.float32))
    dtype, ndim, nbytes = framing.decode_fixed(good[:framing.HEADER_FIXED])
    assert framing.decode_shape(good[framing.HEADER_FIXED:], ndim, dtype, nbytes, 1 << 20) == (2, 3)
    with pytest.raises(FramingError, match="magic"):
        framing.decode_fixed(b"EVIL" + good[4:framing.HEADER_FIXED])
    obj = struct.pack("!4sBB10sQ", b"FACM", 1, 1, b"|O", 8)
    with pytest.raises(FramingError, match="dtype"):
        framing.decode_fixed(obj)  # object arrays (which would need pickle) are refused
    with pytest.raises(FramingError, match="nbytes"):
        framing.decode_shape(struct.pack("!2Q", 2, 3), 2, np.dtype(np.float32), 999, 1 << 20)
    with pytest.raises(FramingError, match="limit"):
        framing.decode_shape(struct.pack("!1Q", 1 << 30), 1, np.dtype(np.float32), 4 << 30, 1 << 20)


# -------------------------------------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_group(ray_session):
    from fedarena.engine.collectives.ray_actors import RayGroup

    group = RayGroup(4, timeout=30)
    yield group
    group.shutdown()


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ray_transport_equals_numpy(ray_group, world_size):
    ray_group.resize(world_size)
    checks = ray_group.run(run_conformance, world_size, DTYPES, ((3, 5),), ("sum", "max"), (-1,))
    assert len(set(checks)) == 1 and checks[0] > 100
    # one payload above the inline limit goes through the object store
    big = ray_group.run(_big_all_reduce)
    assert all(b == world_size * 200_000 for b in big)


def _big_all_reduce(comm):
    return float(comm.all_reduce(np.ones(200_000, np.float32), algorithm="ring").sum())


def test_ray_killed_actor_fails_the_others(ray_session):
    import ray

    from fedarena.engine.collectives.ray_actors import RayGroup

    group = RayGroup(3, timeout=30)
    try:
        refs = group.submit(_all_reduce_forever)
        import time

        time.sleep(1.0)
        ray.kill(group.actors[1])
        for i in (0, 2):
            with pytest.raises(ray.exceptions.RayTaskError, match="PeerFailure"):
                ray.get(refs[i], timeout=60)
    finally:
        group.shutdown()


def _all_reduce_forever(comm):
    x = np.ones(1000, np.float32)
    for _ in range(1_000_000):
        comm.all_reduce(x)
