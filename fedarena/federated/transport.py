"""gRPC transport for federated nodes: one bidirectional-streaming method carrying wire-codec frames.

Every node (scheduler, server) exposes the gRPC method ``/fedarena.federated.v1.Node/Exchange``
(stream of bytes -> stream of bytes, registered with a grpcio *generic handler*, no protobuf).
A request is one :mod:`fedarena.federated.wire` envelope split into frames; the reply is one
envelope split into frames. A reply of kind ``error`` carries ``{code, field, reason}``; the client
side raises it as :class:`RemoteError`. gRPC's own per-message limit is set to one frame, so a peer
that sends an oversize gRPC message is cut off by gRPC itself (RESOURCE_EXHAUSTED) and an oversize
stream is refused at its first frame by :class:`~fedarena.federated.wire.FrameAssembler`.

The handler never lets an exception escape: malformed frames or envelopes, protocol violations and
internal faults all become error replies, so a hostile peer cannot stop a node from serving.
TLS is used when a certificate and key are configured (``grpc.ssl_server_credentials``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import grpc

from fedarena.federated import wire

SERVICE = "fedarena.federated.v1.Node"
METHOD = "Exchange"
FULL_METHOD = f"/{SERVICE}/{METHOD}"

log = logging.getLogger("fedarena.federated.transport")


class ProtocolError(Exception):
    """A request that is well-formed on the wire but not acceptable; becomes an ``error`` reply."""

    def __init__(self, field: str, reason: str, code: str = "rejected") -> None:
        self.field, self.reason, self.code = field, reason, code
        super().__init__(f"{code}: {field}: {reason}")


class RemoteError(Exception):
    """The peer answered with an ``error`` reply."""

    def __init__(self, code: str, field: str, reason: str) -> None:
        self.code, self.field, self.reason = code, field, reason
        super().__init__(f"{code}: {field}: {reason}")


class TransportError(Exception):
    """The peer could not be reached, timed out, or cut the stream (``code`` is the gRPC status name)."""

    def __init__(self, code: str, details: str) -> None:
        self.code, self.details = code, details
        super().__init__(f"{code}: {details}")


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for TLS: the server's certificate chain and key; clients need the root certificate."""

    cert_chain: str = ""
    private_key: str = ""
    root_cert: str = ""
    server_name: str = ""
    """name to check in the server certificate (defaults to the host of the address)"""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_chain or self.root_cert)


Handler = Callable[[wire.Message, int], tuple[str, Mapping[str, Any]]]
"""``handler(request, request_bytes) -> (reply_kind, reply_body)``; may raise ProtocolError / WireError."""


def _channel_options(chunk_bytes: int) -> list[tuple[str, int]]:
    frame_cap = chunk_bytes + 4096
    return [
        ("grpc.max_receive_message_length", frame_cap),
        ("grpc.max_send_message_length", frame_cap),
    ]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def serve(
    handler: Handler,
    address: str,
    *,
    kinds: Iterable[str],
    limits: wire.Limits = wire.DEFAULT_LIMITS,
    chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
    max_workers: int = 64,
    tls: TLSFiles | None = None,
    name: str = "node",
) -> tuple[grpc.Server, int]:
    """Start a gRPC server running ``handler`` on ``address`` ('host:port', port 0 = any); returns (server, port)."""
    from concurrent import futures

    allowed = frozenset(kinds)
    counter = {"errors": 0}
    lock = threading.Lock()

    def exchange(request_iterator, context):
        try:
            asm = wire.FrameAssembler(limits)
            for frame in request_iterator:
                if asm.add(frame):
                    break
            data = asm.result()
            msg = wire.decode(data, limits, kinds=allowed)
            kind, body = handler(msg, len(data))
        except wire.WireError as e:
            kind, body = "error", wire.error_body(e.field, e.reason, "malformed")
        except ProtocolError as e:
            kind, body = "error", wire.error_body(e.field, e.reason, e.code)
        except grpc.RpcError:  # the peer went away mid-stream; nothing to answer
            return
        except Exception as e:  # noqa: BLE001 - a node keeps serving whatever a request does
            log.exception("%s: internal error while handling a request", name)
            kind, body = "error", wire.error_body("server", f"internal error ({type(e).__name__})", "internal")
        if kind == "error":
            with lock:
                counter["errors"] += 1
            log.info("%s: refused request: %s %s: %s", name, body.get("code"), body.get("field"), body.get("reason"))
        try:
            data = wire.encode(kind, body, limits)
        except wire.WireError as e:
            log.error("%s: reply could not be encoded: %s", name, e)
            data = wire.encode("error", wire.error_body("server", "reply could not be encoded", "internal"))
        yield from wire.split_frames(data, chunk_bytes)

    method = grpc.stream_stream_rpc_method_handler(exchange)  # no (de)serializers: raw bytes
    generic = grpc.method_handlers_generic_handler(SERVICE, {METHOD: method})
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name),
        handlers=[generic],
        options=_channel_options(chunk_bytes),
        maximum_concurrent_rpcs=max_workers * 4,
    )
    if tls is not None and tls.cert_chain:
        creds = grpc.ssl_server_credentials([(_read(tls.private_key), _read(tls.cert_chain))])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"{name}: could not bind {address}")
    server.start()
    server.error_replies = counter  # type: ignore[attr-defined]  # read by tests and status replies
    return server, port


class Peer:
    """Client side of the Exchange method for one address; thread-safe, reuses one channel."""

    def __init__(
        self,
        address: str,
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
    ) -> None:
        self.address = address
        self.limits = limits
        self.chunk_bytes = chunk_bytes
        options = _channel_options(chunk_bytes)
        if tls is not None and tls.root_cert:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.root_cert))
            if tls.server_name:
                options = options + [("grpc.ssl_target_name_override", tls.server_name)]
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = self._channel.stream_stream(FULL_METHOD)
        self.bytes_sent = 0
        self.bytes_received = 0

    def exchange_frames(self, frames: list[bytes], timeout: float) -> bytes:
        """Send raw frames and return the reassembled reply envelope bytes (used by fuzzers too)."""
        try:
            replies = self._stub(iter(frames), timeout=timeout)
            asm = wire.FrameAssembler(self.limits)
            for frame in replies:
                self.bytes_received += len(frame)
                asm.add(frame)
            data = asm.result()
        except grpc.RpcError as e:
            code = e.code().name if hasattr(e, "code") and e.code() is not None else "UNKNOWN"
            raise TransportError(code, e.details() if hasattr(e, "details") else str(e)) from None
        self.bytes_sent += sum(len(f) for f in frames)
        return data

    def call(self, kind: str, body: Mapping[str, Any], timeout: float = 10.0) -> wire.Message:
        """One request/reply; raises RemoteError for an ``error`` reply, TransportError if unreachable."""
        frames = list(wire.split_frames(wire.encode(kind, body, self.limits), self.chunk_bytes))
        reply = wire.decode(self.exchange_frames(frames, timeout), self.limits)
        if reply.kind == "error":
            b = reply.body
            raise RemoteError(str(b.get("code", "")), str(b.get("field", "")), str(b.get("reason", "")))
        return reply

    def close(self) -> None:
        self._channel.close()
