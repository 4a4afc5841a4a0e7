"""Run folders: one experiment run = one folder with its resolved config, metrics, checkpoints, log and report.

Layout of ``runs/<kind>-<UTC timestamp>-<short id>/``::

    config.yaml        the fully resolved config (for a config rejected at load: the config as given)
    metrics.jsonl      one JSON row per step (the source of truth); metrics.csv is derived from it
    tensorboard/       TensorBoard event files (scalars); other trackers of ``loggers:`` (mlflow.db, wandb/) too
    checkpoints/       ckpt-<step>.fdck, atomic and checksummed, the newest ``checkpoint.keep`` kept
    run.log            the run's log
    status.json        running / completed / failed / interrupted; the final summary, or the one-line error
    report/            index.html with PNG plots, the config and the final numbers

A config whose ``kind`` is known but which fails validation when it is loaded (a bad value, an unknown
environment id, a missing optional package, PSRO on a general-sum game) still gets its folder, holding only
``status.json`` = failed with the one-line message and ``config.yaml`` as given; a file that cannot be parsed or
names no known kind gets none (unless ``--out`` names one).

Resuming (``execute(resume=RUN_DIR)``) continues from the newest valid checkpoint; metric rows written
after that checkpoint are dropped so no row is duplicated or missing. ``execute`` runs every run and seed group
inside :func:`fedarena.platform.loop.stop_signals`: SIGTERM and SIGINT end it ``interrupted`` with a checkpoint.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from fedarena.platform import checkpoint as ckpt
from fedarena.platform import config as cfgmod
from fedarena.platform.config import ConfigError
from fedarena.platform.errors import RunError, is_user_error, one_line
from fedarena.platform.experiment import Experiment, ExperimentConfig
from fedarena.platform.loop import RunInterrupted, stop_signals
from fedarena.platform.progress import Progress
from fedarena.platform.registry import UnknownKindError, get_kind
from fedarena.platform.loggers import Logger, build_loggers, scalars

LOGGER_NAME = "fedarena"


# ----------------------------------------------------------------------------- config resolution


def resolve(config: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> tuple[Experiment, ExperimentConfig]:
    """Load a YAML path (or a mapping), apply ``--set`` overrides, and build the kind's typed config."""
    data, experiment = load_given(config, overrides)
    return experiment, cfgmod.build(experiment.config, data)


def resolve_saved(path: str | Path, overrides: Sequence[str] = ()) -> tuple[Experiment, ExperimentConfig]:
    """:func:`resolve` for the ``config.yaml`` a run folder stores: written by fedarena itself, possibly by an older
    version, so keys its kind has since moved (``MOVED``, e.g. the flat FL layout) are moved to their new paths
    first instead of refused; ``overrides`` use the new paths."""
    data, experiment = load_given(path)
    data = cfgmod.migrate(experiment.config, data)
    return resolve(data, overrides)


def load_given(config: str | Path | Mapping[str, Any],
               overrides: Sequence[str] = ()) -> tuple[dict[str, Any], Experiment]:
    """The config as given (YAML path or mapping, ``--set`` overrides applied) and its kind, before validation.

    Raises :class:`ConfigError` when the file cannot be read or parsed, or names no known ``kind``.
    """
    data = dict(config) if isinstance(config, Mapping) else cfgmod.load_yaml(config)
    data = cfgmod.apply_overrides(data, list(overrides))
    kind = data.get("kind")
    if not kind:
        raise ConfigError("missing required config key 'kind' (the experiment kind; see `fedarena list`)")
    if not isinstance(kind, str):
        raise ConfigError(f"kind: expected str, got {kind!r} ({type(kind).__name__})")
    try:
        experiment = get_kind(kind)
    except UnknownKindError as e:
        raise ConfigError(str(e)) from None
    return data, experiment


# ----------------------------------------------------------------------------- the run object


