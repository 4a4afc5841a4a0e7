"""Multi-seed groups: one run per seed under a group folder, run in parallel, and a report with spread.

``fedarena run CONFIG --seeds 0 1 2`` (or ``seeds: [0, 1, 2]`` in the config, or ``fedarena.run(..., seeds=)``)
writes::

    <group>/config.yaml        the resolved config (with its seeds)
    <group>/group.json         kind, seeds, run folders, state (running / completed / failed)
    <group>/seed-<s>/          an ordinary run folder per seed (config with seed = s, status.json, report, ...)
    <group>/logs/seed-<s>.log  what that run printed
    <group>/summary.json       the group summary (below) and the path of the group report, for listings
    <group>/report/index.html  mean and min-max band over seeds of the kind's group metrics against its x axis
                               (environment steps for RL kinds, else the step) and against wall time, a table of
                               every seed's summary, and mean / std / min / max per summary number

Each seed runs as its own ``python -m fedarena run`` process (so any kind works, Ray kinds included), at most
``parallel`` at a time (default: one per CPU). In the band plots a seed that stopped early (e.g. it reached its
target) holds its last value to the end of the axis; curves are linearly interpolated onto a common grid.
``--resume GROUP`` resumes the seeds that did not complete.

Seeds of a kind with a target (RL kinds' ``reached_target``) are counted: "k of n seeds reached the target", and
the numbers that only exist for a run that reached it (``steps_to_target``, ``time_to_target_s``) are summarised
over those k seeds (:func:`group_summary`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fedarena.platform import config as cfgmod
from fedarena.platform.errors import ConfigError, RunError


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _write_json(path: Path, data: Any) -> None:
    from fedarena.platform.checkpoint import write_atomic

    write_atomic(path, json.dumps(data, indent=2).encode())


def seed_dir(group_dir: Path, seed: int) -> Path:
    return Path(group_dir) / f"seed-{seed}"


def execute_group(config: Any, overrides: Sequence[str] = (), *, out: str | Path | None = None,
                  seeds: Sequence[int] | None = None, resume: bool = False, quiet: bool = False, report: bool = True,
                  parallel: int = 0) -> dict[str, Any]:
    """Run (or resume) a seed group; returns the group summary with ``run_dir`` (the group folder) and ``runs``."""
    from fedarena.platform.runs import new_run_dir, resolve, resolve_saved

    if resume:
        group_dir = Path(out)  # type: ignore[arg-type]
        experiment, cfg = resolve_saved(group_dir / "config.yaml", overrides)
        seed_list = list(json.loads((group_dir / "group.json").read_text(encoding="utf-8"))["seeds"])
    else:
        experiment, cfg = resolve(config, overrides)
        seed_list = [int(s) for s in (seeds if seeds is not None else cfg.seeds)]
        if not seed_list:
            raise ConfigError("seeds: give at least one seed")
        if len(set(seed_list)) != len(seed_list):
            raise ConfigError(f"seeds: listed twice in {seed_list}")
        group_dir = Path(out) if out is not None else new_run_dir(cfg.kind, name=f"{cfg.name}-seeds" if cfg.name
                                                                   else "seeds")
        if (group_dir / "group.json").exists():
            raise RunError(f"--out {group_dir}: already holds a seed group; use --resume {group_dir} to continue it")
        group_dir.mkdir(parents=True, exist_ok=True)
        data = cfgmod.to_dict(cfg)
        data["seeds"] = seed_list
        (group_dir / "config.yaml").write_text(cfgmod.dump_yaml(data), encoding="utf-8")
    (group_dir / "logs").mkdir(exist_ok=True)
    info = {"kind": cfg.kind, "seeds": seed_list, "runs": {str(s): seed_dir(group_dir, s).name for s in seed_list},
            "state": "running"}
    _write_json(group_dir / "group.json", info)
    workers = parallel if parallel > 0 else min(len(seed_list), os.cpu_count() or 1)
    t0 = time.monotonic()
    _run_seeds(group_dir, seed_list, overrides if resume else (), workers, resume, quiet, report)
    statuses = {s: _status(seed_dir(group_dir, s)) for s in seed_list}
    failed = {s: st for s, st in statuses.items() if st.get("state") != "completed"}
    info["state"] = "failed" if failed else "completed"
    info["wall_time"] = round(time.monotonic() - t0, 3)
    _write_json(group_dir / "group.json", info)
    summary = group_summary(statuses)
    result: dict[str, Any] = {**summary, "seeds": seed_list, "runs": [str(seed_dir(group_dir, s)) for s in seed_list]}
    if report:
        result["report"] = str(render_group(group_dir, experiment=experiment))
    else:
        write_group_summary(group_dir, summary, None)
    if failed:
        s, st = next(iter(failed.items()))
        message = (f"seed {s} of {len(seed_list)} in {group_dir} {st.get('state', 'did not finish')}: "
                   f"{st.get('error', 'see ' + str(group_dir / 'logs' / f'seed-{s}.log'))}")
        raise (GroupRunFailed if st.get("user_error", True) else GroupInternalFailure)(message)
    result["run_dir"] = str(group_dir)
    return result


class GroupRunFailed(RunError):
    """A seed of the group failed with a user error (the group report is still written)."""


class GroupInternalFailure(RuntimeError):
    """A seed of the group failed with an internal error."""


def _command(group_dir: Path, seed: int, overrides: Sequence[str], resume: bool, report: bool) -> list[str]:
    run_dir = seed_dir(group_dir, seed)
    cmd = [sys.executable, "-m", "fedarena", "run"]
    if resume and (run_dir / "config.yaml").exists():
        cmd += ["--resume", str(run_dir)]
        for o in overrides:
            cmd += ["--set", o]
    else:
        cmd += [str(group_dir / "config.yaml"), "--set", f"seed={seed}", "--set", "seeds=[]", "--out", str(run_dir)]
    cmd.append("--quiet")
    if not report:
        cmd.append("--no-report")
    return cmd


def _run_seeds(group_dir: Path, seeds: list[int], overrides: Sequence[str], workers: int, resume: bool,
               quiet: bool, report: bool) -> None:
    todo = [s for s in seeds if not (resume and _status(seed_dir(group_dir, s)).get("state") == "completed")]
    run_commands({f"seed-{s}": _command(group_dir, s, overrides, resume, report) for s in todo}, group_dir / "logs",
                 workers, quiet=quiet, desc=f"{len(todo)} seeds, {workers} at a time")


def run_commands(commands: Mapping[str, Sequence[str]], log_dir: Path, workers: int, *, quiet: bool,
                 desc: str) -> dict[str, int]:
    """Run each command as its own process, at most ``workers`` at a time, its output in ``<log_dir>/<name>.log``;
    returns the exit status by name. Interrupted, it stops the processes it started. (Seed groups and sweeps.)"""
    import logging

    from fedarena.platform.progress import Progress

    logger = logging.getLogger("fedarena.group")
    log_dir.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, Any]] = {}
    queue = list(commands)
    codes: dict[str, int] = {}
    env = dict(os.environ)
    with Progress(len(queue), 0, desc, logger=logger, quiet=quiet) as bar:
        try:
            while queue or running:
                while queue and len(running) < workers:
                    name = queue.pop(0)
                    log = open(log_dir / f"{name}.log", "ab")
                    running[name] = (subprocess.Popen(list(commands[name]), stdout=log, stderr=subprocess.STDOUT,
                                                      env=env), log)
                time.sleep(0.05)
                for name, (proc, log) in list(running.items()):
                    if proc.poll() is not None:
                        log.close()
                        del running[name]
                        codes[name] = proc.returncode
                        bar.update(1, run=name, rc=proc.returncode)
        finally:
            for proc, log in running.values():  # interrupted: stop the children we started
                proc.terminate()
                proc.wait(timeout=30)
                log.close()
    return codes


TARGET_FLAG = "reached_target"
"""A boolean summary field a kind sets when the run reached its target (RL kinds: the return threshold)."""


def depends_on_target(key: str) -> bool:
    """Whether a summary number only means something for a run that reached its target (``steps_to_target``,
    ``time_to_target_s``, ``rounds_to_target``): such numbers are summarised over the seeds that reached it."""
    return "to_target" in key


def _stats(out: dict[str, Any], key: str, vals: Sequence[float]) -> None:
    a = np.asarray(vals, dtype=float)
    out[f"{key}/mean"], out[f"{key}/std"] = float(np.mean(a)), float(np.std(a))
    out[f"{key}/min"], out[f"{key}/max"] = float(np.min(a)), float(np.max(a))


def group_summary(statuses: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Mean / std / min / max over seeds of every numeric summary field the completed seeds share.

    When the seeds' summaries carry ``reached_target``, the group says how many reached it
    (``reached_target/count`` of ``reached_target/seeds``), and a field for which :func:`depends_on_target` holds
    is summarised over those seeds only (a seed that did not reach the target has no ``steps_to_target``; the -1
    it reports is not averaged in); with no seed reaching it such a field has no statistics.
    """
    done = [st.get("summary", {}) for st in statuses.values() if st.get("state") == "completed"]
    out: dict[str, Any] = {"completed_seeds": len(done), "failed_seeds": len(statuses) - len(done)}
    if not done:
        return out
    flagged = all(isinstance(d.get(TARGET_FLAG), bool) for d in done)
    reached = [d for d in done if d.get(TARGET_FLAG) is True] if flagged else done
    if flagged:
        out[f"{TARGET_FLAG}/count"], out[f"{TARGET_FLAG}/seeds"] = len(reached), len(done)
    for k in done[0]:
        pool = reached if flagged and depends_on_target(k) else done
        vals = [d.get(k) for d in pool]
        if pool and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            _stats(out, k, vals)
    return out


