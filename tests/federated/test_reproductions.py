"""Reduced-size versions of the reproduction kinds (fedavg_table, fedprox_figure) and the straggler injection
they use; the full reproductions are quoted in docs/reproductions.md with their commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedarena.federated import simulation as sim
from fedarena.federated.fedsim_experiment import FedSimConfig, build
from fedarena.platform.config import build as build_config
from fedarena.platform.config import merged
from fedarena.federated.strategy import FitConfig
from fedarena.platform.config import ConfigError
from fedarena.platform.runs import execute, read_metrics

TABLE = {"kind": "fedavg_table", "num_clients": 20, "hidden": [8], "target": 0.5, "max_rounds": 12,
         "client_fractions": [0.0, 0.2], "epochs": [2], "batch_sizes": [10, 0], "partitions": ["iid", "shards"]}


def test_fedavg_table_rounds_are_the_first_crossing_of_the_fedsim_run(tmp_path):
    summary = execute(TABLE, out=tmp_path / "t", quiet=True)
    res = json.loads((tmp_path / "t" / "fedavg_curves.json").read_text())
    assert len(res["cells"]) == 8 and len(read_metrics(tmp_path / "t")) == 8
    # oracle: the fedsim kind itself, same cell (B = 10 cells; clients_per_round = max(1, C K))
    for part, c in (("iid", 0.2), ("shards", 0.0)):
        name = f"{'iid' if part == 'iid' else 'non-iid'} C={c:g} E=2 B=10"
        execute(dict(kind="fedsim", rounds=12, data={"num_clients": 20, "partition": part, "held_out_fraction": 0.0},
                     model={"hidden": [8]}, privacy={"seed": 0},
                     clients={"epochs": 2, "batch_size": 10, "lr": 0.1, "per_round": max(1, round(c * 20))}),
                out=tmp_path / name.replace(" ", "_"), quiet=True, report=False)
        accs = [r["test_acc"] for r in read_metrics(tmp_path / name.replace(" ", "_"))]
        first = next((i + 1 for i, a in enumerate(accs) if a >= 0.5), None)
        assert res["rounds"][name] == first
        n = len(res["curves"][name])
        np.testing.assert_allclose(res["curves"][name], accs[:n], rtol=1e-12)
        assert summary[f"rounds[{name}]"] == (first if first else ">12")
    table = (tmp_path / "t" / "report" / "fedavg_table.md").read_text()
    assert table.count("\n") == 2 + 8
    for png in ("fedavg_curves.png", "fedavg_table.png"):
        assert (tmp_path / "t" / "report" / png).stat().st_size > 1000


def test_infinite_batch_is_one_full_batch_gradient_step_per_epoch():
    """B = inf (batch = the largest client): each epoch is one gradient step on the client's whole data (torch)."""
    cfg = build_config(FedSimConfig, {
        "kind": "fedsim", "rounds": 1, "data": {"dataset": "breast_cancer", "num_clients": 6, "held_out_fraction": 0.0},
        "model": {"hidden": []}, "clients": {"per_round": 0, "epochs": 2, "batch_size": 10, "lr": 0.3},
        "privacy": {"seed": 0}})
    d, s = build(cfg)
    bmax = max(len(t) for t in d.train)
    fit = FitConfig(epochs=2, batch_size=bmax, lr=0.3)
    params = s.model.init_params(0)
    _, deltas, _, steps = s._train(params, s.client_ids, 1, fit, None)
    for i, c in enumerate(s.client_ids):
        assert steps[c] == 2
        w = torch.tensor(params["l0.w"], dtype=torch.float64, requires_grad=True)
        b = torch.tensor(params["l0.b"], dtype=torch.float64, requires_grad=True)
        x = torch.tensor(d.x[d.train[i]], dtype=torch.float64)
        y = torch.tensor(d.y[d.train[i]])
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(x @ w + b, y)
            gw, gb = torch.autograd.grad(loss, (w, b))
            w = (w - 0.3 * gw).detach().requires_grad_(True)
            b = (b - 0.3 * gb).detach().requires_grad_(True)
        np.testing.assert_allclose(deltas[c]["l0.w"], w.detach().numpy() - params["l0.w"], atol=2e-5)


def _straggler_sim(partial: bool, fraction: float) -> sim.Simulation:
    cfg = build_config(FedSimConfig, {
        "kind": "fedsim", "rounds": 1, "model": {"hidden": []}, "privacy": {"seed": 0},
        "data": {"dataset": "synthetic", "num_clients": 10, "synthetic_size_mean": 2.0, "synthetic_size_sigma": 0.5,
                 "synthetic_size_min": 20},
        "clients": {"per_round": 4, "local_steps": 6, "batch_size": 5, "lr": 0.05},
        "heterogeneity": {"straggler_fraction": fraction, "partial_work": partial}})
    return build(cfg)[1]


