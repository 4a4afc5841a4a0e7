"""Hyperparameter sweeps: one run folder per trial under a sweep folder, a report naming the best trial.

``fedarena sweep CONFIG`` (or ``fedarena.sweep``) varies any config fields, named by dotted paths:

- ``--grid ppo.learning_rate=1e-3,3e-4 ppo.hidden=[8],[16]``: every combination (values in YAML; commas inside
  brackets stay in the value);
- ``--random N FIELD=DIST ...``: N samples, DIST one of ``uniform(a,b)``, ``loguniform(a,b)``, ``int(a,b)``
  (inclusive) or ``choice(v1,v2,...)`` (random search, Bergstra & Bengio, JMLR 2012);
- ``--optuna N FIELD=DIST ...``: N trials proposed by Optuna's TPE sampler (Akiba et al., KDD 2019), told each
  finished trial's value.

Trials run as ``fedarena run`` processes, ``--parallel`` at a time (the seed groups' runner), or with ``--ray`` as
Ray Tune trials (grid and random search) with asynchronous successive halving (ASHA, Li et al., MLSys 2020)
stopping poor trials early on the metric as the trials log it (time axis: the kind's x axis, e.g. environment
steps). A trial's value is the metric in its summary, else its last logged value (none for a failed trial). The metric defaults to the
kind's first group metric (``eval_return`` for RL kinds), else its first summary key; the mode defaults to ``min``
for names of losses, errors, regret and exploitability, else ``max``.

Layout::

    <sweep>/config.yaml            the base config (with --set applied)
    <sweep>/sweep.json             method, space, metric, mode, every trial's parameters, state and value, the best
    <sweep>/trial-000/ ...         an ordinary run folder per trial
    <sweep>/logs/trial-000.log     what that trial printed
    <sweep>/report/index.html      the table of trials (best first), the best trial named, parallel coordinates
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from fedarena.platform import config as cfgmod
from fedarena.platform.errors import ConfigError, MissingDependencyError, RunError

MIN_WORDS = ("loss", "error", "regret", "exploitab", "nash_conv", "to_target", "perplexity")


# ----------------------------------------------------------------------------- the search space


def split_values(text: str) -> list[str]:
    """``1e-3,[8, 8],x`` -> ``["1e-3", "[8, 8]", "x"]``: split at commas outside brackets and braces."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return [v for v in out if v != ""]


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _yaml(text: str, where: str) -> Any:
    """A YAML value; numbers such as ``1e-3``, which YAML 1.1 reads as strings, are floats."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: '{text}' is not a YAML value ({str(e).splitlines()[0]})") from None
    return float(value) if isinstance(value, str) and _FLOAT.match(value) else value


def _assignment(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not all(key.strip().split(".")):
        raise ConfigError(f"{option} {text}: expected FIELD=VALUES with FIELD a dotted config path")
    return key.strip(), value


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["a.b=1,2", ...]`` -> ``{"a.b": [1, 2]}``."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, text = _assignment(item, "--grid")
        values = [_yaml(v, f"--grid {key}") for v in split_values(text)]
        if not values:
            raise ConfigError(f"--grid {key}: give at least one value")
        grid[key] = values
    return grid


@dataclass(frozen=True)
class Distribution:
    """One field's distribution for random search and Optuna."""

    kind: str  # uniform, loguniform, int, choice
    args: tuple[Any, ...]

    def sample(self, rng: np.random.Generator) -> Any:
        if self.kind == "uniform":
            return float(rng.uniform(self.args[0], self.args[1]))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(self.args[0]), math.log(self.args[1]))))
        if self.kind == "int":
            return int(rng.integers(self.args[0], self.args[1] + 1))
        return self.args[int(rng.integers(len(self.args)))]

    def suggest(self, trial: Any, name: str) -> Any:
        if self.kind in ("uniform", "loguniform"):
            return trial.suggest_float(name, self.args[0], self.args[1], log=self.kind == "loguniform")
        if self.kind == "int":
            return trial.suggest_int(name, self.args[0], self.args[1])
        choices = [json.dumps(a) for a in self.args]  # Optuna's categorical values are scalars
        return json.loads(trial.suggest_categorical(name, choices))


