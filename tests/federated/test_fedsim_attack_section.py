"""The fedsim kind's ``attack`` section and ``strategy.defence`` through ``fedarena run``: an ALIE coalition against
bucketing gives the model of the same simulation built by hand from the public constructors (the oracle), a
backdoor reports its attack success, and bad input is one line with exit status 2."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena.platform.cli import main
from fedarena.platform.runs import read_metrics

BASE = ("kind: fedsim\nseed: 3\nrounds: 6\n"
        "data: {dataset: digits, num_clients: 20, partition: iid, held_out_fraction: 0.0}\n"
        "model: {hidden: [16]}\nclients: {per_round: 10, epochs: 1, batch_size: 10, lr: 0.1}\n"
        "evaluation: {every: 3}\nprivacy: {seed: 0}\n")


def _run(tmp_path, name: str, extra: str) -> list[dict]:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(BASE + extra)
    assert main(["run", str(cfg), "--out", str(tmp_path / name), "--quiet", "--no-report"]) == 0
    return read_metrics(tmp_path / name)


def test_alie_against_bucketing_through_the_cli_is_the_hand_built_simulation(tmp_path):
    rows = _run(tmp_path, "alie", "attack: {kind: alie, fraction: 0.2}\n"
                "strategy: {defence: {kind: bucketing, bucket_size: 2, tau: 0.15}}\n")
    assert sum(r["attackers"] for r in rows) > 0 and all(r["attackers"] <= 4 for r in rows)
    from fedarena.federated import data
    from fedarena.federated.attacks import ALIE, Attacked
    from fedarena.federated.defences import Defended
    from fedarena.federated.simulation import BatchedMLP, Simulation
    from fedarena.federated.strategy import FedAvg, FitConfig

    d = data.load(data.DataSpec("digits", partition=data.PartitionSpec("iid", 20), held_out_fraction=0.0), 3)
    ids = [f"c{i}" for i in range(20)]
    coalition = frozenset(np.asarray(ids)[np.random.default_rng([3, 23]).choice(20, 4, replace=False)].tolist())
    inner = Defended(FedAvg(FitConfig(1, 10, 0.1), clients_per_round=10), "bucketing",
                     {"bucket_size": 2, "rule": "centered_clipping", "rule_params": {"tau": 0.15, "iterations": 1}},
                     center_previous=True, bucket_seeded=True, seed=3)
    model = BatchedMLP((d.num_features, 16, d.num_classes))
    sim = Simulation(model, Attacked(inner, ALIE(), coalition), d.x, d.y, d.train, ids, d.num_classes, seed=3,
                     test=d.test_set(), eval_every=3, privacy_seed=0)
    from fedarena.federated.config import ModelConfig

    _, records = sim.run(6, sim.init_state(ModelConfig(hidden=(16,)).init_params(model, 3)))
    assert rows[-1]["test_acc"] == pytest.approx(records[-1].metrics["test_acc"], abs=1e-9)
    assert [r["attackers"] for r in rows] == [float(len(coalition & set(r.reporting))) for r in records]


def test_backdoor_reports_its_attack_success(tmp_path):
    clean = _run(tmp_path, "clean", "")
    attacked = _run(tmp_path, "bd", "attack: {kind: backdoor, num_attackers: 4, target: 0}\n")
    assert "attack_success" not in clean[-1]
    success = [r["attack_success"] for r in attacked if "attack_success" in r]
    assert len(success) == 2 and all(0 <= s <= 1 for s in success)  # evaluated rounds 3 and 6
    # model replacement plants the trigger: most triggered test digits go to the target class
    assert success[-1] > 0.5, success


@pytest.mark.parametrize("sets, message", [
    (["attack.kind=alie", "attack.num_attackers=30"], "attack.num_attackers: 30 attackers exceed the 20 clients"),
    (["strategy.defence.kind=fltrust"], "strategy.defence.root_size: fltrust needs a clean root set"),
    (["attack.kind=lie", "attack.num_attackers=2"], "attack.kind"),
    (["heterogeneity.adversary_fraction=0.2"], "heterogeneity.adversary_fraction: moved to attack.fraction"),
    (["adversary_scale=2.0"], "adversary_scale: moved to attack.scale"),
    (["strategy.defence.kind=centered_clipping", "strategy.aggregation=median"], "strategy.defence: "),
])
def test_bad_attack_input_is_one_line_exit_2(tmp_path, capsys, sets, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE)
    args = ["run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"fedarena: error: {message}"), err