def test_straggler_fraction_injects_exactly_that_many_partial_workers():
    s = _straggler_sim(True, 0.5)
    fit = FitConfig(batch_size=5, lr=0.05, local_steps=6)
    for rnd in (1, 2, 3):
        chosen = s.strategy.select(rnd, s.client_ids, s.seed)
        _, _, _, steps = s._train(s.model.init_params(0), chosen, rnd, fit, None)
        short = [c for c in chosen if steps[c] < 6]
        assert len(short) == 2 and all(1 <= steps[c] <= 5 for c in short)
    # FedAvg drops the two stragglers; FedProx's partial work keeps them; the two first rounds differ
    state = s.init_state()
    _, kept = s.round(state)
    d = _straggler_sim(False, 0.5)
    _, dropped = d.round(d.init_state())
    assert kept.metrics["stragglers"] == dropped.metrics["stragglers"] == 2
    assert kept.metrics["reporting"] == 4 and dropped.metrics["reporting"] == 2
    assert set(dropped.reporting) < set(kept.reporting) == set(kept.selected)
    # no stragglers: both rules give the same model
    a, b = _straggler_sim(True, 0.0), _straggler_sim(False, 0.0)
    sa, _ = a.round(a.init_state())
    sb, _ = b.round(b.init_state())
    for k in sa.params:
        np.testing.assert_array_equal(sa.params[k], sb.params[k])


def test_straggler_partial_work_equals_training_for_the_finished_steps():
    """A straggler's kept update is exactly the update of training with local_steps = its finished steps."""
    s = _straggler_sim(True, 0.5)
    fit = FitConfig(batch_size=5, lr=0.05, local_steps=6)
    params = s.model.init_params(0)
    chosen = s.strategy.select(1, s.client_ids, s.seed)
    _, deltas, _, steps = s._train(params, chosen, 1, fit, None)
    ref = _straggler_sim(True, 0.0)
    for c in chosen:
        _, dref, _, _ = ref._train(params, [c], 1, FitConfig(batch_size=5, lr=0.05, local_steps=steps[c]), None)
        np.testing.assert_allclose(deltas[c]["l0.w"], dref[c]["l0.w"], atol=1e-6)


FIG = {"kind": "fedprox_figure", "synthetic": [[1.0, 1.0]], "num_clients": 8, "clients_per_round": 4,
       "straggler_fractions": [0.0, 0.5], "rounds": 3, "local_steps": 5, "size_mean": 2.0, "size_sigma": 0.5,
       "size_min": 20, "train_seeds": [0, 1]}


def test_fedprox_figure_loss_curves_and_summary(tmp_path):
    summary = execute(FIG, out=tmp_path / "f", quiet=True)
    losses = json.loads((tmp_path / "f" / "fedprox_losses.json").read_text())["losses"]
    assert len(losses) == 6 and all(np.asarray(v).shape == (2, 3) for v in losses.values())
    z = "synthetic(1,1) stragglers={} {}"
    assert losses[z.format(0, "fedavg")] == losses[z.format(0, "fedprox_mu0")]
    assert losses[z.format(0.5, "fedavg")] != losses[z.format(0.5, "fedprox_mu0")]
    # oracle for one curve: the fedsim pieces by hand, loss = mean cross-entropy on all training examples
    from fedarena.federated.reproductions import FedProxFigureConfig

    cfg = FedProxFigureConfig(**{k: v for k, v in FIG.items()})
    _, s = build(cfg.cell_config([1.0, 1.0], 0.5, "fedprox", 0))
    d = build(cfg.cell_config([1.0, 1.0], 0.5, "fedprox", 0))[0]
    s.seed = 1
    state = s.init_state({k: np.zeros_like(v) for k, v in s.model.init_params(0).items()})
    idx = np.concatenate(d.train)
    curve = []
    for _ in range(3):
        state, _ = s.round(state)
        z_ = s.model.logits(state.params, d.x[idx])
        logp = z_ - z_.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        curve.append(float(-logp[np.arange(len(idx)), d.y[idx]].mean()))
    np.testing.assert_allclose(losses[z.format(0.5, "fedprox")][1], curve, rtol=1e-10)
    final = np.asarray(losses[z.format(0.5, "fedprox")])[:, -1].mean()
    assert summary[f"final_train_loss[{z.format(0.5, 'fedprox')}]"] == pytest.approx(final, abs=1e-5)
    assert (tmp_path / "f" / "report" / "fedprox_figure.png").stat().st_size > 1000
    # the same jobs in two worker processes give the same curves
    execute(dict(FIG, workers=2, straggler_fractions=[0.5]), out=tmp_path / "w", quiet=True, report=False)
    again = json.loads((tmp_path / "w" / "fedprox_losses.json").read_text())["losses"]
    for k, v in again.items():
        assert v == losses[k]


