"""A TensorBoard scalar event writer with no TensorFlow or PyTorch dependency.

Writes the TFRecord-framed ``Event`` protocol buffers that TensorBoard reads (``events.out.tfevents.*``):
each record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``
(little-endian), and each ``Event`` carries ``wall_time`` (field 1, double), ``step`` (2, int64) and a
``Summary`` (5) of ``Value``s with ``tag`` (1) and ``simple_value`` (2, float). The few protobuf fields are
encoded by hand. Resuming a run drops the events after the checkpoint's step, so curves are not duplicated.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Iterator, Mapping

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def encode_event(step: int, wall_time: float, scalars: Mapping[str, float] | None = None,
                 file_version: str | None = None) -> bytes:
    msg = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if file_version is not None:
        msg += _len_field(0x1A, file_version.encode())
    if scalars:
        values = b"".join(
            _len_field(0x0A, _len_field(0x0A, tag.encode()) + b"\x15" + struct.pack("<f", float(v)))
            for tag, v in scalars.items()
        )
        msg += _len_field(0x2A, values)
    return msg


def frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


def read_records(path: str | Path) -> Iterator[bytes]:
    """The records of an event file; stops at a torn or corrupt record (e.g. after a crash)."""
    blob = Path(path).read_bytes()
    pos = 0
    while pos + 12 <= len(blob):
        (length,) = struct.unpack_from("<Q", blob, pos)
        (hcrc,) = struct.unpack_from("<I", blob, pos + 8)
        if hcrc != _masked_crc(blob[pos: pos + 8]) or pos + 16 + length > len(blob):
            return
        data = blob[pos + 12: pos + 12 + length]
        (dcrc,) = struct.unpack_from("<I", blob, pos + 12 + length)
        if dcrc != _masked_crc(data):
            return
        yield data
        pos += 16 + length


def event_step(data: bytes) -> int:
    """The ``step`` field of an encoded Event (0 when absent)."""
    pos = 0
    while pos < len(data):
        key = data[pos]
        pos += 1
        field, wire = key >> 3, key & 7
        if wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 0:
            n, shift = 0, 0
            while True:
                b = data[pos]
                pos += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if field == 2:
                return n
        elif wire == 2:
            n, shift = 0, 0
            while True:
                b = data[pos]
                pos += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            pos += n
        else:
            return 0
    return 0


class EventWriter:
    """Appends scalar events to one ``events.out.tfevents.*`` file in ``logdir``."""

    def __init__(self, logdir: str | Path, purge_after: int | None = None) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        if purge_after is not None:
            truncate_events(self.logdir, purge_after)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / name
        self._file = open(self.path, "ab")
        self._file.write(frame(encode_event(0, time.time(), file_version="brain.Event:2")))

    def add_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if scalars:
            self._file.write(frame(encode_event(step, time.time(), scalars)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def truncate_events(logdir: str | Path, max_step: int) -> None:
    """Rewrite every event file in ``logdir`` without the scalar events whose step is beyond ``max_step``."""
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        records = list(read_records(path))
        kept = [r for r in records if event_step(r) <= max_step]
        if len(kept) != len(records) or path.stat().st_size != sum(len(r) + 16 for r in records):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"".join(frame(r) for r in kept))
            os.replace(tmp, path)