class Run:
    """What an experiment's ``run`` function writes through: metrics, checkpoints, progress, log."""

    def __init__(self, directory: Path, config: ExperimentConfig, *, quiet: bool = False, resuming: bool = False):
        self.dir = Path(directory)
        self.config = config
        self.quiet = quiet
        self.resuming = resuming
        self.checkpoint_dir = self.dir / "checkpoints"
        self.metrics_path = self.dir / "metrics.jsonl"
        self.logger = logging.getLogger(f"{LOGGER_NAME}.run.{self.dir.name}")
        self._elapsed_before = 0.0
        self._t0 = time.monotonic()
        self._trackers: list[Logger] | None = None  # built at the first row, after restore (config.loggers)
        self._resumed_at: int | None = None
        self._metrics_file = None
        self._last_flush = time.monotonic()
        self._restored = False
        self._pending: tuple[int, Callable[[], Any]] | None = None
        self.last_step: int | None = None
        self.last_checkpoint_step: int | None = None
        self.restored_step: int | None = None
        self.stop_requested: str | None = None
        """The name of the stop signal received (SIGTERM / SIGINT), set by :mod:`fedarena.platform.loop`."""

    # -- metrics
    @property
    def elapsed(self) -> float:
        """Wall seconds spent in this run, summed over resumes."""
        return self._elapsed_before + time.monotonic() - self._t0

    def log(self, step: int, **metrics: Any) -> None:
        """Record one row of metrics for ``step``: scalars, or lists of numbers (e.g. a strategy)."""
        if self.resuming and not self._restored:  # nothing is appended to the rows of the run being resumed
            raise RunError(f"--resume {self.dir}: experiment kind '{self.config.kind}' does not resume (it logged "
                           "a row before calling run.restore()); start a new run")
        row: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            row[k] = _jsonable(v, k)
        row.setdefault("wall_time", round(self.elapsed, 6))
        if self._metrics_file is None:
            self._metrics_file = open(self.metrics_path, "a", encoding="utf-8")
        self._metrics_file.write(json.dumps(row, allow_nan=True) + "\n")
        now = time.monotonic()
        if now - self._last_flush > 2.0:  # rows before a checkpoint are fsynced by save_checkpoint
            self._metrics_file.flush()
            for tracker in self._trackers or ():
                tracker.flush()
            self._last_flush = now
        numbers = scalars(row)
        for tracker in self.trackers():
            tracker.log_metrics(int(step), numbers)
        self.last_step = int(step)

    def trackers(self) -> list[Logger]:
        """The experiment trackers of ``config.loggers`` (:mod:`fedarena.platform.loggers`), given the config at
        the first call."""
        if self._trackers is None:
            self._trackers = build_loggers(self.config.loggers, self.dir, self.config.tracking,
                                           resumed_at=self._resumed_at, kind=self.config.kind)
            for tracker in self._trackers:
                tracker.log_config(cfgmod.to_dict(self.config))
        return self._trackers

    def end_trackers(self, state: str, artifacts: Sequence[Path] = ()) -> None:
        """Give the trackers the run's files (config, status, report) and end their runs; later calls do nothing."""
        trackers, self._trackers = self._trackers or [], []
        for tracker in trackers:
            try:
                for path in artifacts:
                    tracker.log_artifact(path)
                tracker.close(state)
            except Exception as exc:  # a failed run keeps its own error; the tracker's goes to run.log
                if state == "completed":
                    raise
                self.logger.warning("logger %s: %s", type(tracker).__name__, one_line(exc))

    # -- checkpoints
    def should_checkpoint(self, step: int) -> bool:
        every = self.config.checkpoint.every
        return every > 0 and step % every == 0

    def save_checkpoint(self, step: int, state: Any) -> Path:
        """Atomically write ``state`` (nested dicts/lists of arrays and JSON scalars) as the checkpoint of ``step``."""
        if self._metrics_file is not None:
            self._metrics_file.flush()
            os.fsync(self._metrics_file.fileno())
        for tracker in self._trackers or ():
            tracker.flush()
        full = {"experiment": state, "platform": {"elapsed": self.elapsed}}
        path = ckpt.save(self.checkpoint_dir, int(step), full, keep=self.config.checkpoint.keep)
        self.last_checkpoint_step = int(step)
        if self._pending is not None and self._pending[0] <= int(step):
            self._pending = None
        self.logger.debug("checkpoint %s", path.name)
        if self.stop_requested is not None:
            raise RunInterrupted(self.stop_requested, int(step), graceful=True)
        return path

    def checkpoint(self, step: int, state: Callable[[], Any]) -> Path | None:
        """Offer the state of ``step`` (a function returning it, called only when it is written).

        The state is written now when ``checkpoint.every`` says so; otherwise it is kept as the run's
        pending final checkpoint, which :meth:`final_checkpoint` writes (the platform calls it when the
        kind's ``run`` returns, so every run ends with a checkpoint of its last step). Kinds call this once
        per step, after the step's metrics are logged. After a stop signal the state is written now and the
        run stops (:class:`~fedarena.platform.loop.RunInterrupted`).
        """
        if self.should_checkpoint(step) or self.stop_requested is not None:
            return self.save_checkpoint(step, state())
        self._pending = (int(step), state)
        return None

    def final_checkpoint(self) -> Path | None:
        """Write the pending state offered by :meth:`checkpoint` unless that step is already saved.

        A kind whose state lives in remote workers calls it before shutting them down; calling it again is a
        no-op.
        """
        if self._pending is None:
            return None
        step, state = self._pending
        self._pending = None
        if self.last_checkpoint_step is not None and step <= self.last_checkpoint_step:
            return None
        return self.save_checkpoint(step, state())

    def restore(self, accept=None) -> tuple[int, Any] | None:
        """The (step, state) of the newest valid checkpoint, or None on a fresh run.

        ``accept(step, state)``, when given, loads the state into the experiment; a checkpoint it fails on with
        a malformed-content error (:data:`fedarena.platform.checkpoint.MALFORMED_CONTENT`) is skipped with a
        warning and the next older one is tried. Metric rows after the chosen step are dropped. On a resumed run whose checkpoints are all invalid this raises
        instead of silently starting over; a run stopped before it wrote any checkpoint starts over (its rows are
        dropped and written again).
        """
        self._restored = True
        if not self.resuming:
            return None
        if not ckpt.list_checkpoints(self.checkpoint_dir):  # stopped before its first checkpoint: nothing to keep
            self.logger.warning("%s: the run was stopped before its first checkpoint; starting it over", self.dir)
            self._truncate_metrics(-1)
            self._tb_purge = -1
            self.resuming = False
            return None
        loads = None if accept is None else lambda step, full: accept(step, full["experiment"])
        found = ckpt.load_newest_valid(self.checkpoint_dir, warn=self.logger.warning, accept=loads)
        if found is None:
            raise RunError(f"{self.dir}: no valid checkpoint to resume from (the run would start over)")
        step, full = found
        self._elapsed_before = float(full.get("platform", {}).get("elapsed", 0.0))
        self._t0 = time.monotonic()
        self._truncate_metrics(step)
        self._resumed_at = step
        self.last_step = step
        self.last_checkpoint_step = step
        self.restored_step = step
        self.logger.info("resumed from checkpoint at step %d", step)
        return step, full["experiment"]

    def _truncate_metrics(self, step: int) -> None:
        kept = [row for row in read_metrics(self.dir) if row["step"] <= step]
        ckpt.write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def rows(self) -> list[dict[str, Any]]:
        """The metric rows written so far (on a resumed run: those before the checkpoint too)."""
        if self._metrics_file is not None:
            self._metrics_file.flush()
        return read_metrics(self.dir)

    # -- progress
    def progress(self, total: int, initial: int = 0, desc: str = "") -> Progress:
        return Progress(total, initial, desc or self.config.kind, logger=self.logger, quiet=self.quiet)

    def close(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None
        for tracker in self._trackers or ():
            tracker.flush()
        write_csv(self.dir)


def _jsonable(v: Any, key: str) -> Any:
    if hasattr(v, "tolist"):  # numpy scalars and arrays
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, key) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"metric '{key}': expected a number, string or list of numbers, got {type(v).__name__}")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Metric rows of a run; a torn last line (from a crash mid-write) is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def write_csv(run_dir: str | Path) -> Path:
    """Derive metrics.csv from metrics.jsonl (lists become columns ``name[i]``)."""
    rows = read_metrics(run_dir)
    flat_rows = []
    columns: dict[str, None] = {}
    for row in rows:
        flat: dict[str, Any] = {}
        for k, v in row.items():
            if isinstance(v, list):
                for i, x in enumerate(v):
                    flat[f"{k}[{i}]"] = x
            else:
                flat[k] = v
        columns.update(dict.fromkeys(flat))
        flat_rows.append(flat)
    path = Path(run_dir) / "metrics.csv"
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(flat_rows)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- executing a run


