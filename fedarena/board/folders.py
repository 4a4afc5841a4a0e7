"""Run folders read for the board: tolerant, read-only views of what :mod:`fedarena.platform.runs` writes.

Every reader here opens files for reading only, through :mod:`fedarena.board.confined` (no symbolic link, no
FIFO or device, a byte cap per file), and survives what a run that is being written (or one that crashed, or a
hostile folder) leaves behind: a metrics line cut off mid-write, a malformed or over-long line, a
``status.json`` being replaced, a missing or unparsable ``config.yaml``.  Metrics are read incrementally by
byte offset and in pages of at most :data:`METRICS_PAGE_BYTES`, so a live page asks only for the rows appended
since its last poll and no request holds more than one page; a complete line that is not a JSON object with a
``step`` is counted as malformed and skipped, a line longer than :data:`MAX_LINE_BYTES` is skipped unparsed,
an unterminated last line is left for the next poll; a row keeps only its numeric values.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import yaml

from fedarena.board.confined import Unreadable, is_regular, list_dir, read_bytes, read_range, read_tail, regular_files

RUN_MARKERS = ("status.json", "config.yaml", "metrics.jsonl")
"""A folder holding any of these is a run folder (a group folder holds ``group.json`` instead)."""

TOTAL_KEYS = ("rounds", "iterations", "total_steps", "generations", "epochs", "episodes", "steps")
"""Config fields that state how many steps a run will log, tried in this order for the progress column."""

STATES = {"completed": "finished", "running": "running", "failed": "failed", "interrupted": "interrupted"}
"""``status.json`` state -> what the board shows."""

_CHECKPOINT = re.compile(r"^ckpt-(\d{9})\.fdck$")  # the names fedarena.platform.checkpoint writes
_STAMP = re.compile(r"-(\d{8}T\d{6}Z)-[0-9a-f]{6}$")
MAX_DEPTH = 3  # runs/<group>/seed-<s>/ is the deepest layout the platform writes
LOG_TAIL_BYTES = 64 * 1024
MAX_JSON_BYTES = 4 * 1024 * 1024
"""``status.json``, ``group.json``, ``payoff.json`` and profile documents larger than this are not read."""
MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_NODES = 100_000
METRICS_PAGE_BYTES = 512 * 1024
"""The most bytes of ``metrics.jsonl`` one read takes (a client pages through a longer file)."""
MAX_LINE_BYTES = 256 * 1024
"""A metrics line longer than this is counted as malformed without being parsed."""
SKIP_PAGES = 64
"""How many pages one read skips looking for the end of an over-long line (the next read goes on)."""
LAST_ROW_BYTES = 256 * 1024
MAX_LISTED = 500
"""Report figures and checkpoints listed per run, at most."""
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
"""Report figures the board serves (no SVG: an SVG file can carry script)."""


class RunNotFound(LookupError):
    """A run id that names no run folder under the board's root (or points outside it)."""


