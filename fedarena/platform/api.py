"""The Python API for scripts: ``fedarena.run(config_or_path, overrides=, out=, seeds=) -> Result``,
``fedarena.load_run(run_dir) -> Result`` and ``fedarena.evaluate(run, ...)`` (``fedarena.load_policy`` and
``fedarena.sweep`` live beside them in :mod:`fedarena`, :mod:`fedarena.rl.evaluation` and
:mod:`fedarena.platform.sweep`).

``run`` does exactly what ``fedarena run`` does (same config resolution, run folder, checkpoints, report,
errors) and returns the finished run read back from its folder, so a script sees the same summary the CLI
prints. ``overrides`` maps dotted key paths to values (``{"ppo.learning_rate": 3e-4, "total_steps": 10000}``),
the ``--set`` of the CLI with Python values instead of YAML text. ``evaluate`` is ``fedarena evaluate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedarena.platform import checkpoint as ckpt
from fedarena.platform import config as cfgmod
from fedarena.platform.errors import ConfigError, RunError


@dataclass(frozen=True)
class Result:
    """A run folder read back: where it is, its config, metric rows, summary and final state files.

    For a seed group (``seeds=``), ``run_dir`` is the group folder, ``summary`` the group summary (mean / std /
    min / max per summary number) and ``runs`` holds one :class:`Result` per seed; ``rows`` is empty.
    """

    run_dir: Path
    state: str
    """running / completed / failed / interrupted (from status.json)"""
    config: dict[str, Any]
    summary: dict[str, Any]
    rows: list[dict[str, Any]] = field(repr=False)
    checkpoints: list[Path] = field(default_factory=list)
    """checkpoint files, oldest first; the last one is the run's final state"""
    policies: dict[str, Path] = field(default_factory=dict)
    """exported policies by name (``final``, ``best``) for RL kinds"""
    report: Path | None = None
    error: str | None = None
    runs: dict[int, "Result"] = field(default_factory=dict)

    @property
    def final_checkpoint(self) -> Path | None:
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def x_axis(self) -> str:
        """The kind's x axis (``Experiment.x_axis``): ``env_steps`` for RL kinds (the unit of their configs'
        ``total_steps`` and ``eval.every``), else ``step`` (the row's iteration / round)."""
        from fedarena.platform.registry import get_kind

        try:
            return get_kind(str(self.config.get("kind"))).x_axis
        except Exception:  # noqa: BLE001 - a kind no longer registered: rows still have their step
            return "step"

    def metric(self, name: str, x: str | None = None) -> list[tuple[Any, Any]]:
        """``(x, value)`` of every row that has ``name`` and ``x``; ``x`` defaults to the kind's :attr:`x_axis`
        (so RL kinds give environment steps, not PPO iterations); ``x="step"`` gives the row's step and
        ``x="wall_time"`` seconds."""
        x = x or self.x_axis
        if self.runs and not self.rows:
            raise RunError(f"metric: {self.run_dir} is a seed group; read one seed's rows (result.runs[seed])")
        return [(int(r[x]) if x == "step" else r[x], r[name]) for r in self.rows if name in r and x in r]


def load_run(run_dir: str | Path) -> Result:
    """Read a run folder (or a seed group folder) written by ``fedarena run`` / :func:`run`."""
    from fedarena.platform.runs import read_metrics

    run_dir = Path(run_dir)
    if (run_dir / "group.json").exists():
        return _load_group(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise RunError(f"load_run {run_dir}: not a run folder (no config.yaml)")
    status = _read_json(run_dir / "status.json")
    policies = {p.parent.name: p.parent for p in sorted((run_dir / "policies").glob("*/manifest.json"))}
    report = run_dir / "report" / "index.html"
    return Result(run_dir=run_dir, state=status.get("state", "unknown"), config=cfgmod.load_yaml(run_dir / "config.yaml"),
                  summary=dict(status.get("summary", {})), rows=read_metrics(run_dir),
                  checkpoints=[p for _, p in ckpt.list_checkpoints(run_dir / "checkpoints")], policies=policies,
                  report=report if report.exists() else None, error=status.get("error"))


def _load_group(group_dir: Path) -> Result:
    from fedarena.platform.groups import group_summary, seed_dir

    info = _read_json(group_dir / "group.json")
    runs = {int(s): load_run(seed_dir(group_dir, int(s))) for s in info.get("seeds", [])
            if (seed_dir(group_dir, int(s)) / "config.yaml").exists()}
    statuses = {s: _read_json(r.run_dir / "status.json") for s, r in runs.items()}
    report = group_dir / "report" / "index.html"
    return Result(run_dir=group_dir, state=info.get("state", "unknown"), config=cfgmod.load_yaml(group_dir / "config.yaml"),
                  summary=group_summary(statuses), rows=[], report=report if report.exists() else None, runs=runs)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _apply(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = cfgmod.apply_overrides(data, [])  # a deep copy
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"overrides: '{key}' is not a dotted key path like section.field")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"overrides: '{'.'.join(parts[:i + 1])}' is a value, not a section")
            node = child
        node[parts[-1]] = list(value) if isinstance(value, tuple) else value
    return out


def run(config: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
        out: str | Path | None = None, seeds: Sequence[int] | None = None, quiet: bool = True, report: bool = True,
        parallel: int = 0) -> Result:
    """Run an experiment from a YAML path or a config mapping and return its :class:`Result`.

    ``overrides``: ``{"key.path": value}`` (or ``--set`` strings); ``out``: the run folder (default
    ``runs/<kind>-...``); ``seeds``: run a seed group (one folder per seed, ``parallel`` at a time).
    Errors are raised as the CLI reports them (``ConfigError`` and other ``UserError`` for bad input).
    """
    from fedarena.platform.runs import execute

    if isinstance(config, Mapping):
        data: Any = dict(config)
    else:
        data = cfgmod.load_yaml(config)
    strings: list[str] = []
    if isinstance(overrides, Mapping):
        data = _apply(data, overrides)
    elif overrides:
        strings = list(overrides)
    summary = execute(data, strings, out=out, quiet=quiet, report=report, seeds=seeds, parallel=parallel)
    return load_run(summary["run_dir"])


def evaluate(run: str | Path | Result, *, episodes: int | None = None, policy: str = "final", seed: int | None = None,
             render: str | None = None, render_episodes: int = 1) -> dict[str, Any]:
    """``fedarena evaluate``: replay a run's exported policy (``final`` / ``best``) for deterministic episodes
    (default: the run's evaluation episodes and seed); returns the mean return, its spread and the run's own
    evaluation return. ``render="rgb_array"`` also writes GIFs under ``<run>/evaluation/``."""
    from fedarena.platform.runs import resolve_saved

    run_dir = Path(run.run_dir if isinstance(run, Result) else run)
    if not (run_dir / "config.yaml").exists():
        raise RunError(f"evaluate {run_dir}: not a run folder (no config.yaml)")
    experiment, cfg = resolve_saved(run_dir / "config.yaml")
    if experiment.evaluate is None:
        raise RunError(f"evaluate {run_dir}: kind '{cfg.kind}' exports no policy to evaluate")
    if episodes is not None and episodes < 1:
        raise ConfigError(f"episodes: must be >= 1, got {episodes}")
    if policy not in ("final", "best"):
        raise ConfigError(f"policy: expected 'final' or 'best', got {policy!r}")
    return dict(experiment.evaluate(run_dir, cfg, {"episodes": episodes, "policy": policy, "seed": seed,
                                                   "render": render, "render_episodes": render_episodes}))