def new_run_dir(kind: str, root: str | Path = "runs", name: str = "") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    label = f"{kind}-{name}" if name else kind
    return Path(root) / f"{label}-{stamp}-{secrets.token_hex(3)}"


def _attach_log_file(run: Run, quiet: bool) -> list[logging.Handler]:
    handlers: list[logging.Handler] = []
    fh = logging.FileHandler(run.dir / "run.log", encoding="utf-8")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    fh.setLevel(logging.DEBUG)
    handlers.append(fh)
    sh = logging.StreamHandler()
    sh.setFormatter(logging.Formatter("%(levelname)s %(message)s" if quiet else "[%(asctime)s] %(message)s", "%H:%M:%S"))
    sh.setLevel(logging.WARNING if quiet else logging.INFO)
    handlers.append(sh)
    for h in handlers:
        run.logger.addHandler(h)
    run.logger.setLevel(logging.DEBUG)
    run.logger.propagate = False
    return handlers


def execute(config: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *,
            out: str | Path | None = None, resume: str | Path | None = None, quiet: bool = False,
            report: bool = True, seeds: Sequence[int] | None = None, parallel: int = 0) -> dict[str, Any]:
    """Run an experiment (or resume one) and return its summary, which includes ``run_dir`` and ``report``.

    ``seeds`` (or a non-empty ``seeds:`` list in the config) runs a group: one run folder per seed under a
    group folder, ``parallel`` of them at a time (0: as many as there are CPUs), and a group report
    (:mod:`fedarena.platform.groups`). A failing run leaves ``status.json`` = failed with the one-line message.
    """
    if resume is not None:
        run_dir = Path(resume)
        if (run_dir / "group.json").exists():
            return _execute_group(None, overrides, out=run_dir, resume=True, quiet=quiet, report=report,
                                  parallel=parallel)
        saved = run_dir / "config.yaml"
        if not saved.exists():
            raise RunError(f"--resume {run_dir}: not a run folder (no config.yaml)")
        experiment, cfg = resolve_saved(saved, overrides)
        if config is not None:
            _, given = resolve(config, overrides)
            diff = _differences(cfgmod.to_dict(given), cfgmod.to_dict(cfg))
            if diff:
                raise ConfigError(
                    f"--resume {run_dir}: the config differs from the run's saved config in {', '.join(diff)}; "
                    "omit CONFIG or change values with --set"
                )
        status = _read_status(run_dir)
        if status.get("state") == "completed" and not overrides:
            return {**status.get("summary", {}), "run_dir": str(run_dir), "already_completed": True}
        if not experiment.resumable:
            raise RunError(f"--resume {run_dir}: experiment kind '{cfg.kind}' keeps no checkpoint to continue from; "
                           "start a new run")
        resuming = True
    else:
        if config is None:
            raise RunError("a config file is required (or --resume RUN_DIR)")
        try:
            data, experiment = load_given(config, overrides)
        except Exception as exc:  # unreadable, or no known kind: no run folder unless --out names one
            _status_of_rejected_config(out, exc)
            raise
        try:
            cfg = cfgmod.build(experiment.config, data)
        except Exception as exc:  # known kind, rejected at load (bad value, unknown env id, missing package, ...)
            _status_of_rejected_config(out if out is not None else _rejected_run_dir(data), exc, data)
            raise
        if seeds is not None or cfg.seeds:
            group_dir = out if out is not None else new_run_dir(cfg.kind, name=f"{cfg.name}-seeds" if cfg.name
                                                                 else "seeds")  # the group folder groups.py names
            return _execute_group(config, overrides, out=group_dir, seeds=seeds, quiet=quiet, report=report,
                                  parallel=parallel)
        run_dir = Path(out) if out is not None else new_run_dir(cfg.kind, name=cfg.name)
        if (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists():
            raise RunError(f"--out {run_dir}: already holds a run; use --resume {run_dir} to continue it")
        resuming = False
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfgmod.dump_yaml(cfg), encoding="utf-8")
    run = Run(run_dir, cfg, quiet=quiet, resuming=resuming)
    handlers = _attach_log_file(run, quiet)
    try:
        with stop_signals(run) as stopper:
            return _execute_run(run, experiment, cfg, overrides if resuming else (), report, stopper)
    finally:
        run.close()
        for h in handlers:
            run.logger.removeHandler(h)
            h.close()


