"""Versioned wire codec for fedarena's federated protocols: msgpack envelopes with raw array bytes.

Every message on a federated wire (horizontal FL over gRPC, vertical FL) is one *envelope*, a msgpack
map with exactly three keys::

    {"v": 1, "kind": "<message kind>", "body": {<field>: <value>, ...}}

Body values may be ``None``, ``bool``, ``int`` (signed/unsigned 64 bit), ``float``, ``str``, ``bytes``,
lists, maps with ``str`` keys, and numpy arrays. An array travels as msgpack extension type 1 whose
payload is::

    uint16 big-endian header length H | msgpack header [dtype, shape] (H bytes) | raw C-order bytes

``dtype`` is a numpy type string from a fixed allow-list (little-endian: ``<f4``, ``<f8``, ``<f2``,
``<i1``..``<i8``, ``<u1``..``<u8`` written as ``|i1``/``|u1`` for bytes, ``|b1`` for bool) and ``shape``
is a list of non-negative ints; the byte count must equal ``prod(shape) * itemsize``. There is no
pickle, no object dtype and no code execution anywhere in the format.

Decoding is strict: a message is rejected with :class:`WireError` (whose ``field`` names where and
whose message says why) when it is over the size limit, is not msgpack, has trailing bytes, nests
deeper than ``Limits.max_depth``, has an unknown envelope key, a wrong version, an unknown kind (when
the caller passes ``kinds``), a map key that is not a string, an extension type other than 1, a dtype
off the allow-list, a shape/byte-count mismatch, or more array elements than ``Limits.max_elements``.

Large messages are streamed as *frames* (see :func:`split_frames` / :class:`FrameAssembler`): each
frame is a msgpack array ``[v, index, count, total_bytes, chunk]``; the assembler checks the frame
order, the declared count and total size against the limits before buffering anything, so an
oversize upload is refused at its first frame.

The format is the message layer of the MindSpore Federated architecture's "pluggable, loosely coupled
communication" (FL-Server / FL-Client exchanges; see docs/architecture.md, Federated section).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import msgpack
import numpy as np

WIRE_VERSION = 1
"""Version of the envelope and frame layout; a decoder refuses any other value."""

ARRAY_EXT_CODE = 1
"""msgpack extension type code that carries a numpy array."""

ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"}
)
"""numpy dtype strings an array may have on the wire (little-endian numbers and bool only)."""


class WireError(ValueError):
    """A message that cannot be encoded or decoded; ``field`` names the offending part."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class Limits:
    """Size limits a decoder enforces (and an encoder checks, so a sender learns early)."""

    max_message_bytes: int = 64 * 1024 * 1024
    """largest encoded envelope accepted, in bytes"""
    max_elements: int = 16 * 1024 * 1024
    """largest number of elements of one array"""
    max_ndim: int = 8
    """largest number of array dimensions"""
    max_depth: int = 16
    """deepest nesting of lists/maps inside the body"""
    max_frames: int = 4096
    """most frames one streamed message may be split into"""

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_elements", "max_ndim", "max_depth", "max_frames"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"Limits.{name}: must be positive, got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Message:
    """A decoded envelope: the message kind and its body (plain data and numpy arrays)."""

    kind: str
    body: dict[str, Any]


# ----------------------------------------------------------------------------- arrays


def _array_to_ext(arr: np.ndarray, path: str) -> msgpack.ExtType:
    if arr.dtype.kind not in "biuf":
        raise WireError(path, f"dtype {arr.dtype} cannot be sent (only bool, int, uint, float arrays)")
    a = arr.astype(arr.dtype.newbyteorder("<"), copy=False) if arr.dtype.byteorder == ">" else arr
    a = a if a.flags.c_contiguous else a.copy(order="C")
    dtype = a.dtype.str
    if dtype not in ALLOWED_DTYPES:
        raise WireError(path, f"dtype {dtype} is not on the wire allow-list {sorted(ALLOWED_DTYPES)}")
    header = msgpack.packb([dtype, [int(d) for d in a.shape]])
    return msgpack.ExtType(ARRAY_EXT_CODE, struct.pack(">H", len(header)) + header + a.tobytes())


