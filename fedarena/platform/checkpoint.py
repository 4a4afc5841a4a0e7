"""Atomic, checksummed checkpoint files holding a nested state of numpy arrays and JSON scalars (no pickle).

File layout: the magic line ``FDCK1``, a line with the payload's digest, then the payload: an ``.npz``
archive whose entry ``__meta__`` is a JSON document describing the state tree and whose other entries are
the arrays. The digest line is the SHA-256 hex digest, or, when the environment variable
``FEDARENA_CHECKPOINT_KEY`` holds a key, ``hmac-sha256:`` and the HMAC-SHA256 (RFC 2104) of the payload
under that key; with a key set, a file without a valid MAC is refused. A file is written to a temporary
name, fsynced and renamed, so a crash leaves either the old file or the new one, never half of one;
truncation or corruption fails the checksum.

A checkpoint is read as untrusted input (docs/security.md, "Checkpoints and configs"): the archive through
:func:`fedarena.npz.read_npz` (bounded decompressed size, plain dtypes only), the state tree checked node by
node (at most ``MAX_DEPTH`` levels and ``MAX_NODES`` nodes, every leaf an array of the archive or a JSON
scalar). Anything malformed is one :class:`CheckpointError`, which :func:`load_newest_valid` reports and
answers by trying the next older checkpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from fedarena.npz import ArchiveError, read_npz
from fedarena.platform.errors import UserError

MAGIC = b"FDCK1\n"
KEY_ENV = "FEDARENA_CHECKPOINT_KEY"
MIN_KEY_LENGTH = 32
MAC_PREFIX = "hmac-sha256:"
MAX_DEPTH = 64
MAX_NODES = 1_000_000
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


def checkpoint_key() -> bytes | None:
    """The key in ``FEDARENA_CHECKPOINT_KEY`` (UTF-8 bytes of the value), or None when it is unset or empty."""
    raw = os.environ.get(KEY_ENV, "")
    if not raw:
        return None
    if len(raw) < MIN_KEY_LENGTH:
        raise CheckpointError(f"{KEY_ENV}: the key has {len(raw)} characters; use at least {MIN_KEY_LENGTH} "
                              "(e.g. the output of `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return raw.encode("utf-8")


def mac(key: bytes, data: bytes) -> str:
    """``hmac-sha256:<hex>`` of ``data`` under ``key``."""
    return MAC_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()


def mac_matches(key: bytes, data: bytes, tag: str) -> bool:
    """Whether ``tag`` is the MAC of ``data`` under ``key`` (compared in constant time)."""
    return hmac.compare_digest(mac(key, data).encode(), str(tag).encode("utf-8", "replace"))


def _unflatten(desc: Any, arrays: dict[str, np.ndarray], path: str, depth: int, count: list[int]) -> Any:
    """Rebuild the state from its description, refusing anything :func:`_flatten` does not write."""
    count[0] += 1
    if count[0] > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes")
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep at '{path}'")
    if not isinstance(desc, dict) or len(desc) != 1:
        raise ValueError(f"malformed node at '{path or '/'}'")
    (kind, val), = desc.items()
    if kind == "dict" and isinstance(val, dict):
        return {k: _unflatten(v, arrays, f"{path}/{k}", depth + 1, count) for k, v in val.items()}
    if kind in ("list", "tuple") and isinstance(val, list):
        items = [_unflatten(v, arrays, f"{path}/{i}", depth + 1, count) for i, v in enumerate(val)]
        return items if kind == "list" else tuple(items)
    if kind == "array" and isinstance(val, str):
        if val not in arrays:
            raise ValueError(f"array {val!r} at '{path}' is not in the archive")
        return arrays[val]
    if kind == "value" and (val is None or isinstance(val, (bool, int, float, str))):
        return val
    raise ValueError(f"malformed node {kind!r} at '{path or '/'}'")


def encode_state(state: Any, key: bytes | None = None) -> bytes:
    """The file's bytes for ``state``; with ``key``, authenticated by HMAC-SHA256 instead of a bare SHA-256."""
    arrays: dict[str, np.ndarray] = {}
    meta = _flatten(state, arrays, "")
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    payload = buf.getvalue()
    digest = mac(key, payload) if key is not None else hashlib.sha256(payload).hexdigest()
    return MAGIC + digest.encode() + b"\n" + payload


