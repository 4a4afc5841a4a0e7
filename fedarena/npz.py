"""Bounded reading of numpy ``.npz`` archives (a zip of ``.npy`` arrays) from files that may be hostile.

``np.load`` trusts the archive: a small file whose entries deflate to gigabytes is inflated in full before
anything is checked (a zip bomb). :func:`read_npz` reads the same archives under a limit on the total
decompressed size: it checks every entry's declared size in the zip's central directory first (a bomb that
declares its size is refused before one byte is inflated), then each ``.npy`` header against that size, and
finally streams each entry into its preallocated array in 1 MiB pieces, where the zip reader never returns
more than the declared size (a bomb that understates its size stops there and fails the entry's CRC-32).
Peak memory is the arrays themselves (at most the limit) plus one piece. Only numeric, boolean and string
dtypes are accepted; nothing is unpickled. Formats: zip application note (PKWARE APPNOTE 6.3.x) and the
``.npy`` format (NEP 1); both writers here (``np.savez``) store entries uncompressed.

This module sits below every layer of fedarena (it imports numpy only): the engine's parameter files and the
platform's checkpoints both read through it.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib

import numpy as np

MIN_LIMIT = 256 << 20
"""The decompressed-size limit is never below 256 MiB ..."""
RATIO = 4
"""... and otherwise 4 times the archive's own size (stored entries inflate by 1x, deflated weights by ~1.1x)."""
MAX_ENTRIES = 100_000
DTYPE_KINDS = "biufcSU"   # bool, int, uint, float, complex, bytes, str: never object, void or structured
_PIECE = 1 << 20


class ArchiveError(ValueError):
    """An archive that is malformed, holds something other than plain arrays, or inflates past the limit."""


def inflate_limit(archive_bytes: int) -> int:
    """The default cap on the total decompressed size of an archive of ``archive_bytes`` bytes."""
    return max(MIN_LIMIT, RATIO * int(archive_bytes))


def read_npz(source: bytes | str | os.PathLike, max_bytes: int | None = None,
             max_entries: int = MAX_ENTRIES) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive (bytes or a path) by entry name (without ``.npy``).

    The total decompressed size may not exceed ``max_bytes`` (default :func:`inflate_limit` of the archive's
    size); raises :class:`ArchiveError` naming the entry and the reason for anything else than plain arrays
    within the limits.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        f: io.IOBase = io.BytesIO(source)
        size = len(source)
    else:
        f = open(source, "rb")
        size = os.fstat(f.fileno()).st_size
    limit = inflate_limit(size) if max_bytes is None else int(max_bytes)
    try:
        with f, zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
            if len(infos) > max_entries:
                raise ArchiveError(f"{len(infos)} entries, more than the limit {max_entries}")
            declared, keys = 0, []
            for info in infos:
                key = _check_entry(info, keys)
                declared += info.file_size
                if declared > limit:
                    raise ArchiveError(f"entries declare {declared} bytes decompressed (at entry {info.filename!r}), "
                                       f"more than the limit {limit}")
                keys.append(key)
            out = {}
            for key, info in zip(keys, infos):
                with zf.open(info) as member:
                    out[key] = _read_npy(member, info.file_size, info.filename)
            return out
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError,
            zlib.error, SyntaxError) as exc:
        raise ArchiveError(f"not a readable .npz archive ({type(exc).__name__}: {exc})") from None


def _check_entry(info: zipfile.ZipInfo, keys: list[str]) -> str:
    name = info.filename
    if info.is_dir() or not name.endswith(".npy"):
        raise ArchiveError(f"entry {name!r}: not a .npy array")
    if info.flag_bits & 0x1:
        raise ArchiveError(f"entry {name!r}: encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ArchiveError(f"entry {name!r}: compression method {info.compress_type} (only stored or deflated)")
    key = name[:-4]
    if key in keys:
        raise ArchiveError(f"entry {name!r}: appears twice")
    return key


def _read_npy(member, size: int, name: str) -> np.ndarray:
    try:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise ArchiveError(f"entry {name!r}: .npy format version {version} (1.0 or 2.0 only)")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(member)
    except ArchiveError:
        raise
    except Exception as exc:   # numpy's header parser raises several types (ValueError, TokenError, ...)
        raise ArchiveError(f"entry {name!r}: malformed .npy header ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in DTYPE_KINDS or dtype.subdtype is not None:
        raise ArchiveError(f"entry {name!r}: dtype {dtype} is not a plain numeric, boolean or string dtype")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if member.tell() + nbytes != size:
        raise ArchiveError(f"entry {name!r}: header says shape {shape} of {dtype} ({nbytes} bytes), "
                           f"the entry holds {size - member.tell()} bytes of data")
    arr = np.empty(count, dtype=dtype)
    buf = memoryview(arr.view(np.uint8)) if nbytes else memoryview(b"")
    done = 0
    while done < nbytes:
        n = member.readinto(buf[done:done + _PIECE])
        if not n:
            raise ArchiveError(f"entry {name!r}: data ends after {done} of {nbytes} bytes")
        done += n
    if member.read(1):   # at the declared size the reader stops and checks the CRC-32
        raise ArchiveError(f"entry {name!r}: data past the declared size")
    return arr.reshape(shape, order="F" if fortran else "C")
