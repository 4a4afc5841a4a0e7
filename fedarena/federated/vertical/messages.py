"""Message types of the vertical-FL protocols and their wire form (fedarena.federated.wire envelopes).

Every message is a small frozen dataclass whose fields are ``int`` (64-bit), ``float``, ``str``,
``bytes``, ``bool`` or a numpy array. Big integers (RSA and Paillier values) travel as ``bytes``
blobs of fixed-width big-endian numbers (see :func:`ints_to_blob` / :func:`blob_to_ints`), so the
wire carries no pickle and no arbitrary-precision ints; a receiver checks every field's type and
every blob's length against the count it declares before it does any arithmetic.
The same bytes go over an in-process channel (tests) or gRPC (:mod:`.channel`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterable, Sequence

import numpy as np

from fedarena.federated import wire


class ProtocolError(ValueError):
    """A message that breaks a vertical-FL protocol; ``field`` names the offending part."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


_REGISTRY: dict[str, type] = {}


def message(kind: str):
    """Class decorator: register a frozen dataclass as the wire message ``kind``."""

    def wrap(cls: type) -> type:
        if kind in _REGISTRY:
            raise ValueError(f"message kind {kind!r} registered twice")
        cls.KIND = kind
        _REGISTRY[kind] = cls
        return cls

    return wrap


_PLAIN = {int: int, float: float, str: str, bytes: bytes, bool: bool, np.ndarray: np.ndarray}


def encode(msg: Any) -> bytes:
    """Encode a registered message dataclass as one wire envelope."""
    kind, body = body_of(msg)
    return wire.encode(kind, body)


def kinds() -> frozenset[str]:
    """Every registered vertical-FL message kind (those of the modules imported so far)."""
    return frozenset(_REGISTRY)


def decode(data: bytes, expected: type | tuple[type, ...] | None = None) -> Any:
    """Decode and type-check one envelope into its message dataclass.

    ``expected`` restricts which message classes are acceptable here (protocol state); anything else
    raises :class:`ProtocolError` naming the kind.
    """
    try:
        env = wire.decode(data, kinds=_REGISTRY.keys())
    except wire.WireError as e:
        raise ProtocolError(e.field, e.reason) from None
    return from_envelope(env, expected)


def from_envelope(env: wire.Message, expected: type | tuple[type, ...] | None = None) -> Any:
    """The message dataclass of an already decoded envelope; checks kind, field set and field types."""
    cls = _REGISTRY.get(env.kind)
    if cls is None:
        raise ProtocolError("kind", f"unknown message kind {env.kind!r}")
    if expected is not None:
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if cls not in allowed:
            names = ", ".join(c.KIND for c in allowed)
            raise ProtocolError("kind", f"got message {env.kind!r}, expected {names}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(env.body) - names
    if extra:
        raise ProtocolError(env.kind, f"unknown fields {sorted(extra)}")
    values = {}
    for name in names:
        try:
            values[name] = wire.field(env.body, name, _PLAIN[hints[name]], where=env.kind)
        except wire.WireError as e:
            raise ProtocolError(e.field, e.reason) from None
    return cls(**values)


def body_of(msg: Any) -> tuple[str, dict]:
    """(kind, body) of a registered message, for transports that take them separately."""
    kind = getattr(type(msg), "KIND", None)
    if kind is None or _REGISTRY.get(kind) is not type(msg):
        raise TypeError(f"{type(msg).__name__} is not a registered vertical-FL message")
    return kind, {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


# ----------------------------------------------------------------------------- big-integer blobs


def ints_to_blob(values: Iterable[int], width: int) -> bytes:
    """Concatenate non-negative integers as ``width``-byte big-endian numbers."""
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def blob_to_ints(blob: bytes, width: int, count: int, field: str) -> list[int]:
    """Split a blob of ``count`` numbers of ``width`` bytes; a length mismatch is a ProtocolError."""
    if count < 0:
        raise ProtocolError(field, f"count must be non-negative, got {count}")
    if len(blob) != width * count:
        raise ProtocolError(field, f"{len(blob)} bytes, but {count} values of {width} bytes need {width * count}")
    return [int.from_bytes(blob[i : i + width], "big") for i in range(0, len(blob), width)]


def check_in_range(values: Sequence[int], low: int, high: int, field: str) -> None:
    """Every value must lie in ``[low, high)``; names the first offender."""
    for i, v in enumerate(values):
        if not low <= v < high:
            raise ProtocolError(f"{field}[{i}]", f"value outside [{low}, modulus): not an element of the group")


def check_count(value: int, field: str, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ProtocolError(field, f"{value} outside the allowed range {low}..{high}")
