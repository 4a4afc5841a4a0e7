"""Device budgets and HeteroFL sub-models in the gRPC runtime (issue 35): one round with two widths through a real
scheduler, two FL-Servers and four FLClient threads on loopback reaches the simulation's global model
(``Simulation.device_round``, the oracle computed in process over no transport) to ``1e-5``, and the scheduler
records every client's width level and device cost."""

from __future__ import annotations

import numpy as np

from fedarena.federated.devices import DeviceFleet, DeviceProfile, training_memory
from fedarena.federated.hetero import WidthLevels, level_sizes
from fedarena.federated.protocol import RoundConfig
from fedarena.federated.scheduler import RoundPolicy
from fedarena.federated.task import TaskSpec

SEED, CLIENTS = 3, 4
TASK = TaskSpec(dataset="synthetic", num_clients=CLIENTS, hidden=(8, 8), trainer="engine", synthetic_features=10,
                synthetic_classes=3, synthetic_examples=200, alpha=0.5)
CFG = RoundConfig(epochs=2, batch_size=8, lr=0.1)


def _fleet(sizes):
    """Clients c0, c1 hold the full width; c2, c3 only half (memory between the two widths' training memory)."""
    full, half = (training_memory(level_sizes(sizes, r), CFG.batch_size) for r in (1.0, 0.5))
    mem = [full + 1, full + 1, half + 1, half + 1]
    return DeviceFleet([DeviceProfile(i, m, 1e12, 1e9, 1e9, 0.0, 86_400.0) for i, m in enumerate(mem)],
                       [level_sizes(sizes, r) for r in (1.0, 0.5)])


def test_one_round_with_two_widths_over_grpc_equals_the_simulation(make_cluster, device_simulation):
    from fedarena.federated.task import build_task

    task = build_task(TASK)
    widths = WidthLevels((1.0, 0.5), "heterofl", scaler=True)
    ids = tuple(f"c{i}" for i in range(CLIENTS))
    policy = RoundPolicy(rounds=1, clients_per_round=CLIENTS, window_seconds=120, start_clients=CLIENTS,
                         min_fraction=1.0, selection="uniform", seed=SEED, round_config=CFG, max_client_weight=1.0,
                         norm_bound_multiple=0.0, devices=_fleet(task.sizes), widths=widths, device_clients=ids)
    c = make_cluster(policy, task=TASK)
    c.run_clients(CLIENTS, seed=SEED, wait_s=0.5)
    assert c.scheduler.version == 1, c.scheduler.history[-1]
    row = c.scheduler.history[-1]
    assert {cid: d["level"] for cid, d in row["device_costs"].items()} == {"c0": 0, "c1": 0, "c2": 1, "c3": 1}
    assert all(d["memory_bytes"] <= p.memory_bytes for d, p in zip(row["device_costs"].values(),
                                                                 policy.devices.profiles))

    sim = device_simulation(task, CFG, _fleet(task.sizes), widths, SEED)
    init = task.trainer.init_params(0)
    state, rec = sim.round(sim.init_state(init))
    assert rec.metrics["level0_clients"] == 2 and rec.metrics["level1_clients"] == 2
    a = np.concatenate([np.asarray(c.scheduler.params[k], np.float64).ravel() for k in sorted(init)])
    b = np.concatenate([np.asarray(state.params[k], np.float64).ravel() for k in sorted(init)])
    i = np.concatenate([np.asarray(init[k], np.float64).ravel() for k in sorted(init)])
    assert np.linalg.norm(a - b) / np.linalg.norm(b - i) < 1e-5, np.linalg.norm(a - b) / np.linalg.norm(b - i)
    assert np.abs(a - b).max() < 1e-5


def test_grpc_devices_bad_input_is_one_line_exit_2(tmp_path, cli_error_line):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[2] / "experiments" / "heterofl_grpc.yaml"
    for sets, message in [(["strategy.aggregation=median"], "strategy.aggregation: devices.enabled averages sub-model "
                                                            "updates per coordinate; use mean"),
                          (["devices.int8_download=true", "clients.prox_mu=0.01"],
                           "clients.prox_mu: clients that receive int8 models (devices.int8_download) train plain SGD "
                           "quantization-aware; set clients.prox_mu to 0"),
                          (["devices.tier_memory_mb=[0.1,0,0.025,0.012,0.008]"],
                           "devices.tier_memory_mb: every tier needs a value > 0")]:
        cli_error_line(cfg, tmp_path / "r", sets, message)


def test_resumed_grpc_run_logs_each_device_row_once(tmp_path):
    """A fedavg_grpc run resumed from an older checkpoint than its scheduler's state logs the later rounds again
    from the scheduler's history: their device-cost rows replace the ones written before, once per (round,
    client), so ``device_costs.csv`` keeps its rows up to the resumed round's and adds the next round's."""
    from pathlib import Path

    import yaml

    from fedarena.platform.runs import execute, read_metrics

    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments" / "heterofl_grpc.yaml").read_text())
    cfg.update(rounds=3, checkpoint={"every": 1, "keep": 3})
    cfg["data"].update(dataset="synthetic", num_clients=4)
    cfg["model"].update(hidden=[16], trainer="numpy")
    cfg["execution"]["num_servers"] = 1
    cfg["devices"].update(width_levels=[1.0, 0.5], tier_fraction=[0.5, 0.5], tier_memory_mb=[1.0, 0.01],
                          tier_gflops=[2.0, 1.0], tier_up_mbps=[2.0, 1.0], tier_down_mbps=[8.0, 4.0], deadline_s=0)
    run = tmp_path / "run"
    execute(cfg, out=run, quiet=True, report=False)
    records = run / "device_costs.csv"
    before = records.read_text()
    assert {ln.split(",")[0] for ln in before.splitlines()[1:]} == {"1", "2", "3"}
    # the run stopped after logging round 3 but before its checkpoint: the newest checkpoint is round 2's
    newest = max((run / "checkpoints").glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
    newest.unlink()
    execute(None, overrides=["rounds=4"], resume=run, quiet=True, report=False)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    after = records.read_text()
    keys = [tuple(ln.split(",")[:2]) for ln in after.splitlines()[1:]]
    assert len(keys) == len(set(keys)) and {k[1] for k in keys} == {f"client{i:03d}" for i in range(4)}
    assert after.startswith(before) and {r for r, _ in keys} == {"1", "2", "3", "4"}
