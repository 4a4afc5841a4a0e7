"""TCP sockets between ranks (one process per rank, on loopback or across hosts), authenticated, no pickle.

Rendezvous: rank 0 listens on the ``master`` address; every other rank opens its own listener, connects to
rank 0 and reports its listening address; rank 0 answers with the table of all addresses; then rank ``i``
connects to every rank ``0 < j < i`` and accepts from every ``j > i``, giving one socket per pair.

Every connection is mutually authenticated with a shared secret before anything else is read (HMAC-SHA256
challenge/response, compared with ``hmac.compare_digest``)::

    acceptor  -> connector : b"FAC1" | nonce_a (32 random bytes)
    connector -> acceptor  : nonce_c (32) | rank (u32) | HMAC(secret, b"c" | nonce_a | nonce_c | rank | world)
    acceptor  -> connector : HMAC(secret, b"a" | nonce_a | nonce_c | rank | world)

A connection that fails the check is closed without reading further. After it, each direction carries
messages in the documented :mod:`.framing` format (header, then raw array bytes). Sends run on one thread per
peer (so both ends of a ring step can send at once without deadlock); receives read straight into the
destination buffer, and reductions receive 256 KiB pieces into a reused scratch buffer and reduce each at once. A closed connection (the peer process died) or a socket timeout raises
:class:`PeerFailure`; ``abort`` closes every socket, so the failure reaches every rank.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import queue
import socket
import struct
import threading
import time

import numpy as np

from . import framing
from .transport import PeerFailure, Reduction, Request, Transport, contiguous

_HELLO = b"FAC1"
_NONCE = 32
_MAC = 32
_SMALL = 64 << 10
_PIECE = 256 << 10  # receive-and-reduce unit: fits in L2 next to the accumulator slice


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def _recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 26))
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k


def _mac(secret: bytes, role: bytes, nonce_a: bytes, nonce_c: bytes, rank: int, world: int) -> bytes:
    return hmac.new(secret, role + nonce_a + nonce_c + struct.pack("!II", rank, world), hashlib.sha256).digest()


def _tune(sock: socket.socket) -> None:
    # only TCP_NODELAY: setting SO_SNDBUF / SO_RCVBUF would switch off the kernel's buffer autotuning
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _authenticate_acceptor(sock: socket.socket, secret: bytes, world: int) -> int:
    """Challenge a connecting peer; returns its rank or raises ``PermissionError``."""
    nonce_a = os.urandom(_NONCE)
    sock.sendall(_HELLO + nonce_a)
    reply = _recv_exact(sock, _NONCE + 4 + _MAC)
    nonce_c, (rank,), mac = reply[:_NONCE], struct.unpack("!I", reply[_NONCE:_NONCE + 4]), reply[_NONCE + 4:]
    if not hmac.compare_digest(mac, _mac(secret, b"c", nonce_a, nonce_c, rank, world)):
        raise PermissionError("peer failed authentication (wrong shared secret or world size)")
    if not 0 <= rank < world:
        raise PermissionError(f"authenticated peer claims rank {rank} outside [0, {world})")
    sock.sendall(_mac(secret, b"a", nonce_a, nonce_c, rank, world))
    return rank


def _authenticate_connector(sock: socket.socket, secret: bytes, rank: int, world: int) -> None:
    hello = _recv_exact(sock, len(_HELLO) + _NONCE)
    if hello[:4] != _HELLO:
        raise PermissionError("the listener is not a fedarena collectives rank")
    nonce_a, nonce_c = hello[4:], os.urandom(_NONCE)
    sock.sendall(nonce_c + struct.pack("!I", rank) + _mac(secret, b"c", nonce_a, nonce_c, rank, world))
    if not hmac.compare_digest(_recv_exact(sock, _MAC), _mac(secret, b"a", nonce_a, nonce_c, rank, world)):
        raise PermissionError("the listener failed authentication (wrong shared secret)")


class _Send(Request):
    def __init__(self, header: bytes, payload: memoryview, owner: "TCPTransport", dst: int) -> None:
        self.header, self.payload, self.owner, self.dst = header, payload, owner, dst
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        if not self.done.wait(self.owner.timeout + 1.0):
            raise PeerFailure(f"rank {self.owner.rank}: send to rank {self.dst} did not finish within "
                              f"{self.owner.timeout:g} s")
        if self.error is not None:
            raise PeerFailure(f"rank {self.owner.rank}: send to rank {self.dst} failed: {self.error}")


class TCPTransport(Transport):
    """One rank of a TCP group. ``master``: rank 0's (host, port); ``secret``: the group's shared key (at least
    16 bytes); ``host``: the address this rank listens on and advertises; ``max_message_bytes``: the largest
    payload a peer may announce."""

    alpha = 60e-6
    beta = 1.0 / 1.5e9

    def __init__(self, rank: int, world_size: int, master: tuple[str, int], secret: bytes, timeout: float = 30.0,
                 host: str = "127.0.0.1", max_message_bytes: int = 1 << 34) -> None:
        super().__init__(rank, world_size, timeout)
        if len(secret) < 16:
            raise ValueError("secret: the shared secret must be at least 16 bytes")
        self.secret = bytes(secret)
        self.max_message_bytes = int(max_message_bytes)
        self.socks: dict[int, socket.socket] = {}
        self._queues: dict[int, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._scratch: dict[int, np.ndarray] = {}
        self._closed = False
        deadline = time.monotonic() + timeout
        try:
            self._connect(master, host, deadline)
        except BaseException:
            self.close()
            raise
        for peer, sock in self.socks.items():
            sock.settimeout(timeout)
            q: queue.Queue = queue.Queue()
            self._queues[peer] = q
            t = threading.Thread(target=self._sender, args=(sock, q), daemon=True, name=f"tcp-send-{rank}->{peer}")
            t.start()
            self._threads.append(t)

    # ------------------------------------------------------------------------------------------- rendezvous
    def _accept(self, listener: socket.socket, deadline: float, expect: set[int]) -> None:
        while expect:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                raise PeerFailure(f"rank {self.rank}: ranks {sorted(expect)} did not connect within "
                                  f"{self.timeout:g} s") from None
            sock.settimeout(max(0.01, min(5.0, deadline - time.monotonic())))
            try:
                peer = _authenticate_acceptor(sock, self.secret, self.world_size)
            except (PermissionError, OSError, ConnectionError, struct.error):
                sock.close()  # unauthenticated or broken: drop it and keep listening
                continue
            if peer not in expect:
                sock.close()
                continue
            _tune(sock)
            self.socks[peer] = sock
            expect.discard(peer)

    def _dial(self, address: tuple[str, int], peer: int, deadline: float) -> socket.socket:
        while True:
            try:
                sock = socket.create_connection(address, timeout=max(0.01, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise PeerFailure(f"rank {self.rank}: cannot reach rank {peer} at {address}: {exc}") from None
                time.sleep(0.05)
        try:
            _authenticate_connector(sock, self.secret, self.rank, self.world_size)
        except BaseException:
            sock.close()
            raise
        _tune(sock)
        return sock

    def _connect(self, master: tuple[str, int], host: str, deadline: float) -> None:
        n = self.world_size
        if n == 1:
            return
        if self.rank == 0:
            listener = socket.create_server(master, reuse_port=False)
            try:
                self._accept(listener, deadline, set(range(1, n)))
                table = [np.frombuffer(self._recv_small(peer), dtype=np.uint8) for peer in range(1, n)]
                for peer in range(1, n):
                    for entry in table:
                        self._send_small(peer, entry)
            finally:
                listener.close()
            return
        listener = socket.create_server((host, 0))
        try:
            self.socks[0] = self._dial(master, 0, deadline)
            self.socks[0].settimeout(self.timeout)
            me = f"{self.rank} {host} {listener.getsockname()[1]}".encode()
            self._send_small(0, np.frombuffer(me, dtype=np.uint8))
            addresses: dict[int, tuple[str, int]] = {}
            for _ in range(1, n):
                r, h, p = bytes(self._recv_small(0)).decode().split()
                addresses[int(r)] = (h, int(p))
            for peer in range(1, self.rank):
                self.socks[peer] = self._dial(addresses[peer], peer, deadline)
            self._accept(listener, deadline, set(range(self.rank + 1, n)))
        finally:
            listener.close()

    def _send_small(self, peer: int, array: np.ndarray) -> None:
        self.socks[peer].sendall(framing.encode_header(array) + array.tobytes())

    def _recv_small(self, peer: int) -> np.ndarray:
        return self.recv(peer)

    # ----------------------------------------------------------------------------------------------- traffic
    def _sender(self, sock: socket.socket, q: queue.Queue) -> None:
        failed: BaseException | None = None
        while True:
            req = q.get()
            if req is None:
                return
            if failed is None:
                try:
                    if len(req.payload) <= _SMALL:
                        sock.sendall(req.header + req.payload)
                    else:
                        sock.sendall(req.header)
                        sock.sendall(req.payload)
                except OSError as exc:
                    failed = exc
            req.error = failed
            req.done.set()

    def isend(self, dst: int, array: np.ndarray) -> Request:
        self._check_peer(dst)
        if self._closed:
            raise PeerFailure(f"rank {self.rank}: transport closed")
        a = contiguous(array)
        req = _Send(framing.encode_header(a), memoryview(a.reshape(-1).view(np.uint8)), self, dst)
        self._queues[dst].put(req)
        return req

    def _header(self, src: int) -> tuple[np.dtype, tuple[int, ...]]:
        self._check_peer(src)
        sock = self.socks.get(src)
        if sock is None or self._closed:
            raise PeerFailure(f"rank {self.rank}: no connection to rank {src} (transport closed)")
        try:
            dtype, ndim, nbytes = framing.decode_fixed(_recv_exact(sock, framing.HEADER_FIXED))
            shape = framing.decode_shape(_recv_exact(sock, 8 * ndim), ndim, dtype, nbytes, self.max_message_bytes)
        except socket.timeout:
            raise PeerFailure(f"rank {self.rank}: no message from rank {src} within {self.timeout:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise PeerFailure(f"rank {self.rank}: connection to rank {src} lost ({exc}); the peer failed "
                              "or aborted") from None
        return dtype, shape

    def _payload(self, src: int, out: np.ndarray) -> None:
        try:
            _recv_into_exact(self.socks[src], memoryview(out.reshape(-1).view(np.uint8)))
        except socket.timeout:
            raise PeerFailure(f"rank {self.rank}: message from rank {src} stalled for {self.timeout:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise PeerFailure(f"rank {self.rank}: connection to rank {src} lost mid-message ({exc})") from None

    def recv_into(self, src: int, out: np.ndarray) -> None:
        dtype, shape = self._header(src)
        try:
            framing.check_matches(dtype, shape, out, src)
        except framing.FramingError:
            self.abort("protocol mismatch")
            raise
        self._payload(src, out)

    def recv(self, src: int) -> np.ndarray:
        dtype, shape = self._header(src)
        out = np.empty(shape, dtype=dtype)
        self._payload(src, out)
        return out

    def recv_reduce(self, src: int, acc: np.ndarray, op: Reduction) -> None:
        """Receive in cache-sized pieces into a reused scratch buffer and reduce each piece while it is hot."""
        dtype, shape = self._header(src)
        try:
            framing.check_matches(dtype, shape, acc, src)
        except framing.FramingError:
            self.abort("protocol mismatch")
            raise
        scratch = self._scratch.get(src)
        if scratch is None:
            scratch = self._scratch[src] = np.empty(_PIECE, dtype=np.uint8)
        flat = acc.reshape(-1)
        step = max(1, _PIECE // acc.dtype.itemsize)
        for a in range(0, flat.size, step):
            target = flat[a:a + step]
            piece = scratch[:target.nbytes].view(acc.dtype)
            self._payload(src, piece)
            op(target, piece, out=target)

    def abort(self, reason: str) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self._queues.values():
            q.put(None)
        for sock in self.socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for t in self._threads:
            t.join(timeout=1.0)
