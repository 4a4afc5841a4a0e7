"""The contract between the platform and an experiment kind.

An experiment kind is a config schema (a frozen dataclass deriving from :class:`ExperimentConfig`)
plus a ``run(config, run)`` function that does the work and writes metrics and checkpoints through
the :class:`fedarena.platform.runs.Run` it is given, plus optional plots for the report.

What the platform does for every kind: the run folder, ``status.json`` (running / completed / failed with the
one-line error of :mod:`fedarena.platform.errors` / interrupted by SIGTERM or SIGINT, :mod:`fedarena.platform.loop`),
a checkpoint of the last step (a kind offers its state each step with ``run.checkpoint(step, lambda: state)``, or
supplies its steps to :func:`fedarena.platform.loop.run_loop`, which does; the platform writes the last offer when
``run`` returns),
multi-seed groups (``--seeds`` / ``seeds:``, :mod:`fedarena.platform.groups`), and the Python API
(``fedarena.run`` / ``fedarena.load_run``). Raise ``ConfigError`` from ``__post_init__`` (or ``ValueError``, which
the loader turns into one) for bad values, so they are reported when the config is loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from fedarena.platform.loggers import LoggerName


def param(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A config field with a default and a one-line description shown by ``fedarena show``."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class ClusterConfig:
    """Where Ray work runs."""

    address: str | None = param(None, "Ray cluster address ('auto' or host:port); None starts a local instance")
    num_cpus: int = param(2, "CPUs a local Ray instance may use")
    object_store_mb: int = param(256, "object store size of a local Ray instance, in MiB")


@dataclass(frozen=True)
class CheckpointConfig:
    """How often and how many checkpoints a run keeps."""

    every: int = param(100, "write a checkpoint every this many steps (0 disables periodic checkpoints)")
    keep: int = param(3, "how many of the newest checkpoints to keep")


@dataclass(frozen=True)
class TrackingConfig:
    """Options of the experiment trackers named in ``loggers`` (:mod:`fedarena.platform.loggers`)."""

    experiment: str | None = param(None, "MLflow experiment / W&B project the run goes to (default: the kind)")
    mlflow_uri: str | None = param(None, "MLflow tracking URI (default: MLFLOW_TRACKING_URI, else "
                                         "sqlite:///<run folder>/mlflow.db)")
    wandb_mode: Literal["offline", "online", "disabled"] | None = param(None, "W&B mode (default: WANDB_MODE, "
                                                                             "else offline)")


@dataclass(frozen=True)
class ExperimentConfig:
    """Fields every experiment kind has; a kind's schema derives from this and adds its own."""

    kind: str = param("", "experiment kind, as listed by `fedarena list`")
    name: str = param("", "optional run name, used in the run folder name")
    seed: int = param(0, "seed for every random number generator of the run")
    seeds: list[int] = param(doc="run a group, one run per seed (as --seeds); empty: one run with `seed`",
                             factory=list)
    checkpoint: CheckpointConfig = param(doc="checkpoint policy", factory=CheckpointConfig)
    cluster: ClusterConfig = param(doc="Ray cluster access (kinds that use Ray)", factory=ClusterConfig)
    loggers: list[LoggerName] = param(doc="experiment trackers every metric row also goes to: tensorboard, mlflow, "
                                          "wandb; tune reports to the Ray Tune trial the run is in",
                                      factory=lambda: ["tensorboard"])
    tracking: TrackingConfig = param(doc="options of the trackers in `loggers`", factory=TrackingConfig)


PlotFn = Callable[[Sequence[Mapping[str, Any]], Any, str], list[str]]
"""``plots(rows, config, report_dir) -> [png paths]``: renders the report's figures from metric rows."""


@dataclass(frozen=True)
class Experiment:
    """An experiment kind: its schema, what runs it, and how its report is drawn."""

    config: type
    run: Callable[[Any, Any], Mapping[str, Any]]
    plots: PlotFn | None = None
    summary_keys: tuple[str, ...] = ()
    """Metric names whose latest values the report shows in a table beside the final summary."""
    x_axis: str = "step"
    """The metric used as the x axis of group (multi-seed) plots, e.g. ``env_steps``; ``wall_time`` is the other."""
    group_metrics: tuple[str, ...] = ()
    """Metrics a group report plots as mean and min-max band over seeds (default: ``summary_keys``, else every
    scalar metric all seeds logged)."""
    resumable: bool = True
    """False for kinds that keep no checkpoint to continue from: ``--resume`` is refused in one line before
    anything runs (a resumable kind calls ``run.restore()`` before its first metrics row, or uses
    :func:`fedarena.platform.loop.run_loop`, which does)."""
    evaluate: Callable[[Any, Any, Mapping[str, Any]], Mapping[str, Any]] | None = None
    """``evaluate(run_dir, config, options) -> results`` for ``fedarena evaluate`` (kinds that export a policy);
    options: ``episodes``, ``policy`` (final / best), ``seed``, ``render``."""
