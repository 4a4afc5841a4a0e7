"""Experiment kind ``fedavg_grpc``: a real loopback deployment (scheduler, FL-Servers, client processes).

Launches the processes of :mod:`fedarena.federated.deployment` inside the run folder
(``<run>/deployment``), follows the scheduler's round history and logs, per round: test accuracy
and loss of the global model, mean client training loss, clients selected / reporting, bytes up
and down, the round's duration and how it closed. FedAvg (McMahan et al. 2017) by default; FedProx
(``clients.prox_mu``), FedAdam/FedYogi (``strategy.server_optimizer``), compression, local DP and SecAgg by config;
device budgets, HeteroFL / FedRolex sub-models and int8 downloads trained quantization-aware by the ``devices``
section (each client's cost per round in the run folder's ``device_costs.csv``; docs/devices.md).
The driver runs under the platform's loop (:func:`fedarena.platform.loop.run_loop`), one step per round.
Resuming (``fedarena run --resume RUN``) restarts every process; the scheduler continues from its
state file (last completed round, identical model bytes), and rounds it closed after the run's checkpoint
are logged again from its history. The driver watches the scheduler and FL-Server processes while it
waits: one that exits fails the run within a poll (a :class:`RunError` naming it, with the resume
command), or, with ``restart: true``, is started again (the scheduler on its old port, from its state
file).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from fedarena.federated.config import (GRPC_MOVED, AttackConfig, DevicesConfig, FLExperimentConfig, GrpcClientsConfig,
                                       GrpcExecutionConfig,
                                       GrpcPrivacyConfig, GrpcStrategyConfig, GrpcUploadConfig, TaskDataConfig,
                                       TaskModelConfig, TLSConfig)
from fedarena.platform.experiment import Experiment, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class FedAvgGrpcConfig(FLExperimentConfig):
    """A loopback deployment, section by section (:mod:`fedarena.federated.config`; ``clients``,
    ``strategy.server_optimizer`` and ``privacy.ldp`` / ``privacy.signds`` mean what they mean in ``fedsim``)."""

    MOVED: ClassVar[dict[str, str]] = GRPC_MOVED

    SECTIONS = {"data": TaskDataConfig, "model": TaskModelConfig, "clients": GrpcClientsConfig,
                "strategy": GrpcStrategyConfig, "upload": GrpcUploadConfig, "privacy": GrpcPrivacyConfig,
                "execution": GrpcExecutionConfig, "tls": TLSConfig, "attack": AttackConfig, "devices": DevicesConfig}
    rounds: int = param(30, "number of rounds")

    def check_sections(self) -> None:
        secagg = self.privacy.secagg.enabled
        if secagg and self.strategy.aggregation != "mean":
            raise ValueError(f"strategy.aggregation: '{self.strategy.aggregation}' needs every client's delta, which "
                             "secure aggregation hides; use 'mean' with privacy.secagg")
        if secagg and self.privacy.signds.on:
            raise ValueError("privacy.secagg.enabled: cannot be combined with SignDS (privacy.signds.k > 0)")
        if secagg and (self.clients.per_round or self.data.num_clients) < 3:
            raise ValueError("privacy.secagg.enabled: a secure round needs at least 3 clients per round")
        if self.attack.kind in ("alie", "ipm", "min_max", "min_sum"):
            raise ValueError(f"attack.kind: {self.attack.kind} is computed from the round's honest updates, which a "
                             "client of the gRPC runtime never sees (it has only its own data); use sign_flip, scale, "
                             "label_flip or backdoor, or the fedsim kind")
        if self.attack.count(self.data.num_clients) > self.data.num_clients:
            raise ValueError(f"attack.num_attackers: {self.attack.count(self.data.num_clients)} attackers exceed the "
                             f"{self.data.num_clients} clients (data.num_clients)")
        if self.devices.enabled:
            _check_devices(self)
        _policy(self)  # the runtime's own limits across fields (e.g. the SecAgg fixed-point capacity); no data read


def _check_devices(cfg: FedAvgGrpcConfig) -> None:
    """What device budgets support in the runtime: the MLP, the plain per-coordinate mean of dense sub-model
    updates, no SecAgg, SignDS, local DP or attack; int8 clients train plain SGD (no FedProx), as in fedsim."""
    if not cfg.model.hidden and cfg.devices.submodel != "none":
        raise ValueError("model.hidden: width-scaled sub-models need at least one hidden layer")
    if cfg.strategy.aggregation != "mean":
        raise ValueError("strategy.aggregation: devices.enabled averages sub-model updates per coordinate; use mean")
    if cfg.upload.encoding != "dense" or cfg.upload.clip_norm > 0:
        raise ValueError("upload.encoding: devices.enabled sends dense float32 sub-model updates (the cost model "
                         "prices them); set upload.encoding to dense and upload.clip_norm to 0")
    p = cfg.privacy
    if p.secagg.enabled or p.signds.on or p.ldp.epsilon > 0 or cfg.attack.kind != "none":
        raise ValueError("devices.enabled: SecAgg, SignDS, local DP and attacks need whole-model updates; turn them "
                         "off")
    if cfg.devices.int8_download and cfg.clients.prox_mu > 0:
        raise ValueError("clients.prox_mu: clients that receive int8 models (devices.int8_download) train plain SGD "
                         "quantization-aware; set clients.prox_mu to 0")


def _policy(cfg: FedAvgGrpcConfig):
    """The scheduler's :class:`~fedarena.federated.scheduler.RoundPolicy` of ``cfg``."""
    from fedarena.federated.protocol import RoundConfig
    from fedarena.federated.scheduler import RoundPolicy

    c, s, p = cfg.clients, cfg.strategy, cfg.privacy
    sa = p.secagg
    return RoundPolicy(
        rounds=cfg.rounds, clients_per_round=c.per_round, min_fraction=c.min_fraction,
        window_seconds=c.window_seconds, start_clients=cfg.data.num_clients, selection=c.selection,
        round_config=RoundConfig(epochs=c.epochs, batch_size=c.batch_size, lr=c.lr, prox_mu=c.prox_mu,
                                 signds_k=p.signds.k, signds_h=p.signds.h, signds_epsilon=p.signds.epsilon,
                                 signds_lr=p.signds.lr, secagg=sa.enabled, secagg_threshold=sa.threshold,
                                 secagg_colluders=sa.colluders, secagg_neighbours=sa.neighbours,
                                 secagg_stage_seconds=sa.stage_seconds, secagg_clip=sa.clip,
                                 secagg_max_examples=sa.max_examples, secagg_consistency_check=sa.consistency_check),
        server_optimizer=s.server_optimizer.build(), seed=cfg.seed, aggregation=s.aggregation,
        trim_fraction=s.trim_fraction, krum_byzantine=s.krum_byzantine, max_client_weight=s.max_client_weight,
        norm_bound_multiple=s.norm_bound_multiple)


