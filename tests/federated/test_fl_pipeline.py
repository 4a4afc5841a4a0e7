"""fedsim from data.path through the per-client pipeline (fedarena.federated.datasets): a run on LEAF FEMNIST
files written with json trains, writes the data manifest and the per-stage timings, and matches the same data
held in memory; a corrupt file stops the CLI with one line and exit status 2."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np

from fedarena.federated.data import DataSpec, FederatedData, PartitionSpec, load
from fedarena.platform.runs import execute, read_metrics


def _femnist(folder, sizes, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    users, start = {}, 0
    for k, n in enumerate(sizes):
        y = rng.integers(0, 62, n)
        x = np.clip(0.1 * rng.standard_normal((n, 784)) + (y[:, None] % 7) / 7, 0, 1).round(2)
        users[f"f{k:04d}_{k % 7:02d}"] = {"x": x.tolist(), "y": y.tolist()}
        start += n
    names = list(users)
    half = len(names) // 2
    for j, part in enumerate((names[:half], names[half:])):
        (folder / f"all_data_{j}.json").write_text(json.dumps(
            {"users": part, "num_samples": [len(users[u]["y"]) for u in part],
             "user_data": {u: users[u] for u in part}}))
    return users


CFG = {"kind": "fedsim", "rounds": 2, "model": {"hidden": [16]},
       "clients": {"per_round": 6, "lr": 0.05, "batch_size": 4}, "privacy": {"seed": 1}}


def test_fedsim_from_leaf_femnist_files_end_to_end(tmp_path):
    users = _femnist(tmp_path / "femnist", [5, 9, 3, 12, 7, 4, 8, 6, 10, 5])
    cfg = dict(CFG, data={"dataset": "leaf_femnist", "path": str(tmp_path / "femnist"), "num_clients": 10,
                          "prefetch_threads": 2})
    execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reporting"] == 6 and r["data_clients_read"] >= 6 and r["data_read_s"] > 0
        assert 0 <= r["data_wait_fraction"] and np.isfinite(r["test_acc"])
    man = json.loads((tmp_path / "run" / "data_manifest.json").read_text())
    files = sorted((tmp_path / "femnist").glob("*.json"))
    assert [m["name"] for m in man["files"]] == [str(f.resolve()) for f in files]
    assert [m["sha256"] for m in man["files"]] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert [m["size"] for m in man["files"]] == [f.stat().st_size for f in files]


def test_streamed_rounds_equal_in_memory_rounds(tmp_path):
    """The same clients in memory (a plain FederatedData) and read from disk give the same global model."""
    from fedarena.federated.fedsim_experiment import FedSimConfig, build

    _femnist(tmp_path / "femnist", [5, 9, 3, 12, 7, 4], seed=3)
    spec = DataSpec(dataset="leaf_femnist", path=str(tmp_path / "femnist"), partition=PartitionSpec(num_clients=6),
                    held_out_fraction=0.2)
    d = load(spec, 0)
    everything = np.arange(d.x.shape[0])
    mem = FederatedData(d.x[everything], d.y, [d.train[i] for i in range(6)], [d.held_out[i] for i in range(6)],
                        np.zeros(0, np.int64), d.num_classes)
    from fedarena.platform.config import build as build_config

    cfg = build_config(FedSimConfig, dict(CFG, data={"dataset": "leaf_femnist", "path": str(tmp_path / "femnist"),
                                                     "num_clients": 6}))
    _, sim = build(cfg)
    from fedarena.federated.simulation import Simulation

    ref = Simulation(sim.model, sim.strategy, mem.x, mem.y, mem.train, sim.client_ids, mem.num_classes, seed=cfg.seed,
                     held_out=mem.held_out, test=d.test_set(), privacy_seed=1)
    params = cfg.model.init_params(sim.model, cfg.seed)
    a, b = sim.init_state(params), ref.init_state(params)
    for _ in range(2):
        a, ra = sim.round(a)
        b, rb = ref.round(b)
        assert ra.selected == rb.selected
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert ra.metrics["client_acc_mean"] == rb.metrics["client_acc_mean"]


def test_cli_corrupt_data_file_one_line_exit_2(tmp_path):
    _femnist(tmp_path / "femnist", [5, 9, 3, 4])
    f = tmp_path / "femnist" / "all_data_1.json"
    f.write_bytes(f.read_bytes()[:-500])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kind: fedsim\nrounds: 1\nclients: {per_round: 2}\n")
    p = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "run", str(cfg), "--set",
                        "data.dataset=leaf_femnist", "--set", f"data.path={tmp_path / 'femnist'}", "--set",
                        "data.num_clients=4", "--out", str(tmp_path / "proc")], capture_output=True, text=True,
                       timeout=300)
    errors = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("fedarena: error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr
    assert "data.path:" in errors[0] and str(f) in errors[0] and "truncated" in errors[0]
    assert "Traceback" not in p.stderr


def test_in_memory_leaf_run_writes_the_manifest_too(tmp_path):
    _femnist(tmp_path / "femnist", [5, 9, 3, 4])
    load(DataSpec(dataset="leaf_femnist", path=str(tmp_path / "femnist"), partition=PartitionSpec(num_clients=4)), 0)
    assert list((tmp_path / "femnist" / ".fedarena_index").glob("*.npz"))  # an index cache beside the data
    cfg = dict(CFG, rounds=1, clients={"per_round": 2},
               data={"dataset": "leaf", "path": str(tmp_path / "femnist"), "num_clients": 4})
    execute(cfg, out=tmp_path / "run", quiet=True, report=False)
    man = json.loads((tmp_path / "run" / "data_manifest.json").read_text())
    assert [m["name"] for m in man["files"]] == [str(f.resolve()) for f in sorted((tmp_path / "femnist").glob("*.json"))]