def _execute_run(run: Run, experiment: Experiment, cfg: ExperimentConfig, resume_overrides: Sequence[str],
                 report: bool, stopper: Any) -> dict[str, Any]:
    """Run the kind inside :func:`~fedarena.platform.loop.stop_signals` and write ``status.json``."""
    run_dir = run.dir
    resuming = run.resuming
    _write_status(run_dir, {"state": "running", "kind": cfg.kind, "seed": cfg.seed})
    try:
        run.logger.info("%s run in %s", "resuming" if resuming else "starting", run_dir)
        try:
            summary = dict(experiment.run(cfg, run) or {})
        except Exception as exc:
            _refuse_smaller_budget(run, cfg, resume_overrides, exc)
            raise
        if resuming and not run._restored:
            raise RunError(f"experiment kind '{cfg.kind}' does not support resuming (it never called run.restore())")
        run.final_checkpoint()
        if run.last_step is not None and run.last_checkpoint_step != run.last_step:
            run.logger.info("kind '%s' logged step %s but checkpointed step %s last (it should offer every step "
                               "through run.checkpoint)", cfg.kind, run.last_step, run.last_checkpoint_step)
        run.close()
        summary = {k: _jsonable(v, k) for k, v in summary.items()}
        _write_status(run_dir, {"state": "completed", "kind": cfg.kind, "seed": cfg.seed, "summary": summary,
                                "last_step": run.last_step, "last_checkpoint_step": run.last_checkpoint_step,
                                "wall_time": round(run.elapsed, 3)})
        if stopper is not None:
            stopper.uninstall()  # completed: a signal from here on no longer turns the run into `interrupted`
        if report:
            from fedarena.platform.report import render

            summary["report"] = str(render(run_dir, experiment=experiment, config=cfg))
        run.end_trackers("completed", [run_dir / "config.yaml", run_dir / "status.json"]
                         + ([Path(summary["report"]).parent] if report else []))
        summary["run_dir"] = str(run_dir)
        return summary
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        message = "interrupted" if interrupted else one_line(exc)
        if interrupted:
            signame = getattr(exc, "signame", "SIGINT")
            run.logger.info("interrupted by %s after step %s; newest checkpoint: step %s; continue with --resume %s",
                            signame, run.last_step, run.last_checkpoint_step, run_dir)
            message = f"interrupted by {signame}"
        else:
            run.logger.debug("run failed: %s", message, exc_info=exc)  # the traceback goes to run.log only
        _write_status(run_dir, {"state": "interrupted" if interrupted else "failed", "kind": cfg.kind,
                                "seed": cfg.seed, "error": message,
                                "error_type": type(exc).__name__, "user_error": is_user_error(exc),
                                "last_step": run.last_step, "last_checkpoint_step": run.last_checkpoint_step})
        run.end_trackers("interrupted" if interrupted else "failed")
        raise


