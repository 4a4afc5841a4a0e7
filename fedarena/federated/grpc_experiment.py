"""Experiment kind ``fedavg_grpc``: a real loopback deployment (scheduler, FL-Servers, client processes).

Launches the processes of :mod:`fedarena.federated.deployment` inside the run folder
(``<run>/deployment``), follows the scheduler's round history and logs, per round: test accuracy
and loss of the global model, mean client training loss, clients selected / reporting, bytes up
and down, the round's duration and how it closed. FedAvg (McMahan et al. 2017) by default; FedProx
(``prox_mu``), FedAdam/FedYogi (``server_optimizer``), compression and local DP by config.
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
from dataclasses import dataclass
from typing import Any, Literal

from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class FedAvgGrpcConfig(ExperimentConfig):
    dataset: Literal["digits", "synthetic"] = param("digits", "data set: scikit-learn digits or synthetic blobs")
    num_clients: int = param(20, "number of FL-Client processes (one data shard each)")
    alpha: float = param(0.5, "Dirichlet label-skew concentration over clients (0 = IID split)")
    hidden: list[int] = param(doc="hidden layer sizes of the MLP", factory=lambda: [64])
    trainer: Literal["engine", "numpy"] = param("engine", "local trainer: fedarena.engine MLP or numpy reference")
    num_servers: int = param(2, "number of FL-Server processes")
    rounds: int = param(30, "number of rounds")
    clients_per_round: int = param(0, "clients selected per round (0 = all candidates)")
    min_fraction: float = param(0.5, "fraction of selected clients needed for a round to count")
    window_seconds: float = param(20.0, "time window of a round, in seconds")
    selection: Literal["uniform", "available"] = param("available", "client selection rule")
    epochs: int = param(2, "local epochs E")
    batch_size: int = param(16, "local minibatch size B")
    lr: float = param(0.1, "local SGD learning rate")
    prox_mu: float = param(0.0, "FedProx proximal coefficient (0 = FedAvg)")
    server_optimizer: Literal["fedavg", "fedadagrad", "fedadam", "fedyogi"] = param("fedavg", "server update rule")
    server_lr: float = param(1.0, "server learning rate (eta)")
    beta1: float = param(0.9, "FedAdam/FedYogi beta1")
    beta2: float = param(0.99, "FedAdam/FedYogi beta2")
    tau: float = param(1e-3, "FedAdam/FedYogi adaptivity tau")
    encoding: Literal["dense", "topk", "q8"] = param("dense", "upload encoder")
    topk_fraction: float = param(0.1, "fraction of entries kept by the topk encoder")
    clip_norm: float = param(0.0, "client-side clipping of the update's L2 norm (0 = off)")
    ldp_epsilon: float = param(0.0, "local DP epsilon per upload (0 = off)")
    ldp_delta: float = param(1e-5, "local DP delta")
    ldp_clip_norm: float = param(1.0, "local DP clipping norm")
    signds_k: int = param(0, "SignDS top-k size (0 = off); when on, clients upload SignDS reports")
    signds_h: int = param(0, "SignDS number of reported dimensions h")
    signds_epsilon: float = param(1.0, "SignDS epsilon per upload")
    signds_lr: float = param(0.01, "SignDS global learning rate")
    secagg: bool = param(False, "secure aggregation (SecAgg) of every round's updates")
    secagg_threshold: float = param(2 / 3, "SecAgg threshold t = floor(f * share holders m) + 1, f in [0.5, 1]; "
                                           "resists 2 t - m - 1 colluding clients with a malicious scheduler")
    secagg_colluders: int = param(-1, "SecAgg: colluding clients to resist with a malicious scheduler; sets "
                                      "t = floor((m + K) / 2) + 1 instead of secagg_threshold (-1 = off)")
    secagg_neighbours: int = param(0, "SecAgg+ neighbourhood size (even; 0 = plain SecAgg)")
    secagg_stage_seconds: float = param(10.0, "window of each SecAgg stage after the first")
    secagg_clip: float = param(1.0, "SecAgg: every update coordinate is clipped to [-clip, clip] before masking")
    secagg_max_examples: int = param(10000, "SecAgg: example counts are clipped to 1..N inside the masked vector")
    secagg_consistency_check: bool = param(True, "SecAgg: signed survivor-list round (malicious-server variant)")
    aggregation: Literal["mean", "median", "trimmed_mean", "krum"] = param(
        "mean", "the scheduler's rule: example-weighted mean, or a Byzantine-robust rule over every client's delta "
        "(coordinate-wise median, trimmed mean, Krum; not with secagg)")
    trim_fraction: float = param(0.2, "trimmed mean: fraction cut at each end of every coordinate")
    krum_byzantine: int = param(0, "Krum's assumed number of Byzantine clients f per round")
    max_client_weight: float = param(0.25, "'mean': no client's weight exceeds this fraction of the round's total "
                                           "(water-filling cap; 1 = uncapped)")
    norm_bound_multiple: float = param(3.0, "'mean': every delta is clipped to this multiple of the round's median "
                                            "update norm (0 = off)")
    max_update_norm: float = param(100.0, "servers refuse updates with a larger L2 norm")
    max_examples: int = param(0, "largest example count a client may declare (0 = the task's largest shard)")
    tls_cert: str = param("", "PEM certificate chain of the nodes (enables TLS)")
    tls_key: str = param("", "PEM private key of the nodes")
    tls_root: str = param("", "PEM root certificate clients trust")
    tls_mutual: bool = param(False, "mutual TLS: every node and client also presents tls_cert, checked against "
                                    "tls_root")
    tls_client_certs: str = param("", "mutual TLS: folder of <client id>.pem/.key, one certificate per client naming "
                                      "its id; nodes refuse a client whose token names another id")
    tls_loopback: bool = param(False, "generate a loopback CA, a node certificate and one certificate per client "
                                      "(named by its id) in the run folder and use mutual TLS between all nodes "
                                      "(instead of tls_cert/tls_key/tls_root)")
    timeout_s: float = param(1800.0, "give up if the deployment has not finished by then")
    restart: bool = param(False, "restart a scheduler or FL-Server process that dies (the scheduler resumes from its "
                                 "state file); otherwise the run fails within seconds, naming it")

    def __post_init__(self) -> None:
        _spec(self)  # every section validates its fields; a ValueError names the field
        if self.num_servers < 1:
            raise ValueError(f"num_servers: must be >= 1, got {self.num_servers}")
        if self.tls_loopback and (self.tls_cert or self.tls_key or self.tls_root or self.tls_client_certs):
            raise ValueError("tls_loopback: generates its own certificates; leave tls_cert/tls_key/tls_root/"
                             "tls_client_certs empty")


def _spec(cfg: FedAvgGrpcConfig):
    from fedarena.federated.client import ClientOptions
    from fedarena.federated.deployment import DeploymentSpec
    from fedarena.federated.protocol import RoundConfig
    from fedarena.federated.scheduler import RoundPolicy
    from fedarena.federated.server import ServerOptions
    from fedarena.federated.strategy import ServerOptimizer
    from fedarena.federated.task import TaskSpec
    from fedarena.federated.transport import TLSFiles

    task = TaskSpec(dataset=cfg.dataset, num_clients=cfg.num_clients, alpha=cfg.alpha, hidden=tuple(cfg.hidden),
                    seed=cfg.seed, trainer=cfg.trainer)
    return DeploymentSpec(
        task=task,
        policy=RoundPolicy(
            rounds=cfg.rounds, clients_per_round=cfg.clients_per_round, min_fraction=cfg.min_fraction,
            window_seconds=cfg.window_seconds, start_clients=cfg.num_clients, selection=cfg.selection,
            round_config=RoundConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, prox_mu=cfg.prox_mu,
                                     signds_k=cfg.signds_k, signds_h=cfg.signds_h,
                                     signds_epsilon=cfg.signds_epsilon, signds_lr=cfg.signds_lr,
                                     secagg=cfg.secagg, secagg_threshold=cfg.secagg_threshold,
                                     secagg_colluders=cfg.secagg_colluders,
                                     secagg_neighbours=cfg.secagg_neighbours,
                                     secagg_stage_seconds=cfg.secagg_stage_seconds, secagg_clip=cfg.secagg_clip,
                                     secagg_max_examples=cfg.secagg_max_examples,
                                     secagg_consistency_check=cfg.secagg_consistency_check),
            server_optimizer=ServerOptimizer(cfg.server_optimizer, cfg.server_lr, cfg.beta1, cfg.beta2, cfg.tau),
            seed=cfg.seed, aggregation=cfg.aggregation, trim_fraction=cfg.trim_fraction,
            krum_byzantine=cfg.krum_byzantine, max_client_weight=cfg.max_client_weight,
            norm_bound_multiple=cfg.norm_bound_multiple,
        ),
        server=ServerOptions(max_update_norm=cfg.max_update_norm, max_examples=_max_examples(cfg, task)),
        client=ClientOptions(encoding=cfg.encoding, topk_fraction=cfg.topk_fraction, clip_norm=cfg.clip_norm,
                             ldp_epsilon=cfg.ldp_epsilon, ldp_delta=cfg.ldp_delta, ldp_clip_norm=cfg.ldp_clip_norm,
                             secagg_min_threshold=cfg.secagg_threshold, secagg_min_colluders=cfg.secagg_colluders,
                             seed=cfg.seed),
        num_servers=cfg.num_servers,
        init_seed=cfg.seed,
        tls=TLSFiles(cert_chain=cfg.tls_cert, private_key=cfg.tls_key, root_cert=cfg.tls_root,
                     server_name="localhost" if cfg.tls_root else "", mutual=cfg.tls_mutual,
                     client_certs=cfg.tls_client_certs),
    )


def _max_examples(cfg: FedAvgGrpcConfig, task) -> int:
    """The servers' bound on declared example counts: the config's, or the largest shard of the task's split."""
    if cfg.max_examples < 0:
        raise ValueError(f"max_examples: must be >= 0, got {cfg.max_examples}")
    if cfg.max_examples:
        return cfg.max_examples
    from fedarena.federated.task import max_shard

    return max_shard(task)  # the split every node rebuilds from the same TaskSpec