def read_json(folder: Path, name: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON document ``folder/name``, or None when it is missing, unreadable, too large, or malformed."""
    try:
        return json.loads(read_bytes(folder, name, limit).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def read_config(run_dir: Path) -> tuple[dict[str, Any], str, str | None]:
    """``(config mapping, YAML text, problem)`` of a run; a missing or unparsable file gives ``({}, text, why)``."""
    try:
        text = read_bytes(run_dir, "config.yaml", MAX_CONFIG_BYTES).decode("utf-8", errors="replace")
    except Unreadable as exc:
        return {}, "", f"config.yaml unavailable ({exc})"
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        return {}, text, f"config.yaml is not valid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if not isinstance(data, dict):
        return {}, text, "config.yaml does not hold a mapping"
    if not _small(data, MAX_CONFIG_NODES):  # YAML aliases can make a short file a huge tree ("billion laughs")
        return {}, text, f"config.yaml expands to more than {MAX_CONFIG_NODES} values (aliases): not read"
    return data, text, None


def _small(data: Any, limit: int) -> bool:
    """Whether ``data`` (lists and mappings, shared ones counted each time they appear) has at most ``limit``
    values; stops counting as soon as it has more."""
    stack, seen = [data], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


@dataclass
class MetricsChunk:
    """Rows appended to ``metrics.jsonl`` since ``start``; ``offset`` is where the next read starts."""

    rows: list[dict[str, Any]]
    offset: int
    malformed: int
    reset: bool = False
    """the file was replaced or shortened (a resumed run drops rows after its checkpoint): read it again from 0"""
    file_id: str = ""
    more: bool = False
    """the file holds complete lines past ``offset``: read again at once"""
    size: int = 0


def _file_id(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _parse_line(line: bytes) -> dict[str, Any] | None:
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(row, dict) and is_number(row.get("step")):
        # only numbers are drawn: nested lists, objects and strings are dropped (they cost memory, not curves)
        return {k: v for k, v in row.items() if is_number(v)}
    return None


def read_metrics_since(run_dir: Path, offset: int = 0, file_id: str = "",
                       limit: int = METRICS_PAGE_BYTES) -> MetricsChunk:
    """Complete rows of ``metrics.jsonl`` from byte ``offset`` on, reading at most ``limit`` bytes.

    ``file_id`` is the value a previous chunk returned; if the file has since been replaced (another inode) or
    is shorter than ``offset``, the chunk says ``reset`` and holds the rows from the start.  A page that ends
    inside a line stops before it (``more`` says to read on); a page too small for its first line is widened to
    :data:`MAX_LINE_BYTES`; a line longer than :data:`MAX_LINE_BYTES` is skipped unparsed and counted as malformed.
    """
    limit = max(1, min(int(limit), METRICS_PAGE_BYTES))
    offset = max(0, int(offset))
    try:
        data, st = read_range(run_dir, "metrics.jsonl", offset, limit)
    except Unreadable:
        return MetricsChunk([], 0, 0, reset=bool(offset), file_id="")
    fid = _file_id(st)
    if offset and (st.st_size < offset or (file_id and file_id != fid)):
        offset = 0
        try:
            data, st = read_range(run_dir, "metrics.jsonl", 0, limit)
        except Unreadable:
            return MetricsChunk([], 0, 0, reset=True, file_id="")
        fid, reset = _file_id(st), True
    else:
        reset = False
    end = data.rfind(b"\n") + 1  # an unterminated last line is still being written: leave it for later
    malformed = 0
    if end == 0 and len(data) >= limit and limit <= MAX_LINE_BYTES:  # a small page inside one line: widen it
        limit = MAX_LINE_BYTES + 1
        try:
            data, st = read_range(run_dir, "metrics.jsonl", offset, limit)
        except Unreadable:
            return MetricsChunk([], 0, 0, reset=True, file_id="")
        end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= limit:  # a line longer than MAX_LINE_BYTES: skip to its end, count it once
        skip, page = offset + len(data), METRICS_PAGE_BYTES
        for _ in range(SKIP_PAGES):
            try:
                data, st = read_range(run_dir, "metrics.jsonl", skip, page)
            except Unreadable:
                break
            nl = data.find(b"\n")
            if nl >= 0:
                skip += nl + 1
                break
            skip += len(data)
            if len(data) < page:
                return MetricsChunk([], offset, 0, reset=reset, file_id=fid, size=st.st_size)  # still being written
        return MetricsChunk([], skip, 1, reset=reset, file_id=fid, more=st.st_size > skip, size=st.st_size)
    rows = []
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        row = _parse_line(line)
        if row is None:
            malformed += 1
        else:
            rows.append(row)
    new_offset = offset + end
    return MetricsChunk(rows, new_offset, malformed, reset=reset, file_id=fid,
                        more=st.st_size - new_offset > 0 and len(data) >= limit, size=st.st_size)


def iter_metrics(run_dir: Path, max_bytes: int = 256 * METRICS_PAGE_BYTES) -> Iterator[dict[str, Any]]:
    """Every row of ``metrics.jsonl``, page by page (at most ``max_bytes`` of the file), without holding the file."""
    offset, fid, read = 0, "", 0
    while read < max_bytes:
        chunk = read_metrics_since(run_dir, offset, fid)
        if chunk.reset and offset:
            return  # replaced while being read: the rows so far stand
        yield from chunk.rows
        read += chunk.offset - offset
        offset, fid = chunk.offset, chunk.file_id
        if not chunk.more:
            return


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
    env_steps: int | None = None
    """environment steps done, for a run whose ``total`` counts them (``total_steps`` of the RL kinds)"""

    @property
    def progress(self) -> float | None:
        if self.state == "finished":
            return 1.0
        done = self.env_steps if self.env_steps is not None else self.step
        if self.total and done is not None:
            return max(0.0, min(1.0, done / self.total))
        return None

    @property
    def progress_text(self) -> str:
        if self.env_steps is not None:
            return f"{self.env_steps} / {self.total} env steps" + (f" (step {self.step})" if self.step is not None else "")
        if self.step is None:
            return ""
        return f"step {self.step}" + (f" / {self.total}" if self.total else "")


def _last_row(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete row of metrics.jsonl, reading only the file's tail."""
    try:
        data = read_tail(run_dir, "metrics.jsonl", LAST_ROW_BYTES)
    except Unreadable:
        return None
    for line in reversed(data[: data.rfind(b"\n") + 1].split(b"\n")):
        row = _parse_line(line)
        if row is not None:
            return row
    return None


def _started(run_dir: Path) -> tuple[str, float]:
    m = _STAMP.search(run_dir.name)
    if m:
        t = datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    else:
        try:
            ts = min(st.st_mtime for _, st in list_dir(run_dir, limit=MAX_LISTED))
        except (OSError, ValueError):
            ts = 0.0
        t = datetime.fromtimestamp(max(0.0, ts), timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S"), t.timestamp()


def total_steps(config: dict[str, Any]) -> int | None:
    """How many steps the config asks for (the first of :data:`TOTAL_KEYS` that is a positive integer)."""
    for key in TOTAL_KEYS:
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def run_info(root: Path, run_dir: Path) -> RunInfo:
    status = read_json(run_dir, "status.json")
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
    group = rel.rsplit("/", 1)[0] if "/" in rel and has_entry(run_dir.parent, "group.json") else None
    total = total_steps(config)
    env_steps = last.get("env_steps") if last and "total_steps" in config and total == config.get("total_steps") \
        else None  # the RL kinds' budget counts environment steps, their rows count updates
    return RunInfo(id=rel, path=run_dir, kind=str(config.get("kind") or status.get("kind") or "?"),
                   name=str(config.get("name") or ""), state=state,
                   step=int(step) if is_number(step) and math.isfinite(step) else None, total=total,
                   started=started, started_ts=ts, metrics=metrics,
                   error=status.get("error") if isinstance(status.get("error"), str) else None, group=group,
                   env_steps=int(env_steps) if is_number(env_steps) and math.isfinite(env_steps) else None)


def broken_run(root: Path, run_dir: Path, exc: BaseException) -> RunInfo:
    """The row of a run folder that could not be read: its id and what went wrong, nothing else."""
    started, ts = _started(run_dir)
    return RunInfo(id=run_dir.relative_to(root).as_posix(), path=run_dir, kind="?", name="", state="error",
                   step=None, total=None, started=started, started_ts=ts,
                   error=f"the board could not read this folder: {type(exc).__name__}: {exc}"[:500])


def has_entry(folder: Path, name: str) -> bool:
    try:
        os.lstat(folder / name)
        return True
    except OSError:
        return False


def _is_run_folder(folder: Path) -> bool:
    return any(has_entry(folder, m) for m in RUN_MARKERS)


def _walk(directory: Path, depth: int) -> Iterator[tuple[Path, bool]]:
    """``(folder, is_group)`` of every run folder and group folder under ``directory`` (links not followed)."""
    try:
        children = [directory / n for n, st in list_dir(directory) if stat.S_ISDIR(st.st_mode)]
    except OSError:
        return
    for child in children:
        if has_entry(child, "group.json"):
            yield child, True
            if depth < MAX_DEPTH:
                yield from _walk(child, depth + 1)
        elif _is_run_folder(child):
            yield child, False
        elif depth < MAX_DEPTH:
            yield from _walk(child, depth + 1)


def run_folders(root: Path) -> list[Path]:
    return [p for p, is_group in _walk(Path(root), 1) if not is_group]


def group_folders(root: Path) -> list[Path]:
    return [p for p, is_group in _walk(Path(root), 1) if is_group]


def list_runs(root: Path) -> list[RunInfo]:
    """Every run folder under ``root`` (seed runs of a group included), newest first; a folder that cannot be
    read is listed with state ``error`` and the reason instead of failing the list."""
    root = Path(root)
    runs = []
    for d in run_folders(root):
        try:
            runs.append(run_info(root, d))
        except Exception as exc:  # noqa: BLE001 - one broken folder must not hide the others
            runs.append(broken_run(root, d, exc))
    return sorted(runs, key=lambda r: (-r.started_ts, r.id))


def resolve_folder(root: Path, folder_id: str) -> Path:
    """The real path of ``folder_id`` under ``root``, a folder reached without links; :class:`RunNotFound` else."""
    root = Path(os.path.realpath(root))
    if not folder_id or "\x00" in folder_id or folder_id.startswith("/") or "\\" in folder_id:
        raise RunNotFound(f"run {folder_id!r}: not a run under {root}")
    parts = folder_id.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise RunNotFound(f"run {folder_id!r}: not a run under {root}")
    path = root.joinpath(*parts)
    if os.path.realpath(path) != str(path):  # a link on the way, or a name the file system normalises
        raise RunNotFound(f"run {folder_id!r}: not a run under {root}")
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise RunNotFound(f"run {folder_id!r}: no run folder there")
    except OSError:
        raise RunNotFound(f"run {folder_id!r}: no run folder there") from None
    return path


def resolve_run(root: Path, run_id: str) -> Path:
    """The folder of ``run_id`` under ``root``; raises :class:`RunNotFound` for anything else (``..``, links)."""
    path = resolve_folder(root, run_id)
    if not _is_run_folder(path) or has_entry(path, "group.json"):
        raise RunNotFound(f"run {run_id!r}: no run folder there")
    return path


def resolve_group(root: Path, group_id: str) -> Path:
    """The folder of the multi-seed group ``group_id`` under ``root`` (it holds ``group.json``)."""
    path = resolve_folder(root, group_id)
    if not has_entry(path, "group.json"):
        raise RunNotFound(f"group {group_id!r}: no group folder there")
    return path


def report_file(folder: Path, name: str) -> str:
    """``report/<name>`` of a run or group folder, as a relative name the confined readers take."""
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise RunNotFound(f"report/{name!r}: no such file")
    return f"report/{name}"


def log_tail(run_dir: Path, lines: int = 200) -> str:
    """The last ``lines`` lines of ``run.log`` (decoding errors replaced); empty when it cannot be read."""
    try:
        data = read_tail(run_dir, "run.log", LOG_TAIL_BYTES)
    except Unreadable:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def figures(run_dir: Path) -> list[str]:
    """Report figures (``report/*.png`` and other images), as paths relative to the run folder."""
    return [f"report/{n}" for n, _ in regular_files(run_dir, "report")[:MAX_LISTED]
            if Path(n).suffix.lower() in IMAGE_TYPES]


def has_report(folder: Path) -> bool:
    return is_regular(folder, "report/index.html")


def checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """Checkpoint files of the run, oldest first: step, file name, size, UTC modification time."""
    out = []
    for name, st in regular_files(run_dir, "checkpoints"):
        m = _CHECKPOINT.match(name)
        if m:
            out.append({"step": int(m.group(1)), "file": name, "bytes": st.st_size,
                        "modified": datetime.fromtimestamp(st.st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")})
    return sorted(out, key=lambda c: c["step"])[-MAX_LISTED:]


def status(run_dir: Path) -> dict[str, Any]:
    s = read_json(run_dir, "status.json")
    return s if isinstance(s, dict) else {}


@dataclass
class GroupInfo:
    """One multi-seed group folder (``group.json``, ``seed-<s>/`` run folders, ``report/``) as the list shows it."""

    id: str
    path: Path
    kind: str
    name: str
    state: str
    seeds: list[tuple[str, Path]]
    """``(seed, run folder)`` of the seeds whose folders exist"""
    started: str
    started_ts: float
    report: bool
    """whether ``report/index.html`` is there"""
    error: str | None = None


def group_info(root: Path, group_dir: Path) -> GroupInfo:
    doc = read_json(group_dir, "group.json")
    doc = doc if isinstance(doc, dict) else {}
    config, _, _ = read_config(group_dir)
    rel = group_dir.relative_to(root).as_posix()
    runs = doc.get("runs") if isinstance(doc.get("runs"), dict) else {}
    seeds = []
    for seed, folder in list(runs.items())[:MAX_LISTED]:
        try:
            seeds.append((str(seed), resolve_run(root, f"{rel}/{folder}")))
        except (RunNotFound, TypeError):
            continue
    started, ts = _started(group_dir)
    state = STATES.get(str(doc.get("state", "")), str(doc.get("state") or "unknown"))
    return GroupInfo(id=rel, path=group_dir, kind=str(doc.get("kind") or config.get("kind") or "?"),
                     name=str(config.get("name") or ""), state=state, seeds=seeds, started=started, started_ts=ts,
                     report=has_report(group_dir), error=None if doc else "group.json unavailable or malformed")


def list_groups(root: Path) -> list[GroupInfo]:
    """Every multi-seed group folder under ``root``, newest first (an unreadable one listed with its error)."""
    root = Path(root)
    out = []
    for d in group_folders(root):
        try:
            out.append(group_info(root, d))
        except Exception as exc:  # noqa: BLE001 - one broken folder must not hide the others
            started, ts = _started(d)
            out.append(GroupInfo(id=d.relative_to(root).as_posix(), path=d, kind="?", name="", state="error",
                                 seeds=[], started=started, started_ts=ts, report=False,
                                 error=f"the board could not read this folder: {type(exc).__name__}: {exc}"[:500]))
    return sorted(out, key=lambda g: (-g.started_ts, g.id))