def test_loss_statistics_closed_form():
    from fedarena.federated.reproductions import loss_statistics

    c = np.array([[5.0, 4.0, 1.0, 3.0, 1.0, 3.0], [5.0, 4.0, 2.0, 2.0, 2.0, 2.0]])
    st = loss_statistics(c)
    assert st["final_train_loss"] == pytest.approx(2.5)
    assert st["seed_spread"] == pytest.approx(0.5)  # |3-2|/2 = 0.5 at every one of the last 3 rounds
    assert st["loss_oscillation"] == pytest.approx((np.std([-2.0, 2.0]) + 0.0) / 2)


def test_reproduction_configs_name_the_bad_field(tmp_path):
    for bad, field in ((dict(TABLE, target=1.5), "target"), (dict(TABLE, partitions=["dirichlet"]), "partitions"),
                       (dict(TABLE, batch_sizes=[-1]), "batch_sizes"), (dict(FIG, mu=0.0), "mu"),
                       (dict(FIG, straggler_fractions=[1.5]), "straggler_fractions")):
        with pytest.raises(ConfigError, match=field):
            execute(bad, out=tmp_path / field, quiet=True)



SWEEP = {"kind": "fedsim_sweep", "x_metric": "bytes_up", "privacy_plot": True,
         "base": {"rounds": 3, "data": {"dataset": "breast_cancer", "num_clients": 8, "held_out_fraction": 0.0},
                  "model": {"hidden": []}, "clients": {"per_round": 0, "lr": 0.05}, "privacy": {"seed": 3}},
         "variants": [{"label": "dense"}, {"label": "q8", "upload": {"codec": "quantize", "bits": 8}},
                      {"label": "ldp", "privacy": {"ldp": {"epsilon": 8.0}}},
                      {"label": "signds", "privacy": {"signds": {"k": 10, "h": 3, "epsilon": 2.0}}},
                      {"label": "dp", "privacy": {"dp": {"noise_multiplier": 1.0, "sample_rate": 0.5}}}]}


def test_fedsim_sweep_matches_the_fedsim_runs_of_each_variant(tmp_path):
    summary = execute(SWEEP, out=tmp_path / "s", quiet=True)
    curves = json.loads((tmp_path / "s" / "sweep_curves.json").read_text())
    for v in SWEEP["variants"]:
        fields = {k: x for k, x in v.items() if k != "label"}
        one = tmp_path / v["label"]
        execute({"kind": "fedsim", **merged(SWEEP["base"], fields)}, out=one, quiet=True, report=False)
        rows = read_metrics(one)
        if v["label"] != "dp":
            assert curves[v["label"]]["test_acc"] == pytest.approx([r["test_acc"] for r in rows], rel=1e-12)
            assert curves[v["label"]]["bytes_up"][-1] == sum(r["bytes_up"] for r in rows)
            assert summary[f"bytes_up[{v['label']}]"] == sum(r["bytes_up"] for r in rows)
        else:  # DP-FedAvg's noise and Poisson client sampling come from os.urandom: runs differ, bytes too
            assert curves["dp"]["bytes_up"][-1] == summary["bytes_up[dp]"]
        if v["label"] == "ldp":
            assert curves["ldp"]["epsilon"] == pytest.approx([r["ldp_epsilon_cumulative"] for r in rows])
        if v["label"] == "dp":
            assert curves["dp"]["epsilon"] == pytest.approx([r["dp_epsilon"] for r in rows])
    assert curves["signds"]["epsilon"] == [2.0, 4.0, 6.0]  # every client reports every round: basic composition
    assert curves["q8"]["bytes_up"][-1] < curves["dense"]["bytes_up"][-1] / 3.5
    table = (tmp_path / "s" / "report" / "sweep_table.md").read_text()
    assert "| ldp |" in table and "(ldp)" in table and "(dp_fedavg)" in table
    for png in ("sweep_accuracy.png", "sweep_epsilon.png", "sweep_table.png"):
        assert (tmp_path / "s" / "report" / png).stat().st_size > 1000


def test_fedsim_sweep_bad_variant_names_it(tmp_path):
    bad = dict(SWEEP, variants=[{"label": "a"}, {"label": "b", "upload": {"codec": "gzip"}}])
    with pytest.raises(ConfigError, match=r"variants\[1\].*upload.codec"):
        execute(bad, out=tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match=r"variants\[1\].*upload_codec: moved to variants\[1\].upload.codec"):
        execute(dict(SWEEP, variants=[{"label": "a"}, {"label": "b", "upload_codec": "quantize"}]),
                out=tmp_path / "d", quiet=True)
    with pytest.raises(ConfigError, match="label"):
        execute(dict(SWEEP, variants=[{"upload": {"codec": "quantize"}}]), out=tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="seed"):
        execute(dict(SWEEP, variants=[{"label": "a", "seed": 3}]), out=tmp_path / "c", quiet=True)
