"""The engine profiles recorded in a run folder (by :func:`fedarena.board.record.record_profile`), read for
the profile page: ``profile/<name>.json`` (per-equation times, per-primitive totals, the compiled schedule's
line times, the memory plan) beside ``profile/<name>.trace.json`` (the Chrome trace).  Read-only.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fedarena.board.folders import read_json

FORMAT = 1
PROFILE_DIR = "profile"
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")


def check_name(name: str) -> str:
    """``name`` if it is a plain profile name (letters, digits, ``_ - .``; not starting with a dot)."""
    if not _NAME.match(name):
        raise ValueError(f"name: expected 1-64 letters, digits, '_', '-', '.' (not starting with '.'), got {name!r}")
    return name


def has_profiles(run_dir: Path) -> bool:
    """Whether the run folder holds a ``profile/`` folder with a profile document."""
    try:
        return any(not p.name.endswith(".trace.json") for p in (Path(run_dir) / PROFILE_DIR).glob("*.json"))
    except OSError:
        return False


def read_profiles(run_dir: Path) -> list[dict[str, Any]]:
    """The profiles recorded in a run folder (well-formed ones only), by name."""
    out = []
    try:
        paths = sorted((Path(run_dir) / PROFILE_DIR).glob("*.json"))
    except OSError:
        return []
    for path in paths:
        if path.name.endswith(".trace.json"):
            continue
        doc = read_json(path)
        try:
            name = check_name(path.stem)
        except ValueError:
            continue
        if _well_formed(doc):
            memory = doc.get("memory") if isinstance(doc.get("memory"), dict) else {}
            blocks = memory.get("blocks") if isinstance(memory.get("blocks"), list) else []
            memory["blocks"] = [b for b in blocks if isinstance(b, dict)
                                and all(isinstance(b.get(k), int) for k in ("first", "last", "bytes"))]
            doc["memory"] = memory
            doc["lines"] = [list(x) for x in doc.get("lines") or [] if isinstance(x, list) and len(x) == 2
                            and isinstance(x[0], str) and isinstance(x[1], (int, float)) and math.isfinite(x[1])]
            doc["by_primitive"] = {str(k): v for k, v in (doc.get("by_primitive") or {}).items()
                                   if isinstance(v, (int, float)) and math.isfinite(v)} \
                if isinstance(doc.get("by_primitive"), dict) else {}
            doc["trace_available"] = (path.parent / f"{name}.trace.json").is_file()
            doc["name"] = name
            out.append(doc)
    return out


def _well_formed(doc: Any) -> bool:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return False
    eqs = doc.get("equations")
    return isinstance(eqs, list) and all(isinstance(e, dict) and isinstance(e.get("primitive"), str)
                                         and isinstance(e.get("seconds"), (int, float))
                                         and math.isfinite(e["seconds"]) for e in eqs)


def trace_path(run_dir: Path, name: str) -> Path | None:
    """``profile/<name>.trace.json`` of the run, if it exists and ``name`` is a plain profile name."""
    try:
        check_name(name)
    except ValueError:
        return None
    path = Path(run_dir) / PROFILE_DIR / f"{name}.trace.json"
    return path if path.is_file() else None
