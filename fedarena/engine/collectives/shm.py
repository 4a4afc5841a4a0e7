"""Shared memory between the rank processes of one host (``multiprocessing.shared_memory``).

Every ordered pair of ranks has a single-producer single-consumer byte ring in a shared segment created by
the receiver: a 128-byte control block (write position at byte 0, read position at byte 64, both monotonic
uint64 counters) and ``capacity`` bytes of data. A message is the :mod:`.framing` header padded to 64 bytes,
then the payload padded to 64 bytes; the writer copies in pieces that are multiples of 64 bytes and publishes
them by advancing the write position, so every piece the reader sees starts at an element boundary. The reader
copies straight into the destination (``recv_into``) or reduces straight out of the shared ring into the
accumulator (``recv_reduce``): the only copy on a reduction step is the sender's copy into the ring.

Publication relies on stores becoming visible in program order (x86-64's TSO; the counters are written after
the data by separate interpreter calls). Waits spin briefly (about 100 polls), then block in the kernel on a
futex (``futex(2)``, Franke, Russell & Kirkwood, "Fuss, futexes and furwocks: fast userlevel locking in
Linux", OLS 2002) on the low 32 bits of the counter the waiter needs to move: a reader waits on the write
position, a writer with a full ring on the read position. ``FUTEX_WAIT`` sleeps only while the word still
holds the value the waiter saw, and every counter update is followed by a ``FUTEX_WAKE`` on that word, so the
kernel's ordering of the two calls leaves no lost wake-up (the rule of the kernel's ``futex/waitwake.c``) and a
waiting rank uses no CPU: on a contended machine the peer gets the core instead of a spinning or sleeping
poller. Blocks last at most 20 ms; between them a rank checks the group's abort flag and whether the peer
process still exists, and gives up after ``timeout``. Where the futex system call is not available (not
Linux on x86-64 or AArch64), waits fall back to sleeping in growing steps (at most 50 us for the first
20 ms, then up to 1 ms, then 5 ms).
Each rank also has a control segment (its pid, the abort flag and reason) that the other ranks attach to.
"""

from __future__ import annotations

import ctypes
import os
import platform
import queue
import sys
import threading
import time
from multiprocessing import shared_memory

import numpy as np

from . import framing
from .transport import PeerFailure, Reduction, Request, Transport, contiguous

_CTL = 128
_ALIGN = 64
_REASON = 256


_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE_FLAG): the word is in memory of several processes
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_BLOCK = 0.02  # longest single block in the kernel (the liveness-check interval)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_calls():  # noqa: ANN202 - (wait, wake) or None
    """``wait(addr, expected, seconds)`` and ``wake(addr)`` on a 32-bit word of shared memory, through
    ``syscall(2)`` (ctypes releases the GIL for the call), or ``None`` where they are unavailable."""
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None or sys.byteorder != "little":
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):  # pragma: no cover - a libc without syscall()
        return None
    syscall.restype = ctypes.c_long
    nr = ctypes.c_long(_SYS_FUTEX)
    null = ctypes.c_void_p(0)

    def wait(addr: int, expected: int, seconds: float) -> None:
        ts = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
        # returns at once (EAGAIN) when the word no longer holds ``expected``; EINTR/ETIMEDOUT are fine too
        syscall(nr, ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAIT), ctypes.c_uint32(expected & 0xFFFFFFFF),
                ctypes.byref(ts), null, ctypes.c_int(0))

    def wake(addr: int) -> None:
        syscall(nr, ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(0x7FFFFFFF), null, null,
                ctypes.c_int(0))

    # probe once: a wait on a word that does not hold the expected value must return at once
    probe = np.zeros(1, dtype=np.uint32)
    try:
        if syscall(nr, ctypes.c_void_p(probe.ctypes.data), ctypes.c_int(_FUTEX_WAIT), ctypes.c_uint32(1),
                   null, null, ctypes.c_int(0)) != -1 or ctypes.get_errno() not in (11,):  # EAGAIN
            return None
    except OSError:  # pragma: no cover
        return None
    return wait, wake


_FUTEX = _futex_calls()


