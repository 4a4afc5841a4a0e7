"""The sections of the federated experiment configs: ``data``, ``model``, ``clients``, ``strategy``, ``upload``,
``download``, ``privacy``, ``heterogeneity``, ``evaluation``, ``execution`` (and, for the gRPC runtime, ``tls``).

Each section is a frozen dataclass that checks its own fields (every field is validated here and only here; its
error starts with the field's name, and the platform's loader prefixes the section path, so a bad value reads
``strategy.trim_fraction: must lie in [0, 0.5), got 0.7``) and builds the runtime object it configures
(``FitConfig``, the strategy, the upload stages, ``Heterogeneity``, ...) through the public constructors of
:mod:`fedarena.federated.strategy`, :mod:`fedarena.federated.stages`, :mod:`fedarena.federated.compression` and
:mod:`fedarena.federated.scheduler`. A section that means the same in the simulation (kind ``fedsim``) and the
gRPC runtime (kind ``fedavg_grpc``) is the same class in both (:class:`ClientsConfig` for local training,
:class:`ServerOptimizerConfig`, :class:`LDPConfig`, :class:`SignDSConfig`); a kind that needs more derives from it.
Checks across sections (SecAgg needs a mean, DP-FedAvg samples its own clients, ...) live in the kinds' config
classes, :class:`fedarena.federated.fedsim_experiment.FedSimConfig` and
:class:`fedarena.federated.grpc_experiment.FedAvgGrpcConfig`.

Attackers and defences: the section ``attack`` (:class:`AttackConfig`, :mod:`fedarena.federated.attacks`) says who
attacks and how; the defence is part of how the server aggregates, so it is ``strategy.defence``
(:class:`DefenceConfig`, :mod:`fedarena.federated.defences`) and is configured with or without an attack. They
replace ``heterogeneity.adversary``, ``adversary_fraction`` and ``adversary_scale`` (:data:`ADVERSARY_MOVED`).

``FEDSIM_MOVED`` and ``GRPC_MOVED`` map every key of the old flat layouts (before the sections) to its dotted path
now: the loader names the new path of an old key in one line, and ``fedarena show --migrate FILE`` rewrites an old
file (:func:`fedarena.platform.config.migrate`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from fedarena.platform.experiment import ExperimentConfig, param

ServerOptimizerName = Literal["fedavg", "fedadagrad", "fedadam", "fedyogi"]


def _in_unit(name: str, v: float, lo_open: bool = False, hi_open: bool = False) -> None:
    lo_ok = v > 0 if lo_open else v >= 0
    hi_ok = v < 1 if hi_open else v <= 1
    if not (lo_ok and hi_ok):
        raise ValueError(f"{name}: must lie in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}, got {v}")


def _at_least(name: str, v: float, lo: float) -> None:
    if v < lo:
        raise ValueError(f"{name}: must be >= {lo:g}, got {v}")


def _positive(name: str, v: float) -> None:
    if not v > 0:
        raise ValueError(f"{name}: must be > 0, got {v}")


def _check_trim(v: float) -> None:
    """The trimmed mean cuts ``v`` of the updates at each end: less than half, or nothing would remain."""
    if not 0 <= v < 0.5:
        raise ValueError(f"trim_fraction: must lie in [0, 0.5), got {v}")


# ----------------------------------------------------------------------------- sections of both kinds


@dataclass(frozen=True)
class ClientsConfig:
    """Which clients train in a round and how they train (McMahan et al. 2017's C, E, B; FedProx's mu)."""

    per_round: int = param(10, "clients selected per round (0 = all)")
    epochs: int = param(1, "local epochs E")
    batch_size: int = param(10, "local minibatch size B")
    lr: float = param(0.1, "local SGD learning rate")
    prox_mu: float = param(0.0, "FedProx proximal coefficient mu (Li et al. 2020; 0 = FedAvg)")

    def __post_init__(self) -> None:
        _at_least("per_round", self.per_round, 0)
        _at_least("epochs", self.epochs, 1)
        _at_least("batch_size", self.batch_size, 1)
        _positive("lr", self.lr)
        _at_least("prox_mu", self.prox_mu, 0)

    def check_clients(self, num_clients: int) -> None:
        """``per_round`` against the clients there are (called by the kinds, which know ``data.num_clients``)."""
        if self.per_round > num_clients:
            raise ValueError(f"clients.per_round: {self.per_round} exceeds the {num_clients} clients")

    def build(self, local_steps: int = 0):
        """The local training of a round: :class:`fedarena.federated.strategy.FitConfig`."""
        from fedarena.federated.strategy import FitConfig

        return FitConfig(self.epochs, self.batch_size, self.lr, self.prox_mu, local_steps)


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """The server's update rule on the aggregated delta (Reddi et al. 2021's FedOpt: FedAdagrad, FedAdam, FedYogi;
    ``fedavg`` adds ``lr`` times the delta)."""

    name: ServerOptimizerName = param("fedavg", "server update rule")
    lr: float = param(1.0, "server learning rate eta")
    beta1: float = param(0.9, "FedAdam/FedYogi beta1")
    beta2: float = param(0.99, "FedAdam/FedYogi beta2")
    tau: float = param(1e-3, "FedAdagrad/FedAdam/FedYogi adaptivity tau")

    def __post_init__(self) -> None:
        _positive("lr", self.lr)
        _in_unit("beta1", self.beta1, hi_open=True)
        _in_unit("beta2", self.beta2, hi_open=True)
        _positive("tau", self.tau)

    def build(self):
        from fedarena.federated.strategy import ServerOptimizer

        return ServerOptimizer(self.name, self.lr, self.beta1, self.beta2, self.tau)


@dataclass(frozen=True)
class LDPConfig:
    """Local DP of every upload: clip to ``clip_norm`` and add analytic-Gaussian noise (Balle & Wang 2018)."""

    epsilon: float = param(0.0, "epsilon per upload (0 = off)")
    delta: float = param(1e-5, "delta per upload")
    clip_norm: float = param(1.0, "L2 clipping norm of the update before the noise")

    def __post_init__(self) -> None:
        _at_least("epsilon", self.epsilon, 0)
        _in_unit("delta", self.delta, lo_open=True, hi_open=True)
        _positive("clip_norm", self.clip_norm)

    @property
    def on(self) -> bool:
        return self.epsilon > 0

    def build(self):
        from fedarena.federated.stages import GaussianLDP

        return GaussianLDP(self.epsilon, self.delta, self.clip_norm)


@dataclass(frozen=True)
class SignDSConfig:
    """SignDS uploads (Jiang et al. 2022): a client reports ``h`` dimensions drawn around its top-``k`` set."""

    k: int = param(0, "top-k size (0 = off); when on, clients upload SignDS reports")
    h: int = param(0, "number of reported dimensions h")
    epsilon: float = param(1.0, "epsilon per upload")
    lr: float = param(0.01, "global learning rate of the decoded sign vector")

    def __post_init__(self) -> None:
        _at_least("k", self.k, 0)
        if self.k > 0 and self.h < 1:
            raise ValueError(f"h: SignDS with k = {self.k} reports h >= 1 dimensions, got {self.h}")
        _at_least("h", self.h, 0)
        _positive("epsilon", self.epsilon)
        _positive("lr", self.lr)

    @property
    def on(self) -> bool:
        return self.k > 0

    def build(self):
        from fedarena.federated.stages import SignDSUpload

        return SignDSUpload(self.k, self.h, self.epsilon, self.lr)


# ----------------------------------------------------------------------------- fedsim


@dataclass(frozen=True)
class DataConfig:
    """The data set and its split over the simulated clients (:mod:`fedarena.federated.data`)."""

    dataset: Literal["digits", "breast_cancer", "synthetic", "leaf", "mnist", "leaf_femnist", "leaf_shakespeare",
                     "tff_emnist", "tff_shakespeare", "tff_cifar100", "tff_stackoverflow_nwp", "tff_stackoverflow_tag",
                     "cifar10", "cifar100"] = param(
        "digits", "data set; leaf_* / tff_* / cifar10 / cifar100 are read per client from data.path "
        "(fedarena.federated.datasets), leaf and mnist whole into memory")
    path: str = param("", "local file or folder of a data set read from disk (no download)")
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
    label: Literal["fine", "coarse"] = param("fine", "CIFAR-100 labels: fine (100 classes) or coarse (20)")
    cache_dir: str = param("", "folder of the per-user index when the data folder is read-only "
                           "('' = ~/.cache/fedarena/data)")
    prefetch_threads: int = param(2, "threads reading and mapping a round's clients ahead of training")
    augment: bool = param(True, "CIFAR: random crop (padding 4) and horizontal flip of training examples")
    test_clients: int = param(200, "global test set of a per-user data set without one: the held-out examples "
                              "of this many users")
    vocab_path: str = param("", "tff_stackoverflow_*: TFF's word-count file ('' = stackoverflow.word_count beside "
                            "the data; its folder also holds stackoverflow.tag_count)")

    def __post_init__(self) -> None:
        if self.dataset not in ("digits", "breast_cancer", "synthetic") and not self.path:
            raise ValueError(f"path: dataset '{self.dataset}' is read from a local path; set path")
        # a missing path is reported when the data are loaded (one line naming data.path, exit 2), not here: a
        # shipped config names the files of the machine it runs on (experiments/reddi_*.yaml)
        _at_least("num_clients", self.num_clients, 1)
        _positive("alpha", self.alpha)
        _at_least("shards_per_client", self.shards_per_client, 1)
        _positive("beta", self.beta)
        _in_unit("test_fraction", self.test_fraction, lo_open=True, hi_open=True)
        _in_unit("held_out_fraction", self.held_out_fraction, hi_open=True)
        _at_least("synthetic_alpha", self.synthetic_alpha, 0)
        _at_least("synthetic_beta", self.synthetic_beta, 0)
        _at_least("synthetic_size_sigma", self.synthetic_size_sigma, 0)
        _at_least("synthetic_size_min", self.synthetic_size_min, 1)
        _at_least("synthetic_size_max", self.synthetic_size_max, 0)
        _at_least("prefetch_threads", self.prefetch_threads, 1)
        _at_least("test_clients", self.test_clients, 0)

    def build(self):
        """:class:`fedarena.federated.data.DataSpec` (``data.load(spec, seed)`` makes the data set)."""
        from fedarena.federated import data

        return data.DataSpec(dataset=self.dataset, path=self.path, partition=data.PartitionSpec(
            self.partition, self.num_clients, self.alpha, self.shards_per_client, self.beta),
            test_fraction=self.test_fraction, held_out_fraction=self.held_out_fraction,
            synthetic_alpha=self.synthetic_alpha, synthetic_beta=self.synthetic_beta,
            synthetic_size_mean=self.synthetic_size_mean, synthetic_size_sigma=self.synthetic_size_sigma,
            synthetic_size_min=self.synthetic_size_min, synthetic_size_max=self.synthetic_size_max, label=self.label,
            cache_dir=self.cache_dir, prefetch_threads=self.prefetch_threads, augment=self.augment,
            test_clients=self.test_clients, vocab_path=self.vocab_path)


ZOO_ARCHS = ("resnet18_gn", "resnet8_gn", "cnn_emnist", "char_lstm", "word_lstm", "transformer", "tag_lr")
"""``model.arch`` names of :mod:`fedarena.federated.models` (kept here so that loading a config imports no engine)"""


@dataclass(frozen=True)
class ModelConfig:
    """The model every client trains (:mod:`fedarena.federated.simulation`'s batched models)."""

    arch: str = param("mlp", "mlp (ReLU MLP of hidden sizes; the paper's 2NN is [200, 200]), cnn (McMahan et al. "
                      "2017's CNN: 5x5 convs, 2x2 max pools, a ReLU layer), or a torch model "
                      "'torch:module.path:factory' (factory(num_features, num_classes) -> nn.Module, converted by "
                      "engine.from_torch; the run imports that module and calls the factory: a config is code, "
                      "run only configs you trust); Reddi et al. 2021's models (fedarena.federated.models): "
                      "resnet18_gn, resnet8_gn, cnn_emnist, char_lstm, word_lstm, transformer, tag_lr")
    hidden: list[int] = param(doc="hidden layer sizes of the MLP ([] = softmax regression)", factory=lambda: [32])
    cnn_channels: list[int] = param(doc="cnn: channels of the two 5x5 convolutions", factory=lambda: [32, 64])
    cnn_hidden: int = param(512, "cnn: units of the fully connected ReLU layer")
    image_shape: list[int] = param(doc="cnn: (channels, height, width) of an example; [] = one channel, square",
                                   factory=list)
    zero_init: bool = param(False, "start from all-zero parameters (softmax regression)")
    widths: list[int] = param(doc="resnet*_gn: channels per stage; cnn_emnist: the two convolutions' channels "
                              "([] = the paper's)", factory=list)
    embed_dim: int = param(0, "char_lstm/word_lstm: embedding width; transformer: model width (0 = the paper's: "
                           "8, 96; transformer 64)")
    units: int = param(0, "char_lstm/word_lstm: LSTM units; transformer: feed-forward units; cnn_emnist: dense "
                       "units (0 = 256, 670; 2 x embed_dim; 128)")
    num_layers: int = param(0, "char_lstm/word_lstm/transformer: stacked layers (0 = 2, 1, 2)")
    num_heads: int = param(0, "transformer: attention heads (0 = 4)")
    norm_groups: int = param(2, "resnet*_gn: group-norm groups (2, as Hsieh et al. 2020 and Reddi et al. 2021)")

    def __post_init__(self) -> None:
        if self.arch not in ("mlp", "cnn", *ZOO_ARCHS) and not self.arch.startswith("torch:"):
            raise ValueError(f"arch: expected mlp, cnn, {', '.join(ZOO_ARCHS)} or torch:module:factory, got {self.arch!r}")
        for name in ("embed_dim", "units", "num_layers", "num_heads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 = the paper's value), got {getattr(self, name)}")
        if self.norm_groups < 1 or any(w < 1 for w in self.widths):
            raise ValueError(f"norm_groups/widths: must be >= 1, got {self.norm_groups}, {self.widths}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: every layer needs >= 1 unit, got {self.hidden}")
        if self.image_shape and len(self.image_shape) != 3:
            raise ValueError(f"image_shape: (channels, height, width) expected, got {self.image_shape}")

    def build(self, num_features: int, num_classes: int):
        """The batched model: the MLP ``(features, *hidden, classes)``, the CNN on ``image_shape``, or a torch
        model through engine.from_torch (:mod:`fedarena.federated.torch_model`). Data-dependent errors (a CNN
        whose image does not fit the features) are ``ValueError`` naming the field."""
        import numpy as np

        from fedarena.federated.simulation import BatchedCNN, BatchedMLP

        if self.arch == "mlp":
            return BatchedMLP((num_features, *self.hidden, num_classes))
        from fedarena.federated.models import BatchedZooModel

        if self.arch in ZOO_ARCHS:
            return BatchedZooModel(self.arch, num_features, num_classes, image=tuple(self.image_shape),
                                   widths=tuple(self.widths), embed_dim=self.embed_dim, hidden=self.units,
                                   num_layers=self.num_layers, num_heads=self.num_heads, groups=self.norm_groups)
        if self.arch.startswith("torch:"):
            from fedarena.engine.interop import TorchConversionError
            from fedarena.federated.torch_model import BatchedTorchModel

            try:
                return BatchedTorchModel(self.arch, num_features, num_classes)
            except (ValueError, TorchConversionError) as e:  # torch_model names the field "model"
                raise ValueError(f"model.arch: {str(e).removeprefix('model: ')}") from None
        image = tuple(self.image_shape)
        if not image:
            side = int(round(num_features ** 0.5))
            if side * side != num_features:
                raise ValueError(f"model.image_shape: {num_features} features are not a square one-channel image; "
                                 "set model.image_shape")
            image = (1, side, side)
        if int(np.prod(image)) != num_features:
            raise ValueError(f"model.image_shape: {list(image)} has {int(np.prod(image))} pixels, the data has "
                             f"{num_features}")
        return BatchedCNN(image, num_classes, self.cnn_channels, self.cnn_hidden)

    def init_params(self, model: Any, seed: int) -> dict[str, Any]:
        """The global model's starting parameters (all zero with ``zero_init``)."""
        import numpy as np

        params = model.init_params(seed)
        return {k: np.zeros_like(v) for k, v in params.items()} if self.zero_init else params


@dataclass(frozen=True)
class SimClientsConfig(ClientsConfig):
    """:class:`ClientsConfig` plus the simulation's local-step schedules (the FL chapter's adaptive aggregation
    frequency: few local steps early, more later, or driven by the divergence of the client updates)."""

    local_steps: int = param(0, "> 0: this many local steps instead of epochs")
    step_schedule: Literal["fixed", "linear", "divergence"] = param(
        "fixed", "local steps per round: fixed, linear growth, or driven by the divergence of client updates")
    steps_min: int = param(1, "fewest local steps of a schedule")
    steps_max: int = param(20, "most local steps of a schedule")
    divergence_target: float = param(1.0, "divergence schedule: halve steps above, double below this divergence")

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least("local_steps", self.local_steps, 0)
        if not 1 <= self.steps_min <= self.steps_max:
            raise ValueError(f"steps_min/steps_max: need 1 <= min <= max, got {self.steps_min}, {self.steps_max}")
        _positive("divergence_target", self.divergence_target)

    def build(self, local_steps: int | None = None):
        return super().build(self.local_steps if local_steps is None else local_steps)


SIM_RULES = ("fedavg", "scaffold", "median", "trimmed_mean", "krum", "geometric_median")


@dataclass(frozen=True)
class StrategyConfig:
    """How the server aggregates (FedAvg, SCAFFOLD, a Byzantine-robust rule) and updates the global model, and
    whether it runs rounds or the buffered-asynchronous modes of :mod:`fedarena.federated.buffered_async`."""

    aggregation: Literal["fedavg", "scaffold", "median", "trimmed_mean", "krum", "geometric_median"] = param(
        "fedavg", "aggregation rule")
    trim_fraction: float = param(0.2, "trimmed mean: fraction trimmed at each end")
    krum_byzantine: int = param(0, "Krum's assumed number of Byzantine clients f")
    krum_keep: int = param(1, "multi-Krum: updates averaged (m = n - f is Blanchard et al.'s multi-Krum)")
    krum_preselect: bool = param(False, "median/trimmed_mean/geometric_median: first keep the n - f updates with "
                                 "the lowest Krum scores (Bulyan's selection stage)")
    max_weight: float = param(0.0, "example-count bound on a client's FedAvg weight (0 = none)")
    server_optimizer: ServerOptimizerConfig = param(doc="the server's update rule",
                                                    factory=ServerOptimizerConfig)
    server_mode: Literal["rounds", "sync", "threshold", "async"] = param(
        "rounds", "rounds: synchronous rounds; sync / threshold (FedBuff) / async: the global model lives on the "
        "engine's parameter server, async_concurrency clients train at once and `rounds` counts server steps "
        "(fedarena.federated.buffered_async; plain FedAvg with dense uploads only)")
    async_concurrency: int = param(10, "clients training at once (server_mode sync / threshold / async)")
    async_buffer: int = param(5, "deltas per server step in threshold mode (FedBuff's K)")
    async_staleness: int = param(4, "largest model-version lag of an applied delta (threshold / async)")
    defence: DefenceConfig = param(doc="a defence in place of the aggregation rule (with aggregation fedavg)",
                                   factory=lambda: DefenceConfig())

    def __post_init__(self) -> None:
        _check_trim(self.trim_fraction)
        if self.defence.on and self.aggregation != "fedavg":
            raise ValueError(f"defence: strategy.defence.kind {self.defence.kind} replaces the aggregation rule; "
                             f"set strategy.aggregation to fedavg, got {self.aggregation}")
        _at_least("krum_byzantine", self.krum_byzantine, 0)
        _at_least("krum_keep", self.krum_keep, 1)
        if self.krum_preselect and (self.aggregation not in ("median", "trimmed_mean", "geometric_median")
                                    or self.krum_byzantine < 1):
            raise ValueError("krum_preselect: needs median, trimmed_mean or geometric_median and krum_byzantine >= 1")
        _at_least("max_weight", self.max_weight, 0)
        _at_least("async_concurrency", self.async_concurrency, 1)
        _at_least("async_buffer", self.async_buffer, 1)
        if self.server_mode != "rounds" and self.async_buffer > self.async_concurrency:
            raise ValueError(f"async_buffer: a server step waits for {self.async_buffer} deltas but only "
                             f"async_concurrency = {self.async_concurrency} clients train at once")
        _at_least("async_staleness", self.async_staleness, 0)

    def build(self, fit: Any, clients_per_round: int):
        """The strategy of a round (DP-FedAvg and SecAgg wrap it: :meth:`SimPrivacyConfig.wrap`)."""
        from fedarena.federated import strategy as st

        common = dict(fit=fit, server_optimizer=self.server_optimizer.build(), clients_per_round=clients_per_round,
                      max_weight=self.max_weight)
        if self.aggregation == "fedavg":
            return st.FedAvg(**common)
        if self.aggregation == "scaffold":
            return st.Scaffold(**common, server_lr=self.server_optimizer.lr)
        return st.RobustAggregate(**common, rule=self.aggregation, trim_fraction=self.trim_fraction,
                                  num_byzantine=self.krum_byzantine, krum_keep=self.krum_keep,
                                  krum_preselect=self.krum_preselect)

    def build_async(self, rounds: int, eval_every: int):
        """:class:`fedarena.federated.buffered_async.AsyncFLConfig` of the asynchronous server modes."""
        from fedarena.federated.buffered_async import AsyncFLConfig

        return AsyncFLConfig(mode=self.server_mode, concurrency=self.async_concurrency, buffer=self.async_buffer,
                             staleness=self.async_staleness, server_lr=self.server_optimizer.lr, steps=rounds,
                             eval_every=eval_every)


CodecName = Literal["dense", "quantize", "topk", "topk_quantize"]


@dataclass(frozen=True)
class UploadConfig:
    """What a client does to its update before it leaves: clipping and compression
    (:mod:`fedarena.federated.compression`; local DP and SignDS are in ``privacy``)."""

    clip_norm: float = param(0.0, "client-side clipping of the update's L2 norm (0 = off)")
    codec: CodecName = param("dense", "upload compression")
    bits: int = param(8, "bits of the upload quantizer")
    fraction: float = param(0.01, "fraction kept by top-k uploads")
    error_feedback: bool = param(True, "error feedback for compressed uploads")
    prediction: Literal["none", "trajectory"] = param(
        "none", "compress the update's difference to its prediction from the global model's trajectory since the "
        "client's last upload (for partial participation; see fedarena.federated.compression)")

    def __post_init__(self) -> None:
        _at_least("clip_norm", self.clip_norm, 0)
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits: must lie in 1..8, got {self.bits}")
        _in_unit("fraction", self.fraction, lo_open=True)

    def build(self):
        """``(stages, upload)``: the clipping stage (if on) and the compressed upload (None when dense)."""
        from fedarena.federated import compression, stages

        pre = [stages.Clip(self.clip_norm)] if self.clip_norm > 0 else []
        if self.codec == "dense":
            return pre, None
        return pre, compression.UploadCompression(compression.Codec(self.codec, self.bits, self.fraction),
                                                  self.error_feedback, self.prediction)


@dataclass(frozen=True)
class DownloadConfig:
    """Compression of the broadcast global model (:class:`fedarena.federated.compression.Broadcast`)."""

    codec: CodecName = param("dense", "broadcast compression")
    bits: int = param(8, "bits of the broadcast quantizer")
    fraction: float = param(0.01, "fraction kept by a top-k broadcast")

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits: must lie in 1..8, got {self.bits}")
        _in_unit("fraction", self.fraction, lo_open=True)

    def build(self, seed: int):
        from fedarena.federated import compression

        if self.codec == "dense":
            return None
        return compression.Broadcast(compression.Codec(self.codec, self.bits, self.fraction), seed=seed)


@dataclass(frozen=True)
class DPFedAvgConfig:
    """DP-FedAvg (McMahan et al. 2018): Poisson client sampling with rate ``sample_rate``, server-side clipping,
    Gaussian noise on the sum (:class:`fedarena.federated.stages.DPFedAvg`)."""

    noise_multiplier: float = param(0.0, "noise multiplier z (0 = off)")
    clip_norm: float = param(1.0, "server-side clip S of every client update")
    sample_rate: float = param(0.1, "Poisson client sampling rate q (replaces clients.per_round)")
    delta: float = param(1e-5, "delta of the reported epsilon")
    accountant: Literal["rdp", "pld"] = param("rdp", "accountant of dp_epsilon: RDP or the tighter privacy loss "
                                                     "distribution; both are logged as dp_epsilon_rdp / dp_epsilon_pld")
    adaptive_clip: bool = param(False, "adapt the clip to a quantile of the update norms (Andrew et al. 2021); "
                                       "clip_norm is then the initial clip")
    target_quantile: float = param(0.5, "adaptive clip: target fraction gamma of unclipped updates")
    clip_learning_rate: float = param(0.2, "adaptive clip: eta_C of C <- C exp(-eta_C (b_bar - gamma))")
    clip_count_stddev: float = param(0.0, "adaptive clip: noise sigma_b on the count of unclipped updates "
                                          "(0 = q N / 20); must exceed noise_multiplier / 2")

    def __post_init__(self) -> None:
        _at_least("noise_multiplier", self.noise_multiplier, 0)
        _positive("clip_norm", self.clip_norm)
        _in_unit("sample_rate", self.sample_rate, lo_open=True)
        _in_unit("delta", self.delta, lo_open=True, hi_open=True)
        if self.accountant not in ("rdp", "pld"):
            raise ValueError(f"accountant: must be 'rdp' or 'pld', got {self.accountant!r}")
        _in_unit("target_quantile", self.target_quantile, lo_open=True, hi_open=True)
        _positive("clip_learning_rate", self.clip_learning_rate)
        _at_least("clip_count_stddev", self.clip_count_stddev, 0)
        if self.adaptive_clip and 0 < 2 * self.clip_count_stddev <= self.noise_multiplier:
            raise ValueError(f"clip_count_stddev: must exceed noise_multiplier / 2 = {self.noise_multiplier / 2:g}, "
                             f"got {self.clip_count_stddev}")

    def mechanism(self, num_clients: int, seed: int | None = None):
        """The :class:`~fedarena.privacy.dp_fedavg.DPFedAvgMechanism` of ``num_clients`` clients."""
        from fedarena.privacy.adaptive_clipping import QuantileClipper
        from fedarena.privacy.dp_fedavg import DPFedAvgMechanism

        n = max(num_clients, 1)
        clipper = None
        if self.adaptive_clip:
            count_stddev = self.clip_count_stddev or self.sample_rate * n / 20
            if 2 * count_stddev <= self.noise_multiplier:
                from fedarena.platform.errors import ConfigError

                raise ConfigError(f"privacy.dp.clip_count_stddev: {count_stddev:g} (0 means q N / 20 with N = {n}) "
                                  f"must exceed noise_multiplier / 2 = {self.noise_multiplier / 2:g}")
            clipper = QuantileClipper(self.clip_norm, self.sample_rate * n, self.target_quantile,
                                      self.clip_learning_rate, self.clip_count_stddev, seed=seed)
        return DPFedAvgMechanism(self.clip_norm, self.noise_multiplier, self.sample_rate, n, self.delta,
                                 seed=seed, accountant=self.accountant, clipper=clipper)

    @property
    def on(self) -> bool:
        return self.noise_multiplier > 0


@dataclass(frozen=True)
class SimSecAggConfig:
    """Secure aggregation of every simulated round with the real protocol objects
    (:class:`fedarena.federated.stages.SecureAggregation`)."""

    enabled: bool = param(False, "secure aggregation of every round")
    neighbours: int = param(0, "SecAgg+ neighbourhood size (even; 0 = plain SecAgg)")
    dropout: float = param(0.0, "fraction of clients silent before their masked input")

    def __post_init__(self) -> None:
        if self.neighbours < 0 or self.neighbours % 2:
            raise ValueError(f"neighbours: must be even and >= 0, got {self.neighbours}")
        _in_unit("dropout", self.dropout, hi_open=True)


@dataclass(frozen=True)
class SimPrivacyConfig:
    """Privacy of the simulated rounds: local DP or SignDS uploads, DP-FedAvg, secure aggregation."""

    ldp: LDPConfig = param(doc="local DP of every upload", factory=LDPConfig)
    signds: SignDSConfig = param(doc="SignDS uploads", factory=SignDSConfig)
    dp: DPFedAvgConfig = param(doc="DP-FedAvg", factory=DPFedAvgConfig)
    secagg: SimSecAggConfig = param(doc="secure aggregation", factory=SimSecAggConfig)
    seed: int = param(-1, "seed of the privacy randomness (LDP noise, SignDS); -1 = every draw from the OS CSPRNG; "
                          "set only for reproducible tests")

    def __post_init__(self) -> None:
        _at_least("seed", self.seed, -1)

    def wrap(self, strategy: Any, num_clients: int, seed: int):
        """``strategy`` inside DP-FedAvg and / or SecAgg, as configured."""
        from fedarena.federated import stages

        if self.dp.on:
            strategy = stages.DPFedAvg(strategy, self.dp.mechanism(num_clients))
        if self.secagg.enabled:
            strategy = stages.SecureAggregation(strategy, neighbours=self.secagg.neighbours,
                                                dropout=self.secagg.dropout, seed=seed)
        return strategy


AttackName = Literal["none", "sign_flip", "scale", "alie", "ipm", "min_max", "min_sum", "label_flip", "backdoor"]
ATTACKS: tuple[str, ...] = ("none", "sign_flip", "scale", "alie", "ipm", "min_max", "min_sum", "label_flip",
                            "backdoor")
Direction = Literal["unit", "std", "sign"]


@dataclass(frozen=True)
class AttackConfig:
    """The ``attack`` section: which attack (:mod:`fedarena.federated.attacks`), how many clients collude, and the
    attack's parameters. The coalition is drawn once per run from the seed (the same clients in both kinds); in the
    simulation it sees the round's honest updates (:class:`~fedarena.federated.attacks.Attacked`), in the gRPC
    runtime each attacker sees only its own data and update (:class:`~fedarena.federated.attacks.ClientAttack`),
    so the attacks built on the honest updates (alie, ipm, min_max, min_sum) are simulation only."""

    kind: AttackName = param("none", "the attack: none, sign_flip, scale, alie, ipm, min_max, min_sum, label_flip, "
                             "backdoor")
    num_attackers: int = param(0, "clients of the coalition (or give fraction)")
    fraction: float = param(0.0, "the coalition as a fraction of all clients, round(fraction * clients) of them "
                            "(or give num_attackers)")
    scale: float = param(4.0, "sign_flip / scale: the factor s of -s Delta / s Delta")
    z: float = param(0.0, "alie: the shift in standard deviations; 0 = Baruch et al.'s z_max for the round's n and f")
    epsilon: float = param(0.5, "ipm: the attackers upload -epsilon times the benign mean")
    direction: Direction = param("std", "min_max / min_sum: perturbation direction (unit, std, sign)")
    gamma_init: float = param(10.0, "min_max / min_sum: first gamma of the search")
    tolerance: float = param(1e-5, "min_max / min_sum: the search stops when its step is below this")
    target: int = param(0, "backdoor: the label the trigger should produce")
    poison_fraction: float = param(0.5, "backdoor: triggered copies added, as a fraction of an attacker's examples")
    boost: float = param(0.0, "backdoor: upload scale; 0 = n / (eta a), model replacement (fedavg_grpc: a is the "
                         "coalition's expected share of a round, a client cannot count the attackers reporting)")

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"kind: unknown attack '{self.kind}' ({', '.join(ATTACKS)})")
        _at_least("num_attackers", self.num_attackers, 0)
        _in_unit("fraction", self.fraction)
        if self.num_attackers and self.fraction:
            raise ValueError("num_attackers: give num_attackers or fraction, not both")
        if self.kind != "none" and self.num_attackers == 0 and self.fraction == 0:
            raise ValueError(f"num_attackers: attack '{self.kind}' needs attackers (num_attackers or fraction)")
        _positive("scale", self.scale)
        _at_least("z", self.z, 0)
        _positive("epsilon", self.epsilon)
        if self.direction not in ("unit", "std", "sign"):
            raise ValueError(f"direction: unknown '{self.direction}' (unit, std, sign)")
        _positive("gamma_init", self.gamma_init)
        _positive("tolerance", self.tolerance)
        _at_least("target", self.target, 0)
        _in_unit("poison_fraction", self.poison_fraction, lo_open=True)
        _at_least("boost", self.boost, 0)

    @property
    def on(self) -> bool:
        return self.kind != "none"

    def count(self, num_clients: int) -> int:
        """Clients of the coalition among ``num_clients``."""
        return self.num_attackers if self.num_attackers else int(round(self.fraction * num_clients))

    def build(self, client_ids, num_classes: int, seed: int):
        """:class:`fedarena.federated.attacks.AttackPlan`: the attack and a coalition of :meth:`count` of
        ``client_ids`` drawn by ``(seed, 23)``."""
        import numpy as np

        from fedarena.federated.attacks import AttackPlan, make_attack

        if self.kind == "backdoor" and self.target >= num_classes:
            raise ValueError(f"target: must lie in [0, {num_classes}), got {self.target}")
        members = self.coalition(len(client_ids), seed)
        if not members:
            return AttackPlan(None, frozenset(), seed)
        ids = frozenset(np.asarray(client_ids)[members].tolist())
        return AttackPlan(make_attack(self.kind, num_classes, **self.attack_params()), ids, seed)

    def coalition(self, num_clients: int, seed: int) -> list[int]:
        """The indices of the coalition's clients among ``num_clients``, drawn by ``(seed, 23)`` (the same in both
        runtimes); empty without an attack."""
        import numpy as np

        k = self.count(num_clients)
        if k > num_clients:
            raise ValueError(f"num_attackers: {k} attackers exceed the {num_clients} clients")
        if not self.on or k == 0:
            return []
        return sorted(np.random.default_rng([seed, 23]).choice(num_clients, k, replace=False).tolist())

    def attack_params(self) -> dict[str, Any]:
        """The parameters :func:`fedarena.federated.attacks.make_attack` takes."""
        return dict(scale=self.scale, z=self.z, epsilon=self.epsilon, direction=self.direction,
                    gamma_init=self.gamma_init, tolerance=self.tolerance, target=self.target,
                    poison_fraction=self.poison_fraction, boost=self.boost)