def _secagg_summary(cfg: FedAvgGrpcConfig, spec) -> dict[str, Any]:
    """What the secure rounds' threshold resists, at the configured number of clients per round."""
    if not cfg.secagg:
        return {}
    from fedarena.federated.secure_round import colluders_tolerated, holders, threshold

    rc, n = spec.policy.round_config, cfg.clients_per_round or cfg.num_clients
    return {"secagg_threshold_t": threshold(rc, n), "secagg_share_holders": holders(rc, n),
            "secagg_colluders_tolerated": colluders_tolerated(rc, n),
            "secagg_dropouts_tolerated": holders(rc, n) - threshold(rc, n)}


_METRICS = ("test_acc", "test_loss", "train_loss", "reporting", "selected", "bytes_up", "bytes_down",
            "duration_s", "model_version")


def run(cfg: FedAvgGrpcConfig, run) -> dict[str, Any]:
    from fedarena.federated.deployment import NodeExited

    spec = _spec(cfg)  # validates the config before any process starts
    if cfg.tls_loopback:
        import dataclasses

        from fedarena.federated.certs import loopback_pki

        from fedarena.federated.deployment import client_name

        spec = dataclasses.replace(spec, tls=loopback_pki(run.dir / "deployment" / "tls", client_ids=[
            client_name(i) for i in range(cfg.num_clients)]))
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
        self.logged, self.model_version = int(state["round"]), int(state["model_version"])

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
            self.end = time.monotonic() + self.cfg.timeout_s
            self.dep.start()
        if not self.pending:
            self.pending = self._wait(step)
        row = self.pending.pop(0)
        self.logged, self.model_version = row["round"], row["model_version"]
        metrics = {k: row[k] for k in _METRICS if k in row}
        metrics["aggregated"] = int(row["outcome"] == "aggregated")
        metrics["bytes_total"] = row["bytes_up"] + row["bytes_down"]
        metrics["closed_by_deadline"] = int(row["close_reason"] == "deadline")
        return metrics

    def _wait(self, step: int) -> list[dict[str, Any]]:
        """The scheduler's closed rounds from ``step`` on, once it has closed round ``step``."""
        from fedarena.platform.errors import RunError

        cfg, dep = self.cfg, self.dep
        try:
            status = dep.wait_for(lambda s: len(s["history"]) >= step or s["phase"] == "done",
                                  timeout=max(1.0, self.end - time.monotonic()),
                                  watch=lambda: dep.check_nodes(restart=cfg.restart))
        except TimeoutError:
            raise RunError(f"timeout_s: the deployment did not finish {cfg.rounds} rounds within "
                           f"{cfg.timeout_s:g} s (last logged round {self.logged}; node logs in "
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