def _devices(cfg: FedAvgGrpcConfig, task: Any) -> dict[str, Any]:
    """The policy's device fleet, width levels and client ids (``devices.enabled``; {} otherwise), and with int8
    downloads the scheduler's calibration sample (fedsim's draw from the clients' training pool): the task's layer
    sizes need its data, so this runs when the deployment is built, not when the config is checked."""
    if not cfg.devices.enabled:
        return {}
    from fedarena.federated.deployment import client_name
    from fedarena.federated.task import build_task

    built = build_task(task)
    fleet, widths = cfg.devices.build(built.sizes, cfg.data.num_clients, cfg.seed)
    out = {"devices": fleet, "widths": widths,
           "device_clients": tuple(client_name(i) for i in range(cfg.data.num_clients))}
    if fleet.int8_tiers is not None:
        import numpy as np

        from fedarena.federated.int8_clients import calibration_sample

        off = np.cumsum([0] + [len(y) for _, y in built.clients])
        out["int8_calibration"] = calibration_sample(np.concatenate([x for x, _ in built.clients]),
                                                     [np.arange(a, b) for a, b in zip(off[:-1], off[1:])],
                                                     cfg.seed, fleet.int8_calibration)
    return out


def _spec(cfg: FedAvgGrpcConfig):
    """The deployment of ``cfg``: the sections built into the runtime's objects."""
    from fedarena.federated.client import ClientOptions
    from fedarena.federated.deployment import DeploymentSpec
    from fedarena.federated.server import ServerOptions
    from fedarena.federated.task import TaskSpec

    u, p = cfg.upload, cfg.privacy
    sa = p.secagg
    task = TaskSpec(dataset=cfg.data.dataset, num_clients=cfg.data.num_clients, alpha=cfg.data.alpha,
                    hidden=tuple(cfg.model.hidden), seed=cfg.seed, trainer=cfg.model.trainer,
                    model=cfg.model.task_model())
    return DeploymentSpec(
        task=task,
        policy=replace(_policy(cfg), **_devices(cfg, task)),
        server=ServerOptions(max_update_norm=u.max_update_norm, max_examples=_max_examples(cfg, task)),
        client=ClientOptions(encoding=u.encoding, topk_fraction=u.topk_fraction, clip_norm=u.clip_norm,
                             ldp_epsilon=p.ldp.epsilon, ldp_delta=p.ldp.delta, ldp_clip_norm=p.ldp.clip_norm,
                             secagg_min_threshold=sa.threshold, secagg_min_colluders=sa.colluders, seed=cfg.seed),
        num_servers=cfg.execution.num_servers,
        init_seed=cfg.seed,
        tls=cfg.tls.build(),
        attack=_attack_spec(cfg),
    )