def _refuse_smaller_budget(run: Run, cfg: ExperimentConfig, overrides: Sequence[str], exc: Exception) -> None:
    """A resumed run given ``--set`` values that failed before any step past its checkpoint (e.g. a budget below
    the checkpoint's step, which the kind did not handle): refuse in one line instead of an internal error."""
    if not overrides or is_user_error(exc) or run.restored_step is None:
        return
    if run.last_step is not None and run.last_step > run.restored_step:
        return
    raise RunError(f"--resume {run.dir}: kind '{cfg.kind}' cannot continue from its checkpoint at step "
                   f"{run.restored_step} with --set {' '.join(overrides)} ({one_line(exc)})") from exc


def _execute_group(config: Any, overrides: Sequence[str], **kwargs: Any) -> dict[str, Any]:
    """Run a seed group; a stop signal stops the seeds' processes (each ends ``interrupted``) and marks the group."""
    from fedarena.platform.groups import execute_group

    try:
        with stop_signals(None):
            return execute_group(config, overrides, **kwargs)
    except KeyboardInterrupt:
        out = kwargs.get("out")
        info_path = Path(out) / "group.json" if out is not None else None
        if info_path is not None and info_path.exists():
            info = json.loads(info_path.read_text(encoding="utf-8"))
            info["state"] = "interrupted"
            ckpt.write_atomic(info_path, json.dumps(info, indent=2).encode())
        raise


