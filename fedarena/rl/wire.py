"""A pickle-free codec for trajectories and weights sent between RL worker processes.

Nested dicts / lists of numpy arrays and JSON scalars become msgpack maps in which each array is
``{"__nd__": [dtype string, shape, raw bytes]}``. Decoding accepts only plain numeric and bool dtypes
and checks that the byte count matches the shape, so a corrupt or hostile message raises
:class:`WireError` naming the field instead of executing anything.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_ALLOWED_KINDS = "biuf"


class WireError(ValueError):
    """A message that does not decode to the documented format."""


def _pack(x: Any) -> Any:
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.ascontiguousarray(x)
        if a.dtype.kind not in _ALLOWED_KINDS:
            raise WireError(f"encode: dtype {a.dtype} is not sendable (numeric and bool only)")
        return {"__nd__": [a.dtype.str, list(a.shape), a.tobytes()]}
    if isinstance(x, dict):
        return {str(k): _pack(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_pack(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise WireError(f"encode: values of type {type(x).__name__} are not sendable")


def encode(message: Any) -> bytes:
    """Serialize ``message`` (dicts, lists, numpy arrays, JSON scalars)."""
    return msgpack.packb(_pack(message), use_bin_type=True)


def _unpack(x: Any, path: str) -> Any:
    if isinstance(x, dict):
        if "__nd__" in x:
            try:
                dtype_str, shape, raw = x["__nd__"]
                dtype = np.dtype(dtype_str)
                shape = tuple(int(s) for s in shape)
            except (TypeError, ValueError) as exc:
                raise WireError(f"{path}: malformed array header ({exc})") from None
            if dtype.kind not in _ALLOWED_KINDS:
                raise WireError(f"{path}: dtype {dtype} is not accepted")
            if any(s < 0 for s in shape) or not isinstance(raw, bytes):
                raise WireError(f"{path}: bad shape {shape} or payload")
            if len(raw) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                raise WireError(f"{path}: {len(raw)} bytes do not fit shape {shape} of {dtype}")
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        return {k: _unpack(v, f"{path}.{k}") for k, v in x.items()}
    if isinstance(x, list):
        return [_unpack(v, f"{path}[{i}]") for i, v in enumerate(x)]
    return x


def decode(data: bytes) -> Any:
    """Inverse of :func:`encode`; raises :class:`WireError` on anything malformed."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for corrupt input
        raise WireError(f"message: not valid msgpack ({exc})") from None
    return _unpack(raw, "message")
