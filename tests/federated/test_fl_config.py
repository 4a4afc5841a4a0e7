"""The nested FL configs (fedarena.federated.config): sampled fields change the run in both runtimes (the simulation
and the gRPC runtime: scheduler, two FL-Servers and FLClient threads on loopback), the old flat layouts are refused
in one line naming the new path (exit 2) and rewritten by ``fedarena show --migrate``, bad values name their
dotted path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import typing
from pathlib import Path

import numpy as np
import pytest

from fedarena.federated.config import FEDSIM_MOVED, GRPC_MOVED
from fedarena.federated.fedsim_experiment import FedSimConfig
from fedarena.federated.fedsim_experiment import build as build_sim
from fedarena.federated.grpc_experiment import FedAvgGrpcConfig, _spec
from fedarena.platform.cli import main
from fedarena.platform.config import ConfigError, build, load_yaml, merged, migrate

REPO = Path(__file__).resolve().parents[2]

# the same sections mean the same in both kinds: one base per kind, the same dotted paths changed in both
SIM_BASE = {"kind": "fedsim", "seed": 1, "rounds": 2, "data": {"dataset": "breast_cancer", "num_clients": 6,
                                                               "held_out_fraction": 0.0},
            "model": {"hidden": [4]}, "clients": {"per_round": 4, "epochs": 1, "batch_size": 8, "lr": 0.05},
            "privacy": {"seed": 0}}
GRPC_BASE = {"kind": "fedavg_grpc", "seed": 1, "rounds": 2, "data": {"dataset": "synthetic", "num_clients": 4},
             "model": {"hidden": [4], "trainer": "numpy"},
             "clients": {"per_round": 4, "epochs": 1, "batch_size": 8, "lr": 0.05, "min_fraction": 1.0,
                         "window_seconds": 60.0, "selection": "uniform"},
             "strategy": {"max_client_weight": 1.0, "norm_bound_multiple": 0.0}}

# (dotted path, base value the field is changed from (None: the kind's default), new value)
FIELDS = [
    ("clients.epochs", None, 3),
    ("clients.batch_size", None, 2),
    ("clients.lr", None, 0.2),
    ("clients.prox_mu", None, 5.0),
    ("clients.per_round", None, 2),
    ("strategy.server_optimizer.name", None, "fedadam"),
    ("strategy.server_optimizer.lr", None, 0.3),
    ("strategy.aggregation", None, "median"),
    ("strategy.trim_fraction", ("strategy.aggregation", "trimmed_mean"), 0.3),
    ("upload.clip_norm", None, 0.01),
    ("model.hidden", None, [6]),
]


def _nested(path: str, value) -> dict:
    out: dict = {}
    node = out
    *sections, last = path.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def _flat(params: dict) -> np.ndarray:
    return np.concatenate([np.asarray(params[k], np.float64).ravel() for k in sorted(params)])


def _simulate(data: dict) -> np.ndarray:
    cfg = build(FedSimConfig, data)
    _, sim = build_sim(cfg)
    state = sim.init_state(cfg.model.init_params(sim.model, cfg.seed))
    state, _ = sim.run(cfg.rounds, state)
    return _flat(state.params)


def _runtime(data: dict, tmp_path: Path) -> np.ndarray:
    """The deployment of the config in this process: its scheduler policy, server options, task and client
    options (``_spec``); the scheduler and two FL-Servers on loopback gRPC, one FLClient thread per client."""
    from fedarena.federated import auth
    from fedarena.federated.client import FLClient
    from fedarena.federated.scheduler import Scheduler
    from fedarena.federated.server import FLServer
    from fedarena.federated.task import build_task

    cfg = build(FedAvgGrpcConfig, data)
    spec = _spec(cfg)
    task, secret = build_task(spec.task), auth.new_secret()
    scheduler = Scheduler(spec.policy, task.trainer.init_params(spec.init_seed), secret, tmp_path / "state.fl")
    address = f"127.0.0.1:{scheduler.start('127.0.0.1:0')}"
    servers = [FLServer(f"s{i}", address, secret, dataclasses.replace(spec.server, sync_wait_s=0.2))
               for i in range(cfg.execution.num_servers)]
    clients = []
    try:
        for s in servers:
            s.start("127.0.0.1:0")
        opts = dataclasses.replace(spec.client, wait_s=0.5)
        clients = [FLClient(f"c{i}", auth.client_token(secret, f"c{i}"), address, task.clients[i], task.trainer, opts)
                   for i in range(cfg.data.num_clients)]
        threads = [threading.Thread(target=cl.run, daemon=True) for cl in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert scheduler.phase == "done" and scheduler.version == cfg.rounds
        return _flat(scheduler.params)
    finally:
        for cl in clients:
            cl.close()
        for s in servers:
            s.stop()
        scheduler.stop()


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape != b.shape or float(np.linalg.norm(a - b)) > 1e-4 * float(np.linalg.norm(b))


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    sim = _simulate(SIM_BASE)
    assert not _differs(_simulate(SIM_BASE), sim)  # the simulation is deterministic in its seeds
    runtime = _runtime(GRPC_BASE, tmp_path_factory.mktemp("base"))
    assert not _differs(_runtime(GRPC_BASE, tmp_path_factory.mktemp("again")), runtime)  # and so is the runtime
    return sim, runtime


@pytest.mark.parametrize("path, base, value", FIELDS, ids=[f[0] for f in FIELDS])
def test_a_field_changes_the_run_in_both_runtimes(path, base, value, baselines, tmp_path):
    sim_ref, runtime_ref = baselines
    sim_base, grpc_base = SIM_BASE, GRPC_BASE
    if base is not None:  # the field acts only with another setting: the reference runs with that setting too
        sim_base, grpc_base = (merged(b, _nested(*base)) for b in (SIM_BASE, GRPC_BASE))
        sim_ref, runtime_ref = _simulate(sim_base), _runtime(grpc_base, tmp_path / "ref")
    assert _differs(_simulate(merged(sim_base, _nested(path, value))), sim_ref), path
    assert _differs(_runtime(merged(grpc_base, _nested(path, value)), tmp_path / "run"), runtime_ref), path


def _leaves(schema: type, prefix: str = "") -> set[str]:
    """Every scalar or list field of a config class, by its dotted path."""
    out: set[str] = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return out


@pytest.mark.parametrize("schema, moved, count", [(FedSimConfig, FEDSIM_MOVED, 87), (FedAvgGrpcConfig, GRPC_MOVED, 53)])
def test_every_old_flat_key_has_exactly_one_new_path(schema, moved, count):
    from fedarena.platform.experiment import ExperimentConfig

    kind_fields = _leaves(schema) - _leaves(ExperimentConfig)
    # the old flat layouts had `count` fields of their own: every one but `rounds` moved, each to its own field,
    # and every field of the sections is the new home of one old key, or one of the fields added since
    zoo = {"model.widths", "model.embed_dim", "model.units", "model.num_layers", "model.num_heads", "model.norm_groups"}
    added = {FedSimConfig: {"execution.threads", "execution.max_stacked_clients", "execution.ray_workers",
                            "execution.ray_chunk", "privacy.dp.accountant", "privacy.dp.adaptive_clip",
                            "privacy.dp.target_quantile", "privacy.dp.clip_learning_rate",
                            "privacy.dp.clip_count_stddev", "data.label", "data.cache_dir",
                            "data.prefetch_threads", "data.augment", "data.test_clients", "data.vocab_path"} | zoo,
             # the runtime's model section became fedsim's (issue 31)
             FedAvgGrpcConfig: {"model.arch", "model.cnn_channels", "model.cnn_hidden", "model.image_shape",
                                "model.zero_init"}}.get(schema, set())
    added |= zoo & kind_fields
    # the attack section (both kinds) and strategy.defence (fedsim), issue 36; three old fedsim keys moved into it
    added |= {p for p in kind_fields if p.startswith(("attack.", "strategy.defence."))} - set(moved.values())
    # the devices section (fedsim), issue 35: new, no old key moved into it
    added |= {p for p in kind_fields if p.startswith("devices.")}
    assert len(moved) == count - 1 and len(set(moved.values())) == len(moved)
    assert set(moved.values()) | {"rounds"} | added == kind_fields


def test_old_flat_layout_is_one_line_naming_the_new_path_exit_2(tmp_path, capsys):
    flat = tmp_path / "old.yaml"
    for text, path in [("kind: fedsim\nrounds: 2\naggregation: krum\n", "aggregation: moved to strategy.aggregation"),
                       ("kind: fedsim\nmodel: cnn\n", "model: moved to model.arch"),
                       ("kind: fedavg_grpc\nsecagg_threshold: 0.7\n",
                        "secagg_threshold: moved to privacy.secagg.threshold"),
                       ("kind: fedavg_grpc\nnum_clients: 4\n", "num_clients: moved to data.num_clients")]:
        flat.write_text(text)
        assert main(["run", str(flat), "--out", str(tmp_path / "r"), "--quiet"]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith(f"fedarena: error: {path} "), err
        assert "fedarena show --migrate" in err[0] and f"({flat}, line " in err[0]


@pytest.mark.parametrize("sets, message", [
    (["strategy.trim_fraction=0.7"], "strategy.trim_fraction: must lie in [0, 0.5), got 0.7"),
    (["clients.per_round=500"], "clients.per_round: 500 exceeds the 100 clients"),
    (["privacy.dp.noise_multiplier=1.0"], "clients.per_round: DP-FedAvg samples every client with probability "
                                          "privacy.dp.sample_rate (0.1); set clients.per_round to 0, got 10"),
    (["privacy.dp.noise_multiplier=1.0", "clients.per_round=0", "privacy.dp.sample_rate=2"],
     "privacy.dp.sample_rate: must lie in (0, 1], got 2.0"),
    (["upload.bits=9"], "upload.bits: must lie in 1..8, got 9"),
    (["privacy.secagg.enabled=true", "strategy.aggregation=median"],
     "privacy.secagg.enabled: secure aggregation gives only the sum"),
    (["clients.epochs=0"], "clients.epochs: must be >= 1, got 0"),
    (["strategy.server_optimizer.name=sgd"], "strategy.server_optimizer.name: expected one of"),
    (["strategy.server_mode=threshold", "strategy.async_concurrency=2", "strategy.async_buffer=3",
      "evaluation.personalize_epochs=0"], "strategy.async_buffer: a server step waits for 3 deltas"),
    (["strategy.server_mode=async"], "evaluation.personalize_epochs: strategy.server_mode async runs plain FedAvg"),
])
def test_a_bad_value_is_one_line_naming_its_dotted_path(sets, message, tmp_path, capsys):
    args = ["run", str(REPO / "experiments" / "fedsim_digits.yaml"), "--out", str(tmp_path / "r"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"fedarena: error: {message}"), err


OLD_FEDSIM_DIGITS = """\
# the shipped experiments/fedsim_digits.yaml before the sections
kind: fedsim
name: digits
seed: 0
dataset: digits
num_clients: 100
partition: dirichlet
alpha: 0.5
hidden: [32]
rounds: 50
clients_per_round: 10
epochs: 1
batch_size: 10
lr: 0.1
aggregation: fedavg
personalize_epochs: 1
"""


def test_show_migrate_prints_the_nested_config_of_an_old_file(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(OLD_FEDSIM_DIGITS)
    p = subprocess.run([sys.executable, "-m", "fedarena.platform.cli", "show", "--migrate", str(old)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("# the shipped experiments/fedsim_digits.yaml before the sections\n")
    new = tmp_path / "new.yaml"
    new.write_text(p.stdout)
    shipped = build(FedSimConfig, load_yaml(REPO / "experiments" / "fedsim_digits.yaml"))
    assert build(FedSimConfig, load_yaml(new)) == shipped  # the same run as the migrated shipped file
    with pytest.raises(ConfigError, match=r"^dataset: moved to data.dataset .*, line 5\)$"):  # its first old key
        build(FedSimConfig, load_yaml(old))


def test_migrate_moves_keys_into_sections_and_keeps_the_rest():
    got = migrate(FedAvgGrpcConfig, {"kind": "fedavg_grpc", "rounds": 3, "secagg": True, "tls_loopback": True,
                                     "server_lr": 0.5, "checkpoint": {"every": 1}})
    assert got == {"kind": "fedavg_grpc", "rounds": 3, "privacy": {"secagg": {"enabled": True}},
                   "tls": {"loopback": True}, "strategy": {"server_optimizer": {"lr": 0.5}}, "checkpoint": {"every": 1}}
    cfg = build(FedAvgGrpcConfig, got)
    assert cfg.privacy.secagg.enabled and cfg.tls.loopback and cfg.strategy.server_optimizer.lr == 0.5


def test_digits_and_breast_cancer_are_scikit_learns_without_importing_it():
    """The fedsim kind reads scikit-learn's shipped files itself (its import costs more than a small run): the
    arrays equal scikit-learn's own loaders', and scikit-learn is not imported."""
    code = ("import sys; from fedarena.federated import data; data.load_digits(); data.load_breast_cancer(); "
            "print('sklearn' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr
    from sklearn.datasets import load_breast_cancer, load_digits

    from fedarena.federated import data

    x, y = data.load_digits()
    d = load_digits()
    np.testing.assert_array_equal(x, (d.data / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, d.target)
    x, y = data.load_breast_cancer()
    d = load_breast_cancer()
    np.testing.assert_array_equal(x, ((d.data - d.data.mean(0)) / d.data.std(0)).astype(np.float32))
    np.testing.assert_array_equal(y, d.target)


def test_the_execution_section_reaches_the_simulation():
    cfg = build(FedSimConfig, merged(SIM_BASE, {"execution": {"threads": 2, "max_stacked_clients": 3,
                                                              "ray_workers": 2, "ray_chunk": 0}}))
    _, sim = build_sim(cfg)
    assert (sim.threads, sim.max_stacked_clients, sim.ray_workers, sim.ray_groups_per_task) == (2, 3, 2, 0)
    _, default = build_sim(build(FedSimConfig, SIM_BASE))
    assert default.threads == 1  # one math-library thread unless asked: the stacked clients fill the cores
    with pytest.raises(ConfigError, match="execution.max_stacked_clients"):
        build(FedSimConfig, merged(SIM_BASE, {"execution": {"max_stacked_clients": -1}}))


def _flat_layout(nested: dict, moved: dict) -> dict:
    """``nested`` written back in the old flat layout (every path of ``moved`` at its old key; fields added since,
    all at their defaults here, dropped)."""
    import copy

    src, out = copy.deepcopy(nested), dict(nested)
    for old, new in moved.items():
        *sections, last = new.split(".")
        node = src
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            out[old] = node.pop(last)
    sections = {"data", "model", "clients", "strategy", "upload", "download", "privacy", "heterogeneity",
                "evaluation", "execution", "attack", "tls"}
    return {k: v for k, v in out.items() if k not in sections}  # what is left there came after the flat layout


def test_a_run_folder_from_before_the_sections_still_reports_and_resumes(tmp_path):
    import yaml

    from fedarena.platform.runs import execute, resolve_saved

    run = tmp_path / "run"
    execute(merged(SIM_BASE, {"checkpoint": {"every": 1}}), out=run, quiet=True, report=False)
    saved = load_yaml(run / "config.yaml")
    flat = _flat_layout(yaml.safe_load((run / "config.yaml").read_text()), FEDSIM_MOVED)
    assert "strategy" not in flat and "aggregation" in flat  # an old flat config, as an older fedarena wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(flat))
    with pytest.raises(ConfigError, match="moved to"):  # a user's old file is still refused...
        build(FedSimConfig, load_yaml(run / "config.yaml"))
    _, cfg = resolve_saved(run / "config.yaml")  # ... the run's own is migrated
    assert cfg == build(FedSimConfig, saved)
    assert main(["report", str(run)]) == 0
    from fedarena.platform.runs import read_metrics

    before = max(r["step"] for r in read_metrics(run))
    execute(None, out=None, resume=run, overrides=["rounds=3"], quiet=True, report=False)
    assert (before, max(r["step"] for r in read_metrics(run))) == (2, 3)
