"""Experiment kind ``fedsim``: federated simulation of many clients in one process (or on Ray).

Builds the federated data set (:mod:`fedarena.federated.data`), the strategy and its stages
(:mod:`fedarena.federated.strategy`, :mod:`fedarena.federated.stages`, compression, DP-FedAvg, SecAgg)
and runs :class:`fedarena.federated.simulation.Simulation`, logging per round: global test accuracy
and loss, the per-client held-out accuracy distribution (mean, 10th percentile, worst), clients
selected / reporting / stragglers, exact bytes up and down, the divergence of the client updates,
local steps, and DP epsilon. The report draws these, the per-client label histogram of the split, and
(with ``personalize_epochs``) per-client accuracy before and after local fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedarena.platform.config import ConfigError
from fedarena.platform.experiment import Experiment, ExperimentConfig, param
from fedarena.platform.loop import run_loop


@dataclass(frozen=True)
class FedSimConfig(ExperimentConfig):
    dataset: Literal["digits", "breast_cancer", "synthetic", "leaf", "mnist"] = param("digits", "data set")
    path: str = param("", "local file or folder of a leaf / mnist data set")
    num_clients: int = param(100, "number of clients")
    partition: Literal["iid", "dirichlet", "shards", "quantity"] = param("iid", "how examples are split over clients")
    alpha: float = param(0.5, "Dirichlet label-skew concentration (partition: dirichlet)")
    shards_per_client: int = param(2, "labels (shards) per client (partition: shards)")
    beta: float = param(0.5, "Dirichlet concentration of client sizes (partition: quantity)")
    test_fraction: float = param(0.2, "global test set fraction (digits, breast_cancer)")
    held_out_fraction: float = param(0.2, "per-client held-out fraction for per-client evaluation")
    synthetic_alpha: float = param(1.0, "FedProx Synthetic(alpha, beta): model heterogeneity")
    synthetic_beta: float = param(1.0, "FedProx Synthetic(alpha, beta): data heterogeneity")
    synthetic_size_mean: float = param(4.0, "examples per device ~ lognormal(mean, sigma) + min")
    synthetic_size_sigma: float = param(2.0, "see synthetic_size_mean")
    synthetic_size_min: int = param(50, "see synthetic_size_mean")
    synthetic_size_max: int = param(0, "cap on examples per device (0 = none)")
    model: str = param("mlp", "mlp (ReLU MLP of hidden sizes; the paper's 2NN is [200, 200]), cnn (McMahan et al. "
                       "2017's CNN: 5x5 convs, 2x2 max pools, a ReLU layer), or a torch model "
                       "'torch:module.path:factory' (factory(num_features, num_classes) -> nn.Module, converted by "
                       "engine.from_torch; the run imports that module and calls the factory: a config is code, "
                       "run only configs you trust)")
    hidden: list[int] = param(doc="hidden layer sizes of the MLP ([] = softmax regression)", factory=lambda: [32])
    cnn_channels: list[int] = param(doc="cnn: channels of the two 5x5 convolutions", factory=lambda: [32, 64])
    cnn_hidden: int = param(512, "cnn: units of the fully connected ReLU layer")
    image_shape: list[int] = param(doc="cnn: (channels, height, width) of an example; [] = one channel, square",
                                   factory=list)
    zero_init: bool = param(False, "start from all-zero parameters (softmax regression)")
    rounds: int = param(50, "number of rounds")
    clients_per_round: int = param(10, "clients selected per round (0 = all)")
    epochs: int = param(1, "local epochs E")
    batch_size: int = param(10, "local minibatch size B")
    lr: float = param(0.1, "local SGD learning rate")
    prox_mu: float = param(0.0, "FedProx proximal coefficient mu")
    local_steps: int = param(0, "> 0: this many local steps instead of epochs")
    step_schedule: Literal["fixed", "linear", "divergence"] = param(
        "fixed", "local steps per round: fixed, linear growth, or driven by the divergence of client updates")
    steps_min: int = param(1, "fewest local steps of a schedule")
    steps_max: int = param(20, "most local steps of a schedule")
    divergence_target: float = param(1.0, "divergence schedule: halve steps above, double below this divergence")
    aggregation: Literal["fedavg", "scaffold", "median", "trimmed_mean", "krum", "geometric_median"] = param(
        "fedavg", "aggregation rule")
    trim_fraction: float = param(0.2, "trimmed mean: fraction trimmed at each end")
    krum_byzantine: int = param(0, "Krum's assumed number of Byzantine clients f")
    krum_keep: int = param(1, "multi-Krum: updates averaged (m = n - f is Blanchard et al.'s multi-Krum)")
    krum_preselect: bool = param(False, "median/trimmed_mean/geometric_median: first keep the n - f updates with "
                                 "the lowest Krum scores (Bulyan's selection stage)")
    max_weight: float = param(0.0, "example-count bound on a client's FedAvg weight (0 = none)")
    server_optimizer: Literal["fedavg", "fedadagrad", "fedadam", "fedyogi"] = param("fedavg", "server update rule")
    server_lr: float = param(1.0, "server learning rate")
    beta1: float = param(0.9, "FedAdam/FedYogi beta1")
    beta2: float = param(0.99, "FedAdam/FedYogi beta2")
    tau: float = param(1e-3, "FedAdam/FedYogi tau")
    availability: float = param(1.0, "probability a client is reachable in a round")
    speed_mean: float = param(0.0, "mean client speed in local steps per simulated second (0 = no time model)")
    speed_sigma: float = param(0.0, "log-normal sigma of client speeds")
    window_s: float = param(0.0, "round window in simulated seconds (0 = none)")
    partial_work: bool = param(False, "keep stragglers' finished steps instead of dropping them")
    straggler_fraction: float = param(0.0, "fraction of each round's clients that finish only U{1..E-1} epochs "
                                      "(FedProx Sec. 5.1); dropped unless partial_work")
    drop_before_training: float = param(0.0, "dropout probability before local training")
    drop_after_training: float = param(0.0, "dropout probability after local training")
    drop_upload: float = param(0.0, "dropout probability during upload")
    adversary_fraction: float = param(0.0, "fraction of clients that corrupt their uploads")
    adversary: Literal["sign_flip", "scale"] = param("sign_flip", "corruption: -s Delta or s Delta")
    adversary_scale: float = param(4.0, "s of the corruption")
    upload_codec: Literal["dense", "quantize", "topk", "topk_quantize"] = param("dense", "upload compression")
    upload_bits: int = param(8, "bits of the upload quantizer")
    upload_fraction: float = param(0.01, "fraction kept by top-k uploads")
    upload_error_feedback: bool = param(True, "error feedback for compressed uploads")
    upload_prediction: Literal["none", "trajectory"] = param(
        "none", "compress the update's difference to its prediction from the global model's trajectory since the "
        "client's last upload (for partial participation; see fedarena.federated.compression)")
    download_codec: Literal["dense", "quantize", "topk", "topk_quantize"] = param("dense", "broadcast compression")
    download_bits: int = param(8, "bits of the broadcast quantizer")
    download_fraction: float = param(0.01, "fraction kept by a top-k broadcast")
    clip_norm: float = param(0.0, "client-side clipping of the update (0 = off)")
    ldp_epsilon: float = param(0.0, "local DP (Gaussian) epsilon per upload (0 = off)")
    ldp_delta: float = param(1e-5, "local DP delta")
    ldp_clip_norm: float = param(1.0, "local DP clipping norm")
    signds_k: int = param(0, "SignDS top-k size (0 = off); when on, clients upload SignDS reports")
    signds_h: int = param(0, "SignDS number of reported dimensions h")
    signds_epsilon: float = param(1.0, "SignDS epsilon per upload")
    signds_lr: float = param(0.01, "SignDS global learning rate")
    dp_noise_multiplier: float = param(0.0, "DP-FedAvg noise multiplier z (0 = off)")
    dp_clip_norm: float = param(1.0, "DP-FedAvg server-side clip S")
    dp_sample_rate: float = param(0.1, "DP-FedAvg Poisson client sampling rate q")
    dp_delta: float = param(1e-5, "DP-FedAvg delta")
    secagg: bool = param(False, "secure aggregation of every round (real SecAgg protocol objects)")
    secagg_neighbours: int = param(0, "SecAgg+ neighbourhood size (even; 0 = plain SecAgg)")
    secagg_dropout: float = param(0.0, "fraction of clients silent before their masked input")
    privacy_seed: int = param(-1, "seed of the privacy randomness (LDP noise, SignDS); "
                              "-1 = every draw from the OS CSPRNG; set only for reproducible tests")
    backend: Literal["vmap", "ray"] = param("vmap", "vmap: one process; ray: groups of clients as Ray tasks")
    engine_backend: str = param("numpy", "where the vmapped client training step runs: numpy, cupy (a CUDA GPU) or "
                                "cupy-emulated (the cupy backend's kernels on the CPU, a testing aid); backend vmap "
                                "and server_mode rounds only; aggregation is numpy on the host")
    personalize_epochs: int = param(0, "local fine-tuning epochs after the last round (0 = off)")
    eval_every: int = param(1, "evaluate every this many rounds")
    server_mode: Literal["rounds", "sync", "threshold", "async"] = param(
        "rounds", "rounds: synchronous rounds; sync / threshold (FedBuff) / async: the global model lives on the "
        "engine's parameter server, async_concurrency clients train at once and `rounds` counts server steps "
        "(fedarena.federated.buffered_async; plain FedAvg with dense uploads only)")
    async_concurrency: int = param(10, "clients training at once (server_mode sync / threshold / async)")
    async_buffer: int = param(5, "deltas per server step in threshold mode (FedBuff's K)")
    async_staleness: int = param(4, "largest model-version lag of an applied delta (threshold / async)")

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds: must be >= 1, got {self.rounds}")
        if self.num_clients < 1:
            raise ValueError(f"num_clients: must be >= 1, got {self.num_clients}")
        if self.clients_per_round < 0 or self.clients_per_round > self.num_clients:
            raise ValueError(f"clients_per_round: {self.clients_per_round} must lie in 0..num_clients "
                             f"({self.num_clients})")
        if self.dataset in ("leaf", "mnist") and not self.path:
            raise ValueError(f"path: dataset '{self.dataset}' is read from a local path; set path")
        if self.path and not Path(self.path).exists():
            raise ValueError(f"path: {self.path}: no such file or directory")
        if self.eval_every < 1:
            raise ValueError(f"eval_every: must be >= 1, got {self.eval_every}")
        if not 1 <= self.steps_min <= self.steps_max:
            raise ValueError(f"steps_min/steps_max: need 1 <= min <= max, got {self.steps_min}, {self.steps_max}")
        if self.secagg and self.aggregation not in ("fedavg",):
            raise ValueError("secagg: secure aggregation gives only the sum, so aggregation must be fedavg")
        if self.dp_noise_multiplier and (self.secagg or self.aggregation != "fedavg"):
            raise ValueError("dp_noise_multiplier: DP-FedAvg wraps plain fedavg aggregation without secagg")
        if self.model not in ("mlp", "cnn") and not self.model.startswith("torch:"):
            raise ValueError(f"model: expected mlp, cnn or torch:module:factory, got {self.model!r}")
        from fedarena.engine.backend_selection import check_engine_backend

        check_engine_backend(self.engine_backend, "engine_backend")
        if self.engine_backend != "numpy" and (self.backend != "vmap" or self.server_mode != "rounds"):
            raise ValueError(f"engine_backend: {self.engine_backend} runs with backend vmap and server_mode rounds, "
                             f"got backend {self.backend}, server_mode {self.server_mode}")
        if self.model.startswith("torch:") and self.backend != "vmap":
            raise ValueError("model: a torch model trains with backend vmap (the ray backend rebuilds its models "
                             "from a spec)")
        if self.model == "cnn" and self.image_shape and len(self.image_shape) != 3:
            raise ValueError(f"image_shape: (channels, height, width) expected, got {self.image_shape}")
        _strategy(self, 1)  # validates the strategy fields (their errors name the field)
        _heterogeneity(self)
        if self.server_mode != "rounds":
            _check_async(self)


_ROUND_ONLY = {"aggregation": "fedavg", "server_optimizer": "fedavg", "upload_codec": "dense",
               "download_codec": "dense", "clip_norm": 0.0, "ldp_epsilon": 0.0, "signds_k": 0,
               "dp_noise_multiplier": 0.0, "secagg": False, "step_schedule": "fixed", "availability": 1.0,
               "speed_mean": 0.0, "window_s": 0.0, "straggler_fraction": 0.0, "drop_before_training": 0.0,
               "drop_after_training": 0.0, "drop_upload": 0.0, "adversary_fraction": 0.0, "backend": "vmap",
               "personalize_epochs": 0}
"""Settings the asynchronous server modes do not implement (they are round-based), with their defaults."""


def _check_async(cfg: FedSimConfig) -> None:
    from fedarena.federated.buffered_async import AsyncFLConfig

    for name, default in _ROUND_ONLY.items():
        if getattr(cfg, name) != default:
            raise ValueError(f"{name}: server_mode {cfg.server_mode} runs plain FedAvg with dense uploads; "
                             f"set {name} to {default!r} or use server_mode rounds")
    _async_config(cfg, AsyncFLConfig)


def _async_config(cfg: FedSimConfig, cls: Any) -> Any:
    return cls(mode=cfg.server_mode, concurrency=cfg.async_concurrency, buffer=cfg.async_buffer,
               staleness=cfg.async_staleness, server_lr=cfg.server_lr, steps=cfg.rounds, eval_every=cfg.eval_every)


def _data_spec(cfg: FedSimConfig):
    from fedarena.federated import data

    return data.DataSpec(dataset=cfg.dataset, path=cfg.path, partition=data.PartitionSpec(
        cfg.partition, cfg.num_clients, cfg.alpha, cfg.shards_per_client, cfg.beta),
        test_fraction=cfg.test_fraction, held_out_fraction=cfg.held_out_fraction,
        synthetic_alpha=cfg.synthetic_alpha, synthetic_beta=cfg.synthetic_beta,
        synthetic_size_mean=cfg.synthetic_size_mean, synthetic_size_sigma=cfg.synthetic_size_sigma,
        synthetic_size_min=cfg.synthetic_size_min, synthetic_size_max=cfg.synthetic_size_max)


def _fit(cfg: FedSimConfig, local_steps: int | None = None):
    from fedarena.federated.strategy import FitConfig

    return FitConfig(cfg.epochs, cfg.batch_size, cfg.lr, cfg.prox_mu,
                     cfg.local_steps if local_steps is None else local_steps)


def _strategy(cfg: FedSimConfig, num_clients: int):
    from fedarena.federated import stages
    from fedarena.federated import strategy as st

    opt = st.ServerOptimizer(cfg.server_optimizer, cfg.server_lr, cfg.beta1, cfg.beta2, cfg.tau)
    common = dict(fit=_fit(cfg), server_optimizer=opt, clients_per_round=cfg.clients_per_round,
                  max_weight=cfg.max_weight)
    if cfg.aggregation == "fedavg":
        s: Any = st.FedAvg(**common)
    elif cfg.aggregation == "scaffold":
        s = st.Scaffold(**common, server_lr=cfg.server_lr)
    else:
        s = st.RobustAggregate(**common, rule=cfg.aggregation, trim_fraction=cfg.trim_fraction,
                               num_byzantine=cfg.krum_byzantine, krum_keep=cfg.krum_keep,
                               krum_preselect=cfg.krum_preselect)
    if cfg.dp_noise_multiplier > 0:
        from fedarena.privacy.dp_fedavg import DPFedAvgMechanism

        s = stages.DPFedAvg(s, DPFedAvgMechanism(cfg.dp_clip_norm, cfg.dp_noise_multiplier, cfg.dp_sample_rate,
                                                 max(num_clients, 1), cfg.dp_delta))
    if cfg.secagg:
        s = stages.SecureAggregation(s, neighbours=cfg.secagg_neighbours, dropout=cfg.secagg_dropout, seed=cfg.seed)
    return s


def _heterogeneity(cfg: FedSimConfig):
    from fedarena.federated.simulation import Heterogeneity

    return Heterogeneity(cfg.availability, cfg.speed_mean, cfg.speed_sigma, cfg.window_s, cfg.partial_work,
                         cfg.straggler_fraction, cfg.drop_before_training, cfg.drop_after_training, cfg.drop_upload, cfg.adversary_fraction,
                         cfg.adversary, cfg.adversary_scale)


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


def build(cfg: FedSimConfig):
    """The data set and the :class:`~fedarena.federated.simulation.Simulation` of ``cfg``."""
    from fedarena.federated import compression, data, stages
    from fedarena.federated.simulation import Simulation

    try:
        d = data.load(_data_spec(cfg), cfg.seed)
    except data.DataError as e:
        raise ConfigError(str(e)) from None
    if cfg.clients_per_round > d.num_clients:
        raise ConfigError(f"clients_per_round: {cfg.clients_per_round} exceeds the {d.num_clients} clients")
    strategy = _strategy(cfg, d.num_clients)
    upload_stages: list[Any] = []
    if cfg.clip_norm > 0:
        upload_stages.append(stages.Clip(cfg.clip_norm))
    if cfg.ldp_epsilon > 0:
        upload_stages.append(stages.GaussianLDP(cfg.ldp_epsilon, cfg.ldp_delta, cfg.ldp_clip_norm))
    kw: dict[str, Any] = {}
    if cfg.signds_k > 0:
        if cfg.upload_codec != "dense":
            raise ConfigError("signds_k: SignDS replaces the upload codec; leave upload_codec dense")
        kw["upload"] = stages.SignDSUpload(cfg.signds_k, cfg.signds_h, cfg.signds_epsilon, cfg.signds_lr)
    elif cfg.upload_codec != "dense":
        kw["upload"] = compression.UploadCompression(
            compression.Codec(cfg.upload_codec, cfg.upload_bits, cfg.upload_fraction), cfg.upload_error_feedback,
            cfg.upload_prediction)
    if cfg.download_codec != "dense":
        kw["download"] = compression.Broadcast(compression.Codec(cfg.download_codec, cfg.download_bits,
                                                                 cfg.download_fraction), seed=cfg.seed)
    model = make_model(cfg, d.num_features, d.num_classes)
    sim = Simulation(model, strategy, d.x, d.y, d.train, [f"c{i}" for i in range(d.num_clients)], d.num_classes,
                     seed=cfg.seed, held_out=d.held_out, test=d.test_set(), heterogeneity=_heterogeneity(cfg),
                     upload_stages=upload_stages, backend=cfg.backend, engine_backend=cfg.engine_backend,
                     eval_every=cfg.eval_every,
                     privacy_seed=cfg.privacy_seed, **kw)
    return d, sim


def make_model(cfg: FedSimConfig, num_features: int, num_classes: int):
    """The batched model of ``cfg``: the MLP ``(features, *hidden, classes)``, the CNN on ``image_shape``, or a
    torch model through engine.from_torch (:mod:`fedarena.federated.torch_model`)."""
    from fedarena.federated.simulation import BatchedCNN, BatchedMLP

    if cfg.model == "mlp":
        return BatchedMLP((num_features, *cfg.hidden, num_classes))
    if cfg.model.startswith("torch:"):
        from fedarena.engine.interop import TorchConversionError
        from fedarena.federated.torch_model import BatchedTorchModel

        try:
            return BatchedTorchModel(cfg.model, num_features, num_classes)
        except (ValueError, TorchConversionError) as e:
            raise ConfigError(f"model: {e}") from None
    image = tuple(cfg.image_shape)
    if not image:
        side = int(round(num_features ** 0.5))
        if side * side != num_features:
            raise ConfigError(f"image_shape: {num_features} features are not a square one-channel image; set "
                              "image_shape")
        image = (1, side, side)
    if int(np.prod(image)) != num_features:
        raise ConfigError(f"image_shape: {list(image)} has {int(np.prod(image))} pixels, the data has {num_features}")
    try:
        return BatchedCNN(image, num_classes, cfg.cnn_channels, cfg.cnn_hidden)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _with_steps(strategy: Any, steps: int) -> Any:
    from dataclasses import replace

    if hasattr(strategy, "fit"):
        return replace(strategy, fit=replace(strategy.fit, local_steps=steps))
    return replace(strategy, inner=_with_steps(strategy.inner, steps))


def run(cfg: FedSimConfig, run) -> dict[str, Any]:
    from fedarena.federated import data

    d, sim = build(cfg)
    if cfg.backend == "ray":
        from fedarena.platform.cluster import init_ray

        init_ray(cfg.cluster)
    params = sim.model.init_params(cfg.seed)
    if cfg.zero_init:
        params = {k: np.zeros_like(v) for k, v in params.items()}
    state = sim.init_state(params)
    sim.final_round = cfg.rounds
    hist = data.label_histogram(d.y, d.train, d.num_classes)
    np.save(run.dir / "label_histogram.npy", hist)
    if cfg.server_mode != "rounds":
        return _run_async(cfg, run, sim, params)
    rounds = _RoundSteps(cfg, run, sim, state)
    out = run_loop(run, rounds)
    if cfg.personalize_epochs > 0:
        from dataclasses import replace

        before, after = sim.personalize(rounds.round_state.params, replace(_fit(cfg, 0), epochs=cfg.personalize_epochs))
        np.save(run.dir / "personalization.npy", np.stack([before, after]))
        ok = ~np.isnan(before) & ~np.isnan(after)
        if ok.any():
            out["personalized_acc_before"] = float(before[ok].mean())
            out["personalized_acc_after"] = float(after[ok].mean())
    return out


SUMMARY_METRICS = ("test_acc", "test_loss", "client_acc_mean", "client_acc_p10", "client_acc_worst", "dp_epsilon")


class _RoundSteps:
    """fedsim (``server_mode: rounds``) under :func:`~fedarena.platform.loop.run_loop`: a step is one round."""

    def __init__(self, cfg: FedSimConfig, run: Any, sim: Any, state: Any):
        self.cfg, self.run, self.sim, self.round_state = cfg, run, sim, state
        self.schedule = StepSchedule(cfg.step_schedule, cfg.steps_min, cfg.steps_max, cfg.divergence_target)
        self.base = sim.strategy
        self.last_div: float | None = None
        self.participation: dict[str, int] = {}
        self.r = 0
        self.desc, self.total = "fedsim", cfg.rounds

    def init(self) -> None:
        return None

    def load(self, step: int, saved: dict[str, Any]) -> None:
        self.r = step
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
        if cfg.step_schedule != "fixed":
            steps = self.schedule.steps(r, self.last_div)
            sim.strategy = _with_steps(self.base, steps)
        self.round_state, rec = sim.round(self.round_state)
        self.r = r
        m = dict(rec.metrics)
        self.last_div = m.get("update_divergence")
        if steps:
            m["local_steps"] = steps
        for c in rec.reporting:
            self.participation[c] = self.participation.get(c, 0) + 1
        if cfg.ldp_epsilon > 0 and self.participation:
            m["ldp_epsilon_round"] = cfg.ldp_epsilon
            m["ldp_epsilon_cumulative"] = ldp_cumulative_epsilon(cfg, max(self.participation.values()))
        report = getattr(sim.strategy, "last_report", None)
        if report:
            m.update(report)
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
    from fedarena.federated.buffered_async import AsyncFLConfig, run_async

    if run.restore() is not None:
        raise ConfigError(f"server_mode: {cfg.server_mode} runs keep no mid-run checkpoint; start a new run")
    with run.progress(total=cfg.rounds, desc=f"fedsim {cfg.server_mode}") as bar:
        def on_eval(version: int, row: dict[str, float]) -> None:
            run.log(max(int(version), 1), **row)
            bar.update(max(0, min(int(version), cfg.rounds) - bar.n), acc=row.get("test_acc", float("nan")))

        final, rows = run_async(sim, _async_config(cfg, AsyncFLConfig), params=params, on_eval=on_eval)
    run.save_checkpoint(cfg.rounds, {"params": final})
    last = rows[-1]
    return {"test_acc": last.get("test_acc", float("nan")), "test_loss": last.get("test_loss", float("nan")),
            "server_steps": int(last["version"]), "clients_dispatched": int(last["clients_dispatched"])}


def ldp_cumulative_epsilon(cfg: FedSimConfig, uploads: int) -> float:
    """Epsilon (at ``ldp_delta``) of the client that uploaded most often: its ``uploads`` analytic-Gaussian
    releases (sigma for (ldp_epsilon, ldp_delta), L2 sensitivity 2 C) composed in RDP (Mironov 2017)."""
    from fedarena.privacy.accountant import RDPAccountant
    from fedarena.privacy.ldp import GaussianMechanism

    mech = GaussianMechanism(cfg.ldp_epsilon, cfg.ldp_delta, cfg.ldp_clip_norm)
    acc = RDPAccountant()
    acc.step(mech.sigma / mech.sensitivity, 1.0, uploads)
    return acc.epsilon(cfg.ldp_delta)


def _snapshot(sim, state, last_div, steps_current) -> dict[str, Any]:
    """Everything a resumed run needs (selection and training draws are keyed by (seed, round), so no RNG state)."""
    up, down = sim.upload, sim.download
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
    div = float(saved["last_divergence"])
    return state, (None if np.isnan(div) else div), int(saved["steps_current"])


def _data_setup(cfg) -> str:
    """The data set, the number of clients and how the examples are split over them."""
    split = {"dirichlet": f"Dirichlet({cfg.alpha:g}) label skew", "shards": f"{cfg.shards_per_client} label shards "
             "per client", "quantity": f"Dirichlet({cfg.beta:g}) client sizes", "iid": "IID"}[cfg.partition]
    if cfg.dataset == "synthetic":  # its own device split (FedProx's Synthetic(alpha, beta)); partition unused
        split = f"Synthetic({cfg.synthetic_alpha:g},{cfg.synthetic_beta:g}) devices"
    elif cfg.dataset == "leaf":  # one client per LEAF user; partition unused
        split = "LEAF users"
    return f"{cfg.dataset}, {cfg.num_clients} clients ({split})"


def _setup(cfg) -> str:
    """One line naming what a fedsim run trained: data, split, clients, aggregation and local work."""
    per_round = "all" if cfg.clients_per_round == 0 else str(cfg.clients_per_round)
    server = (f"{per_round} a round, {cfg.aggregation}" if cfg.server_mode == "rounds" else
              f"{cfg.server_mode} server mode, {cfg.async_concurrency} clients in flight")
    local = f"{cfg.local_steps} local steps" if cfg.local_steps else f"E={cfg.epochs}"
    model = f"MLP {list(cfg.hidden)}" if cfg.model == "mlp" else cfg.model
    return f"{_data_setup(cfg)}, {server}, {model}, {local}, B={cfg.batch_size}, lr {cfg.lr:g}, seed {cfg.seed}"


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
    if rows and cfg.server_mode != "rounds":
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
        fig.suptitle(f"{name}: {_setup(cfg)}", fontsize=10)
        fig.tight_layout()
        fig.savefig(report_dir / "fedsim.png", dpi=110)
        plt.close(fig)
        out.append(str(report_dir / "fedsim.png"))
    hist_path = report_dir.parent / "label_histogram.npy"
    if hist_path.exists():
        hist = np.load(hist_path)
        out.append(plot_label_histogram(hist, report_dir / "label_histogram.png",
                                        f"{name}: per-client label histogram of the training split\n{_data_setup(cfg)}",
                                        max_clients=max(50, min(len(hist), 200))))
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
            + (f" (fewer than {_min_examples(cfg)} examples at held_out_fraction {cfg.held_out_fraction:g})"
               if cfg.held_out_fraction > 0 else " (held_out_fraction is 0)"))
    fig.suptitle(f"{name}: personalization, {cfg.personalize_epochs} local epoch(s) of fine-tuning of the final "
                 f"model\n{note}", fontsize=10)
    fig.tight_layout()
    path = report_dir / "personalization.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _min_examples(cfg) -> int:
    """Fewest examples a client needs for one held-out example: floor(f * n) >= 1 with n >= 2."""
    return max(2, int(np.ceil(1 / cfg.held_out_fraction - 1e-9)))


def _async_plot(rows, cfg, report_dir: Path) -> str:
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.4))
    ax[0].plot(steps, [row.get("test_acc", float("nan")) for row in rows], "-o", ms=3, lw=2)
    ax[0].set_title(f"global model, test accuracy ({cfg.server_mode} mode, {cfg.async_concurrency} clients "
                    f"in flight" + (f", steps on {cfg.async_buffer}" if cfg.server_mode == "threshold" else "") + ")",
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
    fig.suptitle(f"{report_dir.parent.name}: {_setup(cfg)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(report_dir / "fedsim.png", dpi=110)
    plt.close(fig)
    return str(report_dir / "fedsim.png")


EXPERIMENT = Experiment(config=FedSimConfig, run=run, plots=plots,
                        summary_keys=("test_acc", "client_acc_mean", "client_acc_p10", "client_acc_worst",
                                      "reporting", "bytes_up", "bytes_down"))
