"""The curve a run is judged by, drawn first: returns against environment steps for the RL kinds,
exploitability for the game kinds, accuracy for the federated kinds; and the band of that curve over the seeds
of a multi-seed group (mean and min-max, :func:`fedarena.platform.groups.band`, the group report's own rule).

The metric names are the ones the kinds log: ``eval_return`` (deterministic evaluation) and ``episode_return``
(training episodes) against ``env_steps`` (:mod:`fedarena.rl.experiments`); ``exploitability`` (``xfp``,
``cfr``) or ``<variant>/exploitability`` (``psro``'s meta-solvers, ``nfsp``'s ``seed<s>/``, ``psro_rl``'s
``rl/`` and ``exact/``) against the iteration; ``test_acc`` (``fedsim``, ``fedavg_grpc``) or
``final_test_acc`` (``fedavg_table``, one row per grid cell) against the round.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from fedarena.board.folders import is_number, iter_metrics

MAX_DEFAULT = 6
"""At most this many metrics are picked by default (``psro`` logs one exploitability per meta-solver)."""
BAND_POINTS = 60
BAND_BYTES = 16 * 1024 * 1024
"""The most bytes of one seed's ``metrics.jsonl`` read for a group's band (a page at a time)."""


@dataclass(frozen=True)
class DefaultCurve:
    """Which metrics a kind's pages show first, and against what."""

    quantity: str
    """what the curve measures, in words (``return``, ``exploitability``, ``accuracy``)"""
    x: str
    """the x axis metric (``env_steps``); ``step`` when the rows lack it"""
    names: tuple[str, ...]
    """metric names, in order of preference"""
    suffixes: tuple[str, ...] = ()
    """also any metric named ``<prefix>/<suffix>`` for one of these"""

    def pick(self, keys: Iterable[str]) -> list[str]:
        """The default metrics among ``keys``: the exact names in preference order, then ``.../suffix`` ones."""
        keys = list(keys)
        exact = [n for n in self.names if n in keys]
        by_suffix = [k for k in keys if k not in exact and any(k.endswith("/" + s) for s in self.suffixes)]
        return [*exact, *by_suffix][:MAX_DEFAULT]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


RETURNS = DefaultCurve("return", "env_steps", ("eval_return", "episode_return"))
EXPLOITABILITY = DefaultCurve("exploitability", "step", ("exploitability",), ("exploitability",))
ACCURACY = DefaultCurve("accuracy", "step", ("test_acc", "final_test_acc", "test_accuracy", "accuracy"))

BY_KIND: dict[str, DefaultCurve] = {
    **dict.fromkeys(("ppo", "dqn", "impala"), RETURNS),
    **dict.fromkeys(("xfp", "cfr", "psro", "nfsp", "psro_rl"), EXPLOITABILITY),
    **dict.fromkeys(("fedsim", "fedavg_grpc", "fedavg_table"), ACCURACY),
}
"""The kinds with a default curve; other kinds start with their summary's metrics."""


def for_kind(kind: str) -> DefaultCurve | None:
    return BY_KIND.get(kind)


@dataclass
class Band:
    """Mean and min-max over seeds of one metric, on a common grid of the x axis."""

    metric: str
    x: str
    grid: list[float]
    mean: list[float | None]
    low: list[float | None]
    high: list[float | None]
    seeds: int
    """seeds that logged the metric"""

    def final(self) -> tuple[float | None, float | None, float | None]:
        """(mean, min, max) at the last grid point."""
        return (self.mean[-1], self.low[-1], self.high[-1]) if self.grid else (None, None, None)

    def svg(self, width: int = 160, height: int = 40) -> dict[str, Any]:
        """Polygon (min-max) and polyline (mean) points scaled into a ``width x height`` box, for a sparkline."""
        pts = [(x, m, lo, hi) for x, m, lo, hi in zip(self.grid, self.mean, self.low, self.high)
               if m is not None and lo is not None and hi is not None]
        if not pts:
            return {"band": "", "mean": "", "width": width, "height": height}
        x0, x1 = pts[0][0], pts[-1][0]
        y0, y1 = min(p[2] for p in pts), max(p[3] for p in pts)
        sx = (width - 2) / (x1 - x0) if x1 > x0 else 0.0
        sy = (height - 4) / (y1 - y0) if y1 > y0 else 0.0

        def xy(x: float, y: float) -> str:
            return f"{1 + (x - x0) * sx:.1f},{height - 2 - (y - y0) * sy:.1f}"

        upper = [xy(p[0], p[3]) for p in pts]
        lower = [xy(p[0], p[2]) for p in reversed(pts)]
        return {"band": " ".join(upper + lower), "mean": " ".join(xy(p[0], p[1]) for p in pts),
                "width": width, "height": height}


def _series(run_dir: Path, curve: DefaultCurve) -> tuple[dict[str, tuple[list[float], list[float]]], bool]:
    """``{metric: (xs, ys)}`` of the curve's candidate metrics in one run, and whether it logged ``curve.x``."""
    found: dict[str, tuple[list[float], list[float]]] = {}
    has_x = False
    for row in iter_metrics(run_dir, BAND_BYTES):
        if is_number(row.get(curve.x)):
            has_x = True
        for k in curve.pick(row):
            v = row[k]
            if is_number(v) and math.isfinite(v):
                x = row.get(curve.x) if is_number(row.get(curve.x)) else row["step"]
                xs, ys = found.setdefault(k, ([], []))
                xs.append(float(x))
                ys.append(float(v))
    return found, has_x


def group_band(seed_dirs: Sequence[Path], kind: str) -> Band | None:
    """The band over ``seed_dirs`` of the kind's first default metric that every seed with metrics logged."""
    from fedarena.platform.groups import band

    curve = for_kind(kind)
    if curve is None:
        return None
    per_seed = [_series(d, curve) for d in seed_dirs]
    per_seed = [(s, has_x) for s, has_x in per_seed if s]
    if not per_seed:
        return None
    common = set.intersection(*(set(s) for s, _ in per_seed))
    metric = next((m for m in curve.pick(per_seed[0][0]) if m in common), None)
    if metric is None:
        return None
    xkey = curve.x if all(has_x for _, has_x in per_seed) else "step"
    curves = []
    for s, _ in per_seed:
        x, y = (np.asarray(v, dtype=float) for v in s[metric])
        order = np.argsort(x, kind="stable")
        curves.append((x[order], y[order]))
    b = band(curves, points=BAND_POINTS)
    if not b:
        return None

    def clean(a: np.ndarray) -> list[float | None]:
        return [float(v) if math.isfinite(v) else None for v in a]

    return Band(metric=metric, x=xkey, grid=[float(g) for g in b["grid"]], mean=clean(b["mean"]),
                low=clean(b["low"]), high=clean(b["high"]), seeds=len(curves))
