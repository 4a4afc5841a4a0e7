"""The board's HTTP/1.1 connection handling: one selector thread reads request heads, a fixed pool of worker
threads answers complete requests.

A thread per connection (the standard library's ``ThreadingHTTPServer``) lets idle or slow clients hold
threads: 200 idle sockets kept 200 threads for as long as their clients liked.  Here a connection costs a
worker only while its response is being produced and sent.  The selector thread accepts connections (at most
``max_connections`` open; past that the one waiting longest is closed), reads whatever bytes arrive without
blocking, and hands a connection to the pool only once a whole request head (up to the blank line, at most
``MAX_HEAD_BYTES``) is in; a connection that has not sent one within ``head_timeout`` seconds of being
accepted or of its previous response is closed, so trickling a header a byte at a time (slowloris) holds no
worker.  A worker builds the whole response in memory and sends what the socket takes at once; the rest is
sent by the selector thread as the client reads it (at most ``SEND_BUFFER_BYTES`` held over all connections;
past that the worker sends itself), and a client that has not read its response within ``send_timeout``
seconds is dropped.  A keep-alive connection goes back to waiting for its next request head.  The board only
serves ``GET`` and ``HEAD``; a request with a body is answered and its connection closed, so bodies are never
read.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from queue import Empty, SimpleQueue
from typing import Any

MAX_HEAD_BYTES = 64 * 1024
SEND_BUFFER_BYTES = 64 * 1024 * 1024
"""Response bytes the selector thread holds for slow readers, over all connections."""
logger = logging.getLogger("fedarena.board")


class _ResponseBuffer(io.RawIOBase):
    """``wfile`` of a handler: the response is collected here and sent by the server."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.chunks.append(bytes(b))
        return len(b)


class OneRequestHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` that answers exactly one request whose head was already read."""

    protocol_version = "HTTP/1.1"

    def __init__(self, conn: socket.socket, client_address: Any, server: "PooledHTTPServer", head: bytes):
        # deliberately not BaseRequestHandler.__init__: the head is in memory, the socket only sends
        self.request = self.connection = conn
        self.client_address = client_address
        self.server = server
        self.rfile = io.BytesIO(head)
        self.wfile = _ResponseBuffer()
        self.close_connection = True
        self.handle_one_request()


class _Waiting:
    __slots__ = ("buf", "deadline", "address")

    def __init__(self, buf: bytes, deadline: float, address: Any):
        self.buf, self.deadline, self.address = bytearray(buf), deadline, address


class _Sending:
    __slots__ = ("data", "sent", "deadline", "keep", "rest", "address")

    def __init__(self, data: bytes, deadline: float, keep: bool, rest: bytes, address: Any):
        self.data, self.sent, self.deadline = memoryview(data), 0, deadline
        self.keep, self.rest, self.address = keep, rest, address


class PooledHTTPServer:
    """An HTTP server with a bounded worker pool; ``handler`` is a :class:`OneRequestHandler` subclass."""

    def __init__(self, address: tuple[str, int], handler: type[OneRequestHandler], *, workers: int = 8,
                 max_connections: int = 512, head_timeout: float = 15.0, send_timeout: float = 30.0):
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=128)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.handler = handler
        self.max_connections = int(max_connections)
        self.head_timeout = float(head_timeout)
        self.send_timeout = float(send_timeout)
        self._pool = ThreadPoolExecutor(int(workers), thread_name_prefix="fedarena-board")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: SimpleQueue[tuple[socket.socket, _Sending | None, bytes, Any]] = SimpleQueue()
        self._waiting: dict[socket.socket, _Waiting] = {}
        self._sending: dict[socket.socket, _Sending] = {}
        self._buffered = 0  # bytes held in self._sending (workers add, the selector thread subtracts)
        self._buffered_lock = threading.Lock()
        self._busy = 0  # connections with a worker (touched by the selector thread only)
        self._finished: SimpleQueue[None] = SimpleQueue()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    # -- the selector thread
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop.clear()
        self._stopped.clear()
        self._selector.register(self.socket, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=poll_interval):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data == "send":
                        self._write(key.fileobj)  # type: ignore[arg-type]
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire(time.monotonic())
        finally:
            self._selector.unregister(self.socket)
            self._selector.unregister(self._wake_r)
            for conn in [*self._waiting, *self._sending]:
                self._close(conn)
            self._stopped.set()

    def _open(self) -> int:
        while True:
            try:
                self._finished.get_nowait()
                self._busy -= 1
            except Empty:
                return len(self._waiting) + len(self._sending) + self._busy

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving the open ones
                logger.warning("board: accept failed (%s)", exc)
                return
            if self._open() >= self.max_connections:
                if not self._waiting:
                    conn.close()
                    continue
                self._close(min(self._waiting, key=lambda c: self._waiting[c].deadline))
            conn.setblocking(False)
            self._watch(conn, b"", address)

    def _watch(self, conn: socket.socket, buf: bytes, address: Any) -> None:
        w = _Waiting(buf, time.monotonic() + self.head_timeout, address)
        self._waiting[conn] = w
        if not self._dispatch_if_complete(conn, w):
            self._selector.register(conn, selectors.EVENT_READ, "conn")

    def _read(self, conn: socket.socket) -> None:
        w = self._waiting.get(conn)
        if w is None:
            return
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        w.buf += data
        if self._dispatch_if_complete(conn, w):
            self._selector.unregister(conn)
        elif len(w.buf) > MAX_HEAD_BYTES:
            self._close(conn)

    def _dispatch_if_complete(self, conn: socket.socket, w: _Waiting) -> bool:
        end = w.buf.find(b"\r\n\r\n")
        end = end + 4 if end >= 0 else -1
        if end < 0:
            lf = w.buf.find(b"\n\n")
            end = lf + 2 if lf >= 0 else -1
        if end < 0 or end > MAX_HEAD_BYTES:
            return False
        del self._waiting[conn]
        self._busy += 1
        self._pool.submit(self._answer, conn, bytes(w.buf[:end]), bytes(w.buf[end:]), w.address)
        return True

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, sending, rest, address = self._returned.get_nowait()
            except Empty:
                return
            if self._stop.is_set():
                if sending is not None:
                    self._release(sending)
                conn.close()
            elif sending is not None:
                self._sending[conn] = sending
                self._selector.register(conn, selectors.EVENT_WRITE, "send")
            else:
                self._watch(conn, rest, address)

    def _write(self, conn: socket.socket) -> None:
        s = self._sending.get(conn)
        if s is None:
            return
        try:
            s.sent += conn.send(s.data[s.sent:s.sent + 256 * 1024])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if s.sent < len(s.data):
            return
        del self._sending[conn]
        self._selector.unregister(conn)
        self._release(s)
        if s.keep and not self._stop.is_set():
            self._watch(conn, s.rest, s.address)
        else:
            conn.close()

    def _release(self, s: _Sending) -> None:
        with self._buffered_lock:
            self._buffered -= len(s.data)

    def _expire(self, now: float) -> None:
        for conn in [c for c, w in self._waiting.items() if w.deadline < now]:
            self._close(conn)
        for conn in [c for c, s in self._sending.items() if s.deadline < now]:
            self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        watched = self._waiting.pop(conn, None) is not None
        sending = self._sending.pop(conn, None)
        if sending is not None:
            self._release(sending)
        if watched or sending is not None:
            try:
                self._selector.unregister(conn)
            except (KeyError, ValueError):
                pass
        try:
            conn.close()
        except OSError:
            pass

    # -- a worker
    def _answer(self, conn: socket.socket, head: bytes, rest: bytes, address: Any) -> None:
        keep, data = False, b""
        try:
            h = self.handler(conn, address, self, head)
            keep = not h.close_connection and not self._stop.is_set()
            data = b"".join(h.wfile.chunks)
            sent = 0
            while sent < len(data):  # what the socket takes at once (the socket is non-blocking)
                try:
                    sent += conn.send(data[sent:])
                except (BlockingIOError, InterruptedError):
                    break
            data = data[sent:]
            if data:
                with self._buffered_lock:
                    hand_over = self._buffered + len(data) <= SEND_BUFFER_BYTES
                    if hand_over:
                        self._buffered += len(data)
                if not hand_over:  # too much held for slow readers: this worker sends, under the timeout
                    conn.setblocking(True)
                    conn.settimeout(self.send_timeout)
                    conn.sendall(data)
                    conn.setblocking(False)
                    data = b""
        except (OSError, ValueError):
            keep, data = False, b""
            try:
                conn.close()
            except OSError:
                pass
            return
        except Exception:  # noqa: BLE001 - a failing handler must not kill the worker
            logger.exception("board: request handler failed")
            conn.close()
            return
        finally:
            self._finished.put(None)
        if data:
            self._hand_back(conn, _Sending(data, time.monotonic() + self.send_timeout, keep, rest, address), rest,
                            address)
        elif keep:
            self._hand_back(conn, None, rest, address)
        else:
            conn.close()

    def _hand_back(self, conn: socket.socket, sending: _Sending | None, rest: bytes, address: Any) -> None:
        self._returned.put((conn, sending, rest, address))
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass  # the selector has a wake-up pending already
        except OSError:
            conn.close()

    # -- control from other threads
    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it to return."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and let the workers finish (their connections close after the response)."""
        self.socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