def _ext_to_array(code: int, data: bytes, limits: Limits) -> np.ndarray:
    if code != ARRAY_EXT_CODE:
        raise WireError("ext", f"unknown msgpack extension type {code} (only {ARRAY_EXT_CODE} = array)")
    if len(data) < 2:
        raise WireError("array", "extension payload shorter than its 2-byte header length")
    (hlen,) = struct.unpack(">H", data[:2])
    if 2 + hlen > len(data):
        raise WireError("array", f"header length {hlen} runs past the payload ({len(data)} bytes)")
    try:
        header = msgpack.unpackb(data[2 : 2 + hlen], raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - any parse failure is a malformed header
        raise WireError("array.header", f"not valid msgpack ({type(e).__name__})") from None
    if not (isinstance(header, list) and len(header) == 2):
        raise WireError("array.header", "must be [dtype, shape]")
    dtype, shape = header
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise WireError("array.dtype", f"{dtype!r} is not on the allow-list {sorted(ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > limits.max_ndim:
        raise WireError("array.shape", f"must be a list of at most {limits.max_ndim} ints, got {shape!r}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape):
        raise WireError("array.shape", f"dimensions must be non-negative ints, got {shape!r}")
    n = math.prod(shape)
    if n > limits.max_elements:
        raise WireError("array.shape", f"{n} elements exceed the limit of {limits.max_elements}")
    dt = np.dtype(dtype)
    raw = data[2 + hlen :]
    if len(raw) != n * dt.itemsize:
        raise WireError("array.data", f"{len(raw)} bytes but shape {shape} of {dtype} needs {n * dt.itemsize}")
    arr = np.frombuffer(raw, dtype=dt).reshape(tuple(shape))
    if dt.kind == "b" and n and not np.isin(np.frombuffer(raw, dtype=np.uint8), (0, 1)).all():
        raise WireError("array.data", "bool array holds bytes other than 0 and 1")
    return arr.copy()  # own, writable memory, independent of the receive buffer


# ----------------------------------------------------------------------------- envelopes


def _prepare(value: Any, path: str, depth: int, limits: Limits) -> Any:
    if depth > limits.max_depth:
        raise WireError(path, f"nesting deeper than {limits.max_depth}")
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise WireError(path, f"int {value} does not fit 64 bits")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.ndarray):
        if value.size > limits.max_elements:
            raise WireError(path, f"{value.size} elements exceed the limit of {limits.max_elements}")
        return _array_to_ext(value, path)
    if isinstance(value, np.generic):
        return _prepare(value.item(), path, depth, limits)
    if isinstance(value, (list, tuple)):
        return [_prepare(v, f"{path}[{i}]", depth + 1, limits) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise WireError(path, f"map key {k!r} is not a string")
            out[k] = _prepare(v, f"{path}.{k}", depth + 1, limits)
        return out
    raise WireError(path, f"type {type(value).__name__} cannot be sent")


def encode(kind: str, body: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Encode one envelope; raises :class:`WireError` for unsendable values or an oversize result."""
    if not isinstance(kind, str) or not kind:
        raise WireError("kind", f"must be a non-empty string, got {kind!r}")
    if not isinstance(body, Mapping):
        raise WireError("body", f"must be a mapping, got {type(body).__name__}")
    payload = {"v": WIRE_VERSION, "kind": kind, "body": _prepare(body, "body", 0, limits)}
    data = msgpack.packb(payload, use_bin_type=True)
    if len(data) > limits.max_message_bytes:
        raise WireError("message", f"{len(data)} bytes exceed the limit of {limits.max_message_bytes}")
    return data


def _check_tree(value: Any, path: str, depth: int, limits: Limits) -> None:
    if depth > limits.max_depth:
        raise WireError(path, f"nesting deeper than {limits.max_depth}")
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_tree(v, f"{path}[{i}]", depth + 1, limits)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise WireError(path, f"map key {k!r} is not a string")
            _check_tree(v, f"{path}.{k}", depth + 1, limits)
    elif not (value is None or isinstance(value, (bool, int, float, str, bytes, np.ndarray))):
        raise WireError(path, f"value of type {type(value).__name__} is not allowed")


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS, kinds: Iterable[str] | None = None) -> Message:
    """Decode one envelope strictly; any problem raises :class:`WireError` naming the field."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("message", f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        raise WireError("message", f"{len(data)} bytes exceed the limit of {limits.max_message_bytes}")
    try:
        obj = msgpack.unpackb(
            bytes(data),
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=lambda code, payload: _ext_to_array(code, payload, limits),
        )
    except WireError:
        raise
    except msgpack.ExtraData:
        raise WireError("message", "trailing bytes after the envelope") from None
    except RecursionError:
        raise WireError("message", "nesting too deep") from None
    except Exception as e:  # noqa: BLE001 - FormatError, StackError, ValueError, UnicodeDecodeError, ...
        raise WireError("message", f"not a valid msgpack envelope ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise WireError("message", f"envelope must be a map, got {type(obj).__name__}")
    extra = set(obj) - {"v", "kind", "body"}
    if extra:
        raise WireError("message", f"unknown envelope keys {sorted(map(str, extra))}")
    if "v" not in obj:
        raise WireError("v", "missing wire version")
    if obj["v"] != WIRE_VERSION or isinstance(obj["v"], bool):
        raise WireError("v", f"unsupported wire version {obj['v']!r} (this side speaks {WIRE_VERSION})")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise WireError("kind", f"must be a non-empty string, got {kind!r}")
    if kinds is not None and kind not in set(kinds):
        raise WireError("kind", f"unknown message kind {kind!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise WireError("body", f"must be a map, got {type(body).__name__}")
    _check_tree(body, "body", 0, limits)
    return Message(kind, body)


# ----------------------------------------------------------------------------- field access


_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes", list: "list", dict: "map"}


def field(body: Mapping[str, Any], name: str, expected: type | tuple[type, ...], *, where: str = "body",
          default: Any = ..., ) -> Any:
    """Return ``body[name]`` checked against ``expected``; missing or mistyped fields raise WireError.

    ``bool`` is never accepted where ``int``/``float`` is expected, and an ``int`` is accepted (and
    converted) where a ``float`` is expected. Pass ``default`` to make the field optional.
    """
    path = f"{where}.{name}"
    if name not in body:
        if default is not ...:
            return default
        raise WireError(path, "missing required field")
    value = body[name]
    types_ = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in types_:
        ok = False
    elif isinstance(value, int) and not isinstance(value, bool) and float in types_ and int not in types_:
        return float(value)
    else:
        ok = isinstance(value, types_)
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(t, getattr(t, "__name__", str(t))) for t in types_)
        raise WireError(path, f"expected {want}, got {type(value).__name__}")
    return value


def array_field(body: Mapping[str, Any], name: str, *, where: str = "body", dtype: str | None = None,
                shape: tuple[int, ...] | None = None, finite: bool = False) -> np.ndarray:
    """Return ``body[name]`` as an array, checking dtype, shape and (optionally) finiteness."""
    arr = field(body, name, np.ndarray, where=where)
    return check_array(arr, f"{where}.{name}", dtype=dtype, shape=shape, finite=finite)


def check_array(arr: Any, path: str, *, dtype: str | None = None, shape: tuple[int, ...] | None = None,
                finite: bool = False) -> np.ndarray:
    """Check an already decoded array; raises :class:`WireError` naming ``path``."""
    if not isinstance(arr, np.ndarray):
        raise WireError(path, f"expected an array, got {type(arr).__name__}")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise WireError(path, f"expected dtype {np.dtype(dtype).str}, got {arr.dtype.str}")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise WireError(path, f"expected shape {tuple(shape)}, got {tuple(arr.shape)}")
    if finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise WireError(path, "contains NaN or Inf")
    return arr


# ----------------------------------------------------------------------------- frames (chunked streams)

DEFAULT_CHUNK_BYTES = 1024 * 1024


def split_frames(data: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Split an encoded envelope into frames ``[v, index, count, total_bytes, chunk]`` (>= 1 frame)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes: must be positive, got {chunk_bytes}")
    total = len(data)
    count = max(1, -(-total // chunk_bytes))
    view = memoryview(data)
    for i in range(count):
        chunk = bytes(view[i * chunk_bytes : (i + 1) * chunk_bytes])
        yield msgpack.packb([WIRE_VERSION, i, count, total, chunk], use_bin_type=True)


class FrameAssembler:
    """Reassembles frames from :func:`split_frames`, refusing bad order or oversize streams early."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._parts: list[bytes] = []
        self._count: int | None = None
        self._total: int | None = None
        self._received = 0

    def add(self, frame: bytes) -> bool:
        """Add one frame; returns True once the message is complete. Raises :class:`WireError`."""
        if not isinstance(frame, (bytes, bytearray)):
            raise WireError("frame", f"expected bytes, got {type(frame).__name__}")
        # a frame carries at most one chunk plus a small header; anything larger is refused unread
        if len(frame) > self.limits.max_message_bytes + 64:
            raise WireError("frame", f"{len(frame)} bytes exceed the message limit")
        try:
            obj = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=True, use_list=True)
        except Exception as e:  # noqa: BLE001
            raise WireError("frame", f"not a valid msgpack frame ({type(e).__name__})") from None
        if not (isinstance(obj, list) and len(obj) == 5):
            raise WireError("frame", "must be [v, index, count, total_bytes, chunk]")
        v, index, count, total, chunk = obj
        if v != WIRE_VERSION or isinstance(v, bool):
            raise WireError("frame.v", f"unsupported wire version {v!r} (this side speaks {WIRE_VERSION})")
        for name, val in (("index", index), ("count", count), ("total_bytes", total)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 0:
                raise WireError(f"frame.{name}", f"must be a non-negative int, got {val!r}")
        if not isinstance(chunk, bytes):
            raise WireError("frame.chunk", f"must be bytes, got {type(chunk).__name__}")
        if self._count is None:
            if count < 1 or count > self.limits.max_frames:
                raise WireError("frame.count", f"{count} frames outside 1..{self.limits.max_frames}")
            if total > self.limits.max_message_bytes:
                raise WireError("frame.total_bytes", f"{total} bytes exceed the limit of {self.limits.max_message_bytes}")
            self._count, self._total = count, total
        elif count != self._count or total != self._total:
            raise WireError("frame", "count/total_bytes changed in the middle of a stream")
        if index != len(self._parts):
            raise WireError("frame.index", f"expected frame {len(self._parts)}, got {index}")
        self._received += len(chunk)
        if self._received > self._total:
            raise WireError("frame.chunk", f"stream carries more than the declared {self._total} bytes")
        self._parts.append(chunk)
        return self.complete

    @property
    def complete(self) -> bool:
        return self._count is not None and len(self._parts) == self._count

    @property
    def declared_bytes(self) -> int | None:
        """The total size the first frame declared (checked against the limit), or None before it."""
        return self._total

    def result(self) -> bytes:
        """The reassembled envelope bytes; raises :class:`WireError` if frames are missing or short."""
        if not self.complete:
            have = len(self._parts)
            raise WireError("stream", f"ended after {have} of {self._count if self._count is not None else '?'} frames")
        if self._received != self._total:
            raise WireError("stream", f"carried {self._received} bytes, declared {self._total}")
        return b"".join(self._parts)


def join_frames(frames: Iterable[bytes], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Reassemble a complete frame stream into envelope bytes (extra frames are an error)."""
    asm = FrameAssembler(limits)
    done = False
    for frame in frames:
        if done:
            raise WireError("stream", "frames after the last declared frame")
        done = asm.add(frame)
    return asm.result()


def error_body(field_name: str, reason: str, code: str = "invalid") -> dict[str, Any]:
    """Body of the standard ``error`` reply: a code, the field at fault and the reason."""
    return {"code": code, "field": field_name, "reason": reason}
