"""LEAF JSON files read per user (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018).

A LEAF file is one JSON object ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
"y": [...]}}}``; a LEAF folder holds ``train/*.json`` and ``test/*.json`` with the same users (or just
``*.json``). The files are scanned once, one at a time: the byte range of every user's record inside
``user_data`` is found with the standard library's incremental JSON decoder and stored in the index
(:mod:`fedarena.federated.datasets.index`), with its labels; a round then reads only its clients' records
(one ``os.pread`` and one ``json.loads`` each), so no file is ever held whole after the scan.

Tasks: FEMNIST (``x`` rows of 784 floats, a 28x28 image, 62 classes) and Shakespeare next-character
prediction (``x`` strings of 80 characters, ``y`` the next character, both over LEAF's 80-character
vocabulary ``LEAF_LETTERS``). A Shakespeare example becomes the ``T + 1 = 81`` ids of ``x`` followed by
``y`` -- character ``LEAF_LETTERS[i]`` is id ``i + 1``, id 0 is the pad (81 classes) -- the layout the
language models of :mod:`fedarena.federated.models` read (the model reads the first 80 ids and predicts each
next one; TFF's Shakespeare reader emits the same layout); its label is the id of ``y``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np

from fedarena.federated.data import LEAF_LETTERS, DataError, leaf_files
from fedarena.federated.datasets.index import ClientIndex, IndexBuilder

SEQ_LEN = 80
"""LEAF Shakespeare's context length"""
FEMNIST_PIXELS = 28 * 28
_LUT = {c: i + 1 for i, c in enumerate(LEAF_LETTERS)}  # id 0 is the pad


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _expect(s: str, i: int, ch: str, f: Path) -> int:
    i = _skip_ws(s, i)
    if i >= len(s):
        raise DataError("data.path", f"{f}: truncated JSON (ends at byte {len(s)} inside the top-level object)")
    if s[i] != ch:
        raise DataError("data.path", f"{f}: corrupt JSON: expected {ch!r} at byte {i}, found {s[i]!r}")
    return i + 1


def _char_ids(strings, f: Path, user: str) -> np.ndarray:
    try:
        return np.array([[_LUT[c] for c in s] for s in strings], np.int64)
    except KeyError as e:
        raise DataError("data.path", f"{f}: user {user!r}: character {e} outside LEAF's 80-character vocabulary") \
            from None
    except TypeError:
        raise DataError("data.path", f"{f}: user {user!r}: Shakespeare x and y must be strings") from None


def _labels(rec, f: Path, user: str, kind: str) -> np.ndarray:
    if not isinstance(rec, dict) or not isinstance(rec.get("x"), list) or not isinstance(rec.get("y"), list) \
            or len(rec["x"]) != len(rec["y"]):
        raise DataError("data.path", f"{f}: user {user!r} has no equal-length 'x' and 'y' lists")
    if kind == "shakespeare":
        if any(not isinstance(y, str) or len(y) != 1 for y in rec["y"]):
            raise DataError("data.path", f"{f}: user {user!r}: Shakespeare labels must be single characters")
        return _char_ids(rec["y"], f, user)[:, 0] if rec["y"] else np.zeros(0, np.int64)
    y = rec["y"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in y):
        raise DataError("data.path", f"{f}: user {user!r}: labels must be integers >= 0")
    return np.array(y, np.int64)


def _check_x(rec: dict, f: Path, user: str, kind: str) -> None:
    """The shape of a record's examples, checked when it is indexed (a bad record is found before any round)."""
    if kind == "shakespeare":
        if any(not isinstance(s, str) or len(s) != SEQ_LEN for s in rec["x"]):
            raise DataError("data.path", f"{f}: user {user!r}: Shakespeare x must be {SEQ_LEN}-character strings")
        _char_ids(rec["x"], f, user)
    elif any(not isinstance(r, list) or len(r) != FEMNIST_PIXELS for r in rec["x"]):
        raise DataError("data.path", f"{f}: user {user!r}: FEMNIST x must be rows of {FEMNIST_PIXELS} numbers (28x28)")


