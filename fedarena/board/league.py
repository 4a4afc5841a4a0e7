"""The league views' data from a run folder: ratings over time and the payoff table.

The ``league`` kind's files are read tolerantly, since several layouts are accepted:

``ratings.jsonl``
    one JSON object a line, its x value under ``step`` (or ``generation`` / ``games`` / ``iteration``), and the
    ratings either as ``{"ratings": {player: rating}}``, as ``{"player": p, "rating": r}`` (one player a line;
    ``elo`` / ``mu`` accepted for ``rating``), or as ``{player: rating, ...}`` beside the x value.  A rating may
    be a number or an object with ``elo`` / ``mu`` / ``rating`` (a TrueSkill ``mu`` with ``sigma``); torn and
    malformed lines are skipped, and only the newest :data:`MAX_RATINGS_BYTES` of the file are read.
``payoff.json``
    ``{"players": [names], "win_rate" | "payoff" | "matrix": [[...]]}`` (row player's win rate or payoff
    against the column player), or the matrix alone; a matrix that is not square with one row per player is
    reported instead of drawn.  With a ``games`` matrix of the same shape, pairs with no games are left blank.

Without ``ratings.jsonl``, metric columns named ``<system>/<player>`` for the systems ``elo``, ``trueskill``
(TrueSkill's mu), ``rating`` (``/`` or ``.`` separated) are used as ratings over the step: the ``league``
kind logs ``elo/<player>`` and ``trueskill/<player>`` per iteration and writes ``payoff.json`` with
``players`` and ``win_rate`` (plus ``games`` and ``ratings``, not drawn).  A rating series longer than
:data:`MAX_POINTS` is thinned to every k-th point.  Files are read through :mod:`fedarena.board.confined`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from fedarena.board.confined import Unreadable, read_tail
from fedarena.board.folders import finite_or_none, has_entry, is_number, read_json

MAX_RATINGS_BYTES = 16 * 1024 * 1024
"""The newest this many bytes of ``ratings.jsonl`` are read."""
MAX_POINTS = 2000
"""Points per player series; a longer one is thinned to every k-th point (its last point kept)."""

X_KEYS = ("step", "generation", "games", "iteration")
VALUE_KEYS = ("rating", "elo", "mu")
_METRIC = re.compile(r"^(elo|trueskill|trueskill_mu|rating|ratings)[./](.+)$")
SYSTEM_NAMES = {"elo": "Elo", "trueskill": "TrueSkill mu", "trueskill_mu": "TrueSkill mu", "rating": "rating",
                "ratings": "rating"}


def _value(v: Any) -> float | None:
    if is_number(v) and math.isfinite(v):
        return float(v)
    if isinstance(v, dict):
        for k in VALUE_KEYS:
            if is_number(v.get(k)) and math.isfinite(v[k]):
                return float(v[k])
    return None


def _x(row: dict[str, Any]) -> float | None:
    for k in X_KEYS:
        if is_number(row.get(k)):
            return float(row[k])
    return None


def thin(series: dict[str, list[list[float]]], points: int = MAX_POINTS) -> dict[str, list[list[float]]]:
    """Every series cut to at most about ``points`` points: every k-th point, and the last one."""
    out = {}
    for k, s in series.items():
        stride = -(-len(s) // points)
        out[k] = s if stride <= 1 else s[::stride] + ([s[-1]] if (len(s) - 1) % stride else [])
    return out


def read_ratings(run_dir: Path) -> dict[str, list[list[float]]]:
    """``{player: [[x, rating], ...]}`` from a run's ``ratings.jsonl`` in any layout of the module docstring."""
    series: dict[str, list[list[float]]] = {}
    try:
        data = read_tail(run_dir, "ratings.jsonl", MAX_RATINGS_BYTES)
    except Unreadable:
        return series
    for line in data[: data.rfind(b"\n") + 1].split(b"\n"):
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        if not isinstance(row, dict):
            continue
        x = _x(row)
        if x is None:
            continue
        if isinstance(row.get("ratings"), dict):
            pairs = row["ratings"].items()
        elif "player" in row:
            pairs = [(row["player"], next((row[k] for k in VALUE_KEYS if k in row), None))]
        else:
            pairs = [(k, v) for k, v in row.items() if k not in X_KEYS and k != "wall_time"]
        for player, v in pairs:
            r = _value(v)
            if r is not None:
                series.setdefault(str(player), []).append([x, r])
    return thin(series)


def ratings_from_metrics(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, list[list[float]]]]:
    """``{system: {player: [[step, rating], ...]}}`` from metric columns ``elo/<player>``, ``trueskill/<player>``..."""
    systems: dict[str, dict[str, list[list[float]]]] = {}
    for row in rows:
        for k, v in row.items():
            m = _METRIC.match(k)
            if m and is_number(v) and math.isfinite(v):
                system = SYSTEM_NAMES[m.group(1)]
                systems.setdefault(system, {}).setdefault(m.group(2), []).append([float(row["step"]), float(v)])
    return {system: thin(series) for system, series in systems.items()}


def read_payoff(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``({"players", "matrix", "label"}, None)``, ``(None, problem)``, or ``(None, None)`` without a file."""
    if not has_entry(run_dir, "payoff.json"):
        return None, None
    doc = read_json(run_dir, "payoff.json")
    label = "win rate"
    if isinstance(doc, dict):
        for key in ("win_rate", "payoff", "matrix"):
            if key in doc:
                matrix, label = doc[key], key.replace("_", " ")
                break
        else:
            return None, "payoff.json: no win_rate, payoff or matrix entry"
        players = doc.get("players")
    elif isinstance(doc, list):
        matrix, players = doc, None
    else:
        return None, "payoff.json: not a JSON object or matrix (being written, malformed, too large or not a regular file)"
    if not (isinstance(matrix, list) and matrix and all(isinstance(r, list) and len(r) == len(matrix) for r in matrix)
            and all(is_number(x) or x is None for r in matrix for x in r)):
        return None, "payoff.json: the matrix is not a square table of numbers"
    if not isinstance(players, list) or len(players) != len(matrix):
        players = [str(i) for i in range(len(matrix))]
    games = doc.get("games") if isinstance(doc, dict) else None
    if isinstance(games, list) and len(games) == len(matrix) and all(
            isinstance(r, list) and len(r) == len(matrix) and all(is_number(g) for g in r) for r in games):
        # a pair that never played has no win rate (the table's 0.5 is a prior, not a result)
        matrix = [[None if g == 0 else x for x, g in zip(row, grow)] for row, grow in zip(matrix, games)]
    else:
        games = None
    return {"players": [str(p) for p in players], "matrix": finite_or_none(matrix), "label": label,
            "games": games}, None


def league_data(run_dir: Path, rows: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"ratings": {system: {player: [[x, r]]}}, "ratings_source", "payoff": {...} | None, "problems": [...]}``."""
    from_file = read_ratings(run_dir)
    ratings = {"rating": from_file} if from_file else {}
    source = "ratings.jsonl" if ratings else None
    if not ratings and rows:
        ratings = ratings_from_metrics(rows)
        source = "metrics.jsonl" if ratings else None
    payoff, why = read_payoff(run_dir)
    return {"ratings": ratings, "ratings_source": source, "payoff": payoff, "problems": [why] if why else []}


def has_league_files(run_dir: Path, kind: str) -> bool:
    return kind == "league" or has_entry(run_dir, "ratings.jsonl") or has_entry(run_dir, "payoff.json")