_DIST = re.compile(r"^\s*(uniform|loguniform|int|choice)\s*\((.*)\)\s*$", re.S)


def parse_distributions(items: Sequence[str], option: str) -> dict[str, Distribution]:
    """``["ppo.learning_rate=loguniform(1e-4,1e-2)", ...]`` -> ``{"ppo.learning_rate": Distribution(...)}``."""
    out: dict[str, Distribution] = {}
    for item in items:
        key, text = _assignment(item, option)
        m = _DIST.match(text)
        if not m:
            raise ConfigError(f"{option} {key}: '{text}' is not uniform(a,b), loguniform(a,b), int(a,b) or "
                              "choice(v1,v2,...)")
        kind, args = m.group(1), tuple(_yaml(v, f"{option} {key}") for v in split_values(m.group(2)))
        if kind == "choice":
            if not args:
                raise ConfigError(f"{option} {key}: choice() needs at least one value")
        else:
            if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                raise ConfigError(f"{option} {key}: {kind}(a,b) needs two numbers, got {m.group(2)!r}")
            if not args[0] < args[1]:
                raise ConfigError(f"{option} {key}: {kind}(a,b) needs a < b, got {args[0]} and {args[1]}")
            if kind == "loguniform" and args[0] <= 0:
                raise ConfigError(f"{option} {key}: loguniform(a,b) needs a > 0, got {args[0]}")
            if kind == "int" and not all(isinstance(a, int) for a in args):
                raise ConfigError(f"{option} {key}: int(a,b) needs integers, got {m.group(2)!r}")
        out[key] = Distribution(kind, args)
    return out


# ----------------------------------------------------------------------------- results


@dataclass
class Trial:
    index: int
    params: dict[str, Any]
    state: str = "pending"
    value: float | None = None

    @property
    def name(self) -> str:
        return f"trial-{self.index:03d}"


@dataclass
class SweepResult:
    """A finished sweep: its folder, metric, trials (in order) and the best one."""

    sweep_dir: Path
    metric: str
    mode: str
    trials: list[Trial] = field(default_factory=list)
    report: Path | None = None

    @property
    def best(self) -> Trial | None:
        scored = [t for t in self.trials if t.value is not None and math.isfinite(t.value)]
        if not scored:
            return None
        return (max if self.mode == "max" else min)(scored, key=lambda t: t.value)

    def run_dir(self, trial: Trial) -> Path:
        return self.sweep_dir / trial.name


def default_metric(experiment: Any) -> str:
    names = list(getattr(experiment, "group_metrics", ()) or getattr(experiment, "summary_keys", ()))
    if not names:
        raise ConfigError("--metric: this kind names no main metric; give --metric NAME (a summary or metric key)")
    return names[0]


def default_mode(metric: str) -> str:
    return "min" if any(w in metric for w in MIN_WORDS) else "max"


def trial_value(run_dir: Path, metric: str) -> float | None:
    """The metric in the run's summary, else its last logged value; None when the run has neither."""
    from fedarena.platform.runs import read_metrics

    try:
        status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        status = {}
    value = status.get("summary", {}).get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        rows = [r for r in read_metrics(run_dir) if isinstance(r.get(metric), (int, float))]
        value = rows[-1][metric] if rows else None
    return None if value is None else float(value)


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "status.json").read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, TypeError, ValueError):
        return {}


def _state(run_dir: Path) -> str:
    return str(_status(run_dir).get("state", "not started"))


# ----------------------------------------------------------------------------- running


