"""The league's model store: versioned, checksummed, immutable parameter snapshots on disk (the run folder,
or a path every node of a cluster mounts).

Layout: ``ROOT/<player>-v<version>/params.npz`` (:func:`fedarena.engine.save_params`, loaded with
``allow_pickle=False``) and ``manifest.json`` (format, name, player, role, parent, version, env step, the
file's byte size and SHA-256, UTC time). A snapshot is written into a temporary folder, fsynced and renamed
into place, so a reader sees it whole or not at all; an existing name is never overwritten, and the files
are made read-only. Loading recomputes the SHA-256 and refuses a mismatch (or any unreadable file) with one
:class:`SnapshotError` line naming the snapshot and the reason; ``params.npz`` is read with the engine's
bounded loader (no zip bomb inflates past its limit). When ``FEDARENA_CHECKPOINT_KEY`` holds a key
(:func:`fedarena.platform.checkpoint.checkpoint_key`), the manifest carries ``mac``, the HMAC-SHA256 of the
rest of the manifest (which includes the parameters' SHA-256), and a snapshot without a valid one is refused.

Resuming a league from a checkpoint rolls the store back to that checkpoint's view
(:meth:`SnapshotStore.set_aside`): snapshots the checkpoint does not record were written after it, and are
moved into ``set-aside-<UTC time>-<id>/`` (kept, never reused), so the resumed league numbers and plays its
snapshots exactly as the run that was not interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedarena import engine
from fedarena.platform.checkpoint import checkpoint_key, mac, mac_matches
from fedarena.platform.errors import UserError

FORMAT = "fedarena.league.snapshot/1"
PARAMS_FILE, MANIFEST_FILE = "params.npz", "manifest.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+-v\d{4,}$")
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class SnapshotError(UserError, ValueError):
    """A snapshot that is missing, corrupt or already exists."""


@dataclass(frozen=True)
class SnapshotRef:
    name: str
    sha256: str
    manifest: dict


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest_body(manifest: dict) -> bytes:
    """What a manifest's ``mac`` authenticates: the manifest without ``mac``, as canonical JSON."""
    return json.dumps({k: v for k, v in manifest.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":")).encode()


def snapshot_name(player: str, version: int) -> str:
    return f"{player}-v{int(version):04d}"


class SnapshotStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, player: str, version: int, params: dict[str, np.ndarray], **info: Any) -> SnapshotRef:
        """Write a new immutable snapshot ``<player>-v<version>``; ``info`` (JSON values) goes into the manifest."""
        name = snapshot_name(player, version)
        if not _NAME.match(name):
            raise SnapshotError(f"snapshot {name}: player names may use letters, digits, '_', '.' and '-' only")
        final = self.root / name
        if final.exists():
            raise SnapshotError(f"snapshot {name}: already exists in {self.root} (snapshots are immutable)")
        tmp = self.root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            engine.save_params(tmp / PARAMS_FILE, {k: np.asarray(v) for k, v in params.items()})
            _fsync(tmp / PARAMS_FILE)
            manifest = {"format": FORMAT, "name": name, "player": player, "version": int(version),
                        "bytes": (tmp / PARAMS_FILE).stat().st_size, "sha256": _sha256(tmp / PARAMS_FILE),
                        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info}
            key = checkpoint_key()
            if key is not None:
                manifest["mac"] = mac(key, _manifest_body(manifest))
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            _fsync(tmp / MANIFEST_FILE)
            for f in (PARAMS_FILE, MANIFEST_FILE):
                os.chmod(tmp / f, _READ_ONLY)
            try:
                os.rename(tmp, final)   # fails if another writer created the name meanwhile
            except OSError as exc:
                raise SnapshotError(f"snapshot {name}: already exists in {self.root} (snapshots are immutable)") from exc
            _fsync(self.root)
        finally:
            if tmp.exists():
                for f in tmp.iterdir():
                    os.chmod(f, stat.S_IWUSR | stat.S_IRUSR)
                shutil.rmtree(tmp, ignore_errors=True)
        return SnapshotRef(name, manifest["sha256"], manifest)

    def manifest(self, name: str) -> dict:
        path = self.root / name / MANIFEST_FILE
        try:
            m = json.loads(path.read_text())
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {name}: not in the store {self.root}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SnapshotError(f"snapshot {name}: manifest.json is unreadable ({type(exc).__name__})") from None
        if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("name") != name:
            raise SnapshotError(f"snapshot {name}: manifest.json is not a {FORMAT} manifest of this snapshot")
        key = checkpoint_key()
        if key is not None and not mac_matches(key, _manifest_body(m), m.get("mac", "")):
            raise SnapshotError(f"snapshot {name}: manifest.json has no valid HMAC under FEDARENA_CHECKPOINT_KEY "
                                "(written without the key or with another one, or altered)")
        return m

    def load(self, name: str, expected_sha256: str | None = None) -> dict[str, np.ndarray]:
        """The snapshot's parameters, after checking the file's SHA-256 against its manifest (and against
        ``expected_sha256``, the checksum the league recorded when the snapshot was made)."""
        m = self.manifest(name)
        path = self.root / name / PARAMS_FILE
        try:
            digest = _sha256(path)
        except OSError as exc:
            raise SnapshotError(f"snapshot {name}: params.npz is unreadable ({type(exc).__name__})") from None
        if digest != m.get("sha256") or (expected_sha256 is not None and digest != expected_sha256):
            raise SnapshotError(f"snapshot {name}: params.npz checksum mismatch (sha256 {digest[:12]}..., "
                                f"recorded {str(expected_sha256 or m.get('sha256'))[:12]}...): the file is corrupt")
        try:
            params = engine.load_params(path)
        except ValueError as exc:
            raise SnapshotError(f"snapshot {name}: {exc}") from None
        if not isinstance(params, dict) or not all(isinstance(v, np.ndarray) for v in params.values()):
            raise SnapshotError(f"snapshot {name}: params.npz does not hold a flat dict of arrays")
        for v in params.values():
            v.setflags(write=False)
        return params

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name))

    def set_aside(self, keep) -> Path | None:
        """Move every snapshot not named in ``keep`` into a new folder ``set-aside-<UTC time>-<id>/`` of the
        store (kept for inspection, never loaded or reused); returns that folder, or None if nothing moved.

        Resume calls it with the snapshots its checkpoint records: the others were written after that
        checkpoint by the run that was interrupted, and a league that found them would number its next
        snapshots past them and diverge from the run it replays.
        """
        keep = set(keep)
        extra = [n for n in self.names() if n not in keep]
        if not extra:
            return None
        folder = self.root / f"set-aside-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        for name in extra:
            os.rename(self.root / name, folder / name)
        _fsync(folder)
        _fsync(self.root)
        return folder

    def verify(self) -> dict[str, str]:
        """Every snapshot's checksum; raises :class:`SnapshotError` at the first corrupt one."""
        out = {}
        for name in self.names():
            self.load(name)
            out[name] = self.manifest(name)["sha256"]
        return out
