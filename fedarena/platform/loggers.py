"""Experiment trackers a run logs to, chosen by the config's ``loggers:`` list: TensorBoard, MLflow, Weights & Biases.

Every tracker is a :class:`Logger`: ``log_config`` once when the run starts (the resolved config, flattened to
dotted keys), ``log_metrics(step, row)`` at each metric row the run writes (the finite scalars of the row, at the
row's ``step`` as in ``metrics.jsonl``), ``log_artifact(path)`` at the end for the run's config, status and report,
and ``close(state)``. ``metrics.jsonl`` stays the source of truth; trackers are copies for the tools people use.

- ``tensorboard``: event files in ``<run>/tensorboard/`` (:mod:`fedarena.platform.tensorboard`, no dependency;
  ``pip install 'fedarena[tensorboard]'`` for the viewer). Scalars only: it ignores config and artefacts.
- ``mlflow``: one MLflow run per fedarena run, in ``tracking.mlflow_uri`` if set, else ``MLFLOW_TRACKING_URI``,
  else a SQLite store inside the run folder (``sqlite:///<run>/mlflow.db``, artefacts in ``<run>/mlartifacts/``;
  MLflow 3 puts its file store in maintenance mode and recommends a database); in a store the user names, artefacts
  go to the experiment's artefact location (MLflow's default: ``./mlruns``). Experiment: ``tracking.experiment``
  (default: the kind). A resumed run continues the same MLflow run.
- ``wandb``: one W&B run with ``dir=<run>`` in ``tracking.wandb_mode`` (else ``WANDB_MODE``, else ``offline``:
  ``<run>/wandb/offline-run-*/run-*.wandb``, uploaded later by ``wandb sync``). Project: ``tracking.experiment``.
- ``tune``: each row to the Ray Tune trial the run executes in (``fedarena sweep --ray``, :mod:`.sweep`).

A resumed run rewinds to its checkpoint: TensorBoard drops the events after it; MLflow and W&B keep what they
already received (W&B ignores steps lower than the last one it saw; MLflow's history holds both copies).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

from fedarena.platform.errors import MissingDependencyError
from fedarena.platform.tensorboard import EventWriter


class Logger(Protocol):
    """What a run calls on each tracker of its ``loggers:`` list."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The resolved config (nested mapping), once at the start of the run."""

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """The finite scalar metrics of one row at ``step`` (the row's step)."""

    def log_artifact(self, path: Path) -> None:
        """A file or folder of the run (config, status, report), at the end."""

    def flush(self) -> None:
        """Make what was logged durable (called with the run's own flushes and before checkpoints)."""

    def close(self, state: str = "completed") -> None:
        """End the tracker's run: ``completed``, ``failed`` or ``interrupted``."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"ppo": {"lr": 1e-3}}`` -> ``{"ppo.lr": 1e-3}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


class TensorBoardLogger:
    """Scalars into ``<run>/tensorboard/events.out.tfevents.*``; a resumed run drops events after its checkpoint."""

    def __init__(self, run_dir: Path, options: Any, resumed_at: int | None, project: str) -> None:
        self.writer = EventWriter(Path(run_dir) / "tensorboard", purge_after=resumed_at)

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass  # scalars only; the config is the run folder's config.yaml

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        self.writer.add_scalars(step, row)

    def log_artifact(self, path: Path) -> None:
        pass

    def flush(self) -> None:
        self.writer.flush()

    def close(self, state: str = "completed") -> None:
        self.writer.close()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")  # MLflow names: alphanumerics, underscores, dashes, periods, spaces, slashes
_MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_IDS = "loggers.json"
"""``<run>/loggers.json``: the trackers' own run ids, so a resumed run continues the same tracker run."""


