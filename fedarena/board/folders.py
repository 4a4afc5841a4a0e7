"""Run folders read for the board: tolerant, read-only views of what :mod:`fedarena.platform.runs` writes.

Every reader here opens files for reading only and survives what a run that is being written (or one that
crashed) leaves behind: a metrics line cut off mid-write, a malformed line, a ``status.json`` being replaced,
a missing or unparsable ``config.yaml``.  Metrics are read incrementally by byte offset, so a live page asks
only for the rows appended since its last poll; a complete line that is not a JSON object with a ``step`` is
counted as malformed and skipped, an unterminated last line is left for the next poll.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import yaml

from fedarena.platform.checkpoint import list_checkpoints

RUN_MARKERS = ("status.json", "config.yaml", "metrics.jsonl")
"""A folder holding any of these is a run folder (a group folder holds ``group.json`` instead)."""

TOTAL_KEYS = ("rounds", "iterations", "total_steps", "generations", "epochs", "episodes", "steps")
"""Config fields that state how many steps a run will log, tried in this order for the progress column."""

STATES = {"completed": "finished", "running": "running", "failed": "failed", "interrupted": "interrupted"}
"""``status.json`` state -> what the board shows."""

_STAMP = re.compile(r"-(\d{8}T\d{6}Z)-[0-9a-f]{6}$")
MAX_DEPTH = 3  # runs/<group>/seed-<s>/ is the deepest layout the platform writes
LOG_TAIL_BYTES = 64 * 1024
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
"""Report figures the board serves (no SVG: an SVG file can carry script)."""


class RunNotFound(LookupError):
    """A run id that names no run folder under the board's root (or points outside it)."""


def read_json(path: Path) -> Any:
    """The JSON document at ``path``, or None when it is missing, being replaced, or malformed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_config(run_dir: Path) -> tuple[dict[str, Any], str, str | None]:
    """``(config mapping, YAML text, problem)`` of a run; a missing or unparsable file gives ``({}, text, why)``."""
    path = run_dir / "config.yaml"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}, "", "no config.yaml"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return {}, text, f"config.yaml is not valid YAML: {str(exc).splitlines()[0]}"
    if not isinstance(data, dict):
        return {}, text, "config.yaml does not hold a mapping"
    return data, text, None


@dataclass
class MetricsChunk:
    """Rows appended to ``metrics.jsonl`` since ``start``; ``offset`` is where the next read starts."""

    rows: list[dict[str, Any]]
    offset: int
    malformed: int
    reset: bool = False
    """the file was replaced or shortened (a resumed run drops rows after its checkpoint): read it again from 0"""
    file_id: str = ""


def _file_id(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def read_metrics_since(run_dir: Path, offset: int = 0, file_id: str = "") -> MetricsChunk:
    """Complete rows of ``metrics.jsonl`` from byte ``offset`` on.

    ``file_id`` is the value a previous chunk returned; if the file has since been replaced (another inode) or
    is shorter than ``offset``, the chunk says ``reset`` and holds every row from the start.
    """
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            fid = _file_id(st)
            reset = bool(offset) and (st.st_size < offset or (file_id and file_id != fid))
            if reset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except OSError:
        return MetricsChunk([], 0, 0, reset=bool(offset), file_id="")
    end = data.rfind(b"\n") + 1  # an unterminated last line is still being written: leave it for later
    rows, malformed = [], 0
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            malformed += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and not isinstance(row["step"], bool):
            rows.append(row)
        else:
            malformed += 1
    return MetricsChunk(rows, offset + end, malformed, reset=reset, file_id=fid)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def scalar_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Names of the numeric metrics in ``rows``, in first-seen order (``step`` and ``wall_time`` excluded)."""
    keys: dict[str, None] = {}
    for row in rows:
        for k, v in row.items():
            if k not in ("step", "wall_time") and is_number(v):
                keys.setdefault(k)
    return list(keys)


