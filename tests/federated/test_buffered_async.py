"""Asynchronous FL on the parameter server (issue 20): sync mode equals synchronous FedAvg rounds on the
same clients; FedBuff (threshold) and async modes learn; bad settings are named."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.federated import simulation as sim
from fedarena.federated import strategy as st
from fedarena.federated.buffered_async import AsyncFLConfig, run_async


def _equal_clients(n_clients=12, per=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_clients * per, 5)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    train = [np.arange(i * per, (i + 1) * per) for i in range(n_clients)]
    return x, y, train, [f"c{i}" for i in range(n_clients)]


def _sim(k, seed=3):
    x, y, train, ids = _equal_clients()
    fit = st.FitConfig(2, 8, 0.1)
    return sim.Simulation(sim.BatchedMLP((5, 8, 3)), st.FedAvg(fit, clients_per_round=k), x, y, train, ids, 3,
                          seed=seed, test=(x, y), eval_clients=False)


def test_sync_mode_equals_fedavg_rounds_on_the_same_clients():
    k, rounds = 4, 5
    rounds_sim = _sim(k)
    state = rounds_sim.init_state()
    start = dict(state.params)
    chosen = []
    for _ in range(rounds):
        state, rec = rounds_sim.round(state)
        chosen.append(rec.selected)
    order = [c for sel in chosen for c in sel]
    got, rows = run_async(_sim(k), AsyncFLConfig(mode="sync", concurrency=k, buffer=k, steps=rounds, eval_every=1),
                          params=start, clients=lambda i: order[i] if i < len(order) else order[-1])
    for name in state.params:
        np.testing.assert_allclose(got[name], state.params[name], rtol=1e-5, atol=1e-6)
    assert rows[-1]["version"] == rounds


@pytest.mark.parametrize("mode", ["threshold", "async"])
def test_buffered_and_async_modes_learn(mode):
    s = _sim(4)
    params = s.model.init_params(0)
    _, before = sim.evaluate_params(s.model, params, *s.test)
    got, rows = run_async(s, AsyncFLConfig(mode=mode, concurrency=4, buffer=2, staleness=3, steps=40, eval_every=10),
                          params=params)
    assert rows[-1]["version"] >= 40
    assert rows[-1]["test_acc"] > before + 0.1
    assert [r["version"] for r in rows] == sorted(r["version"] for r in rows)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="async_fl.buffer"):
        AsyncFLConfig(concurrency=2, buffer=3)
    with pytest.raises(ValueError, match="async_fl.mode"):
        AsyncFLConfig(mode="gossip")


def test_fedsim_kind_runs_fedbuff_and_names_round_only_settings(tmp_path):
    import json

    from fedarena.platform.config import ConfigError
    from fedarena.platform.runs import execute

    cfg = {"kind": "fedsim", "rounds": 12, "seed": 1, "data": {"dataset": "digits", "num_clients": 20},
           "evaluation": {"every": 4}, "model": {"hidden": [16]}, "clients": {"lr": 0.1},
           "strategy": {"server_mode": "threshold", "async_concurrency": 4, "async_buffer": 2, "async_staleness": 2}}
    out = execute(cfg, out=tmp_path / "fedbuff", quiet=True, report=False)
    assert out["server_steps"] >= 12 and out["test_acc"] > 0.5
    rows = [json.loads(line) for line in (tmp_path / "fedbuff" / "metrics.jsonl").read_text().splitlines()]
    # a row when the version passes a multiple of 4 (steps arrive asynchronously, so it may be past it), then
    # the final model (the last step may overshoot 12)
    steps = [r["step"] for r in rows]
    assert 2 <= len(steps) <= 3 and steps == sorted(set(steps)) and steps[0] >= 4 and steps[-1] >= 12
    with pytest.raises((ConfigError, ValueError), match="upload.codec"):
        execute(dict(cfg, upload={"codec": "quantize"}), out=tmp_path / "bad", quiet=True, report=False)