DefenceName = Literal["none", "centered_clipping", "bucketing", "norm_bound", "fltrust"]
DEFENCES: tuple[str, ...] = ("none", "centered_clipping", "bucketing", "norm_bound", "fltrust")


@dataclass(frozen=True)
class DefenceConfig:
    """``strategy.defence``: a defence of :mod:`fedarena.federated.defences` in place of the aggregation rule.

    ``centered_clipping`` clips around the previous aggregate; ``bucketing`` runs ``bucket_rule`` (default
    centered clipping) over bucket means; ``norm_bound`` clips to ``norm_multiple`` median norms; ``fltrust``
    needs a clean root set on the server (``root_size`` examples, taken out of the test split)."""

    kind: DefenceName = param("none", "the defence: none, centered_clipping, bucketing, norm_bound, fltrust")
    tau: float = param(0.15, "centered clipping's radius in the units of the flattened update (about an honest "
                       "update's distance from the previous aggregate)")
    iterations: int = param(1, "centered clipping's iterations per round (the paper: one suffices with momentum)")
    bucket_size: int = param(2, "bucketing's s")
    weighted: bool = param(False, "centered clipping and bucketing weigh each update by the strategy's client weight "
                           "(FedAvg's example count): bucket means are weighted means and CC the weighted mean of the "
                           "clipped steps; False: unweighted, as in the papers")
    bucket_rule: str = param("centered_clipping", "bucketing's inner rule: a rule of the aggregation table (not "
                             "bucketing or fltrust)")
    trim_fraction: float = param(0.2, "bucketing with trimmed_mean: fraction trimmed at each end")
    num_byzantine: int = param(0, "bucketing with krum / multi_krum: Krum's f among the buckets")
    norm_multiple: float = param(1.0, "norm_bound: clip to this many median norms (1 = FLAME's median-norm bound)")
    root_size: int = param(0, "fltrust: examples of the server's clean root set (0 = none)")

    def __post_init__(self) -> None:
        if self.kind not in DEFENCES:
            raise ValueError(f"kind: unknown defence '{self.kind}' ({', '.join(DEFENCES)})")
        _positive("tau", self.tau)
        _at_least("iterations", self.iterations, 1)
        _at_least("bucket_size", self.bucket_size, 1)
        if self.bucket_rule != "centered_clipping":
            from fedarena.federated import rules

            if self.bucket_rule not in rules.AGGREGATION_RULES or self.bucket_rule in ("bucketing", "fltrust"):
                known = ", ".join(sorted(set(rules.AGGREGATION_RULES) - {"bucketing", "fltrust"}))
                raise ValueError(f"bucket_rule: unknown '{self.bucket_rule}' (a rule of the table: {known})")
        _check_trim(self.trim_fraction)
        _at_least("num_byzantine", self.num_byzantine, 0)
        _positive("norm_multiple", self.norm_multiple)
        _at_least("root_size", self.root_size, 0)
        if self.kind == "fltrust" and self.root_size == 0:
            raise ValueError("root_size: fltrust needs a clean root set on the server (root_size > 0)")

    @property
    def on(self) -> bool:
        return self.kind != "none"

    def build(self, strategy: Any, *, root: Any = None, seed: int = 0) -> Any:
        """``strategy`` defended (``strategy`` itself for ``none``); ``root`` is the server's
        :class:`~fedarena.federated.defences.RootSet`."""
        from fedarena.federated.defences import build_defence

        return build_defence(self, strategy, root=root, seed=seed)