def _rejected_run_dir(data: Mapping[str, Any]) -> Path:
    """The default run folder of a config whose kind is known but whose values were rejected."""
    name = data.get("name")
    return new_run_dir(str(data["kind"]), name=name if isinstance(name, str) else "")


def _status_of_rejected_config(out: str | Path | None, exc: BaseException,
                               given: Mapping[str, Any] | None = None) -> None:
    """Write ``status.json`` = failed (and, when known, the config as given) into a run folder that holds no run.

    ``out``: the ``--out`` folder, or the default folder of a config whose kind is known; None writes nothing.
    """
    if out is None:
        return
    run_dir = Path(out)
    earlier = _read_status(run_dir) if (run_dir / "status.json").exists() else None
    if (run_dir / "metrics.jsonl").exists() or (earlier is not None and earlier.get("stage") != "config"):
        return  # a folder that holds (or held) a run keeps its status
    run_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {"state": "failed", "error": one_line(exc), "error_type": type(exc).__name__,
                              "user_error": is_user_error(exc), "stage": "config"}
    if given is not None:
        status["kind"] = given["kind"]
        try:  # the config as given (--set overrides applied), not validated
            text = yaml.safe_dump(cfgmod.plain(dict(given)), sort_keys=False, default_flow_style=None)
        except yaml.YAMLError:
            text = None
        if text is not None:
            (run_dir / "config.yaml").write_text(text, encoding="utf-8")
            status["config"] = "config.yaml (as given; it failed validation)"
    _write_status(run_dir, status)


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in dict.fromkeys([*a, *b]):
            out += _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if a == b else [path]


def _read_status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _write_status(run_dir: Path, status: dict[str, Any]) -> None:
    ckpt.write_atomic(run_dir / "status.json", json.dumps(status, indent=2).encode())