def seeds_phrase(n: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def write_group_summary(group_dir: Path, summary: Mapping[str, Any], report: Path | None) -> Path:
    """``<group>/summary.json``: the group summary and the path of the group's band report (relative to the group
    folder), so a listing of run folders can show the group and link its report."""
    path = Path(group_dir) / "summary.json"
    data = {"summary": dict(summary),
            "report": str(report.relative_to(group_dir)) if report is not None and report.exists() else None}
    _write_json(path, data)
    return path


# ----------------------------------------------------------------------------- report


def _curves(rows: Sequence[Mapping[str, Any]], xkey: str, ykey: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[xkey], r[ykey]) for r in rows if isinstance(r.get(xkey), (int, float)) and
           isinstance(r.get(ykey), (int, float)) and not isinstance(r.get(ykey), bool) and math.isfinite(r[ykey])]
    if not pts:
        return np.zeros(0), np.zeros(0)
    x, y = (np.asarray(v, dtype=float) for v in zip(*pts))
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def band(curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 200) -> dict[str, np.ndarray]:
    """Mean, min and max over seeds on a common grid (linear interpolation; a seed holds its last value after
    its last point and is absent before its first). Returns grid, mean, low, high, count."""
    curves = [(x, y) for x, y in curves if x.size]
    if not curves:
        return {}
    lo_x = min(float(x[0]) for x, _ in curves)
    hi_x = max(float(x[-1]) for x, _ in curves)
    grid = np.linspace(lo_x, hi_x, points) if hi_x > lo_x else np.array([lo_x])
    ys = np.stack([np.where(grid < x[0], np.nan, np.interp(grid, x, y)) for x, y in curves])
    count = np.sum(np.isfinite(ys), axis=0)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, low, high = np.nanmean(ys, axis=0), np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)
    return {"grid": grid, "mean": mean, "low": low, "high": high, "count": count}


