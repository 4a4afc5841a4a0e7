"""The data manifest of a run: every input file's name, size and SHA-256, written into the run folder, so that a
result names exactly the bytes it was computed from."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def data_files(path: str | Path) -> list[Path]:
    """``path`` itself, or every file under the folder ``path`` (the readers' index caches left out)."""
    p = Path(path)
    if p.is_file():
        return [p]
    return sorted(f for f in p.rglob("*") if f.is_file() and ".fedarena_index" not in f.parts)


def write_manifest(files: list[Path], run_dir: str | Path, dataset: str) -> Path:
    """``run_dir/data_manifest.json``: ``{"dataset", "files": [{"name", "size", "sha256"}]}``."""
    out = Path(run_dir) / "data_manifest.json"
    rows = [{"name": str(Path(f).resolve()), "size": Path(f).stat().st_size, "sha256": sha256(Path(f))} for f in files]
    out.write_text(json.dumps({"dataset": dataset, "files": rows}, indent=1) + "\n")
    return out