def _scan_file(f: Path, fid: int, part: int, kind: str, b: IndexBuilder) -> None:
    """Record the byte range and labels of every user of ``f`` (the file read as latin-1: one character per byte,
    so string positions are byte offsets; records are decoded as UTF-8 when read)."""
    try:
        s = f.read_bytes().decode("latin-1")
    except OSError as e:
        raise DataError("data.path", f"{f}: cannot read ({e.strerror})") from None
    dec = json.JSONDecoder()
    i = _expect(s, 0, "{", f)
    users, num_samples, seen = None, None, []
    while True:
        i = _skip_ws(s, i)
        if i < len(s) and s[i] == "}":
            break
        try:
            key, i = dec.raw_decode(s, i)
        except json.JSONDecodeError as e:
            raise DataError("data.path", f"{f}: corrupt or truncated JSON at byte {e.pos} ({e.msg})") from None
        i = _expect(s, i, ":", f)
        i = _skip_ws(s, i)
        if key == "user_data":
            i = _expect(s, i, "{", f)
            while True:
                i = _skip_ws(s, i)
                if i < len(s) and s[i] == "}":
                    i += 1
                    break
                try:
                    user, i = dec.raw_decode(s, i)
                    i = _expect(s, i, ":", f)
                    i = _skip_ws(s, i)
                    rec, end = dec.raw_decode(s, i)
                except json.JSONDecodeError as e:
                    raise DataError("data.path", f"{f}: corrupt or truncated JSON at byte {e.pos} ({e.msg})") from None
                user = user.encode("latin-1").decode("utf-8", "replace")
                labels = _labels(rec, f, user, kind)
                _check_x(rec, f, user, kind)
                b.add(str(user), part, fid, i, end - i, labels)
                seen.append(str(user))
                i = _skip_ws(s, end)
                if i < len(s) and s[i] == ",":
                    i += 1
        else:
            try:
                val, i = dec.raw_decode(s, i)
            except json.JSONDecodeError as e:
                raise DataError("data.path", f"{f}: corrupt or truncated JSON at byte {e.pos} ({e.msg})") from None
            if key == "users":
                users = val
            elif key == "num_samples":
                num_samples = val
        i = _skip_ws(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
        elif i >= len(s):
            raise DataError("data.path", f"{f}: truncated JSON (ends at byte {len(s)} inside the top-level object)")
    if not isinstance(users, list) or not seen and not users:
        raise DataError("data.path", f"{f}: not a LEAF file (needs a 'users' list and a 'user_data' map)")
    if sorted(map(str, users)) != sorted(seen):
        raise DataError("data.path", f"{f}: 'users' ({len(users)}) and the users of 'user_data' ({len(seen)}) differ")
    if num_samples is not None:
        if not isinstance(num_samples, list) or len(num_samples) != len(users):
            raise DataError("data.path", f"{f}: 'num_samples' must list one count per user")
        for u, n in zip(users, num_samples):
            got = b.rows[b.pos[str(u)]][part][3]
            if n != got:
                raise DataError("data.path", f"{f}: user {u!r}: num_samples says {n}, user_data has {got} examples")


def _kind_of(f: Path) -> str:
    """femnist or shakespeare, from the first ``x`` value of the file (read up to its first example)."""
    with open(f, "rb") as fh:
        head = fh.read(1 << 16).decode("latin-1")
    j = head.find('"x"')
    if j < 0:
        return "femnist"
    k = _skip_ws(head, head.find(":", j) + 1)
    k = _skip_ws(head, k + 1) if k < len(head) and head[k] == "[" else k
    return "shakespeare" if k < len(head) and head[k] == '"' else "femnist"


class LeafReader:
    """The users of a LEAF file or folder; :meth:`read` returns one user's examples (train, then test split)."""

    def __init__(self, path: str | Path, task: str = "femnist") -> None:
        self.path = Path(path)
        self.train_files, self.test_files = leaf_files(self.path)
        self.files = self.train_files + self.test_files
        self.task = task
        if task not in ("femnist", "shakespeare"):
            raise DataError("data.dataset", f"unknown LEAF task {task!r}")
        for f in self.files[:1]:
            found = _kind_of(f)
            if found != task:
                raise DataError("data.path", f"{f}: holds LEAF {found} data, data.dataset asks for {task}")
        self.num_classes = len(LEAF_LETTERS) + 1 if task == "shakespeare" else 62
        self.example_shape = (SEQ_LEN + 1,) if task == "shakespeare" else (1, 28, 28)
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()  # the pipeline's threads open the files once between them

    def scan(self) -> ClientIndex:
        b = IndexBuilder(parts=2)
        for fid, f in enumerate(self.train_files):
            _scan_file(f, fid, 0, self.task, b)
        for j, f in enumerate(self.test_files):
            _scan_file(f, len(self.train_files) + j, 1, self.task, b)
        ix = b.build_checked(self.path, held_part=1 if self.test_files else None, empty="no users", who="user")
        if self.task == "femnist" and ix.labels.size and ix.labels.max() >= 62:
            raise DataError("data.path", f"{self.path}: FEMNIST label {int(ix.labels.max())} outside 0..61")
        return ix

    def _fd(self, fid: int) -> int:
        with self._lock:
            fd = self._fds.get(fid)
            if fd is None:
                fd = self._fds[fid] = os.open(self.files[fid], os.O_RDONLY)
        return fd

    def read(self, ix: ClientIndex, u: int) -> tuple[np.ndarray, np.ndarray]:
        """User ``u``'s examples (float32 pixels in [0, 1] as given, or int64 (n, 81) character ids) and labels."""
        xs, ys = [], []
        for p in range(ix.file.shape[1]):
            fid = int(ix.file[u, p])
            if fid < 0:
                continue
            f, user = self.files[fid], str(ix.users[u])
            raw = os.pread(self._fd(fid), int(ix.length[u, p]), int(ix.offset[u, p]))
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise DataError("data.path", f"{f}: user {user!r}: record changed since it was indexed "
                                "(delete the .fedarena_index folder)") from None
            y = _labels(rec, f, user, self.task)
            if self.task == "shakespeare":
                if any(not isinstance(s, str) or len(s) != SEQ_LEN for s in rec["x"]):
                    raise DataError("data.path", f"{f}: user {user!r}: Shakespeare x must be {SEQ_LEN}-character "
                                    "strings")
                x = np.concatenate([_char_ids(rec["x"], f, user).reshape(len(y), SEQ_LEN), y[:, None]], 1)
            else:
                try:
                    x = np.asarray(rec["x"], np.float32)
                except (ValueError, TypeError):
                    x = np.zeros((0, 0))
                if x.shape != (len(y), FEMNIST_PIXELS) or not np.isfinite(x).all():
                    raise DataError("data.path", f"{f}: user {user!r}: FEMNIST x must be rows of {FEMNIST_PIXELS} "
                                    "finite numbers (28x28)")
                x = x.reshape(len(y), 1, 28, 28)
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