ADVERSARY_MOVED: dict[str, str] = {"adversary": "attack.kind", "adversary_fraction": "attack.fraction",
                                   "adversary_scale": "attack.scale"}
"""The corrupting clients of ``heterogeneity`` (before the ``attack`` section) -> their paths now; the old values
carry over (sign_flip / scale are attack kinds, the fraction and the scale mean the same)."""


@dataclass(frozen=True)
class HeterogeneityConfig:
    """Systems heterogeneity of the simulated clients (:class:`fedarena.federated.simulation.Heterogeneity`); the
    corrupting clients it configured are the ``attack`` section now."""

    MOVED: ClassVar[dict[str, str]] = {k: "/" + v for k, v in ADVERSARY_MOVED.items()}

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

    def __post_init__(self) -> None:
        _in_unit("availability", self.availability, lo_open=True)
        _at_least("speed_mean", self.speed_mean, 0)
        _at_least("speed_sigma", self.speed_sigma, 0)
        _at_least("window_s", self.window_s, 0)
        if self.window_s > 0 and self.speed_mean == 0:
            raise ValueError("window_s: a round window needs client speeds (speed_mean > 0)")
        for name in ("straggler_fraction", "drop_before_training", "drop_after_training", "drop_upload"):
            _in_unit(name, getattr(self, name))

    def build(self):
        from fedarena.federated.simulation import Heterogeneity

        return Heterogeneity(self.availability, self.speed_mean, self.speed_sigma, self.window_s, self.partial_work,
                             self.straggler_fraction, self.drop_before_training, self.drop_after_training,
                             self.drop_upload)