def _pad(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _attach(name: str) -> shared_memory.SharedMemory:
    # Python < 3.13 also registers an attached segment with the resource tracker; ranks started by
    # ``launch.spawn`` share their parent's tracker, where the creator's unlink removes the one entry
    return shared_memory.SharedMemory(name=name, create=False)


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


class _Ring:
    def __init__(self, shm: shared_memory.SharedMemory, capacity: int) -> None:
        self.shm = shm
        self.capacity = capacity
        self.pos = np.ndarray((16,), dtype=np.uint64, buffer=shm.buf, offset=0)  # [0]: write, [8]: read
        self.data = np.ndarray((capacity,), dtype=np.uint8, buffer=shm.buf, offset=_CTL)
        self.write_word = self.pos.ctypes.data  # futex words: the low halves of the counters (little-endian)
        self.read_word = self.write_word + 64

    def publish_write(self, w: int) -> None:
        self.pos[0] = w
        if _FUTEX is not None:
            _FUTEX[1](self.write_word)

    def publish_read(self, r: int) -> None:
        self.pos[8] = r
        if _FUTEX is not None:
            _FUTEX[1](self.read_word)

    @property
    def written(self) -> int:
        return int(self.pos[0])

    @property
    def read(self) -> int:
        return int(self.pos[8])


class _Send(Request):
    def __init__(self, array: np.ndarray, owner: "SharedMemoryTransport", dst: int) -> None:
        self.array, self.owner, self.dst = array, owner, dst
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        while not self.done.wait(0.05):
            self.owner._check_alive(self.dst, time.monotonic() + self.owner.timeout, "send")
        if self.error is not None:
            raise self.error


class SharedMemoryTransport(Transport):
    """One rank of a shared-memory group. All ranks pass the same ``name`` (unique per group, e.g. from
    ``secrets.token_hex``) and ``capacity`` (bytes per directed ring, a multiple of 64)."""

    alpha = 15e-6
    beta = 1.0 / 4e9

    def __init__(self, rank: int, world_size: int, name: str, timeout: float = 30.0,
                 capacity: int = 4 << 20) -> None:
        super().__init__(rank, world_size, timeout)
        if capacity < 4096 or capacity % _ALIGN:
            raise ValueError(f"capacity: must be a multiple of {_ALIGN} and >= 4096, got {capacity}")
        self.name, self.capacity = name, int(capacity)
        self._own: list[shared_memory.SharedMemory] = []
        self._attached: list[shared_memory.SharedMemory] = []
        self.inbox: dict[int, _Ring] = {}
        self.outbox: dict[int, _Ring] = {}
        self.ctl: dict[int, np.ndarray] = {}
        self._queues: dict[int, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        for peer in self.outbox:
            q: queue.Queue = queue.Queue()
            self._queues[peer] = q
            t = threading.Thread(target=self._sender, args=(peer, q), daemon=True, name=f"shm-send-{rank}->{peer}")
            t.start()
            self._threads.append(t)

    # ---------------------------------------------------------------------------------------------- setup
    def _create(self, suffix: str, size: int) -> shared_memory.SharedMemory:
        shm = shared_memory.SharedMemory(name=f"{self.name}_{suffix}", create=True, size=size)
        self._own.append(shm)
        return shm

    def _setup(self) -> None:
        me = self._create(f"c{self.rank}", 16 + _REASON)
        ctl = np.ndarray((2 + _REASON // 8,), dtype=np.int64, buffer=me.buf)
        for src in range(self.world_size):
            if src != self.rank:
                self.inbox[src] = _Ring(self._create(f"{src}_{self.rank}", _CTL + self.capacity), self.capacity)
        ctl[1] = 0
        ctl[0] = os.getpid()  # published last: peers wait for a nonzero pid
        self.ctl[self.rank] = ctl
        deadline = time.monotonic() + self.timeout
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            while True:
                try:
                    c = _attach(f"{self.name}_c{peer}")
                    ring = _attach(f"{self.name}_{self.rank}_{peer}")
                    break
                except (FileNotFoundError, ValueError):  # not created yet, or created but not yet sized
                    if time.monotonic() > deadline:
                        raise PeerFailure(f"rank {self.rank}: rank {peer} did not join shared-memory group "
                                          f"{self.name!r} within {self.timeout:g} s") from None
                    time.sleep(0.01)
            self._attached += [c, ring]
            self.ctl[peer] = np.ndarray((2 + _REASON // 8,), dtype=np.int64, buffer=c.buf)
            if ring.size < _CTL + self.capacity:
                raise ValueError(f"capacity: rank {peer} uses a smaller ring ({ring.size - _CTL} bytes)")
            self.outbox[peer] = _Ring(ring, self.capacity)
            while self.ctl[peer][0] == 0:
                if time.monotonic() > deadline:
                    raise PeerFailure(f"rank {self.rank}: rank {peer} did not finish joining")
                time.sleep(0.01)

    # ---------------------------------------------------------------------------------------------- waits
    def _check_alive(self, peer: int, deadline: float, what: str) -> None:
        ctl = self.ctl[self.rank]
        if ctl[1]:
            reason = ctl[2:].tobytes().rstrip(b"\0").decode(errors="replace")
            raise PeerFailure(f"rank {self.rank}: group aborted during {what}: {reason}")
        if not _process_alive(int(self.ctl[peer][0])):
            raise PeerFailure(f"rank {self.rank}: rank {peer} (pid {int(self.ctl[peer][0])}) died during {what}")
        if time.monotonic() > deadline:
            raise PeerFailure(f"rank {self.rank}: {what} with rank {peer} made no progress for {self.timeout:g} s")

    def _wait_for(self, ready, peer: int, what: str, word: int = 0, idle: int = 0) -> None:  # noqa: ANN001
        """Wait until ``ready()`` (a zero-argument predicate); while it is false the 32-bit futex word at
        address ``word`` holds ``idle`` (the waited-for counter's low half), and the peer wakes the word when it
        moves that counter."""
        if ready():
            return
        begin = last_check = time.monotonic()
        deadline = begin + self.timeout
        spins, sleep = 0, 0.0
        while not ready():
            spins += 1
            if spins > 100 and _FUTEX is not None and word:
                _FUTEX[0](word, idle, _BLOCK)
            elif spins > 200:
                # short sleeps while a collective is likely in flight, long ones for an idle rank
                waited = time.monotonic() - begin
                cap = 50e-6 if waited < 0.02 else 1e-3 if waited < 1.0 else 5e-3
                sleep = min(cap, max(2e-6, sleep * 1.5))
                time.sleep(sleep)
            now = time.monotonic()
            if now - last_check > 0.02:
                last_check = now
                if self._closed:
                    raise PeerFailure(f"rank {self.rank}: transport closed during {what}")
                self._check_alive(peer, deadline, what)

    # ----------------------------------------------------------------------------------------------- send
    def _sender(self, peer: int, q: queue.Queue) -> None:
        ring = self.outbox[peer]
        failed: BaseException | None = None
        while True:
            req = q.get()
            if req is None:
                return
            if failed is None:
                try:
                    self._write(ring, peer, req.array)
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting rank
                    failed = exc if isinstance(exc, PeerFailure) else PeerFailure(f"send to rank {peer}: {exc}")
            req.error = failed
            req.done.set()

    def _write(self, ring: _Ring, peer: int, array: np.ndarray) -> None:
        header = framing.encode_header(array)
        hdr = np.zeros(_pad(len(header)), dtype=np.uint8)
        hdr[:len(header)] = np.frombuffer(header, dtype=np.uint8)
        self._stream_out(ring, peer, hdr, hdr.size)
        if array.nbytes:
            self._stream_out(ring, peer, array.reshape(-1).view(np.uint8), _pad(array.nbytes))

    def _stream_out(self, ring: _Ring, peer: int, payload: np.ndarray, padded: int) -> None:
        cap, off = ring.capacity, 0
        w = ring.written
        while off < padded:
            # the ring is full while read == w - cap: wait for the reader to move the read counter
            self._wait_for(lambda: cap - (w - ring.read) > 0, peer, "send", ring.read_word, w - cap)
            space = cap - (w - ring.read)
            start = w % cap
            k = min(space, cap - start, padded - off)
            valid = max(0, min(k, payload.size - off))
            if valid:
                ring.data[start:start + valid] = payload[off:off + valid]
            off += k
            w += k
            ring.publish_write(w)

    def isend(self, dst: int, array: np.ndarray) -> Request:
        self._check_peer(dst)
        if self._closed:
            raise PeerFailure(f"rank {self.rank}: transport closed")
        req = _Send(contiguous(array), self, dst)
        self._queues[dst].put(req)
        return req

    # ------------------------------------------------------------------------------------------------ recv
    def _pieces(self, src: int, padded: int):  # noqa: ANN202 - yields (ring offset, length) and consumes them
        ring, cap = self.inbox[src], self.capacity
        r, off = ring.read, 0
        while off < padded:
            self._wait_for(lambda: ring.written > r, src, "recv", ring.write_word, r)
            start = r % cap
            k = min(ring.written - r, cap - start, padded - off)
            yield start, k
            off += k
            r += k
            ring.publish_read(r)

    def _header(self, src: int) -> tuple[np.dtype, tuple[int, ...]]:
        self._check_peer(src)
        data = self.inbox[src].data
        raw = bytearray()
        need = _pad(framing.HEADER_FIXED)
        got = 0
        dtype = ndim = nbytes = None
        # the header's padded size depends on ndim, known after the first 64 bytes
        for start, k in self._pieces(src, need):
            raw += data[start:start + k].tobytes()
            got += k
        dtype, ndim, nbytes = framing.decode_fixed(bytes(raw[:framing.HEADER_FIXED]))
        total = _pad(framing.header_size(ndim))
        if total > need:
            for start, k in self._pieces(src, total - need):
                raw += data[start:start + k].tobytes()
        shape = framing.decode_shape(bytes(raw[framing.HEADER_FIXED:framing.header_size(ndim)]), ndim, dtype,
                                     nbytes, 1 << 40)
        return dtype, shape

    def _consume(self, src: int, out: np.ndarray, op: Reduction | None) -> None:
        data = self.inbox[src].data
        flat = out.reshape(-1)
        item = out.dtype.itemsize
        nbytes, off = out.nbytes, 0
        for start, k in self._pieces(src, _pad(nbytes)):
            valid = max(0, min(k, nbytes - off))
            if valid:
                incoming = data[start:start + valid].view(out.dtype)
                target = flat[off // item:(off + valid) // item]
                if op is None:
                    target[...] = incoming
                else:
                    op(target, incoming, out=target)
            off += k

    def recv_into(self, src: int, out: np.ndarray) -> None:
        dtype, shape = self._header(src)
        framing.check_matches(dtype, shape, out, src)
        self._consume(src, out, None)

    def recv(self, src: int) -> np.ndarray:
        dtype, shape = self._header(src)
        out = np.empty(shape, dtype=dtype)
        self._consume(src, out, None)
        return out

    def recv_reduce(self, src: int, acc: np.ndarray, op: Reduction) -> None:
        dtype, shape = self._header(src)
        framing.check_matches(dtype, shape, acc, src)
        self._consume(src, acc, op)

    # ------------------------------------------------------------------------------------------ lifecycle
    def abort(self, reason: str) -> None:
        text = f"rank {self.rank}: {reason}".encode()[:_REASON - 1]
        for peer, ctl in self.ctl.items():
            try:
                if not ctl[1]:
                    reason_area = ctl[2:].view(np.uint8)
                    reason_area[:] = 0
                    reason_area[:len(text)] = np.frombuffer(text, dtype=np.uint8)
                    ctl[1] = 1
            except (ValueError, TypeError):
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join(timeout=1.0)
        self.inbox.clear()
        self.outbox.clear()
        self.ctl.clear()
        for shm in self._attached:
            try:
                shm.close()
            except BufferError:
                pass
        for shm in self._own:
            try:
                shm.close()
            except BufferError:
                pass
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
