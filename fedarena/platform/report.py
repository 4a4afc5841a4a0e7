"""Run reports: PNG plots of the metrics plus ``index.html`` showing them with the config and final numbers.

An experiment kind draws its own figures through ``Experiment.plots``; every run also gets one plot per
scalar metric against the step, so a new kind has a useful report before it designs its figures.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedarena.platform import config as cfgmod
from fedarena.platform.runs import RunError, read_metrics, resolve_saved, write_csv


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scalar_metric_plots(rows: Sequence[Mapping[str, Any]], report_dir: Path, skip: Sequence[str] = ()) -> list[str]:
    """One small figure per scalar metric vs step (grid of panels), written as ``metrics.png``."""
    keys = []
    for row in rows:
        for k, v in row.items():
            if k in ("step", "wall_time") or k in skip or k in keys:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.append(k)
    if not keys:
        return []
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    cols = min(3, len(keys))
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(f"{Path(report_dir).parent.name}: every scalar metric against the logged step", fontsize=10)
    fig.tight_layout()
    path = Path(report_dir) / "metrics.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def render(run_dir: str | Path, experiment=None, config=None) -> Path:
    """(Re)create ``report/`` of a run folder from its config and metrics; returns the index.html path."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise RunError(f"{run_dir}: not a run folder (no config.yaml)")
    if experiment is None or config is None:
        experiment, config = resolve_saved(run_dir / "config.yaml")
    rows = read_metrics(run_dir)
    write_csv(run_dir)
    report_dir = run_dir / "report"
    report_dir.mkdir(exist_ok=True)
    for old in report_dir.glob("*.png"):
        old.unlink()
    images: list[str] = []
    if experiment.plots is not None and rows:
        images += experiment.plots(rows, config, str(report_dir)) or []
    images += scalar_metric_plots(rows, report_dir)
    try:
        status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        status = {}
    summary = status.get("summary", {})
    index = report_dir / "index.html"
    latest = {k: next((r[k] for r in reversed(rows) if k in r), None) for k in experiment.summary_keys}
    index.write_text(_html(run_dir, config, summary, latest, status.get("state", "unknown"), rows, images),
                     encoding="utf-8")
    return index


def _html(run_dir: Path, config, summary: Mapping[str, Any], latest: Mapping[str, Any], state: str, rows,
          images: Sequence[str]) -> str:
    esc = html.escape
    latest_table = "".join(
        f"<tr><th>{esc(str(k))}</th><td>{esc(_fmt(v))}</td></tr>" for k, v in latest.items() if v is not None
    )
    latest_html = f"<h2>Latest metrics</h2><table>{latest_table}</table>" if latest_table else ""
    table = "".join(
        f"<tr><th>{esc(str(k))}</th><td>{esc(_fmt(v))}</td></tr>" for k, v in summary.items()
    ) or "<tr><td>(no summary: the run has not completed)</td></tr>"
    figs = "".join(
        f'<figure><img src="{esc(Path(p).name)}" alt="{esc(Path(p).stem)}"><figcaption>{esc(Path(p).stem)}</figcaption></figure>'
        for p in images
    )
    last = rows[-1]["step"] if rows else "-"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(run_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}} img{{max-width:100%}}
figure{{margin:1.5em 0}} pre{{background:#f6f6f6;padding:1em}}</style></head><body>
<h1>{esc(run_dir.name)}</h1>
<p>kind <b>{esc(config.kind)}</b> &middot; state <b>{esc(state)}</b> &middot; last step {esc(str(last))} &middot;
{len(rows)} metric rows (<a href="../metrics.csv">metrics.csv</a>, <a href="../metrics.jsonl">metrics.jsonl</a>)</p>
<h2>Final numbers</h2><table>{table}</table>
{latest_html}
<h2>Plots</h2>{figs or "<p>(no metrics yet)</p>"}
<h2>Config</h2><pre>{esc(cfgmod.dump_yaml(config))}</pre>
</body></html>
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)