def _attack_spec(cfg: FedAvgGrpcConfig) -> dict[str, Any]:
    """The deployment's malicious clients (:func:`fedarena.federated.attacks.client_attack`); {} when none. The
    public round facts an attacker uses: ``n`` = clients per round, the server learning rate; a backdoor's boost
    ``n / (eta a)`` takes ``a`` = the coalition's expected share of a round (a client cannot count the attackers)."""
    a = cfg.attack
    members = a.coalition(cfg.data.num_clients, cfg.seed)
    if not members:
        return {}
    n = cfg.clients.per_round or cfg.data.num_clients
    lr = cfg.strategy.server_optimizer.lr
    params = a.attack_params()
    if a.kind == "backdoor" and a.boost == 0:
        params["boost"] = n / (lr * max(1, round(n * len(members) / cfg.data.num_clients)))
    return {"kind": a.kind, "params": params, "clients": members, "num_updates": n, "server_lr": lr,
            "seed": cfg.seed}


def _max_examples(cfg: FedAvgGrpcConfig, task) -> int:
    """The servers' bound on declared example counts: the config's, or the largest shard of the task's split."""
    if cfg.upload.max_examples:
        return cfg.upload.max_examples
    from fedarena.federated.task import max_shard

    return max_shard(task)  # the split every node rebuilds from the same TaskSpec


def _secagg_summary(cfg: FedAvgGrpcConfig, spec) -> dict[str, Any]:
    """What the secure rounds' threshold resists, at the configured number of clients per round."""
    if not cfg.privacy.secagg.enabled:
        return {}
    from fedarena.federated.secure_round import colluders_tolerated, holders, threshold

    rc, n = spec.policy.round_config, cfg.clients.per_round or cfg.data.num_clients
    return {"secagg_threshold_t": threshold(rc, n), "secagg_share_holders": holders(rc, n),
            "secagg_colluders_tolerated": colluders_tolerated(rc, n),
            "secagg_dropouts_tolerated": holders(rc, n) - threshold(rc, n)}


_METRICS = ("test_acc", "test_loss", "train_loss", "reporting", "selected", "bytes_up", "bytes_down",
            "duration_s", "model_version")