def _ids(run_dir: Path) -> dict[str, str]:
    try:
        return dict(json.loads((run_dir / _IDS).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _save_id(run_dir: Path, name: str, run_id: str) -> None:
    from fedarena.platform.checkpoint import write_atomic

    write_atomic(run_dir / _IDS, json.dumps({**_ids(run_dir), name: run_id}, indent=2).encode())


class MLflowLogger:
    """One MLflow run per fedarena run (see the module docstring for where it is stored)."""

    def __init__(self, run_dir: Path, options: Any, resumed_at: int | None, project: str) -> None:
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir).resolve()
        uri = getattr(options, "mlflow_uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
        local = not uri
        if local:
            uri = f"sqlite:///{run_dir / 'mlflow.db'}"
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = self.client.create_experiment(
                project, artifact_location=(run_dir / "mlartifacts").as_uri() if local else None)
        run_id = _ids(run_dir).get("mlflow")
        if run_id is not None and resumed_at is not None:
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name,
                                            tags={"fedarena.run_dir": str(run_dir)}).info.run_id
            _save_id(run_dir, "mlflow", run_id)
        self.run_id = run_id
        self.closed = False

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = set(self.client.get_run(self.run_id).data.params)
        params = [Param(_MLFLOW_KEY.sub("_", k), json.dumps(v) if isinstance(v, (list, dict)) else str(v))
                  for k, v in flatten(config).items()]
        params = [p for p in params if p.key not in existing]  # a resumed run logged them already
        for i in range(0, len(params), 100):  # MLflow's limit of params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_KEY.sub("_", k), float(v), now, int(step)) for k, v in row.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_artifact(self, path: Path) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
        elif path.exists():
            self.client.log_artifact(self.run_id, str(path))

    def flush(self) -> None:
        pass  # each call above is already stored

    def close(self, state: str = "completed") -> None:
        if not self.closed:
            self.closed = True
            self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS.get(state, "FAILED"))


class WandbLogger:
    """One Weights & Biases run with its files under ``<run>/wandb/`` (offline unless told otherwise)."""

    def __init__(self, run_dir: Path, options: Any, resumed_at: int | None, project: str) -> None:
        import wandb

        run_dir = Path(run_dir).resolve()
        mode = getattr(options, "wandb_mode", None) or os.environ.get("WANDB_MODE") or "offline"
        run_id = _ids(run_dir).get("wandb") if resumed_at is not None else None
        settings = wandb.Settings(console="off", disable_git=True, x_disable_stats=True, silent=True)
        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), mode=mode, id=run_id,
                              resume="allow" if run_id else None, settings=settings, reinit="create_new")
        _save_id(run_dir, "wandb", self.run.id)
        self.closed = False

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        self.run.log(dict(row), step=int(step))

    def log_artifact(self, path: Path) -> None:
        path = Path(path).resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if f.exists():
                self.run.save(str(f), base_path=str(path.parent), policy="now")

    def flush(self) -> None:
        pass  # the W&B service writes the .wandb file as records arrive

    def close(self, state: str = "completed") -> None:
        if not self.closed:
            self.closed = True
            self.run.finish(exit_code=0 if state == "completed" else 1)


class TuneLogger:
    """Each row to the Ray Tune trial the run executes in (with its ``step``), so a Tune scheduler such as ASHA
    can stop it early; ``fedarena sweep --ray`` adds it to its trials' ``loggers``."""

    def __init__(self, run_dir: Path, options: Any, resumed_at: int | None, project: str) -> None:
        from ray import tune

        self._report = tune.report

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass  # the trial's config is its sweep parameters

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        self._report({**row, "step": int(step)})

    def log_artifact(self, path: Path) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, state: str = "completed") -> None:
        pass


LOGGERS: dict[str, tuple[Callable[[Path, Any, int | None, str], Logger], str | None]] = {
    "tensorboard": (TensorBoardLogger, None),
    "mlflow": (MLflowLogger, "mlflow"),
    "wandb": (WandbLogger, "wandb"),
    "tune": (TuneLogger, "ray"),
}
"""name -> (constructor ``(run_dir, tracking options, resumed_at step or None, project)``, the package it imports;
the pip extra that installs it has the package's name, ``sweep`` for Ray Tune)."""

LoggerName = Literal[tuple(LOGGERS)]  # type: ignore[valid-type]
"""The names a config's ``loggers:`` list accepts (checked with a did-you-mean when the config is loaded)."""


def build_loggers(names: Sequence[str], run_dir: Path, options: Any = None, resumed_at: int | None = None,
                  kind: str = "fedarena") -> list[Logger]:
    """The trackers of ``names`` for ``run_dir``; a tracker whose package is missing raises naming the pip extra.

    ``options``: the config's ``tracking`` section; the MLflow experiment / W&B project is its ``experiment``,
    else ``kind``. ``resumed_at``: the checkpoint step a resumed run continues from.
    """
    for name in names:
        package = LOGGERS[name][1]
        if package is not None and importlib.util.find_spec(package) is None:
            extra = {"ray": "sweep"}.get(package, package)
            raise MissingDependencyError(f"loggers: '{name}' needs the {package} package: "
                                         f"pip install 'fedarena[{extra}]'")
    project = getattr(options, "experiment", None) or kind
    return [LOGGERS[name][0](Path(run_dir), options, resumed_at, project) for name in dict.fromkeys(names)]


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metric row except ``step`` (what trackers receive)."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
