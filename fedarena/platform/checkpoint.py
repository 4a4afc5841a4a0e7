"""Atomic, checksummed checkpoint files holding a nested state of numpy arrays and JSON scalars (no pickle).

File layout: the magic line ``FDCK1``, the SHA-256 hex digest of the payload, a newline, then the payload:
an ``.npz`` archive whose entry ``__meta__`` is a JSON document describing the state tree and whose other
entries are the arrays. A file is written to a temporary name, fsynced and renamed, so a crash leaves
either the old file or the new one, never half of one; truncation or corruption fails the checksum.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.platform.errors import UserError

MAGIC = b"FDCK1\n"
_NAME = re.compile(r"^ckpt-(\d{9})\.fdck$")


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read: missing, truncated, corrupt, or of an unknown format."""


def _flatten(tree: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """Replace arrays in ``tree`` by references into ``arrays``; return a JSON-able description."""
    if isinstance(tree, dict):
        for k in tree:
            if not isinstance(k, str):
                raise TypeError(f"checkpoint state: key {k!r} at '{path or '/'}' is not a string")
        return {"dict": {k: _flatten(v, arrays, f"{path}/{k}") for k, v in tree.items()}}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_flatten(v, arrays, f"{path}/{i}") for i, v in enumerate(tree)]}
    if isinstance(tree, np.ndarray):
        if tree.dtype == object:
            raise TypeError(f"checkpoint state: object array at '{path}' cannot be stored without pickle")
        key = f"a{len(arrays)}"
        arrays[key] = tree
        return {"array": key}
    if isinstance(tree, np.generic):
        return {"value": tree.item()}
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return {"value": tree}
    raise TypeError(f"checkpoint state: unsupported value of type {type(tree).__name__} at '{path}'")


def _unflatten(desc: Any, arrays: Any) -> Any:
    if "dict" in desc:
        return {k: _unflatten(v, arrays) for k, v in desc["dict"].items()}
    if "list" in desc:
        return [_unflatten(v, arrays) for v in desc["list"]]
    if "tuple" in desc:
        return tuple(_unflatten(v, arrays) for v in desc["tuple"])
    if "array" in desc:
        return arrays[desc["array"]]
    return desc["value"]


def encode_state(state: Any) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    meta = _flatten(state, arrays, "")
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def decode_state(blob: bytes, where: str = "checkpoint") -> Any:
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"{where}: not a fedarena checkpoint (bad magic)")
    header_end = len(MAGIC) + 65
    if len(blob) < header_end:
        raise CheckpointError(f"{where}: truncated (no checksum)")
    digest = blob[len(MAGIC): header_end - 1].decode("ascii", "replace")
    payload = blob[header_end:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{where}: checksum mismatch (file truncated or corrupt)")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            meta = json.loads(bytes(npz["__meta__"]).decode())
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
    except Exception as e:  # a valid checksum over an unreadable archive: written by something else
        raise CheckpointError(f"{where}: unreadable payload: {e}") from None
    return _unflatten(meta, arrays)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, rename, fsync folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:09d}.fdck"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Checkpoints in ``directory`` as (step, path), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def save(directory: Path, step: int, state: Any, keep: int) -> Path:
    """Write the checkpoint for ``step`` and delete all but the newest ``keep``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, step)
    write_atomic(path, encode_state({"step": step, "state": state}))
    for _, old in list_checkpoints(directory)[: -max(keep, 1)]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> tuple[int, Any]:
    try:
        blob = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None
    tree = decode_state(blob, str(path))
    if not isinstance(tree, dict) or "step" not in tree or "state" not in tree:
        raise CheckpointError(f"{path}: missing step or state")
    return int(tree["step"]), tree["state"]


def load_newest_valid(directory: Path, warn=None) -> tuple[int, Any] | None:
    """The newest checkpoint that passes its checksum; each bad newer one is reported through ``warn``."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            return load(path)
        except CheckpointError as e:
            if warn is not None:
                warn(f"skipping bad checkpoint: {e}")
    return None