# ----------------------------------------------------------------------------- fedsim: device budgets (issue 35)


@dataclass(frozen=True)
class DevicesConfig:
    """Device profiles of the simulated clients and the width-scaled sub-models they train
    (:mod:`fedarena.federated.devices`, :mod:`fedarena.federated.hetero`; docs/devices.md). Tier lists give one
    value per tier; empty lists take the tiers ``profiles`` names (:data:`fedarena.federated.devices.DEFAULT_TIERS`,
    assumed figures, or :data:`~fedarena.federated.devices.PUBLISHED_TIERS`, published measurements)."""

    enabled: bool = param(False, "give every client a device profile and train under its budget")
    submodel: Literal["none", "heterofl", "fedrolex"] = param(
        "heterofl", "sub-models of clients that cannot train the global model: heterofl (static leading units, "
        "Diao et al. 2021), fedrolex (a rolling window, Alam et al. 2022) or none (they sit the round out)")
    width_levels: list[float] = param(doc="widths a client may train, widest first (the first is the global "
                                      "model's); submodel none uses [1]",
                                      factory=lambda: [1.0, 0.5, 0.25, 0.125, 0.0625])
    scaler: bool = param(True, "divide a sub-model's hidden outputs by its width relative to the global model's "
                         "(HeteroFL's scaler)")
    profiles: Literal["assumed", "published"] = param(
        "assumed", "the tiers when the tier lists are empty: assumed (five tiers, this project's assumptions) or "
        "published (three tiers whose memory, throughput and bandwidth come from published measurements, "
        "docs/devices.md)")
    tier_fraction: list[float] = param(doc="share of the clients in each tier ([] = the tiers of devices.profiles)",
                                       factory=list)
    tier_memory_mb: list[float] = param(doc="memory granted to training per tier, MB", factory=list)
    tier_gflops: list[float] = param(doc="sustained training throughput per tier, GFLOP/s", factory=list)
    tier_up_mbps: list[float] = param(doc="uplink per tier, Mbit/s", factory=list)
    tier_down_mbps: list[float] = param(doc="downlink per tier, Mbit/s", factory=list)
    spread: float = param(0.0, "log-normal sigma of each quantity around its tier's median (0 = every device of "
                          "a tier alike)")
    window_hours: float = param(24.0, "daily availability window of a device, hours (24 = always available)")
    round_interval_s: float = param(600.0, "simulated seconds between the starts of two rounds")
    deadline_s: float = param(0.0, "round deadline, simulated seconds (0 = none; the window's end still binds)")
    int8_download: bool = param(False, "clients receive their (sub-)model quantized to int8, start from its "
                                "dequantized parameters and train with fake quantization (QAT); the download is "
                                "priced at the int8 file's bytes")
    int8_tiers: list[int] = param(doc="with int8_download: only the clients of these tiers (0-based, in the tier "
                                  "lists' order) receive int8 models ([] = every tier)", factory=list)
    int8_calibration: int = param(100, "examples in the server's calibration sample (drawn from the training pool) "
                                  "for the int8 models' activation ranges")

    TIER_FIELDS: ClassVar[tuple[str, ...]] = ("tier_fraction", "tier_memory_mb", "tier_gflops", "tier_up_mbps",
                                              "tier_down_mbps")

    def __post_init__(self) -> None:
        lists = {f: getattr(self, f) for f in self.TIER_FIELDS}
        given = [f for f, v in lists.items() if v]
        if given and len(given) != len(lists):
            raise ValueError(f"{given[0]}: set all five tier lists or none, missing "
                             f"{', '.join(f for f in lists if f not in given)}")
        if given and len({len(v) for v in lists.values()}) != 1:
            raise ValueError(f"tier_fraction: the tier lists differ in length: "
                             f"{', '.join(f'{f} {len(v)}' for f, v in lists.items())}")
        for f, v in lists.items():
            if any(not x > 0 for x in v):
                raise ValueError(f"{f}: every tier needs a value > 0, got {v}")
        if given and self.profiles != "assumed":
            raise ValueError(f"profiles: {self.profiles} names a tier distribution, and the tier lists give another; "
                             f"set one of them")
        if given and abs(sum(self.tier_fraction) - 1) > 1e-6:
            raise ValueError(f"tier_fraction: must sum to 1, got {sum(self.tier_fraction):g}")
        if not self.width_levels or any(not 0 < r <= 1 for r in self.width_levels):
            raise ValueError(f"width_levels: every width must lie in (0, 1], got {self.width_levels}")
        if list(self.width_levels) != sorted(set(self.width_levels), reverse=True):
            raise ValueError(f"width_levels: distinct widths, widest first, got {self.width_levels}")
        _at_least("spread", self.spread, 0)
        if not 0 < self.window_hours <= 24:
            raise ValueError(f"window_hours: must lie in (0, 24], got {self.window_hours}")
        _positive("round_interval_s", self.round_interval_s)
        _at_least("deadline_s", self.deadline_s, 0)
        if self.int8_tiers and not self.int8_download:
            raise ValueError("int8_tiers: names the tiers that receive int8 models; set int8_download: true too")
        n = len(self.tiers())
        if any(not 0 <= t < n for t in self.int8_tiers) or len(set(self.int8_tiers)) != len(self.int8_tiers):
            raise ValueError(f"int8_tiers: distinct tier indices in [0, {n - 1}] ({n} tiers), got {self.int8_tiers}")
        _at_least("int8_calibration", self.int8_calibration, 1)

    def tiers(self):
        from fedarena.federated.devices import DEFAULT_TIERS, PUBLISHED_TIERS, DeviceTier

        if not self.tier_fraction:
            return PUBLISHED_TIERS if self.profiles == "published" else DEFAULT_TIERS
        return tuple(DeviceTier(f, m * 1e6, g * 1e9, u * 1e6 / 8, d * 1e6 / 8) for f, m, g, u, d in
                     zip(self.tier_fraction, self.tier_memory_mb, self.tier_gflops, self.tier_up_mbps,
                         self.tier_down_mbps))

    def build(self, sizes: Any, num_clients: int, seed: int):
        """``(DeviceFleet, WidthLevels)`` for an MLP of layer sizes ``sizes``; a width that leaves a hidden layer
        with no unit is a ValueError naming ``devices.width_levels``."""
        from fedarena.federated.devices import DAY_S, DeviceFleet, draw_profiles
        from fedarena.federated.hetero import WidthLevels, level_sizes

        rates = (1.0,) if self.submodel == "none" else tuple(float(r) for r in self.width_levels)
        widths = WidthLevels(rates, "heterofl" if self.submodel == "none" else self.submodel, self.scaler)
        sizes_k = [level_sizes(sizes, r) for r in rates]
        profiles = draw_profiles(self.tiers(), num_clients, seed, self.spread, min(self.window_hours * 3600, DAY_S))
        int8 = (tuple(self.int8_tiers) or tuple(range(len(self.tiers())))) if self.int8_download else None
        return DeviceFleet(profiles, sizes_k, self.round_interval_s, self.deadline_s, int8_tiers=int8,
                           int8_calibration=self.int8_calibration), widths


