"""Flower interoperability (fedarena.federated.flower) against Flower 1.42 itself.

* A real ``flwr.simulation.run_simulation`` (in its own process: it starts Flower's own Ray, and the test
  session has its one Ray instance already) runs a fedarena strategy -- trimmed mean with FedAdam, clipping and
  top-k error-feedback uploads encoded by the fedarena Flower mod -- with fedarena clients as Flower ClientApps;
  fedarena's own simulation of the same federation must give the same global model (1e-6) and the same
  per-client evaluation.
* A plain Flower ClientApp (written against Flower's API only, numpy SGD) trains inside fedarena's simulation;
  the global model equals an independent loop over the same client updates.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from fedarena.federated import compression as cz  # noqa: E402
from fedarena.federated import flower  # noqa: E402
from fedarena.federated import simulation as sim  # noqa: E402
from fedarena.federated import strategy as st  # noqa: E402
from fedarena.federated.trainer import NumpyMLPTrainer, mlp_init  # noqa: E402


def _case_module():
    path = Path(__file__).with_name("flower_case.py")
    spec = importlib.util.spec_from_file_location("flower_case", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flower_run_simulation_with_a_fedarena_strategy_matches_fedarena_simulation(tmp_path):
    fc = _case_module()
    out = tmp_path / "flower.npz"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
               RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("flower_case.py")), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    z = np.load(out)
    got = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("param/")}

    d, strategy, codec, stages = fc.case()
    s = sim.Simulation(sim.BatchedMLP(fc.SIZES), strategy, d.x, d.y, d.train, [f"c{i}" for i in range(fc.CLIENTS)],
                       d.num_classes, seed=fc.SEED, held_out=d.held_out, upload_stages=stages,
                       upload=cz.UploadCompression(codec, error_feedback=True))
    state, recs = s.run(fc.ROUNDS)
    assert sorted(got) == sorted(state.params)
    for k, v in state.params.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    assert not np.allclose(state.params["l0.w"], mlp_init(fc.SIZES, fc.SEED)["l0.w"])  # it did train
    # the same clients reported the same encoded bytes, and Flower's per-client evaluation saw the same model
    assert list(z["reporting"]) == [r.metrics["reporting"] for r in recs]
    assert list(z["bytes_up"]) == [r.metrics["bytes_up"] for r in recs]
    assert float(z["client_acc_mean"]) == pytest.approx(recs[-1].metrics["client_acc_mean"], abs=1e-9)


def _plain_flower_app(x, y, parts, sizes, seed):
    """A Flower ClientApp in Flower's own terms: ArrayRecord in, ArrayRecord + num-examples out."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = msg.content["arrays"]
        params = {k: arrays[k].numpy() for k in arrays.keys()}
        cfg = msg.content["config"]
        rng = np.random.default_rng([seed, int(cfg["server-round"]), pid])
        xi, yi = x[parts[pid]], y[parts[pid]]
        local, loss = NumpyMLPTrainer(sizes).train(params, xi, yi, epochs=int(cfg["epochs"]),
                                                  batch_size=int(cfg["batch-size"]), lr=float(cfg["lr"]),
                                                  prox_mu=0.0, rng=rng)
        context.state["rounds"] = MetricRecord({"n": int(context.state["rounds"]["n"]) + 1
                                                if "rounds" in context.state else 1})
        return Message(RecordDict({"arrays": ArrayRecord({k: flower.Array(v) for k, v in local.items()}),
                                   "metrics": MetricRecord({"num-examples": len(yi), "train_loss": loss})}),
                       reply_to=msg)

    return app


def test_a_flower_client_app_trains_inside_a_fedarena_simulation():
    rng = np.random.default_rng(0)
    sizes, n_clients, rounds, seed = (6, 8, 3), 6, 4, 1
    counts = [7, 12, 9, 15, 5, 11]
    x = rng.standard_normal((sum(counts), 6)).astype(np.float32)
    y = rng.integers(0, 3, sum(counts))
    off = np.cumsum([0, *counts])
    parts = [np.arange(off[i], off[i + 1]) for i in range(n_clients)]
    app = _plain_flower_app(x, y, parts, sizes, seed)
    ids = [f"c{i}" for i in range(n_clients)]
    strategy = st.FedAvg(st.FitConfig(2, 4, 0.2), clients_per_round=3)
    trainer = flower.ClientAppTrainer(app, ids)
    s = sim.Simulation(sim.BatchedMLP(sizes), strategy, x, y, parts, ids, 3, seed=seed, client_trainer=trainer,
                       test=(x, y))
    state, recs = s.run(rounds)

    # independent oracle: the same clients (fedarena's selection), the app's own trainer, a weighted mean
    w = mlp_init(sizes, seed)
    for r in range(1, rounds + 1):
        chosen = st.select_clients(ids, 3, seed, r)
        assert recs[r - 1].reporting == chosen
        acc = {k: np.zeros(v.shape) for k, v in w.items()}
        tot = 0
        for c in chosen:
            pid = ids.index(c)
            local, _ = NumpyMLPTrainer(sizes).train(w, x[parts[pid]], y[parts[pid]], epochs=2, batch_size=4, lr=0.2,
                                                    prox_mu=0.0, rng=np.random.default_rng([seed, r, pid]))
            for k in w:
                acc[k] += counts[pid] * (local[k].astype(np.float64) - w[k].astype(np.float64)).astype(np.float32)
            tot += counts[pid]
        w = {k: (w[k].astype(np.float64) + acc[k] / tot).astype(np.float32) for k in w}
    for k in w:
        np.testing.assert_allclose(state.params[k], w[k], rtol=1e-6, atol=1e-7, err_msg=k)
    # each node's Context persisted across rounds, as on a Flower SuperNode
    times = {c: sum(c in rec.reporting for rec in recs) for c in ids}
    for c, ctx in trainer._contexts.items():
        assert int(ctx.state["rounds"]["n"]) == times[c]
    assert math.isfinite(recs[-1].metrics["test_acc"])


