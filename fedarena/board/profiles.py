"""The engine profiles recorded in a run folder (by :func:`fedarena.board.record.record_profile`), read for
the profile page: ``profile/<name>.json`` (per-equation times, per-primitive totals, the compiled schedule's
line times, the memory plan) beside ``profile/<name>.trace.json`` (the Chrome trace).  Read-only, through
:mod:`fedarena.board.confined` (no links, regular files only, size caps).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fedarena.board.confined import is_regular, regular_files
from fedarena.board.folders import read_json

FORMAT = 1
PROFILE_DIR = "profile"
MAX_PROFILES = 50
MAX_TRACE_BYTES = 64 * 1024 * 1024
"""A Chrome trace larger than this is not served."""
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")


def check_name(name: str) -> str:
    """``name`` if it is a plain profile name (letters, digits, ``_ - .``; not starting with a dot)."""
    if not _NAME.match(name):
        raise ValueError(f"name: expected 1-64 letters, digits, '_', '-', '.' (not starting with '.'), got {name!r}")
    return name


def _documents(run_dir: Path) -> list[str]:
    return [n for n, _ in regular_files(run_dir, PROFILE_DIR)
            if n.endswith(".json") and not n.endswith(".trace.json")][:MAX_PROFILES]


def has_profiles(run_dir: Path) -> bool:
    """Whether the run folder holds a ``profile/`` folder with a profile document."""
    return bool(_documents(run_dir))


def read_profiles(run_dir: Path) -> list[dict[str, Any]]:
    """The profiles recorded in a run folder (well-formed ones only), by name."""
    out = []
    for file_name in _documents(run_dir):
        try:
            name = check_name(file_name[: -len(".json")])
        except ValueError:
            continue
        doc = read_json(run_dir, f"{PROFILE_DIR}/{file_name}")
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
            doc["trace_available"] = is_regular(run_dir, f"{PROFILE_DIR}/{name}.trace.json")
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


def trace_path(run_dir: Path, name: str) -> str | None:
    """``profile/<name>.trace.json`` (relative to the run folder) if it is a regular file and ``name`` a plain
    profile name; read it with :func:`fedarena.board.confined.read_bytes`."""
    try:
        check_name(name)
    except ValueError:
        return None
    rel = f"{PROFILE_DIR}/{name}.trace.json"
    return rel if is_regular(run_dir, rel) else None