@dataclass(frozen=True)
class EvaluationConfig:
    """When the global model is evaluated, and the optional local fine-tuning after the last round."""

    every: int = param(1, "evaluate every this many rounds (and after the last)")
    personalize_epochs: int = param(0, "local fine-tuning epochs after the last round (0 = off)")

    def __post_init__(self) -> None:
        _at_least("every", self.every, 1)
        _at_least("personalize_epochs", self.personalize_epochs, 0)


@dataclass(frozen=True)
class ExecutionConfig:
    """Where the simulated clients train."""

    backend: Literal["vmap", "ray"] = param("vmap", "vmap: one process; ray: groups of clients as Ray tasks")
    engine_backend: str = param("numpy", "where the vmapped client training step runs: numpy, cupy (a CUDA GPU) or "
                                "cupy-emulated (the cupy backend's kernels on the CPU, a testing aid); backend vmap "
                                "and server_mode rounds only; aggregation is numpy on the host")
    threads: int = param(1, "math-library (BLAS/OpenMP) threads of the vmap backend's training and evaluation, set "
                         "with threadpoolctl (0 = the libraries' own default; 1 avoids oversubscribing the cores "
                         "the stacked clients already fill)")
    max_stacked_clients: int = param(0, "vmap backend: at most this many clients' model copies stacked in one "
                                     "training call, so memory is bounded by it, not by clients per round "
                                     "(0 = up to 1024)")
    ray_workers: int = param(0, "ray backend: Ray actors (0 = one per cluster CPU, at most 8)")
    ray_chunk: int = param(1, "ray backend: stacked client groups per Ray task (0 = a worker's whole share of a "
                           "round in one task)")

    def __post_init__(self) -> None:
        from fedarena.engine.backend_selection import check_engine_backend

        for name in ("threads", "max_stacked_clients", "ray_workers", "ray_chunk"):
            _at_least(name, getattr(self, name), 0)

        check_engine_backend(self.engine_backend, "engine_backend")
        if self.engine_backend != "numpy" and self.backend != "vmap":
            raise ValueError(f"engine_backend: {self.engine_backend} runs with backend vmap, got {self.backend}")