def test_fedarena_client_app_is_the_simulated_client():
    """The fedarena ClientApp inside fedarena's simulation reproduces the batched (vmapped) simulation."""
    rng = np.random.default_rng(2)
    sizes, counts, seed = (5, 7, 3), [9, 14, 6, 11, 8], 4
    x = rng.standard_normal((sum(counts), 5)).astype(np.float32)
    y = rng.integers(0, 3, sum(counts))
    off = np.cumsum([0, *counts])
    parts = [np.arange(off[i], off[i + 1]) for i in range(len(counts))]
    ids = [f"c{i}" for i in range(len(counts))]
    strategy = st.FedAvg(st.FitConfig(1, 4, 0.1, prox_mu=0.1), clients_per_round=3)
    app = flower.fedarena_client_app(x, y, parts, sizes, num_classes=3, seed=seed)
    a = sim.Simulation(sim.BatchedMLP(sizes), strategy, x, y, parts, ids, 3, seed=seed,
                       client_trainer=flower.ClientAppTrainer(app, ids))
    b = sim.Simulation(sim.BatchedMLP(sizes), strategy, x, y, parts, ids, 3, seed=seed)
    sa, _ = a.run(3)
    sb, _ = b.run(3)
    for k in sa.params:
        np.testing.assert_allclose(sa.params[k], sb.params[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_flower_records_are_validated():
    like = {"w": np.zeros((2, 3), np.float32)}
    with pytest.raises(flower.RecordError, match=r"arrays\.w: shape \(3, 2\)"):
        flower.record_to_params(flower.params_to_record({"w": np.zeros((3, 2))}), like)
    with pytest.raises(flower.RecordError, match="missing \\['w'\\]"):
        flower.record_to_params(flower.params_to_record({"v": np.zeros((2, 3))}), like)
    with pytest.raises(flower.RecordError, match="not finite"):
        flower.record_to_params(flower.params_to_record({"w": np.full((2, 3), np.inf)}), like)
    codec = cz.Codec("topk", fraction=0.5)
    from flwr.app import ConfigRecord

    bad = RecordDict({"update": ConfigRecord({"codec": flower.codec_name(codec), "data": b"\x05\x00\x00\x00"})})
    with pytest.raises(flower.RecordError, match=r"update\.data"):
        flower.decode_reply(bad, like, codec)
    other = RecordDict({"update": ConfigRecord({"codec": "quantize:8:0.01", "data": b""})})
    with pytest.raises(flower.RecordError, match=r"update\.codec"):
        flower.decode_reply(other, like, codec)
    with pytest.raises(flower.RecordError, match=r"config\.lr: missing"):
        flower.config_to_fit(ConfigRecord({"server-round": 1, "epochs": 1, "batch-size": 2}))
    with pytest.raises(ValueError, match="in the clear.*SecAggPlusWorkflow"):
        from fedarena.federated.stages import SecureAggregation

        flower.FlowerStrategy(SecureAggregation(st.FedAvg()))


def test_flower_strategy_drops_malformed_replies_and_keeps_serving(flower_task_identity, in_process_grid):
    rng = np.random.default_rng(5)
    sizes, counts, seed = (4, 5, 2), [6, 9, 7, 8], 2
    x = rng.standard_normal((sum(counts), 4)).astype(np.float32)
    y = rng.integers(0, 2, sum(counts))
    off = np.cumsum([0, *counts])
    parts = [np.arange(off[i], off[i + 1]) for i in range(4)]
    app = flower.fedarena_client_app(x, y, parts, sizes, num_classes=2, seed=seed)

    def nan_arrays(content):
        arrays = content["arrays"]
        bad = {k: np.full(arrays[k].numpy().shape, np.nan, np.float32) for k in arrays.keys()}
        return RecordDict({"arrays": flower.params_to_record(bad), "metrics": content["metrics"]})

    def wrong_shape(content):
        return RecordDict({"arrays": flower.params_to_record({"l0.w": np.zeros((2, 2))}), "metrics": content["metrics"]})

    strategy = st.FedAvg(st.FitConfig(1, 3, 0.1))
    fs = flower.FlowerStrategy(strategy, seed=seed)
    grid = in_process_grid(app, 4, tamper={3: nan_arrays, 4: wrong_shape})
    from flwr.app import ConfigRecord

    p0 = mlp_init(sizes, seed)
    msgs = list(fs.configure_train(1, flower.params_to_record(p0), ConfigRecord(), grid))
    assert fs.names == {1: "c0", 2: "c1", 3: "c2", 4: "c3"}  # learned by the query message
    arrays, metrics = fs.aggregate_train(1, grid.send_and_receive(msgs))
    assert metrics["reporting"] == 2 and metrics["rejected"] == 2
    # the aggregate is FedAvg of the two honest clients, as fedarena's simulation of them computes it
    s = sim.Simulation(sim.BatchedMLP(sizes), strategy, x, y, parts[:2], ["c0", "c1"], 2, seed=seed)
    want, _ = s.run(1, s.init_state(p0))
    got = flower.record_to_params(arrays)
    for k in got:
        np.testing.assert_allclose(got[k], want.params[k], rtol=1e-6, atol=1e-7)