def decode_state(blob: bytes, where: str = "checkpoint", key: bytes | None = None,
                 max_bytes: int | None = None) -> Any:
    """The state in ``blob``; with ``key``, only if its HMAC-SHA256 is valid. ``max_bytes`` caps the archive's
    decompressed size (default :func:`fedarena.npz.inflate_limit` of the blob's size)."""
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"{where}: not a fedarena checkpoint (bad magic)")
    header_end = blob.find(b"\n", len(MAGIC), len(MAGIC) + len(MAC_PREFIX) + 66)
    if header_end < 0:
        raise CheckpointError(f"{where}: truncated (no checksum)")
    digest = blob[len(MAGIC): header_end].decode("ascii", "replace")
    payload = blob[header_end + 1:]
    keyed = digest.startswith(MAC_PREFIX)
    if key is not None:
        if not keyed:
            raise CheckpointError(f"{where}: has no HMAC, and {KEY_ENV} is set (only files written with the key are read)")
        if not mac_matches(key, payload, digest):
            raise CheckpointError(f"{where}: HMAC mismatch (written with another key, or the file was altered)")
    elif keyed:
        raise CheckpointError(f"{where}: written with a key ({KEY_ENV}); set the same key to read it")
    elif not hmac.compare_digest(hashlib.sha256(payload).hexdigest().encode(), digest.encode()):
        raise CheckpointError(f"{where}: checksum mismatch (file truncated or corrupt)")
    # a valid checksum over malformed content: written by something else, read as hostile
    try:
        arrays = read_npz(payload, max_bytes=max_bytes)
        meta_bytes = arrays.pop("__meta__", None)
        if meta_bytes is None or meta_bytes.dtype != np.uint8 or meta_bytes.ndim != 1:
            raise ValueError("no __meta__ entry of bytes")
        meta = json.loads(meta_bytes.tobytes().decode("utf-8"))
        return _unflatten(meta, arrays, "", 0, [0])
    except (ArchiveError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: unreadable payload: {e}") from None


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
    write_atomic(path, encode_state({"step": step, "state": state}, checkpoint_key()))
    for _, old in list_checkpoints(directory)[: -max(keep, 1)]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> tuple[int, Any]:
    """The (step, state) in ``path``; raises :class:`CheckpointError` for any unreadable or malformed file."""
    try:
        blob = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None
    tree = decode_state(blob, str(path), checkpoint_key())
    if not isinstance(tree, dict) or "step" not in tree or "state" not in tree:
        raise CheckpointError(f"{path}: missing step or state")
    step = tree["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: step {step!r} is not a non-negative integer")
    return step, tree["state"]


MALFORMED_CONTENT = (KeyError, IndexError, TypeError, ValueError, AttributeError)
"""What ``accept`` may raise for a checkpoint that reads cleanly but does not hold what the run expects."""


def load_newest_valid(directory: Path, warn=None, accept=None) -> tuple[int, Any] | None:
    """The newest checkpoint that reads cleanly (checksum or HMAC, archive, tree) and, when ``accept`` is given,
    that ``accept(step, state)`` takes without raising one of :data:`MALFORMED_CONTENT` (a well-formed tree that
    lacks what the experiment needs); each bad newer one is reported through ``warn`` with its file name and
    the reason. A user error raised by ``accept`` (e.g. a config that cannot continue this run) propagates."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            found = load(path)
        except CheckpointError as e:
            if warn is not None:
                warn(f"skipping bad checkpoint: {e}")
            continue
        if accept is None:
            return found
        try:
            accept(*found)
        except MALFORMED_CONTENT as e:
            if isinstance(e, UserError) or getattr(type(e), "user_error", False):
                raise
            if warn is not None:
                warn(f"skipping bad checkpoint: {path}: its content does not fit this run "
                     f"({type(e).__name__}: {e})")
            continue
        return found
    return None