# ----------------------------------------------------------------------------- fedavg_grpc


@dataclass(frozen=True)
class TaskDataConfig:
    """The data set every node of the deployment rebuilds from the same seed (:class:`fedarena.federated.task.TaskSpec`)."""

    dataset: Literal["digits", "synthetic"] = param("digits", "data set: scikit-learn digits or synthetic blobs")
    num_clients: int = param(20, "number of FL-Client processes (one data shard each)")
    alpha: float = param(0.5, "Dirichlet label-skew concentration over clients (0 = IID split)")

    def __post_init__(self) -> None:
        _at_least("num_clients", self.num_clients, 1)
        _at_least("alpha", self.alpha, 0)


@dataclass(frozen=True)
class TaskModelConfig(ModelConfig):
    """The model the FL-Clients train: fedsim's ``model`` section (:class:`ModelConfig`: the MLP, the CNN,
    Reddi et al.'s models, a torch model), with the runtime's MLP default and the MLP's trainer."""

    hidden: list[int] = param(doc="hidden layer sizes of the MLP", factory=lambda: [64])
    trainer: Literal["engine", "numpy"] = param("engine", "local trainer: fedarena.engine MLP or numpy reference "
                                                "(the MLP only; every other arch trains on the engine)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.arch != "mlp" and self.trainer != "engine":
            raise ValueError(f"trainer: {self.arch} trains on the engine, not {self.trainer}")

    def task_model(self) -> dict[str, Any]:
        """The fields :class:`fedarena.federated.task.TaskSpec` carries to every client ({} for the MLP)."""
        if self.arch == "mlp":
            return {}
        return {f.name: getattr(self, f.name) for f in fields(ModelConfig)}


@dataclass(frozen=True)
class GrpcClientsConfig(ClientsConfig):
    """:class:`ClientsConfig` (with the runtime's defaults) plus how the scheduler picks and waits for the clients
    of a round."""

    per_round: int = param(0, "clients selected per round (0 = all candidates)")
    epochs: int = param(2, "local epochs E")
    batch_size: int = param(16, "local minibatch size B")
    selection: Literal["uniform", "available"] = param("available", "client selection rule")
    min_fraction: float = param(0.5, "fraction of selected clients needed for a round to count")
    window_seconds: float = param(20.0, "time window of a round, in seconds")

    def __post_init__(self) -> None:
        super().__post_init__()
        _in_unit("min_fraction", self.min_fraction, lo_open=True)
        _positive("window_seconds", self.window_seconds)


GRPC_RULES = ("mean", "median", "trimmed_mean", "krum")


@dataclass(frozen=True)
class GrpcStrategyConfig:
    """The scheduler's aggregation rule and server update (:class:`fedarena.federated.scheduler.RoundPolicy`)."""

    aggregation: Literal["mean", "median", "trimmed_mean", "krum"] = param(
        "mean", "the scheduler's rule: example-weighted mean, or a Byzantine-robust rule over every client's delta "
        "(coordinate-wise median, trimmed mean, Krum; not with secagg)")
    trim_fraction: float = param(0.2, "trimmed mean: fraction cut at each end of every coordinate")
    krum_byzantine: int = param(0, "Krum's assumed number of Byzantine clients f per round")
    max_client_weight: float = param(0.25, "'mean': no client's weight exceeds this fraction of the round's total "
                                           "(water-filling cap; 1 = uncapped)")
    norm_bound_multiple: float = param(3.0, "'mean': every delta is clipped to this multiple of the round's median "
                                            "update norm (0 = off)")
    server_optimizer: ServerOptimizerConfig = param(doc="the server's update rule", factory=ServerOptimizerConfig)

    def __post_init__(self) -> None:
        _check_trim(self.trim_fraction)
        _at_least("krum_byzantine", self.krum_byzantine, 0)
        _in_unit("max_client_weight", self.max_client_weight, lo_open=True)
        if not (self.norm_bound_multiple == 0 or self.norm_bound_multiple >= 1):
            raise ValueError(f"norm_bound_multiple: must be 0 (off) or >= 1 (a multiple of the median update norm), "
                             f"got {self.norm_bound_multiple}")


@dataclass(frozen=True)
class GrpcUploadConfig:
    """What an FL-Client does to its update before upload, and what the FL-Servers accept."""

    clip_norm: float = param(0.0, "client-side clipping of the update's L2 norm (0 = off)")
    encoding: Literal["dense", "topk", "q8"] = param("dense", "upload encoder")
    topk_fraction: float = param(0.1, "fraction of entries kept by the topk encoder")
    max_update_norm: float = param(100.0, "servers refuse updates with a larger L2 norm")
    max_examples: int = param(0, "largest example count a client may declare (0 = the task's largest shard)")

    def __post_init__(self) -> None:
        _at_least("clip_norm", self.clip_norm, 0)
        _in_unit("topk_fraction", self.topk_fraction, lo_open=True)
        _positive("max_update_norm", self.max_update_norm)
        _at_least("max_examples", self.max_examples, 0)


@dataclass(frozen=True)
class GrpcSecAggConfig:
    """SecAgg / SecAgg+ rounds of the runtime (:mod:`fedarena.federated.secure_round`)."""

    enabled: bool = param(False, "secure aggregation (SecAgg) of every round's updates")
    threshold: float = param(2 / 3, "threshold t = floor(f * share holders m) + 1, f in [0.5, 1]; resists "
                                    "2 t - m - 1 colluding clients with a malicious scheduler")
    colluders: int = param(-1, "colluding clients to resist with a malicious scheduler; sets t = floor((m + K) / 2) "
                               "+ 1 instead of threshold (-1 = off)")
    neighbours: int = param(0, "SecAgg+ neighbourhood size (even; 0 = plain SecAgg)")
    stage_seconds: float = param(10.0, "window of each SecAgg stage after the first")
    clip: float = param(1.0, "every update coordinate is clipped to [-clip, clip] before masking")
    max_examples: int = param(10000, "example counts are clipped to 1..N inside the masked vector")
    consistency_check: bool = param(True, "signed survivor-list round (malicious-server variant)")

    def __post_init__(self) -> None:
        if not 0.5 <= self.threshold <= 1:
            raise ValueError(f"threshold: must lie in [0.5, 1] (t must exceed half of the share holders), "
                             f"got {self.threshold}")
        _at_least("colluders", self.colluders, -1)
        if self.neighbours < 0 or self.neighbours % 2:
            raise ValueError(f"neighbours: must be even and >= 0, got {self.neighbours}")
        _positive("stage_seconds", self.stage_seconds)
        _positive("clip", self.clip)
        _at_least("max_examples", self.max_examples, 1)


@dataclass(frozen=True)
class GrpcPrivacyConfig:
    """Privacy of the runtime's rounds: local DP or SignDS uploads, secure aggregation."""

    ldp: LDPConfig = param(doc="local DP of every upload", factory=LDPConfig)
    signds: SignDSConfig = param(doc="SignDS uploads", factory=SignDSConfig)
    secagg: GrpcSecAggConfig = param(doc="secure aggregation", factory=GrpcSecAggConfig)


@dataclass(frozen=True)
class GrpcExecutionConfig:
    """The processes of the deployment."""

    num_servers: int = param(2, "number of FL-Server processes")
    timeout_s: float = param(1800.0, "give up if the deployment has not finished by then")
    restart: bool = param(False, "restart a scheduler or FL-Server process that dies (the scheduler resumes from its "
                                 "state file); otherwise the run fails within seconds, naming it")

    def __post_init__(self) -> None:
        _at_least("num_servers", self.num_servers, 1)
        _positive("timeout_s", self.timeout_s)


@dataclass(frozen=True)
class TLSConfig:
    """TLS between the nodes and the clients (:class:`fedarena.federated.transport.TLSFiles`)."""

    cert: str = param("", "PEM certificate chain of the nodes (enables TLS)")
    key: str = param("", "PEM private key of the nodes")
    root: str = param("", "PEM root certificate clients trust")
    mutual: bool = param(False, "mutual TLS: every node and client also presents cert, checked against root")
    client_certs: str = param("", "mutual TLS: folder of <client id>.pem/.key, one certificate per client naming "
                                  "its id; nodes refuse a client whose token names another id")
    loopback: bool = param(False, "generate a loopback CA, a node certificate and one certificate per client "
                                  "(named by its id) in the run folder and use mutual TLS between all nodes "
                                  "(instead of cert/key/root)")

    def __post_init__(self) -> None:
        if self.loopback and (self.cert or self.key or self.root or self.client_certs):
            raise ValueError("loopback: generates its own certificates; leave cert/key/root/client_certs empty")

    def build(self):
        from fedarena.federated.transport import TLSFiles

        return TLSFiles(cert_chain=self.cert, private_key=self.key, root_cert=self.root,
                        server_name="localhost" if self.root else "", mutual=self.mutual,
                        client_certs=self.client_certs)


# ----------------------------------------------------------------------------- the kinds' common part


SECTION_DOCS: dict[str, str] = {
    "data": "the data set and its split over the clients",
    "model": "the model every client trains",
    "clients": "clients per round and their local training",
    "strategy": "the aggregation rule and the server's update",
    "upload": "what a client does to its update before upload (the runtime: and what the FL-Servers accept)",
    "download": "compression of the broadcast model",
    "privacy": "local DP, SignDS, DP-FedAvg (fedsim), secure aggregation",
    "heterogeneity": "availability, speeds, stragglers, dropouts",
    "attack": "attacking clients and their attack (fedsim: a coalition that sees each round's honest updates; the "
              "runtime: each attacker sees only its own data)",
    "evaluation": "evaluation cadence and personalization",
    "execution": "where the clients train (fedsim) or the deployment's processes (the runtime)",
    "tls": "TLS between nodes and clients",
    "devices": "device profiles (memory, compute, bandwidth, availability) and the width-scaled sub-models of "
               "HeteroFL / FedRolex",
}
"""What each section means, the same in both kinds (``fedarena show`` prints it beside the section)."""


@dataclass(frozen=True)
class FLExperimentConfig(ExperimentConfig):
    """What the configs of both FL kinds share: ``rounds``, the declaration of their sections and the checks every
    kind makes across them (a kind names its sections, among them ``data`` and ``clients``, and adds its own
    :meth:`check_sections`).

    A kind declares its sections once, as ``SECTIONS`` (section name -> the kind's section class, in order): each
    becomes a field defaulting to that class's defaults and documented by :data:`SECTION_DOCS`."""

    SECTIONS: ClassVar[dict[str, type]] = {}

    rounds: int = param(50, "number of rounds")

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        annotations = cls.__dict__.get("__annotations__")
        if annotations is None:
            annotations = {}
            cls.__annotations__ = annotations
        for name, section in cls.__dict__.get("SECTIONS", {}).items():  # fields of the dataclass decorator to come
            annotations[name] = section
            setattr(cls, name, param(doc=SECTION_DOCS[name], factory=section))

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds: must be >= 1, got {self.rounds}")
        self.clients.check_clients(self.data.num_clients)  # type: ignore[attr-defined]
        self.check_sections()

    def check_sections(self) -> None:
        """The kind's checks across its sections (each section checks its own fields)."""


# ----------------------------------------------------------------------------- the old flat layouts


def _table(prefix: str, names: str, renamed: dict[str, str] | None = None) -> dict[str, str]:
    """``{old: prefix.new}`` for each of the space-separated ``names`` (``renamed`` maps an old name to a new one)."""
    renamed = renamed or {}
    return {n: f"{prefix}.{renamed.get(n, n)}" for n in names.split()}


_OPT = {"server_optimizer": "server_optimizer.name", "server_lr": "server_optimizer.lr",
        "beta1": "server_optimizer.beta1", "beta2": "server_optimizer.beta2", "tau": "server_optimizer.tau"}
_LDP = {"ldp_epsilon": "privacy.ldp.epsilon", "ldp_delta": "privacy.ldp.delta", "ldp_clip_norm": "privacy.ldp.clip_norm"}
_SIGNDS = {"signds_k": "privacy.signds.k", "signds_h": "privacy.signds.h", "signds_epsilon": "privacy.signds.epsilon",
           "signds_lr": "privacy.signds.lr"}

FEDSIM_MOVED: dict[str, str] = {
    **_table("data", "dataset path num_clients partition alpha shards_per_client beta test_fraction held_out_fraction "
                     "synthetic_alpha synthetic_beta synthetic_size_mean synthetic_size_sigma synthetic_size_min "
                     "synthetic_size_max"),
    **_table("model", "model hidden cnn_channels cnn_hidden image_shape zero_init", {"model": "arch"}),
    **_table("clients", "clients_per_round epochs batch_size lr prox_mu local_steps step_schedule steps_min steps_max "
                        "divergence_target", {"clients_per_round": "per_round"}),
    **_table("strategy", "aggregation trim_fraction krum_byzantine krum_keep krum_preselect max_weight server_mode "
                         "async_concurrency async_buffer async_staleness"),
    **{k: f"strategy.{v}" for k, v in _OPT.items()},
    **_table("heterogeneity", "availability speed_mean speed_sigma window_s partial_work straggler_fraction "
                              "drop_before_training drop_after_training drop_upload"),
    **ADVERSARY_MOVED,
    "clip_norm": "upload.clip_norm",
    **_table("upload", "upload_codec upload_bits upload_fraction upload_error_feedback upload_prediction",
             {f"upload_{k}": k for k in ("codec", "bits", "fraction", "error_feedback", "prediction")}),
    **_table("download", "download_codec download_bits download_fraction",
             {f"download_{k}": k for k in ("codec", "bits", "fraction")}),
    **_LDP, **_SIGNDS,
    "dp_noise_multiplier": "privacy.dp.noise_multiplier", "dp_clip_norm": "privacy.dp.clip_norm",
    "dp_sample_rate": "privacy.dp.sample_rate", "dp_delta": "privacy.dp.delta",
    "secagg": "privacy.secagg.enabled", "secagg_neighbours": "privacy.secagg.neighbours",
    "secagg_dropout": "privacy.secagg.dropout", "privacy_seed": "privacy.seed",
    "backend": "execution.backend", "engine_backend": "execution.engine_backend",
    "eval_every": "evaluation.every", "personalize_epochs": "evaluation.personalize_epochs",
}
"""Every key of the flat ``fedsim`` layout -> its dotted path in :class:`FedSimConfig`."""

GRPC_MOVED: dict[str, str] = {
    **_table("data", "dataset num_clients alpha"),
    **_table("model", "hidden trainer"),
    **_table("clients", "clients_per_round epochs batch_size lr prox_mu selection min_fraction window_seconds",
             {"clients_per_round": "per_round"}),
    **_table("strategy", "aggregation trim_fraction krum_byzantine max_client_weight norm_bound_multiple"),
    **{k: f"strategy.{v}" for k, v in _OPT.items()},
    **_table("upload", "clip_norm encoding topk_fraction max_update_norm max_examples"),
    **_LDP, **_SIGNDS,
    **{f"secagg_{k}": f"privacy.secagg.{k}" for k in ("threshold", "colluders", "neighbours", "stage_seconds",
                                                       "clip", "max_examples", "consistency_check")},
    "secagg": "privacy.secagg.enabled",
    **_table("execution", "num_servers timeout_s restart"),
    **{f"tls_{k}": f"tls.{k}" for k in ("cert", "key", "root", "mutual", "client_certs", "loopback")},
}
"""Every key of the flat ``fedavg_grpc`` layout -> its dotted path in :class:`FedAvgGrpcConfig`."""