def run(cfg: FedAvgGrpcConfig, run) -> dict[str, Any]:
    from fedarena.federated.deployment import NodeExited

    spec = _spec(cfg)  # builds every runtime object before any process starts
    if cfg.tls.loopback:
        import dataclasses

        from fedarena.federated.certs import loopback_pki

        from fedarena.federated.deployment import client_name

        spec = dataclasses.replace(spec, tls=loopback_pki(run.dir / "deployment" / "tls", client_ids=[
            client_name(i) for i in range(cfg.data.num_clients)]))
    rounds = _RoundSteps(cfg, run, spec)
    try:
        return _secagg_summary(cfg, spec) | run_loop(run, rounds)
    except NodeExited as e:
        raise NodeExited(f"{e}{rounds.resume_hint}") from None
    finally:
        rounds.stop()


class _RoundSteps:
    """fedavg_grpc under :func:`~fedarena.platform.loop.run_loop`: a step waits until the scheduler has closed the
    next round (aggregated or abandoned), watching the scheduler and FL-Server processes meanwhile, and returns the
    round's row. The deployment starts at the first step, so a resume whose checkpoint already meets ``rounds``
    starts no process. The checkpoint is the round counter; the model lives in the scheduler's state file."""

    def __init__(self, cfg: FedAvgGrpcConfig, run: Any, spec: Any):
        self.cfg, self.run, self.spec = cfg, run, spec
        self.dep: Any = None
        self.logged, self.model_version = 0, 0
        self.pending: list[dict[str, Any]] = []  # closed rounds not yet logged (oldest first)
        self.end = 0.0
        self.resume_hint = f"; continue the run with: fedarena run --resume {run.dir}"
        self.desc, self.total = "fedavg_grpc", cfg.rounds

    def init(self) -> None:
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        from fedarena.federated.fedsim_experiment import DEVICE_RECORDS, drop_device_records_after

        self.logged, self.model_version = int(state["round"]), int(state["model_version"])
        drop_device_records_after(self.run.dir / DEVICE_RECORDS, self.logged)  # later rounds are logged again

    def state(self) -> dict[str, Any]:
        return {"round": self.logged, "model_version": self.model_version}

    def done(self) -> bool:
        return self.logged >= self.cfg.rounds

    def units(self) -> int:
        return self.logged

    def step(self, step: int) -> dict[str, Any]:
        if self.dep is None:
            from fedarena.federated.deployment import Deployment

            self.dep = Deployment(self.run.dir / "deployment", self.spec)
            self.end = time.monotonic() + self.cfg.execution.timeout_s
            self.dep.start()
        if not self.pending:
            self.pending = self._wait(step)
        row = self.pending.pop(0)
        self.logged, self.model_version = row["round"], row["model_version"]
        metrics = {k: row[k] for k in _METRICS if k in row}
        metrics["aggregated"] = int(row["outcome"] == "aggregated")
        metrics["bytes_total"] = row["bytes_up"] + row["bytes_down"]
        metrics["closed_by_deadline"] = int(row["close_reason"] == "deadline")
        if "device_costs" in row:
            metrics.update(self._device_costs(row))
        return metrics

    def _device_costs(self, row: dict[str, Any]) -> dict[str, float]:
        """Device budgets: append the round's per-client costs to the run folder's ``device_costs.csv`` (the
        fedsim kind's columns) and return the round's clients per level (and int8 clients) and largest time and
        memory."""
        from fedarena.federated.fedsim_experiment import DEVICE_RECORDS, write_device_records

        recs = [{"round": row["round"], "client": c, "int8": 0, **d} for c, d in sorted(row["device_costs"].items())]
        write_device_records(self.run.dir / DEVICE_RECORDS, recs)
        levels = 1 if self.cfg.devices.submodel == "none" else len(self.cfg.devices.width_levels)
        out: dict[str, float] = {f"level{k}_clients": sum(r["level"] == k for r in recs) for k in range(levels)}
        if self.cfg.devices.int8_download:
            out["int8_clients"] = sum(r["int8"] for r in recs)
        if recs:
            out["device_seconds_max"] = max(r["seconds"] for r in recs)
            out["device_memory_max_mb"] = max(r["memory_bytes"] for r in recs) / 1e6
            out["over_budget"] = sum(r["memory_bytes"] > r["memory_budget"] or r["seconds"] > r["time_budget"]
                                     for r in recs)
        return out

    def _wait(self, step: int) -> list[dict[str, Any]]:
        """The scheduler's closed rounds from ``step`` on, once it has closed round ``step``."""
        from fedarena.platform.errors import RunError

        cfg, dep = self.cfg, self.dep
        try:
            status = dep.wait_for(lambda s: len(s["history"]) >= step or s["phase"] == "done",
                                  timeout=max(1.0, self.end - time.monotonic()),
                                  watch=lambda: dep.check_nodes(restart=cfg.execution.restart))
        except TimeoutError:
            raise RunError(f"execution.timeout_s: the deployment did not finish {cfg.rounds} rounds within "
                           f"{cfg.execution.timeout_s:g} s (last logged round {self.logged}; node logs in "
                           f"{self.run.dir / 'deployment' / 'logs'}){self.resume_hint}") from None
        rows = [r for r in status["history"] if r["round"] >= step]
        if not rows or rows[0]["round"] != step:  # the scheduler closes rounds 1, 2, ... one history row each
            raise RunError(f"rounds: the scheduler finished at round {len(status['history'])} without round {step} "
                           f"(node logs in {self.run.dir / 'deployment' / 'logs'}){self.resume_hint}")
        return rows

    def stop(self) -> None:
        if self.dep is not None:
            self.dep.stop()

    def summary(self) -> dict[str, Any]:
        history = self.run.rows()  # every logged round (rows before a resume included), one row per round
        last = history[-1] if history else {}
        return {
            "test_acc": float(last.get("test_acc", float("nan"))),
            "test_loss": float(last.get("test_loss", float("nan"))),
            "rounds_aggregated": sum(r["aggregated"] for r in history),
            "rounds_abandoned": sum(1 - r["aggregated"] for r in history),
            "model_version": int(last.get("model_version", 0)),
            "mean_bytes_per_client_round": (sum(r["bytes_total"] for r in history)
                                            / max(1, sum(r.get("reporting", 0) for r in history))),
            "last_round": int(self.logged),
        }


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    if not rows:
        return []
    r = [row["step"] for row in rows]
    fig, ax = plt.subplots(2, 2, figsize=(10, 6.5))
    ax[0, 0].plot(r, [row.get("test_acc", float("nan")) for row in rows], "o-", ms=3)
    ax[0, 0].set_title("test accuracy of the global model")
    ax[0, 1].plot(r, [row.get("test_loss", float("nan")) for row in rows], "o-", ms=3, label="test")
    if any("train_loss" in row for row in rows):  # secure rounds release no per-client training loss
        ax[0, 1].plot(r, [row.get("train_loss", float("nan")) for row in rows], "s-", ms=3, label="client train")
    ax[0, 1].set_title("cross-entropy loss")
    ax[0, 1].legend(fontsize=8)
    ax[1, 0].bar(r, [row.get("selected", 0) for row in rows], color="0.8", label="selected")
    ax[1, 0].bar(r, [row.get("reporting", 0) for row in rows], color="C0", label="reporting")
    ax[1, 0].set_title("clients per round")
    ax[1, 0].legend(fontsize=8)
    ax[1, 1].bar(r, [row.get("bytes_up", 0) / 1e3 for row in rows], label="up")
    ax[1, 1].bar(r, [row.get("bytes_down", 0) / 1e3 for row in rows], bottom=[row.get("bytes_up", 0) / 1e3 for row in rows],
                 label="down")
    ax[1, 1].set_title("kB per round")
    ax[1, 1].legend(fontsize=8)
    for a in ax.flat:
        a.set_xlabel("round")
        a.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(report_dir) / "federated.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


EXPERIMENT = Experiment(config=FedAvgGrpcConfig, run=run, plots=plots,
                        summary_keys=("test_acc", "test_loss", "reporting", "bytes_total", "model_version"))
