"""NCCL through cupy, against numpy, on every CUDA device present (one rank per device); skipped without one."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from fedarena.engine.collectives import run_threads
from fedarena.engine.collectives.nccl import available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not available(), reason="needs cupy with NCCL and a CUDA device")]


def _check(comm):
    import cupy as cp

    from fedarena.engine.collectives.nccl import NCCLCommunicator

    nc = NCCLCommunicator(comm)
    n, me = comm.world_size, comm.rank
    xs = [np.random.default_rng(r).integers(-5, 5, size=(3, 7)).astype(np.float32) for r in range(n)]
    blocks = [np.stack([x] * n) * (r + 1) for r, x in enumerate(xs)]
    try:
        assert np.array_equal(cp.asnumpy(nc.all_reduce(cp.asarray(xs[me]))), sum(xs))
        assert np.allclose(cp.asnumpy(nc.all_reduce(cp.asarray(xs[me]), "mean")), np.mean(xs, axis=0))
        assert np.array_equal(cp.asnumpy(nc.all_reduce(cp.asarray(xs[me]), "max")),
                              functools.reduce(np.maximum, xs))
        assert np.array_equal(cp.asnumpy(nc.broadcast(cp.asarray(xs[me]), n - 1)), xs[n - 1])
        got = nc.reduce(cp.asarray(xs[me]), "min", 0)
        if me == 0:
            assert np.array_equal(cp.asnumpy(got), functools.reduce(np.minimum, xs))
        assert np.array_equal(cp.asnumpy(nc.all_gather(cp.asarray(xs[me]))), np.stack(xs))
        assert np.array_equal(cp.asnumpy(nc.reduce_scatter(cp.asarray(blocks[me]))), sum(blocks)[me])
        g = nc.gather(cp.asarray(xs[me]), 0)
        if me == 0:
            assert np.array_equal(cp.asnumpy(g), np.stack(xs))
        s = nc.scatter(cp.asarray(blocks[0]) if me == 0 else None, cp.empty((3, 7), cp.float32), 0)
        assert np.array_equal(cp.asnumpy(s), blocks[0][me])
        nc.barrier()
    finally:
        nc.close()
    return True


def test_nccl_collectives_equal_numpy():
    import cupy as cp

    n = min(cp.cuda.runtime.getDeviceCount(), 4)
    assert all(run_threads(n, _check, timeout=120))
