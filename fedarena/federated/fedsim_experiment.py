"""Experiment kind ``fedsim``: federated simulation of many clients in one process (or on Ray).

Builds the federated data set (:mod:`fedarena.federated.data`; the data sets read per client from ``data.path``
come from :mod:`fedarena.federated.datasets`, and a run then writes ``data_manifest.json`` and logs the data
pipeline's per-stage seconds each round), the strategy and its stages
(:mod:`fedarena.federated.strategy`, :mod:`fedarena.federated.stages`, compression, DP-FedAvg, SecAgg)
and runs :class:`fedarena.federated.simulation.Simulation`, logging per round: global test accuracy
and loss, the per-client held-out accuracy distribution (mean, 10th percentile, worst), clients
selected / reporting / stragglers, exact bytes up and down, the divergence of the client updates,
local steps, and DP epsilon. The report draws these, the per-client label histogram of the split, and
(with ``evaluation.personalize_epochs``) per-client accuracy before and after local fine-tuning. Under device
budgets (the ``devices`` section, docs/devices.md) a run also writes ``device_costs.csv`` (each trained client's
memory, seconds, FLOPs and bytes against its budgets, per round), logs the clients per width level and each
level's accuracy, and its report draws them (``devices.png``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedarena.federated.config import (FEDSIM_MOVED, AttackConfig, DataConfig, DevicesConfig, DownloadConfig,
                                       EvaluationConfig, ExecutionConfig,
                                       FLExperimentConfig, HeterogeneityConfig, ModelConfig, SimClientsConfig,
                                       SimPrivacyConfig, StrategyConfig, UploadConfig)
from fedarena.platform.config import ConfigError
from fedarena.platform.experiment import Experiment, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class FedSimConfig(FLExperimentConfig):
    """A federated simulation, section by section (:mod:`fedarena.federated.config`); ``attack`` plants a
    colluding coalition (it sees each round's honest updates), ``strategy.defence`` defends the aggregation."""

    MOVED: ClassVar[dict[str, str]] = FEDSIM_MOVED

    SECTIONS = {"data": DataConfig, "model": ModelConfig, "clients": SimClientsConfig, "strategy": StrategyConfig,
                "upload": UploadConfig, "download": DownloadConfig, "privacy": SimPrivacyConfig,
                "heterogeneity": HeterogeneityConfig, "attack": AttackConfig, "evaluation": EvaluationConfig,
                "execution": ExecutionConfig, "devices": DevicesConfig}
    rounds: int = param(50, "number of rounds (server steps in the asynchronous server modes)")

    def check_sections(self) -> None:
        priv, agg = self.privacy, self.strategy.aggregation
        if priv.secagg.enabled and agg != "fedavg":
            raise ValueError("privacy.secagg.enabled: secure aggregation gives only the sum, so "
                             "strategy.aggregation must be fedavg")
        if priv.dp.on and (priv.secagg.enabled or agg != "fedavg"):
            raise ValueError("privacy.dp.noise_multiplier: DP-FedAvg wraps plain fedavg aggregation without secagg")
        if priv.dp.on and self.clients.per_round:
            raise ValueError(f"clients.per_round: DP-FedAvg samples every client with probability "
                             f"privacy.dp.sample_rate ({priv.dp.sample_rate:g}); set clients.per_round to 0, got "
                             f"{self.clients.per_round}")
        if priv.signds.on and self.upload.codec != "dense":
            raise ValueError("privacy.signds.k: SignDS replaces the upload codec; leave upload.codec dense")
        if self.model.arch.startswith("torch:") and self.execution.backend != "vmap":
            raise ValueError("model.arch: a torch model trains with execution.backend vmap (the ray backend rebuilds "
                             "its models from a spec)")
        if self.strategy.server_mode != "rounds":
            _check_async(self)
        if self.strategy.defence.on and (priv.secagg.enabled or priv.dp.on):
            raise ValueError(f"strategy.defence.kind: {self.strategy.defence.kind} needs every individual update; "
                             "secure aggregation and DP-FedAvg give the server only their sum")
        if self.devices.enabled:
            _check_devices(self)
        if self.attack.count(self.data.num_clients) > self.data.num_clients:
            raise ValueError(f"attack.num_attackers: {self.attack.count(self.data.num_clients)} attackers exceed the "
                             f"{self.data.num_clients} clients (data.num_clients)")


def _check_devices(cfg: FedSimConfig) -> None:
    """What training under device budgets supports: the MLP (with a hidden layer when sub-models are on), plain
    FedAvg-family aggregation of dense updates in rounds on the vmap backend, no attack, defence, DP-FedAvg,
    SecAgg or SignDS (each needs whole-model updates), the device clock instead of the speed-based time model."""
    if cfg.model.arch != "mlp":
        raise ValueError(f"model.arch: width-scaled sub-models (devices.enabled) are defined for the MLP, got "
                         f"{cfg.model.arch}")
    if cfg.devices.submodel != "none" and not cfg.model.hidden:
        raise ValueError("model.hidden: width-scaled sub-models need at least one hidden layer")
    if cfg.strategy.aggregation != "fedavg" or cfg.strategy.defence.on or cfg.strategy.server_mode != "rounds":
        raise ValueError("strategy.aggregation: devices.enabled averages sub-model updates per coordinate; use "
                         "aggregation fedavg, no defence, server_mode rounds")
    if cfg.upload.codec != "dense" or cfg.download.codec != "dense":
        raise ValueError("upload.codec: devices.enabled sends dense float32 sub-models (the cost model prices "
                         "them); set upload.codec and download.codec to dense")
    p = cfg.privacy
    if p.dp.on or p.secagg.enabled or p.signds.on or cfg.attack.kind != "none":
        raise ValueError("devices.enabled: DP-FedAvg, SecAgg, SignDS and attacks need whole-model updates; turn "
                         "them off")
    h = cfg.heterogeneity
    if h.window_s > 0 or h.straggler_fraction > 0:
        raise ValueError("heterogeneity.window_s: the device profiles time the clients; set heterogeneity.window_s "
                         "and straggler_fraction to 0")
    if cfg.execution.backend != "vmap":
        raise ValueError("execution.backend: devices.enabled trains with the vmap backend")
    if cfg.evaluation.personalize_epochs:
        raise ValueError("evaluation.personalize_epochs: personalization fine-tunes the global model, not the "
                         "clients' sub-models; set it to 0 with devices.enabled")
    if cfg.devices.int8_download and cfg.clients.prox_mu > 0:
        raise ValueError("clients.prox_mu: clients that receive int8 models (devices.int8_download) train plain SGD "
                         "through fake quantization; set prox_mu to 0")


def _round_only(cfg: FedSimConfig) -> dict[str, tuple[Any, Any]]:
    """Settings the asynchronous server modes do not implement (they are round-based): path -> (value, default)."""
    d = FedSimConfig(kind="fedsim")
    pick = lambda c: {  # noqa: E731
        "strategy.aggregation": c.strategy.aggregation, "strategy.server_optimizer.name": c.strategy.server_optimizer.name,
        "upload.codec": c.upload.codec, "download.codec": c.download.codec, "upload.clip_norm": c.upload.clip_norm,
        "privacy.ldp.epsilon": c.privacy.ldp.epsilon, "privacy.signds.k": c.privacy.signds.k,
        "privacy.dp.noise_multiplier": c.privacy.dp.noise_multiplier, "privacy.secagg.enabled": c.privacy.secagg.enabled,
        "clients.step_schedule": c.clients.step_schedule, "heterogeneity": c.heterogeneity, "attack": c.attack,
        "strategy.defence": c.strategy.defence,
        "execution.backend": c.execution.backend, "execution.engine_backend": c.execution.engine_backend,
        "evaluation.personalize_epochs": c.evaluation.personalize_epochs, "devices.enabled": c.devices.enabled}
    now, default = pick(cfg), pick(d)
    return {k: (now[k], default[k]) for k in now}


def _check_async(cfg: FedSimConfig) -> None:
    for name, (value, default) in _round_only(cfg).items():
        if value != default:
            shown = "its defaults" if name in ("heterogeneity", "attack", "strategy.defence") else f"{default!r}"
            raise ValueError(f"{name}: strategy.server_mode {cfg.strategy.server_mode} runs plain FedAvg with dense "
                             f"uploads; set {name} to {shown} or use server_mode rounds")


@dataclass
class StepSchedule:
    """Local steps per round (the FL chapter's adaptive aggregation frequency): ``fixed``; ``linear`` from
    ``steps_min`` growing by one a round up to ``steps_max`` (few local steps early, more later); or
    ``divergence``: halve the steps when the last round's client-update divergence
    ``mean_i ||Delta_i - mean||^2 / ||mean||^2`` exceeds the target, double them when below."""

    kind: str
    lo: int
    hi: int
    target: float
    current: int = 0

    def steps(self, rnd: int, last_divergence: float | None) -> int:
        if self.kind == "linear":
            return min(self.hi, self.lo + rnd - 1)
        if not self.current:
            self.current = self.lo
        elif last_divergence is not None and np.isfinite(last_divergence):
            self.current = max(self.lo, self.current // 2) if last_divergence > self.target else \
                min(self.hi, self.current * 2)
        return self.current


_DATA_FIELDS = {"partition.name": "data.partition", "partition.num_clients": "data.num_clients",
                "partition.alpha": "data.alpha", "partition.beta": "data.beta",
                "partition.shards_per_client": "data.shards_per_client", "data.size_min": "data.synthetic_size_min"}
"""The data module's field names that differ from the ``data`` section's paths."""


def build(cfg: FedSimConfig):
    """The data set and the :class:`~fedarena.federated.simulation.Simulation` of ``cfg``, section by section."""
    from fedarena.federated import data
    from fedarena.federated.simulation import Simulation

    try:
        d = data.load(cfg.data.build(), cfg.seed)
    except data.DataError as e:  # named by the data module's field: the section's path instead
        raise ConfigError(f"{_DATA_FIELDS.get(e.field, e.field)}: {e.reason}") from None
    try:
        cfg.clients.check_clients(d.num_clients)  # a LEAF folder may hold fewer users than data.num_clients
        model = cfg.model.build(d.num_features, d.num_classes)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    ids = [f"c{i}" for i in range(d.num_clients)]
    x, y, train, test, strategy = _attacked(cfg, d, model, ids)
    upload_stages, upload = cfg.upload.build()
    if cfg.privacy.ldp.on:
        upload_stages.append(cfg.privacy.ldp.build())
    if cfg.privacy.signds.on:
        upload = cfg.privacy.signds.build()
    kw: dict[str, Any] = {}
    if upload is not None:
        kw["upload"] = upload
    download = cfg.download.build(cfg.seed)
    if download is not None:
        kw["download"] = download
    held_out = d.held_out
    if hasattr(held_out, "sizes") and not held_out.sizes().any():
        held_out = None  # streamed clients without held-out examples: no per-client evaluation pass over them all
    if getattr(model, "sequence", False):  # a language model: its every-token test accuracies too
        from fedarena.federated.datasets import token_accuracy_masks

        kw["token_masks"] = token_accuracy_masks(d.name, d.num_classes) or None
    if cfg.devices.enabled:
        try:
            kw["devices"], kw["widths"] = cfg.devices.build(model.sizes, d.num_clients, cfg.seed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    sim = Simulation(model, strategy, x, y, train, ids, d.num_classes,
                     seed=cfg.seed, held_out=held_out, test=test, heterogeneity=cfg.heterogeneity.build(),
                     upload_stages=upload_stages, backend=cfg.execution.backend,
                     engine_backend=cfg.execution.engine_backend, threads=cfg.execution.threads,
                     max_stacked_clients=cfg.execution.max_stacked_clients, ray_workers=cfg.execution.ray_workers,
                     ray_groups_per_task=cfg.execution.ray_chunk, eval_every=cfg.evaluation.every,
                     privacy_seed=cfg.privacy.seed, **kw)
    return d, sim


def _attacked(cfg: FedSimConfig, d: Any, model: Any, ids: list[str]):
    """The examples, the test set and the strategy with ``attack`` and ``strategy.defence`` applied: the coalition's
    local data poisoned (label flip, backdoor), FLTrust's root set taken out of the test split (the first
    ``root_size`` of its seeded permutation; the test set is the rest), the defence in place of the aggregation,
    privacy wrapped around it and the coalition outermost (it replaces its updates before anything aggregates)."""
    from fedarena.federated.defences import RootSet

    test = d.test_set()
    root = None
    defence = cfg.strategy.defence
    if defence.kind == "fltrust":
        if defence.root_size >= len(test[1]):
            raise ConfigError(f"strategy.defence.root_size: {defence.root_size} root examples leave none of the "
                              f"{len(test[1])} test examples")
        pick = np.random.default_rng([cfg.seed, 31]).permutation(len(test[1]))
        r, t = pick[:defence.root_size], pick[defence.root_size:]
        root = RootSet(model, test[0][r], test[1][r], d.num_classes, cfg.seed)
        test = (test[0][t], test[1][t])
    try:
        plan = cfg.attack.build(ids, d.num_classes, cfg.seed)
        x, y, train = plan.data(d.x, d.y, d.train, ids)
    except ValueError as e:
        raise ConfigError(f"attack.{e}") from None
    inner = defence.build(cfg.strategy.build(cfg.clients.build(), cfg.clients.per_round), root=root, seed=cfg.seed)
    return x, y, train, test, plan.strategy(cfg.privacy.wrap(inner, d.num_clients, cfg.seed))


def _with_steps(strategy: Any, steps: int) -> Any:
    """``strategy`` with ``steps`` local steps: the innermost strategy's ``fit`` replaced, every wrapper around it
    copied with its state (a defence's momentum centre, the coalition) kept."""
    import copy
    from dataclasses import replace

    if hasattr(strategy, "fit"):
        return replace(strategy, fit=replace(strategy.fit, local_steps=steps))
    out = copy.copy(strategy)
    object.__setattr__(out, "inner", _with_steps(strategy.inner, steps))
    return out


def run(cfg: FedSimConfig, run) -> dict[str, Any]:
    from fedarena.federated import data

    d, sim = build(cfg)
    if cfg.execution.backend == "ray":
        from fedarena.platform.cluster import init_ray

        init_ray(cfg.cluster)
    params = cfg.model.init_params(sim.model, cfg.seed)
    state = sim.init_state(params)
    sim.final_round = cfg.rounds
    if cfg.data.path:  # read from data.path: the manifest of the files this run used
        from fedarena.federated.datasets.manifest import data_files, write_manifest

        write_manifest(list(getattr(d, "files", ())) or data_files(cfg.data.path), run.dir, cfg.data.dataset)
    # the histogram of a large population covers its first clients (the figure draws at most 200)
    hist = data.label_histogram(d.y, d.train[:HISTOGRAM_CLIENTS], d.num_classes)
    np.save(run.dir / "label_histogram.npy", hist)
    if cfg.strategy.server_mode != "rounds":
        return _run_async(cfg, run, sim, params)
    rounds = _RoundSteps(cfg, run, sim, state)
    out = run_loop(run, rounds)
    if cfg.evaluation.personalize_epochs > 0:
        from dataclasses import replace

        before, after = sim.personalize(rounds.round_state.params,
                                        replace(cfg.clients.build(0), epochs=cfg.evaluation.personalize_epochs))
        np.save(run.dir / "personalization.npy", np.stack([before, after]))
        ok = ~np.isnan(before) & ~np.isnan(after)
        if ok.any():
            out["personalized_acc_before"] = float(before[ok].mean())
            out["personalized_acc_after"] = float(after[ok].mean())
    return out


DEVICE_RECORDS = "device_costs.csv"
"""the run folder's per-client, per-round device costs and budgets (``devices.enabled``)"""

DEVICE_COLUMNS = ("round", "client", "tier", "level", "width", "int8", "memory_bytes", "memory_budget", "seconds",
                  "time_budget", "flops", "bytes_down", "bytes_up", "reported")


def write_device_records(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` (:meth:`Simulation.device_round`'s records) to the CSV ``path`` (a header first)."""
    import csv

    new = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=DEVICE_COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)


def drop_device_records_after(path: Path, rnd: int) -> None:
    """Resume: remove the rows of rounds after ``rnd`` (the checkpoint's) from the device-cost CSV ``path`` (if
    any), since those rounds are run or logged again."""
    if path.exists():
        keep = [ln for i, ln in enumerate(path.read_text(encoding="utf-8").splitlines(keepends=True))
                if i == 0 or int(ln.split(",", 1)[0]) <= rnd]
        path.write_text("".join(keep), encoding="utf-8")


def read_device_records(path: Path) -> dict[str, np.ndarray]:
    """The columns of a device-cost CSV as arrays (``client`` as strings, the rest as floats)."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([r[k] for r in rows]) if k == "client" else np.array([float(r.get(k) or 0) for r in rows])
            for k in DEVICE_COLUMNS}


HISTOGRAM_CLIENTS = 10_000
"""clients in the saved label histogram"""

SUMMARY_METRICS = ("test_acc", "test_loss", "test_token_acc", "test_token_acc_with_oov_eos", "client_acc_mean",
                   "client_acc_p10", "client_acc_worst", "dp_epsilon", "dp_epsilon_rdp", "dp_epsilon_pld",
                   "dp_clip_norm", "attack_success")


def _attack_metrics(sim: Any, state: Any, evaluated: bool) -> dict[str, float]:
    """``attackers``: the coalition's members that reported this round; ``attack_success`` (a backdoor, in evaluated
    rounds): the fraction of the test examples outside the target class that the global model puts in the target
    class once the trigger is stamped on them (:func:`fedarena.federated.attacks.attack_success_rate`)."""
    from fedarena.federated.attacks import Attacked, Backdoor, attack_success_rate

    if not isinstance(sim.strategy, Attacked):
        return {}
    out = {"attackers": float(sim.strategy.last_attackers)}
    if evaluated and isinstance(sim.strategy.attack, Backdoor) and sim.test is not None:
        with sim.math_threads():
            out["attack_success"] = attack_success_rate(lambda v: sim.model.logits(state.params, v), *sim.test,
                                                        sim.strategy.attack)
    return out


class _RoundSteps:
    """fedsim (``server_mode: rounds``) under :func:`~fedarena.platform.loop.run_loop`: a step is one round."""

    def __init__(self, cfg: FedSimConfig, run: Any, sim: Any, state: Any):
        self.cfg, self.run, self.sim, self.round_state = cfg, run, sim, state
        c = cfg.clients
        self.schedule = StepSchedule(c.step_schedule, c.steps_min, c.steps_max, c.divergence_target)
        self.last_div: float | None = None
        self.participation: dict[str, int] = {}
        self.r = 0
        self.desc, self.total = "fedsim", cfg.rounds

    def init(self) -> None:
        return None

    def load(self, step: int, saved: dict[str, Any]) -> None:
        self.r = step
        drop_device_records_after(self.run.dir / DEVICE_RECORDS, step)
        self.round_state, self.last_div, self.schedule.current = _restore(self.sim, saved)
        self.participation = {c: int(n) for c, n in saved.get("participation", {}).items()}

    def state(self) -> dict[str, Any]:
        return dict(_snapshot(self.sim, self.round_state, self.last_div, self.schedule.current),
                    participation=dict(self.participation))

    def done(self) -> bool:
        return self.r >= self.cfg.rounds

    def units(self) -> int:
        return self.r

    def step(self, r: int) -> dict[str, Any]:
        cfg, sim = self.cfg, self.sim
        steps = 0
        if cfg.clients.step_schedule != "fixed":
            steps = self.schedule.steps(r, self.last_div)
            sim.strategy = _with_steps(sim.strategy, steps)
        self.round_state, rec = sim.round(self.round_state)
        self.r = r
        m = dict(rec.metrics)
        m.update(_attack_metrics(sim, self.round_state, "test_acc" in m))
        self.last_div = m.get("update_divergence")
        if steps:
            m["local_steps"] = steps
        for c in rec.reporting:
            self.participation[c] = self.participation.get(c, 0) + 1
        mech = dp_mechanism(sim.strategy)
        if mech is not None:  # DP-FedAvg: the (adaptive) clip, and both accountants' epsilon on evaluated rounds
            m["dp_clip_norm"] = mech.current_clip
            if "dp_epsilon" in m or "test_loss" in m or r == cfg.rounds:  # PLD composition costs ~0.1 s a step
                m.update({f"dp_epsilon_{k}": v for k, v in mech.epsilons(rec.round).items()})
        if cfg.privacy.ldp.on and self.participation:
            m["ldp_epsilon_round"] = cfg.privacy.ldp.epsilon
            m["ldp_epsilon_cumulative"] = ldp_cumulative_epsilon(cfg, max(self.participation.values()))
        if hasattr(sim.x, "pop_timings"):  # the data pipeline's per-stage seconds of this round
            m.update(sim.x.pop_timings())
            if m.get("train_seconds"):
                m["data_wait_fraction"] = m["data_wait_s"] / m["train_seconds"]
        report = getattr(sim.strategy, "last_report", None)
        if report:
            m.update(report)
        if sim.devices is not None:
            write_device_records(self.run.dir / DEVICE_RECORDS, sim.pop_device_records())
        return m

    def summary(self) -> dict[str, Any]:
        final: dict[str, Any] = {}
        for row in self.run.rows():  # the latest value of each metric (rows before a resume included)
            final.update(row)
        out = {k: final[k] for k in SUMMARY_METRICS if k in final}
        out["bytes_up_total"] = self.sim.bytes_up_total
        out["bytes_down_total"] = self.sim.bytes_down_total
        return out


def _run_async(cfg: FedSimConfig, run: Any, sim: Any, params: dict[str, np.ndarray]) -> dict[str, Any]:
    """``server_mode`` sync / threshold / async: one metrics row per evaluation, keyed by server version."""
    from fedarena.federated.buffered_async import run_async

    if run.restore() is not None:
        raise ConfigError(f"strategy.server_mode: {cfg.strategy.server_mode} runs keep no mid-run checkpoint; start a new run")
    with run.progress(total=cfg.rounds, desc=f"fedsim {cfg.strategy.server_mode}") as bar:
        def on_eval(version: int, row: dict[str, float]) -> None:
            run.log(max(int(version), 1), **row)
            bar.update(max(0, min(int(version), cfg.rounds) - bar.n), acc=row.get("test_acc", float("nan")))

        final, rows = run_async(sim, cfg.strategy.build_async(cfg.rounds, cfg.evaluation.every), params=params, on_eval=on_eval)
    run.save_checkpoint(cfg.rounds, {"params": final})
    last = rows[-1]
    return {"test_acc": last.get("test_acc", float("nan")), "test_loss": last.get("test_loss", float("nan")),
            "server_steps": int(last["version"]), "clients_dispatched": int(last["clients_dispatched"])}


def dp_mechanism(strategy: Any):
    """The DP-FedAvg mechanism inside a (wrapped) strategy, or None."""
    while strategy is not None:
        mech = getattr(strategy, "mechanism", None)
        if mech is not None:
            return mech
        strategy = getattr(strategy, "inner", None)
    return None


def ldp_cumulative_epsilon(cfg: FedSimConfig, uploads: int) -> float:
    """Epsilon (at ``privacy.ldp.delta``) of the client that uploaded most often: its ``uploads`` analytic-Gaussian
    releases (sigma for (epsilon, delta) of ``privacy.ldp``, L2 sensitivity 2 C) composed in RDP (Mironov 2017)."""
    from fedarena.privacy.accountant import RDPAccountant
    from fedarena.privacy.ldp import GaussianMechanism

    ldp = cfg.privacy.ldp
    mech = GaussianMechanism(ldp.epsilon, ldp.delta, ldp.clip_norm)
    acc = RDPAccountant()
    acc.step(mech.sigma / mech.sensitivity, 1.0, uploads)
    return acc.epsilon(ldp.delta)


def _snapshot(sim, state, last_div, steps_current) -> dict[str, Any]:
    """Everything a resumed run needs (selection and training draws are keyed by (seed, round), so no RNG state)."""
    up, down = sim.upload, sim.download
    clipper = getattr(dp_mechanism(sim.strategy), "clipper", None)  # the adaptive clip of DP-FedAvg
    return {
        "round": state.round, "params": state.params, "opt_state": state.opt_state, "control": state.control,
        "client_control": sim.client_control,
        "residuals": dict(getattr(up, "residuals", {})),
        "upload_last_seen": dict(getattr(up, "last_seen", {})),
        "upload_models": {str(r): m for r, m in getattr(up, "models", {}).items()},
        "upload_round": int(getattr(up, "_round", 0)),
        "broadcast_reference": getattr(down, "reference", None) or {},
        "broadcast_round": getattr(down, "_round", 0),
        "bytes": [sim.bytes_up_total, sim.bytes_down_total],
        "last_divergence": float("nan") if last_div is None else float(last_div), "steps_current": steps_current,
        "dp_clipper": clipper.state() if clipper is not None else {},
    }


def _restore(sim, saved: dict[str, Any]):
    from fedarena.federated.strategy import RoundState

    state = RoundState(int(saved["round"]), {k: np.asarray(v) for k, v in saved["params"].items()},
                       {k: dict(v) for k, v in saved["opt_state"].items()}, dict(saved["control"]))
    sim.client_control = {c: dict(v) for c, v in saved["client_control"].items()}
    if hasattr(sim.upload, "residuals"):
        sim.upload.residuals = {c: np.asarray(v) for c, v in saved["residuals"].items()}
    if hasattr(sim.upload, "last_seen"):
        sim.upload.last_seen = {c: int(r) for c, r in saved.get("upload_last_seen", {}).items()}
        sim.upload.models = {int(r): np.asarray(m) for r, m in saved.get("upload_models", {}).items()}
        sim.upload._round = int(saved.get("upload_round", 0))
    if sim.download is not None:
        sim.download.reference = dict(saved["broadcast_reference"]) or None
        sim.download._round = int(saved["broadcast_round"])
    sim.bytes_up_total, sim.bytes_down_total = (int(b) for b in saved["bytes"])
    clipper = getattr(dp_mechanism(sim.strategy), "clipper", None)
    if clipper is not None and saved.get("dp_clipper"):  # the adaptive clip of DP-FedAvg
        clipper.restore(saved["dp_clipper"])
    div = float(saved["last_divergence"])
    return state, (None if np.isnan(div) else div), int(saved["steps_current"])


def _data_setup(cfg) -> str:
    """The data set, the number of clients and how the examples are split over them."""
    cfg = cfg.data
    split = {"dirichlet": f"Dirichlet({cfg.alpha:g}) label skew", "shards": f"{cfg.shards_per_client} label shards "
             "per client", "quantity": f"Dirichlet({cfg.beta:g}) client sizes", "iid": "IID"}[cfg.partition]
    if cfg.dataset == "synthetic":  # its own device split (FedProx's Synthetic(alpha, beta)); partition unused
        split = f"Synthetic({cfg.synthetic_alpha:g},{cfg.synthetic_beta:g}) devices"
    elif cfg.dataset == "leaf" or cfg.dataset.startswith(("leaf_", "tff_")):  # one client per user; partition unused
        split = "users of the files"
    return f"{cfg.dataset}, {cfg.num_clients} clients ({split})"


def _setup(cfg) -> str:
    """One line naming what a fedsim run trained: data, split, clients, aggregation and local work."""
    c, s = cfg.clients, cfg.strategy
    per_round = "all" if c.per_round == 0 else str(c.per_round)
    server = (f"{per_round} a round, {s.aggregation}" if s.server_mode == "rounds" else
              f"{s.server_mode} server mode, {s.async_concurrency} clients in flight")
    local = f"{c.local_steps} local steps" if c.local_steps else f"E={c.epochs}"
    model = f"MLP {list(cfg.model.hidden)}" if cfg.model.arch == "mlp" else cfg.model.arch
    return f"{_data_setup(cfg)}, {server}, {model}, {local}, B={c.batch_size}, lr {c.lr:g}, seed {cfg.seed}"


def _integer_ticks(ax, y: bool = False) -> None:
    """Rounds, server steps and client counts are integers: no fractional tick labels (an x range shorter than
    two, as with one logged step, is widened so that integers fall in it)."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = ax.get_xlim()
    if hi - lo < 2:
        mid = (lo + hi) / 2
        ax.set_xlim(mid - 1, mid + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def plots(rows, cfg, report_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedarena.federated.data import plot_label_histogram

    out: list[str] = []
    report_dir = Path(report_dir)
    name = report_dir.parent.name
    if rows and cfg.strategy.server_mode != "rounds":
        out.append(_async_plot(rows, cfg, report_dir))
    elif rows:
        r = [row["step"] for row in rows]
        get = lambda k: [row.get(k, float("nan")) for row in rows]  # noqa: E731
        fig, ax = plt.subplots(2, 2, figsize=(11, 7.4))
        ax[0, 0].plot(r, get("test_acc"), "-", lw=2, label="global model, test set")
        ax[0, 0].plot(r, get("client_acc_mean"), "-", label="clients' held-out: mean")
        ax[0, 0].plot(r, get("client_acc_p10"), "--", label="clients' held-out: 10th percentile")
        ax[0, 0].plot(r, get("client_acc_worst"), ":", label="clients' held-out: worst client")
        ax[0, 0].set_title("accuracy (clients: those with held-out examples)", fontsize=10)
        ax[0, 0].set_ylabel("accuracy")
        ax[0, 0].legend(fontsize=8)
        ax[0, 1].plot(r, get("test_loss"), label="global model, test set")
        ax[0, 1].plot(r, get("train_loss"), label="client training")
        ax[0, 1].set_title("cross-entropy", fontsize=10)
        ax[0, 1].set_ylabel("loss")
        ax[0, 1].legend(fontsize=8)
        # selected >= reporting and up / down can coincide: distinct line styles keep every curve visible
        ax[1, 0].plot(r, get("selected"), "-", lw=3, alpha=0.5, label="selected")
        ax[1, 0].plot(r, get("reporting"), "--", lw=1.5, label="reporting")
        ax[1, 0].plot(r, get("stragglers"), ":", lw=1.5, label="stragglers")
        ax[1, 0].set_title("clients per round", fontsize=10)
        ax[1, 0].set_ylabel("clients")
        ax[1, 0].legend(fontsize=8)
        ax[1, 1].plot(r, np.asarray(get("bytes_up"), float) / 1e3, "-", lw=3, alpha=0.5, label="up (all clients)")
        ax[1, 1].plot(r, np.asarray(get("bytes_down"), float) / 1e3, "--", lw=1.5, label="down (all clients)")
        ax[1, 1].set_title("traffic per round (exact encoded bytes)", fontsize=10)
        ax[1, 1].set_ylabel("kB")
        ax[1, 1].legend(fontsize=8)
        for a in ax.flat:
            if len(r) == 1:  # a single logged round is a point, not a line
                for line in a.get_lines():
                    line.set_marker("o")
            a.set_xlabel("round")
            _integer_ticks(a, y=a is ax[1, 0])
            a.grid(alpha=0.3)
        out.append(_finish(fig, f"{name}: {_setup(cfg)}", report_dir / "fedsim.png"))
    hist_path = report_dir.parent / "label_histogram.npy"
    if hist_path.exists():
        hist = np.load(hist_path)
        out.append(plot_label_histogram(hist, report_dir / "label_histogram.png",
                                        f"{name}: per-client label histogram of the training split\n{_data_setup(cfg)}",
                                        max_clients=max(50, min(len(hist), 200))))
    dev = report_dir.parent / DEVICE_RECORDS
    if dev.exists():
        out.append(_devices_plot(read_device_records(dev), rows, cfg, name, report_dir))
    pers = report_dir.parent / "personalization.npy"
    if pers.exists():
        before, after = np.load(pers)
        out.append(_personalization_plot(before, after, cfg, name, report_dir))
    return out


def _personalization_plot(before: np.ndarray, after: np.ndarray, cfg, name: str, report_dir: Path) -> str:
    """Per-client held-out accuracy before / after local fine-tuning; the figure says how many clients have no
    held-out example (``floor(held_out_fraction * n) = 0``: no accuracy to draw) and leaves them out."""
    import matplotlib.pyplot as plt

    ok = ~np.isnan(before) & ~np.isnan(after)
    n, shown = len(before), int(ok.sum())
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.6))
    # held-out sets are small, so accuracies repeat: the marker area counts the clients at each point
    pts, counts = np.unique(np.stack([before[ok], after[ok]], 1), axis=0, return_counts=True)
    if len(pts):
        ax[0].scatter(pts[:, 0], pts[:, 1], s=12 * counts, alpha=0.6)
    ax[0].plot([0, 1], [0, 1], "k--", lw=1, label="no change")
    ax[0].set_xlabel("held-out accuracy, global model")
    ax[0].set_ylabel("held-out accuracy, after local fine-tuning")
    ax[0].set_title("per-client accuracy before / after (marker area: clients)", fontsize=10)
    ax[0].legend(fontsize=8, loc="lower right")
    ax[1].hist([before[ok], after[ok]], bins=np.linspace(0, 1, 21), label=["global model", "fine-tuned"])
    ax[1].set_xlabel("held-out accuracy")
    ax[1].set_ylabel("clients")
    ax[1].set_title("distribution over clients", fontsize=10)
    ax[1].legend(fontsize=8)
    _integer_ticks(ax[1], y=True)
    ax[1].xaxis.set_major_locator(plt.MaxNLocator(6))
    for a in ax:
        a.grid(alpha=0.3)
    excluded = n - shown
    note = (f"all {n} clients" if not excluded else
            f"{shown} of {n} clients; {excluded} have no held-out example and are not shown"
            + (f" (fewer than {_min_examples(cfg)} examples at held_out_fraction {cfg.data.held_out_fraction:g})"
               if cfg.data.held_out_fraction > 0 else " (held_out_fraction is 0)"))
    return _finish(fig, f"{name}: personalization, {cfg.evaluation.personalize_epochs} local epoch(s) of fine-tuning "
                   f"of the final model\n{note}", report_dir / "personalization.png")


def _devices_plot(rec: dict[str, np.ndarray], rows, cfg, name: str, report_dir: Path) -> str:
    """On-device training cost against budget per client and round (memory, time; the diagonal is the budget),
    the clients trained at each width level per round and the accuracy of each level's sub-model."""
    import matplotlib.pyplot as plt

    levels = [1.0] if cfg.devices.submodel == "none" else list(cfg.devices.width_levels)
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.6))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(levels)))
    for k, w in enumerate(levels):
        sel = rec["level"] == k
        if sel.any():
            ax[0, 0].scatter(rec["memory_budget"][sel] / 1e6, rec["memory_bytes"][sel] / 1e6, s=8, color=colours[k],
                             label=f"width {w:g}")
            budget = np.where(np.isfinite(rec["time_budget"][sel]), rec["time_budget"][sel], np.nan)
            ax[0, 1].scatter(budget, rec["seconds"][sel], s=8, color=colours[k], label=f"width {w:g}")
    lo, hi = ax[0, 0].get_xlim()
    ax[0, 0].plot([0, hi], [0, hi], "k--", lw=1, label="budget")
    ax[0, 0].set_xlabel("device memory budget (MB)")
    ax[0, 0].set_ylabel("training memory (MB)")
    ax[0, 0].set_title("memory per client and round (all on or below the budget line)", fontsize=10)
    ax[0, 0].legend(fontsize=7)
    ax[0, 1].set_xlabel("time budget: deadline or the window's end (s)")
    ax[0, 1].set_ylabel("on-device seconds (download + compute + upload)")
    finite = np.isfinite(rec["time_budget"])
    ax[0, 1].set_title("time per client and round" + (" (log scale)" if finite.any() else
                       " (no deadline and no window: budgets unbounded)"), fontsize=10)
    if finite.any():
        lo = float(min(rec["seconds"].min(), rec["time_budget"][finite].min()))
        top = float(rec["time_budget"][finite].max())
        ax[0, 1].plot([lo, top], [lo, top], "k--", lw=1, label="budget")
        ax[0, 1].set_xscale("log")
        ax[0, 1].set_yscale("log")
    ax[0, 1].legend(fontsize=7)
    r = [row["step"] for row in rows]
    for k, w in enumerate(levels):
        ax[1, 0].plot(r, [row.get(f"level{k}_clients", 0) for row in rows], "-", color=colours[k],
                      label=f"width {w:g}")
    ax[1, 0].plot(r, [row.get("unfit", 0) for row in rows], "k:", label="no level fits")
    ax[1, 0].set_title("clients trained per width level", fontsize=10)
    ax[1, 0].set_ylabel("clients")
    ax[1, 0].legend(fontsize=7)
    for k, w in enumerate(levels):
        ev = [(row["step"], row[f"test_acc_level{k}"]) for row in rows if f"test_acc_level{k}" in row]
        if ev:
            ax[1, 1].plot(*zip(*ev), "-", color=colours[k], label=f"width {w:g}" + (" (global)" if k == 0 else ""))
    ax[1, 1].set_title("test accuracy of each level's sub-model", fontsize=10)
    ax[1, 1].set_ylabel("accuracy")
    ax[1, 1].legend(fontsize=7)
    for a in ax[1]:
        a.set_xlabel("round")
        _integer_ticks(a)
    for a in ax.flat:
        a.grid(alpha=0.3)
    return _finish(fig, f"{name}: device budgets, {cfg.devices.submodel} sub-models; {int(rec['reported'].sum())} "
                        f"uploads, {len(rec['round'])} client trainings", report_dir / "devices.png")


def _finish(fig, title: str, path: Path) -> str:
    """Give ``fig`` its ``title``, lay it out, save it to ``path`` (110 dpi) and close it; the path written."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _min_examples(cfg) -> int:
    """Fewest examples a client needs for one held-out example: floor(f * n) >= 1 with n >= 2."""
    return max(2, int(np.ceil(1 / cfg.data.held_out_fraction - 1e-9)))


def _async_plot(rows, cfg, report_dir: Path) -> str:
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.4))
    ax[0].plot(steps, [row.get("test_acc", float("nan")) for row in rows], "-o", ms=3, lw=2)
    s = cfg.strategy
    ax[0].set_title(f"global model, test accuracy ({s.server_mode} mode, {s.async_concurrency} clients "
                    f"in flight" + (f", steps on {s.async_buffer}" if s.server_mode == "threshold" else "") + ")",
                    fontsize=10)
    ax[0].set_ylabel("accuracy")
    ax[0].annotate(f"{int(rows[-1]['clients_dispatched'])} client updates dispatched in all",
                   xy=(0.98, 0.04), xycoords="axes fraction", ha="right", fontsize=8)
    ax[1].plot(steps, [row.get("test_loss", float("nan")) for row in rows], "-o", ms=3,
               label="global model, test set")
    ax[1].plot(steps, [row.get("train_loss", float("nan")) for row in rows], "-o", ms=3,
               label="client training (last 50)")
    ax[1].set_title("cross-entropy", fontsize=10)
    ax[1].set_ylabel("loss")
    ax[1].legend(fontsize=8)
    for a in ax:
        a.set_xlabel("server step")
        _integer_ticks(a)
        a.grid(alpha=0.3)
    return _finish(fig, f"{report_dir.parent.name}: {_setup(cfg)}", report_dir / "fedsim.png")


EXPERIMENT = Experiment(config=FedSimConfig, run=run, plots=plots,
                        summary_keys=("test_acc", "client_acc_mean", "client_acc_p10", "client_acc_worst",
                                      "reporting", "bytes_up", "bytes_down"))
