"""Shared memory between the rank processes of one host (``multiprocessing.shared_memory``).

Every ordered pair of ranks has a single-producer single-consumer byte ring in a shared segment created by
the receiver: a 128-byte control block (write position at byte 0, read position at byte 64, both monotonic
uint64 counters) and ``capacity`` bytes of data. A message is the :mod:`.framing` header padded to 64 bytes,
then the payload padded to 64 bytes; the writer copies in pieces that are multiples of 64 bytes and publishes
them by advancing the write position, so every piece the reader sees starts at an element boundary. The reader
copies straight into the destination (``recv_into``) or reduces straight out of the shared ring into the
accumulator (``recv_reduce``): the only copy on a reduction step is the sender's copy into the ring.

Publication relies on stores becoming visible in program order (x86-64's TSO; the counters are written after
the data by separate interpreter calls). Waits spin briefly, then sleep (at most 50 us for the first 20 ms,
then up to 1 ms, then 5 ms, so an idle rank costs little); while waiting a rank
checks the group's abort flag and whether the peer process still exists, and gives up after ``timeout``.
Each rank also has a control segment (its pid, the abort flag and reason) that the other ranks attach to.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from multiprocessing import shared_memory

import numpy as np

from . import framing
from .transport import PeerFailure, Reduction, Request, Transport, contiguous

_CTL = 128
_ALIGN = 64
_REASON = 256


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

    def _wait_for(self, ready, peer: int, what: str) -> None:  # noqa: ANN001 - a zero-argument predicate
        if ready():
            return
        begin = last_check = time.monotonic()
        deadline = begin + self.timeout
        spins, sleep = 0, 0.0
        while not ready():
            spins += 1
            if spins > 200:
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
            self._wait_for(lambda: cap - (w - ring.read) > 0, peer, "send")
            space = cap - (w - ring.read)
            start = w % cap
            k = min(space, cap - start, padded - off)
            valid = max(0, min(k, payload.size - off))
            if valid:
                ring.data[start:start + valid] = payload[off:off + valid]
            off += k
            w += k
            ring.pos[0] = w

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
            self._wait_for(lambda: ring.written > r, src, "recv")
            start = r % cap
            k = min(ring.written - r, cap - start, padded - off)
            yield start, k
            off += k
            r += k
            ring.pos[8] = r

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