def _overrides(params: Mapping[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in params.items()]


def sweep(config: str | Path | Mapping[str, Any], *, grid: Mapping[str, Sequence[Any]] | Sequence[str] | None = None,
          space: Mapping[str, str] | Sequence[str] | None = None, samples: int = 0, optuna: int = 0,
          overrides: Sequence[str] | Mapping[str, Any] | None = None, out: str | Path | None = None,
          parallel: int = 0, ray: bool = False, metric: str | None = None, mode: str | None = None, seed: int = 0,
          quiet: bool = True) -> SweepResult:
    """Run a sweep (see the module docstring) and return its :class:`SweepResult`.

    ``grid``: ``{"field": [values]}`` (or ``--grid`` strings); ``space``: ``{"field": "loguniform(1e-4,1e-2)"}``
    (or ``FIELD=DIST`` strings) with ``samples`` random trials, or ``optuna`` trials proposed by Optuna.
    """
    from fedarena.platform.runs import new_run_dir, resolve

    if isinstance(overrides, Mapping):
        overrides = _overrides(overrides)
    overrides = list(overrides or ())
    experiment, cfg = resolve(config, overrides)
    grid_space = parse_grid(grid) if grid is not None and not isinstance(grid, Mapping) else \
        {k: list(v) for k, v in (grid or {}).items()}
    dist_items = [f"{k}={v}" for k, v in space.items()] if isinstance(space, Mapping) else list(space or ())
    dists = parse_distributions(dist_items, "--optuna" if optuna else "--random")
    methods = [m for m, on in (("grid", bool(grid_space)), ("random", samples > 0), ("optuna", optuna > 0)) if on]
    if len(methods) != 1:
        raise ConfigError("sweep: give exactly one of --grid FIELD=VALUES..., --random N FIELD=DIST..., "
                          "--optuna N FIELD=DIST...")
    method = methods[0]
    if method != "grid" and not dists:
        raise ConfigError(f"--{method}: give at least one FIELD=DIST after the number of trials")
    if method == "grid" and dists:
        raise ConfigError("--grid: distributions belong to --random or --optuna")
    if ray and method == "optuna":
        raise ConfigError("--ray: runs grid and random sweeps; use --optuna without --ray")
    metric = metric or default_metric(experiment)
    mode = mode or default_mode(metric)
    if mode not in ("max", "min"):
        raise ConfigError(f"--mode: expected max or min, got {mode!r}")
    names = list(grid_space or dists)
    for key in names:  # a field that is not in the schema fails here, with the config's did-you-mean
        probe = grid_space[key][0] if grid_space else dists[key].sample(np.random.default_rng(0))
        resolve(config, [*overrides, f"{key}={json.dumps(probe)}"])
    sweep_dir = Path(out) if out is not None else new_run_dir(cfg.kind, name=f"{cfg.name}-sweep" if cfg.name
                                                              else "sweep")
    if (sweep_dir / "sweep.json").exists():
        raise RunError(f"--out {sweep_dir}: already holds a sweep")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    data = cfgmod.to_dict(cfg)
    data["seeds"] = []
    (sweep_dir / "config.yaml").write_text(cfgmod.dump_yaml(data), encoding="utf-8")
    result = SweepResult(sweep_dir.resolve(), metric, mode)
    space = {k: v for k, v in grid_space.items()} if grid_space else {k: f"{d.kind}{d.args}" for k, d in dists.items()}
    info: dict[str, Any] = {"kind": cfg.kind, "method": method, "ray": ray, "space": space, "metric": metric,
                            "mode": mode, "seed": seed, "state": "running"}
    workers = parallel if parallel > 0 else None
    if method == "grid":
        result.trials = [Trial(i, dict(zip(names, combo)))
                         for i, combo in enumerate(itertools.product(*(grid_space[k] for k in names)))]
    elif method == "random":
        rng = np.random.default_rng(seed)
        result.trials = [Trial(i, {k: dists[k].sample(rng) for k in names}) for i in range(samples)]
    _save(result, info)
    if method == "optuna":
        _run_optuna(result, info, dists, optuna, workers or 1, seed, quiet)
    elif ray:
        _run_ray(result, info, experiment, cfg, quiet)
    else:
        _run_local(result, result.trials, workers or 1, quiet)
    info["state"] = "completed" if all(t.state == "completed" for t in result.trials) else "finished with failures"
    _save(result, info)
    result.report = render_sweep(result, info)
    return result


def _command(result: SweepResult, trial: Trial) -> list[str]:
    cmd = [sys.executable, "-m", "fedarena", "run", str(result.sweep_dir / "config.yaml")]
    for o in _overrides(trial.params):
        cmd += ["--set", o]
    return cmd + ["--out", str(result.run_dir(trial)), "--quiet"]


def _collect(result: SweepResult, trial: Trial) -> None:
    run_dir = result.run_dir(trial)
    trial.state = _state(run_dir)
    trial.value = None if trial.state == "failed" else trial_value(run_dir, result.metric)


def _run_local(result: SweepResult, trials: Sequence[Trial], workers: int, quiet: bool) -> None:
    from fedarena.platform.groups import run_commands

    run_commands({t.name: _command(result, t) for t in trials}, result.sweep_dir / "logs", workers, quiet=quiet,
                 desc=f"{len(trials)} trials, {workers} at a time")
    for t in trials:
        _collect(result, t)


def _run_optuna(result: SweepResult, info: dict[str, Any], dists: Mapping[str, Distribution], n: int, workers: int,
                seed: int, quiet: bool) -> None:
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError("--optuna: needs Optuna: pip install 'fedarena[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if result.mode == "max" else "minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    while len(result.trials) < n:  # ask a batch of ``workers`` trials, run them, tell their values
        batch = []
        for _ in range(min(workers, n - len(result.trials))):
            asked = study.ask()
            trial = Trial(len(result.trials), {k: d.suggest(asked, k) for k, d in dists.items()})
            result.trials.append(trial)
            batch.append((asked, trial))
        _save(result, info)
        _run_local(result, [t for _, t in batch], workers, quiet)
        for asked, trial in batch:
            if trial.value is not None and math.isfinite(trial.value):
                study.tell(asked, trial.value)
            else:
                study.tell(asked, state=optuna.trial.TrialState.FAIL)


def _budget(cfg: Any) -> int:
    for name in ("total_steps", "iterations", "rounds", "episodes"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 100


def _run_ray(result: SweepResult, info: dict[str, Any], experiment: Any, cfg: Any, quiet: bool) -> None:
    """Each trial is a Ray Tune trial that runs the experiment in its worker, reporting every metric row
    (``loggers`` gets ``tune``); ASHA stops the trials whose metric trails at its rungs."""
    try:
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
    except ImportError:
        raise MissingDependencyError("--ray: needs Ray Tune: pip install 'fedarena[sweep]'") from None
    from fedarena.platform.cluster import ray_cluster

    time_attr = getattr(experiment, "x_axis", "step")
    max_t = _budget(cfg) + 1 if time_attr in ("env_steps", "step") else 100  # a trial that runs out its budget
    # ends by itself, not as stopped at max_t
    scheduler = ASHAScheduler(time_attr=time_attr, metric=result.metric, mode=result.mode, max_t=max_t,
                              grace_period=max(1, max_t // 8), reduction_factor=2)
    base = str(result.sweep_dir / "config.yaml")
    loggers = [*dict.fromkeys([*cfg.loggers, "tune"])]
    trials = {t.index: (t.params, str(result.run_dir(t))) for t in result.trials}

    def trainable(space: dict[str, Any]) -> None:
        from fedarena.platform.runs import execute

        params, out = trials[int(space["trial"])]
        execute(base, [*_overrides(params), f"loggers={json.dumps(loggers)}"], out=out, quiet=True)

    with ray_cluster(cfg.cluster) as ray:
        resources = {"cpu": 1}
        tuner = tune.Tuner(
            tune.with_resources(trainable, resources),
            param_space={"trial": tune.grid_search(sorted(trials))},
            tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=int(ray.available_resources()
                                                                                      .get("CPU", 1)) or 1),
            run_config=tune.RunConfig(name="ray_tune", storage_path=str(result.sweep_dir / "ray_results"),
                                      verbose=0 if quiet else 1),
        )
        grid = tuner.fit()
    errors = {int(r.config["trial"]): r.error for r in grid}
    for t in result.trials:
        _collect(result, t)
        run_dir = result.run_dir(t)
        # Tune ends a stopped trial by raising SystemExit in it (the run's status: failed, SystemExit) or by ending
        # its worker (status: running)
        stopped = t.state in ("running", "interrupted") or (
            t.state == "failed" and _status(run_dir).get("error_type") == "SystemExit")
        if stopped and errors.get(t.index) is None:
            t.state, t.value = "stopped early (ASHA)", trial_value(run_dir, result.metric)


def _save(result: SweepResult, info: Mapping[str, Any]) -> None:
    from fedarena.platform.checkpoint import write_atomic

    best = result.best
    data = {**info, "trials": [{"trial": t.name, "params": t.params, "state": t.state, "value": t.value}
                               for t in result.trials],
            "best": None if best is None else {"trial": best.name, "params": best.params, "value": best.value}}
    write_atomic(result.sweep_dir / "sweep.json", json.dumps(data, indent=2).encode())


def load_sweep(sweep_dir: str | Path) -> SweepResult:
    """Read a sweep folder's ``sweep.json`` back."""
    sweep_dir = Path(sweep_dir)
    try:
        data = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"{sweep_dir}: not a sweep folder (sweep.json: {e})") from None
    trials = [Trial(int(t["trial"].split("-")[1]), t["params"], t["state"], t["value"]) for t in data["trials"]]
    report = sweep_dir / "report" / "index.html"
    return SweepResult(sweep_dir, data["metric"], data["mode"], trials, report if report.exists() else None)


# ----------------------------------------------------------------------------- report


def _axis(values: Sequence[Any]) -> tuple[np.ndarray, list[str] | None]:
    """Values on [0, 1]: numbers scaled (log scale when they span more than a factor 20 and are positive),
    anything else by rank of its distinct values (then the tick labels)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        a = np.asarray(values, dtype=float)
        if np.all(a > 0) and a.max() / a.min() > 20:
            a = np.log10(a)
        lo, hi = float(a.min()), float(a.max())
        return (a - lo) / (hi - lo) if hi > lo else np.full(len(a), 0.5), None
    labels = list(dict.fromkeys(json.dumps(v) for v in values))
    pos = np.asarray([labels.index(json.dumps(v)) for v in values], dtype=float)
    return (pos / (len(labels) - 1) if len(labels) > 1 else np.full(len(pos), 0.5)), labels


def parallel_coordinates(result: SweepResult, path: Path) -> Path:
    """One vertical axis per swept field and one for the metric; one line per scored trial, coloured by the metric
    (the best trial drawn thick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [t for t in result.trials if t.value is not None and math.isfinite(t.value)]
    names = list(result.trials[0].params) if result.trials else []
    columns = [*names, result.metric]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.4 * len(columns)), 4.8))
    if scored:
        axes = [_axis([t.params[n] for t in scored]) for n in names] + [_axis([t.value for t in scored])]
        ys = np.stack([a for a, _ in axes], axis=1)
        values = np.asarray([t.value for t in scored])
        norm = matplotlib.colors.Normalize(values.min(), values.max() if values.max() > values.min() else
                                           values.min() + 1)
        cmap = matplotlib.colormaps["viridis" if result.mode == "max" else "viridis_r"]
        best = result.best
        for t, y in zip(scored, ys):
            ax.plot(range(len(columns)), y, color=cmap(norm(t.value)), lw=3.2 if t is best else 1.4,
                    alpha=1.0 if t is best else 0.75, zorder=3 if t is best else 2)
        for j, (n, (a, labels)) in enumerate(zip(columns, axes)):
            ax.axvline(j, color="0.3", lw=0.8, zorder=1)
            raw = [t.params[n] for t in scored] if j < len(names) else list(values)
            if labels is not None:
                for pos, label in zip(np.unique(a), labels):
                    ax.annotate(label, (j, pos), xytext=(4, 0), textcoords="offset points", fontsize=8, va="center")
            else:
                nums = np.asarray(raw, dtype=float)
                distinct = np.unique(nums)
                ticks = zip(a[[int(np.argmax(nums == v)) for v in distinct]], distinct) if len(distinct) <= 6 else \
                    ((0.0, nums.min()), (1.0, nums.max()))
                for pos, v in ticks:
                    ax.annotate(f"{v:.4g}", (j, pos), xytext=(4, 0), textcoords="offset points", fontsize=8,
                                va="center")
        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=result.metric)
    ax.set_xticks(range(len(columns)), columns, fontsize=9)
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(columns) - 0.5)
    ax.set_ylim(-0.08, 1.08)
    best = result.best
    ax.set_title(f"{len(scored)} of {len(result.trials)} trials scored; best {best.name if best else '-'} "
                 f"({result.metric} {result.mode})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def render_sweep(result: SweepResult, info: Mapping[str, Any]) -> Path:
    """``<sweep>/report/index.html`` and ``parallel_coordinates.png``."""
    import html

    esc = html.escape
    report_dir = result.sweep_dir / "report"
    report_dir.mkdir(exist_ok=True)
    figure = parallel_coordinates(result, report_dir / "parallel_coordinates.png")
    names = list(result.trials[0].params) if result.trials else []
    sign = -1.0 if result.mode == "max" else 1.0
    order = sorted(result.trials, key=lambda t: (t.value is None or not math.isfinite(t.value),
                                                 sign * (t.value if t.value is not None else 0.0), t.index))
    best = result.best
    head = "".join(f"<th>{esc(h)}</th>" for h in ["trial", *names, result.metric, "state"])
    body = ""
    for t in order:
        link = f'<a href="../{esc(t.name)}/report/index.html">{esc(t.name)}</a>'
        cells = "".join(f"<td>{esc(json.dumps(t.params[n]))}</td>" for n in names)
        value = "" if t.value is None else f"{t.value:.6g}"
        mark = ' class="best"' if t is best else ""
        body += f"<tr{mark}><td>{link}</td>{cells}<td>{esc(value)}</td><td>{esc(t.state)}</td></tr>"
    best_line = (f"Best trial: <b>{esc(best.name)}</b> with {esc(result.metric)} = {best.value:.6g} at "
                 + ", ".join(f"{esc(k)} = {esc(json.dumps(v))}" for k, v in best.params.items())
                 if best else "No trial produced the metric.")
    text = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(result.sweep_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}} tr.best{{background:#e6f4e6}}
img{{max-width:100%}}</style></head><body>
<h1>{esc(result.sweep_dir.name)}</h1>
<p>kind <b>{esc(str(info.get("kind")))}</b> &middot; {esc(str(info.get("method")))} search{" on Ray Tune with ASHA"
    if info.get("ray") else ""} over {", ".join(esc(n) for n in names)} &middot; {len(result.trials)} trials &middot;
metric {esc(result.metric)} ({esc(result.mode)}): the trial's summary value, else its last logged value</p>
<p>{best_line}</p>
<h2>Trials, best first</h2><table><tr>{head}</tr>{body}</table>
<h2>Parallel coordinates</h2><figure><img src="{esc(figure.name)}"></figure>
</body></html>
"""
    (report_dir / "index.html").write_text(text, encoding="utf-8")
    return report_dir / "index.html"
