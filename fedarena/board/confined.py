"""Reading files confined to a run folder: no symbolic link, no FIFO or device, no more than a stated size.

Every byte the board serves comes through here.  A path is opened one component at a time from ``/`` with
``openat``-style calls (``os.open(name, O_NOFOLLOW, dir_fd=parent)``), so a symbolic link anywhere on the way
(a ``run.log`` that links to ``/etc/passwd``, a ``report`` folder that links elsewhere) is refused, and a link
swapped in after a check cannot redirect the read: the check and the read are one open (no time-of-check to
time-of-use gap).  A name that ``lstat`` shows is not a regular file is refused unopened; the file itself is
opened with ``O_NONBLOCK`` (should a FIFO be swapped in, it opens at once instead of waiting for a writer) and
kept only if ``fstat`` says it is a regular file with one link (a hard link may be a file from
anywhere on the same file system; the platform never makes one); reads are capped in bytes.  Anything else
raises :class:`Unreadable` (an ``OSError``), which the readers turn into "unavailable".

The caller passes a folder that is already a real path (``os.path.realpath`` of the run folder, checked to lie
inside the runs folder) and a relative name of plain components (no ``..``, no ``.``, no empty part).
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Unreadable(OSError):
    """A file the board will not read: missing, a link, hard-linked, not a regular file, too large, or outside
its folder."""


def _parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if not relative or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise Unreadable(f"{relative!r}: not a plain relative path")
    return parts


def _open_dir(folder: Path, parts: list[str]) -> int:
    """A descriptor of ``folder / parts...`` opened without following any link on the way."""
    folder = Path(folder)
    if not folder.is_absolute():
        raise Unreadable(f"{folder}: not an absolute path")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for name in [*folder.parts[1:], *parts]:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP / ENOTDIR for a link, ENOENT for a missing folder
                raise Unreadable(f"{name}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def open_regular(folder: Path, relative: str) -> Iterator[tuple[int, os.stat_result]]:
    """``(fd, stat)`` of the regular file ``folder/relative``; :class:`Unreadable` for anything else."""
    *dirs, name = _parts(relative)
    dfd = _open_dir(folder, dirs)
    try:
        try:
            mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
        except OSError as exc:
            raise Unreadable(f"{relative}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):  # a link, device or FIFO is refused unopened (opening some devices acts)
            raise Unreadable(f"{relative}: not a regular file")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            raise Unreadable(f"{relative}: {exc.strerror}") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{relative}: not a regular file")
        if st.st_nlink > 1:  # a hard link may be a file from anywhere on the same file system
            raise Unreadable(f"{relative}: has {st.st_nlink} hard links")
        yield fd, st
    finally:
        os.close(fd)


def _pread_all(fd: int, offset: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, offset + got)
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_bytes(folder: Path, relative: str, limit: int) -> bytes:
    """The whole file, if it is a regular file of at most ``limit`` bytes (else :class:`Unreadable`)."""
    with open_regular(folder, relative) as (fd, st):
        if st.st_size > limit:
            raise Unreadable(f"{relative}: {st.st_size} bytes, more than the board reads ({limit})")
        data = _pread_all(fd, 0, limit + 1)
    if len(data) > limit:  # grew since fstat
        raise Unreadable(f"{relative}: more than the board reads ({limit} bytes)")
    return data


def read_range(folder: Path, relative: str, offset: int, limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` bytes from byte ``offset`` on, and the file's ``stat`` (size and identity)."""
    with open_regular(folder, relative) as (fd, st):
        return _pread_all(fd, max(0, offset), max(0, limit)), st


def read_tail(folder: Path, relative: str, limit: int) -> bytes:
    """The last ``limit`` bytes of the file (all of it when shorter)."""
    with open_regular(folder, relative) as (fd, st):
        return _pread_all(fd, max(0, st.st_size - limit), limit)


def is_regular(folder: Path, relative: str) -> bool:
    """Whether ``folder/relative`` is a regular file reachable without links (nothing is read)."""
    try:
        with open_regular(folder, relative):
            return True
    except Unreadable:
        return False


def list_dir(folder: Path, relative: str = "", limit: int = 10_000) -> list[tuple[str, os.stat_result]]:
    """``(name, lstat)`` of up to ``limit`` entries of a folder reached without links, sorted by name."""
    fd = _open_dir(folder, _parts(relative) if relative else [])
    out = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if len(out) >= limit:
                    break
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue
    finally:
        os.close(fd)
    return sorted(out, key=lambda e: e[0])


def regular_files(folder: Path, relative: str = "", limit: int = 10_000) -> list[tuple[str, os.stat_result]]:
    """The regular files (not links, FIFOs or devices) among :func:`list_dir`."""
    try:
        return [(n, st) for n, st in list_dir(folder, relative, limit) if stat.S_ISREG(st.st_mode)]
    except OSError:  # Unreadable, or the folder vanished while being listed
        return []