def finite_or_none(v: Any) -> Any:
    """JSON for a browser: NaN and infinities (which ``JSON.parse`` rejects) become null, recursively."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): finite_or_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_or_none(x) for x in v]
    return v


@dataclass
class RunInfo:
    """One run folder as the runs list shows it."""

    id: str
    """path relative to the board's root, with ``/`` separators (the run's address in URLs)"""
    path: Path
    kind: str
    name: str
    state: str
    step: int | None
    total: int | None
    started: str
    """UTC start time, ``YYYY-MM-DD HH:MM:SS``"""
    started_ts: float
    metrics: dict[str, Any] = field(default_factory=dict)
    """final numbers: the summary of a finished run, else the newest value of each scalar metric"""
    error: str | None = None
    group: str | None = None

    @property
    def progress(self) -> float | None:
        if self.state == "finished":
            return 1.0
        if self.total and self.step is not None:
            return max(0.0, min(1.0, self.step / self.total))
        return None


def _last_row(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete row of metrics.jsonl, reading only the file's tail."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data[: data.rfind(b"\n") + 1].split(b"\n")):
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(row, dict) and is_number(row.get("step")):
            return row
    return None


def _started(run_dir: Path) -> tuple[str, float]:
    m = _STAMP.search(run_dir.name)
    if m:
        t = datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    else:
        try:
            ts = min(p.stat().st_mtime for p in run_dir.iterdir())
        except (OSError, ValueError):
            ts = 0.0
        t = datetime.fromtimestamp(ts, timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S"), t.timestamp()


def total_steps(config: dict[str, Any]) -> int | None:
    """How many steps the config asks for (the first of :data:`TOTAL_KEYS` that is a positive integer)."""
    for key in TOTAL_KEYS:
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def run_info(root: Path, run_dir: Path) -> RunInfo:
    status = read_json(run_dir / "status.json")
    status = status if isinstance(status, dict) else {}
    config, _, _ = read_config(run_dir)
    last = _last_row(run_dir)
    state = STATES.get(str(status.get("state", "")), str(status.get("state") or "unknown"))
    summary = status.get("summary")
    if isinstance(summary, dict) and summary:
        metrics = {str(k): v for k, v in summary.items() if is_number(v)}
    else:
        metrics = {k: v for k, v in (last or {}).items() if k not in ("step", "wall_time") and is_number(v)}
    step = last.get("step") if last else status.get("last_step")
    started, ts = _started(run_dir)
    rel = run_dir.relative_to(root).as_posix()
    group = rel.rsplit("/", 1)[0] if (run_dir.parent / "group.json").exists() and "/" in rel else None
    return RunInfo(id=rel, path=run_dir, kind=str(config.get("kind") or status.get("kind") or "?"),
                   name=str(config.get("name") or ""), state=state,
                   step=int(step) if is_number(step) else None, total=total_steps(config), started=started,
                   started_ts=ts, metrics=metrics, error=status.get("error") if isinstance(status.get("error"), str)
                   else None, group=group)


def _walk(directory: Path, depth: int) -> Iterator[Path]:
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return
    for child in children:
        if any((child / m).exists() for m in RUN_MARKERS) and not (child / "group.json").exists():
            yield child
        elif depth < MAX_DEPTH:
            yield from _walk(child, depth + 1)


def list_runs(root: Path) -> list[RunInfo]:
    """Every run folder under ``root`` (seed runs of a group included), newest first."""
    root = Path(root)
    runs = [run_info(root, d) for d in _walk(root, 1)]
    return sorted(runs, key=lambda r: (-r.started_ts, r.id))


def resolve_run(root: Path, run_id: str) -> Path:
    """The folder of ``run_id`` under ``root``; raises :class:`RunNotFound` for anything else (``..``, links out)."""
    root = Path(root).resolve()
    if not run_id or "\x00" in run_id or run_id.startswith("/"):
        raise RunNotFound(f"run {run_id!r}: not a run under {root}")
    path = (root / run_id).resolve()
    if path != root and root not in path.parents:
        raise RunNotFound(f"run {run_id!r}: not a run under {root}")
    if not path.is_dir() or not any((path / m).exists() for m in RUN_MARKERS):
        raise RunNotFound(f"run {run_id!r}: no run folder there")
    return path


def file_in(run_dir: Path, relative: str, allowed_dirs: tuple[str, ...]) -> Path:
    """A file under one of ``allowed_dirs`` of the run folder; raises :class:`RunNotFound` otherwise."""
    base = run_dir.resolve()
    path = (base / relative).resolve()
    if not any(path.is_relative_to(base / d) for d in allowed_dirs) or not path.is_file():
        raise RunNotFound(f"{relative!r}: no such file of this run")
    return path


def log_tail(run_dir: Path, lines: int = 200) -> str:
    """The last ``lines`` lines of ``run.log`` (decoding errors replaced)."""
    try:
        with open(run_dir / "run.log", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def figures(run_dir: Path) -> list[str]:
    """Report figures (``report/*.png`` and other images), as paths relative to the run folder."""
    report = run_dir / "report"
    try:
        return sorted(f"report/{p.name}" for p in report.iterdir() if p.suffix.lower() in IMAGE_TYPES and p.is_file())
    except OSError:
        return []


def checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """Checkpoint files of the run, oldest first: step, file name, size, UTC modification time."""
    out = []
    for step, path in list_checkpoints(run_dir / "checkpoints"):
        try:
            st = path.stat()
        except OSError:
            continue
        out.append({"step": step, "file": path.name, "bytes": st.st_size,
                    "modified": datetime.fromtimestamp(st.st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")})
    return out


def status(run_dir: Path) -> dict[str, Any]:
    s = read_json(run_dir / "status.json")
    return s if isinstance(s, dict) else {}
