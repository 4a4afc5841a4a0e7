"""Tracing state is per thread: jitted functions traced at the same time in several threads each get their own
trace (before, one global trace stack made concurrent first calls pop each other's traces)."""

from __future__ import annotations

import sys
import threading

import numpy as np

from fedarena import engine
from fedarena.engine import ops


def test_concurrent_traces_in_threads_do_not_interfere():
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []
    results: dict[int, list] = {}

    def worker(k: int) -> None:
        try:
            out = []
            for i in range(30):
                # a fresh function each time, so every call traces; the barrier lines the traces up
                f = engine.jit(lambda x, k=k, i=i: ops.sum(ops.tanh(x * (k + 1)) + i))
                g = engine.grad(lambda x, k=k: ops.sum(ops.square(x) * (k + 1)))
                if i % 10 == 0:
                    barrier.wait(timeout=60)
                x = np.full(5, 0.1 * (i + 1), np.float32)
                out.append((float(f(x)), np.asarray(g(x))))
            results[k] = out
        except BaseException as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so traces interleave
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    for k, out in results.items():
        for i, (v, grad) in enumerate(out):
            x = np.full(5, 0.1 * (i + 1))
            assert abs(v - (np.tanh(x * (k + 1)).sum() + 5 * i)) < 1e-4
            np.testing.assert_allclose(grad, 2 * x * (k + 1), rtol=1e-5)
