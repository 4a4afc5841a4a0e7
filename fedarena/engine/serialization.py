"""Save and load parameter pytrees to one file without pickle.

The file is a numpy ``.npz`` archive (zip of ``.npy`` arrays, read with ``allow_pickle=False``)
holding one entry per leaf plus a ``__meta__`` entry: UTF-8 JSON with the format version, the
tree structure, every leaf's shape and dtype, and optional user metadata.  Loading checks the
stored arrays against that description and, when ``like`` is given, against the expected tree,
shapes and dtypes, and names the offending parameter path in the error.

A parameter file may come from anyone (a shared league store, a downloaded policy): it is read through
:func:`fedarena.npz.read_npz`, which refuses a zip bomb without inflating it past its limit (by default
``max(256 MiB, 4 x the file size)``), and its tree is checked node by node (at most ``MAX_DEPTH`` levels and
``MAX_NODES`` nodes, every leaf an array the file holds), so a malformed file gives one
:class:`ParamsFileError`, never a ``KeyError`` from inside the loader.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fedarena.npz import ArchiveError, read_npz

from .core.ir import SUPPORTED_DTYPES

FORMAT = "fedarena.params"
VERSION = 1
MAX_DEPTH = 64
MAX_NODES = 1_000_000


class ParamsFileError(ValueError):
    """A parameter file is malformed or does not match the expected parameters."""


def _encode(tree: Any, path: str, leaves: dict, meta: dict) -> Any:
    if isinstance(tree, dict):
        out = {}
        for k in sorted(tree):
            if not isinstance(k, str) or "/" in k:
                raise ParamsFileError(f"parameter keys must be strings without '/', got {k!r} at {path or '<root>'}")
            out[k] = _encode(tree[k], f"{path}/{k}" if path else k, leaves, meta)
        return {"dict": out}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_encode(c, f"{path}/{i}" if path else str(i), leaves, meta) for i, c in enumerate(tree)]}
    if tree is None:
        return None
    arr = np.asarray(tree)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise ParamsFileError(f"parameter {path}: dtype {arr.dtype} cannot be saved")
    name = f"p{len(leaves)}"
    leaves[name] = np.array(arr, order="C", copy=True)
    meta[name] = {"path": path, "shape": list(arr.shape), "dtype": arr.dtype.str}
    return {"leaf": name}


def save_params(path: str | os.PathLike, params: Any, metadata: dict | None = None) -> None:
    """Write ``params`` (a pytree of arrays) and JSON-serialisable ``metadata`` to ``path``."""
    leaves: dict[str, np.ndarray] = {}
    meta_leaves: dict[str, dict] = {}
    tree = _encode(params, "", leaves, meta_leaves)
    meta = {"format": FORMAT, "version": VERSION, "tree": tree, "leaves": meta_leaves, "metadata": metadata or {}}
    blob = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, __meta__=blob, **leaves)
    os.replace(tmp, path)


def _decode(node: Any, arrays: dict, meta: dict, depth: int = 0, count: list | None = None) -> Any:
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_NODES:
        raise ParamsFileError(f"the tree has more than {MAX_NODES} nodes")
    if depth > MAX_DEPTH:
        raise ParamsFileError(f"the tree is nested more than {MAX_DEPTH} levels deep")
    if node is None:
        return None
    if not isinstance(node, dict) or len(node) != 1:
        raise ParamsFileError(f"malformed tree node {node!r:.80}")
    (kind, val), = node.items()
    if kind == "dict" and isinstance(val, dict):
        return {k: _decode(v, arrays, meta, depth + 1, count) for k, v in val.items()}
    if kind in ("list", "tuple") and isinstance(val, list):
        items = [_decode(v, arrays, meta, depth + 1, count) for v in val]
        return items if kind == "list" else tuple(items)
    if kind == "leaf" and isinstance(val, str):
        if val not in arrays or not isinstance(meta.get(val), dict):
            raise ParamsFileError(f"leaf {val!r} is missing from the file")
        arr, m = arrays[val], meta[val]
        try:
            path, shape, dtype = str(m["path"]), [int(d) for d in m["shape"]], np.dtype(m["dtype"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ParamsFileError(f"leaf {val!r}: malformed metadata {m!r:.80} ({type(exc).__name__})") from None
        if list(arr.shape) != shape or arr.dtype != dtype:
            raise ParamsFileError(
                f"parameter {path}: stored array has shape {arr.shape} dtype {arr.dtype}, "
                f"metadata says {tuple(shape)} {dtype}"
            )
        return arr
    if kind in ("dict", "list", "tuple", "leaf"):
        raise ParamsFileError(f"malformed tree node {node!r:.80}")
    raise ParamsFileError(f"unknown tree node kind {kind!r}")


def _check_like(got: Any, like: Any, path: str) -> None:
    where = path or "<root>"
    if isinstance(like, dict):
        if not isinstance(got, dict):
            raise ParamsFileError(f"parameter {where}: expected a dict, file has {type(got).__name__}")
        if set(got) != set(like):
            missing, extra = sorted(set(like) - set(got)), sorted(set(got) - set(like))
            raise ParamsFileError(f"parameter {where}: keys differ (missing {missing}, unexpected {extra})")
        for k in like:
            _check_like(got[k], like[k], f"{path}/{k}" if path else k)
    elif isinstance(like, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(like):
            raise ParamsFileError(f"parameter {where}: expected a sequence of {len(like)}, file has {type(got).__name__}")
        for i, (g, l) in enumerate(zip(got, like)):
            _check_like(g, l, f"{path}/{i}" if path else str(i))
    elif like is None:
        if got is not None:
            raise ParamsFileError(f"parameter {where}: expected None")
    else:
        la = np.asarray(like)
        if got is None or not isinstance(got, np.ndarray):
            raise ParamsFileError(f"parameter {where}: expected an array")
        if got.shape != la.shape:
            raise ParamsFileError(f"parameter {where}: shape {got.shape} in file, expected {la.shape}")
        if got.dtype != la.dtype:
            raise ParamsFileError(f"parameter {where}: dtype {got.dtype} in file, expected {la.dtype}")


def load_params(path: str | os.PathLike, like: Any = None, with_metadata: bool = False,
                max_bytes: int | None = None) -> Any:
    """Read parameters saved by :func:`save_params`; with ``like``, check tree, shapes and dtypes.

    ``max_bytes`` caps the decompressed size (default :func:`fedarena.npz.inflate_limit` of the file's size).
    """
    try:
        arrays = read_npz(path, max_bytes=max_bytes)
    except (ArchiveError, OSError) as exc:
        raise ParamsFileError(f"{os.fspath(path)}: not a readable parameter file ({exc})") from exc
    if "__meta__" not in arrays:
        raise ParamsFileError(f"{os.fspath(path)}: missing __meta__ entry (not a fedarena parameter file)")
    try:
        meta = json.loads(arrays.pop("__meta__").tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ParamsFileError(f"{os.fspath(path)}: metadata is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ParamsFileError(f"{os.fspath(path)}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise ParamsFileError(f"{os.fspath(path)}: unsupported format version {meta.get('version')!r}")
    leaves = meta.get("leaves", {})
    if not isinstance(leaves, dict):
        raise ParamsFileError(f"{os.fspath(path)}: malformed leaf table")
    try:
        params = _decode(meta.get("tree"), arrays, leaves)
    except ParamsFileError as exc:
        raise ParamsFileError(f"{os.fspath(path)}: {exc}") from None
    if like is not None:
        _check_like(params, like, "")
    metadata = meta.get("metadata", {})
    return (params, metadata) if with_metadata else params