def _group_metrics(experiment: Any, per_seed_rows: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[str]:
    def scalar_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
        keys: dict[str, None] = {}
        for r in rows:
            for k, v in r.items():
                if k not in ("step", "wall_time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    keys[k] = None
        return list(keys)

    present = [set(scalar_keys(rows)) for rows in per_seed_rows.values() if rows]
    if not present:
        return []
    common = set.intersection(*present)
    wanted = list(getattr(experiment, "group_metrics", ()) or getattr(experiment, "summary_keys", ()))
    chosen = [k for k in wanted if k in common]
    if not chosen:
        first = next(rows for rows in per_seed_rows.values() if rows)
        chosen = [k for k in scalar_keys(first) if k in common][:9]
    return chosen


def render_group(group_dir: str | Path, experiment: Any = None) -> Path:
    """(Re)create ``<group>/report/``: band plots per group metric and the per-seed table."""
    from fedarena.platform.runs import read_metrics, resolve_saved

    group_dir = Path(group_dir)
    info = json.loads((group_dir / "group.json").read_text(encoding="utf-8"))
    if experiment is None:
        experiment, _ = resolve_saved(group_dir / "config.yaml")
    seeds = [int(s) for s in info["seeds"]]
    rows = {s: read_metrics(seed_dir(group_dir, s)) for s in seeds}
    statuses = {s: _status(seed_dir(group_dir, s)) for s in seeds}
    report_dir = group_dir / "report"
    report_dir.mkdir(exist_ok=True)
    for old in report_dir.glob("*.png"):
        old.unlink()
    metrics = _group_metrics(experiment, rows)
    xkey = getattr(experiment, "x_axis", "step")
    if not any(r and xkey in r[0] for r in rows.values()):
        xkey = "step"
    images = [_band_plot(rows, metrics, xkey, report_dir, info["kind"])] if metrics else []
    summary = group_summary(statuses)
    (report_dir / "index.html").write_text(_html(group_dir, info, statuses, summary, images, xkey), encoding="utf-8")
    write_group_summary(group_dir, summary, report_dir / "index.html")
    return report_dir / "index.html"


def _band_plot(rows: Mapping[int, Sequence[Mapping[str, Any]]], metrics: list[str], xkey: str, report_dir: Path,
               kind: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 2, figsize=(12, 3.6 * len(metrics)), squeeze=False)
    for i, metric in enumerate(metrics):
        for j, x in enumerate((xkey, "wall_time")):
            ax = axes[i, j]
            curves = {s: _curves(r, x, metric) for s, r in rows.items()}
            b = band(list(curves.values()))
            for s, (cx, cy) in curves.items():
                ax.plot(cx, cy, lw=0.7, alpha=0.45, label=f"seed {s}")
            if b:
                ax.fill_between(b["grid"], b["low"], b["high"], alpha=0.25, color="tab:blue", label="min-max over seeds")
                ax.plot(b["grid"], b["mean"], lw=2.0, color="tab:blue", label=f"mean of {seeds_phrase(len(curves))}")
            ax.set_xlabel({"env_steps": "environment steps", "wall_time": "wall time (s)"}.get(x, x))
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"{kind}: mean and min-max band over {seeds_phrase(len(rows))}")
    fig.tight_layout()
    path = report_dir / "seeds.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return "" if v is None else str(v)


def _html(group_dir: Path, info: Mapping[str, Any], statuses: Mapping[int, Mapping[str, Any]],
          summary: Mapping[str, Any], images: Sequence[str], xkey: str) -> str:
    import html

    esc = html.escape
    keys: dict[str, None] = {}
    for st in statuses.values():
        keys.update(dict.fromkeys(st.get("summary", {})))
    head = "".join(f"<th>{esc(k)}</th>" for k in ["seed", "state", *keys])
    body = ""
    for s, st in statuses.items():
        link = f'<a href="../{esc(seed_dir(group_dir, s).name)}/report/index.html">{s}</a>'
        cells = "".join(f"<td>{esc(_fmt(st.get('summary', {}).get(k)))}</td>" for k in keys)
        state = st.get("state", "unknown") + (f": {st['error']}" if st.get("error") else "")
        body += f"<tr><td>{link}</td><td>{esc(state)}</td>{cells}</tr>"
    agg = ""
    if f"{TARGET_FLAG}/count" in summary:
        k, n = summary[f"{TARGET_FLAG}/count"], summary[f"{TARGET_FLAG}/seeds"]
        agg += (f"<tr><th>reached the target</th><td>{k} of {seeds_phrase(n)}; numbers *_to_target* are over "
                f"{'that seed' if k == 1 else f'those {k}'} only</td></tr>")
    agg += "".join(f"<tr><th>{esc(k)}</th><td>{esc(_fmt(v))}</td></tr>" for k, v in summary.items()
                   if not k.startswith(f"{TARGET_FLAG}/"))
    figs = "".join(f'<figure><img src="{esc(Path(p).name)}"></figure>' for p in images)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(group_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}} img{{max-width:100%}}</style></head><body>
<h1>{esc(group_dir.name)}</h1>
<p>kind <b>{esc(str(info.get("kind")))}</b> &middot; state <b>{esc(str(info.get("state")))}</b> &middot;
seeds {esc(", ".join(str(s) for s in info.get("seeds", [])))} &middot; x axis {esc(xkey)} and wall time</p>
<h2>Per seed</h2><table><tr>{head}</tr>{body}</table>
<h2>Over seeds</h2><table>{agg}</table>
<h2>Curves</h2>{figs or "<p>(no metrics)</p>"}
<p>Band: min-max over seeds of curves interpolated onto a common grid; a seed that stopped early holds its last
value.</p>
</body></html>
"""
