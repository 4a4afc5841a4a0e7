"""Parameter server: synchronous SGD against a sequential oracle; a straggler slows the synchronous mode but
not the threshold mode (step membership, not wall-clock); the asynchronous staleness bound holds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedarena.engine import optim
from fedarena.engine.collectives import run_threads
from fedarena.engine.distributed import ParameterServerConfig, run_parameter_server

RNG = np.random.default_rng(0)
W_TRUE = RNG.standard_normal(7)
DATA = [(a, a @ W_TRUE) for a in (RNG.standard_normal((16, 7)) for _ in range(4))]


def _least_squares_grad(w, worker):
    a, b = DATA[worker]
    return (a.T @ (a @ w - b) / len(b)).astype(np.float32)


def _run(cfg, workers, gradient, lr=0.1):
    params = {"w": np.zeros(7, np.float32)}
    return run_threads(cfg.servers + workers, lambda c: run_parameter_server(
        c, cfg, params, gradient, optim.sgd(lr)), timeout=60)


def test_sync_mode_is_sequential_minibatch_sgd():
    cfg = ParameterServerConfig(mode="sync", servers=2, steps=12)
    res = _run(cfg, 4, lambda p, w, k: {"w": _least_squares_grad(p["w"], w)})
    w = np.zeros(7, np.float32)
    for _ in range(12):  # oracle: w <- w - lr * mean over workers of their gradients at w
        w = w - 0.1 * np.mean([_least_squares_grad(w, i) for i in range(4)], axis=0)
    got = np.concatenate([res[0].params, res[1].params])
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    assert res[0].step_workers == [(2, 3, 4, 5)] * 12
    assert [r.pushes for r in res[2:]] == [12] * 4


def _straggler_grad(fast_done: threading.Event, pushes: list, wait: float):
    def gradient(p, worker, k):
        pushes[worker] += 1
        if worker == 3:  # the straggler: each gradient takes until the fast workers are done (at most `wait`)
            fast_done.wait(wait)
        elif min(pushes[:3]) >= 15:
            fast_done.set()
        return {"w": _least_squares_grad(p["w"], worker)}
    return gradient


@pytest.mark.parametrize("mode", ["sync", "threshold"])
def test_a_straggler_paces_sync_but_not_threshold(mode):
    fast_done, pushes = threading.Event(), [0] * 4
    cfg = ParameterServerConfig(mode=mode, servers=1, threshold=0.75, staleness=0, steps=15)
    # sync can never let the fast workers finish first, so there the straggler always waits the full 0.1 s
    res = _run(cfg, 4, _straggler_grad(fast_done, pushes, 0.1 if mode == "sync" else 30.0))
    server, logs = res[0], res[1:]
    assert server.version == 15
    if mode == "sync":  # every step waited for the straggler
        assert all(ws == (1, 2, 3, 4) for ws in server.step_workers)
        assert logs[3].pushes == 15
    else:  # the three fast workers made the steps while the straggler computed its first gradient; once they
        # have begun their 15th gradients the straggler is released, its stale first push is dropped, and its
        # second (at version 14) may race into the last step, so only that step may include it
        assert all(ws == (1, 2, 3) for ws in server.step_workers[:-1])
        assert len(server.step_workers[-1]) == 3
        assert logs[3].pushes <= 2 and server.applied.get(4, 0) <= 1
    assert np.linalg.norm(server.params - W_TRUE) < np.linalg.norm(W_TRUE)  # it learned


def test_async_applies_every_fresh_enough_gradient_within_the_staleness_bound():
    cfg = ParameterServerConfig(mode="async", servers=2, staleness=3, steps=60)
    res = _run(cfg, 3, lambda p, w, k: {"w": _least_squares_grad(p["w"], w)}, lr=0.05)
    # the shards step independently (a gradient may be fresh enough for one and too stale for the other); the
    # workers stop when the first shard reaches 60 steps
    assert max(server.version for server in res[:2]) == 60
    for server in res[:2]:
        assert server.max_applied_staleness <= 3 and server.version == len(server.step_workers) > 30
        assert all(len(ws) == 1 for ws in server.step_workers)  # one gradient per step
    got = np.concatenate([res[0].params, res[1].params])
    assert np.linalg.norm(got - W_TRUE) < 0.5 * np.linalg.norm(W_TRUE)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="mode"):
        ParameterServerConfig(mode="eventual")
    with pytest.raises(ValueError, match="threshold"):
        ParameterServerConfig(mode="threshold", threshold=1.5)
    with pytest.raises(ValueError, match="servers"):
        run_threads(1, lambda c: run_parameter_server(c, ParameterServerConfig(), {"w": np.zeros(2)}, None))
