"""gRPC transport for federated nodes: one bidirectional-streaming method carrying wire-codec frames.

Every node (scheduler, server, vertical-FL party) exposes the gRPC method
``/fedarena.federated.v1.Node/Exchange`` (stream of bytes -> stream of bytes, registered with a
grpcio *generic handler*, no protobuf). A request is one :mod:`fedarena.federated.wire` envelope
split into frames; the reply is one envelope split into frames. A reply of kind ``error`` carries
``{code, field, reason}``; the client side raises it as :class:`RemoteError`.

Hostile peers (issue 17, finding 5). The server side runs on ``grpc.aio``: a stream that sends
nothing holds no thread, only a coroutine. Before a single request frame is read, a stream is
*admitted*:

1. its metadata credentials (:class:`~fedarena.federated.auth.Credentials`) are checked by the
   node's authenticator; bad credentials get an ``unauthenticated`` error reply at once, without
   reading the request. A stream without credentials is *anonymous*: it may only ``ping``, its
   request may be at most ``StreamLimits.anonymous_message_bytes`` long and must arrive within
   ``anonymous_deadline_s``, and at most ``max_anonymous_streams`` of them (``..._per_host`` from
   one IP address) are open at a time;
2. an authenticated peer may have at most ``max_streams_per_peer`` open streams;
3. the size the first frame declares is reserved against the peer's and the node's bytes-in-flight
   budgets (``peer_bytes_in_flight`` / ``bytes_in_flight``) before anything is buffered.
   Cluster members (holders of the deployment secret; a server relays SecAgg messages for all its
   clients at once) are held to the node's budget and their own thread pools, not to per-peer limits;
4. the whole request must arrive within ``request_deadline_s``.

A refused stream gets an error reply (``unauthenticated``, ``unavailable`` or ``timeout``, naming
the field and the reason) and its slots are released. Decoding, the node's handler and encoding
run on three thread pools: clients (``workers``), cluster members (``cluster_workers``: partials,
relayed SecAgg messages, models) and the cluster's health checks (``health_workers``: the servers'
``sync`` heartbeats and the scheduler's pings, told apart by the ``fedarena-kind`` metadata that
:class:`Peer` sends and the node checks against the decoded request). Clients, however many or slow,
cannot starve the cluster, and busy cluster traffic cannot starve its heartbeats. gRPC's
per-message limit is one frame, and server keep-alive pings drop dead connections.

The handler never lets an exception escape: malformed frames or envelopes, protocol violations and
internal faults all become error replies, so a hostile peer cannot stop a node from serving.
TLS is used when a certificate and key are configured; with ``TLSFiles.mutual`` both sides present
certificates signed by the shared root (mutual TLS; :mod:`fedarena.federated.certs` makes a
loopback CA for tests and shipped configs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import grpc
import grpc.aio

from fedarena.federated import auth, wire

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
    """PEM files for TLS: this node's certificate chain and key, and the root certificate peers are checked against.

    With ``mutual`` a server requires every caller to present a certificate signed by ``root_cert``
    and a caller presents ``cert_chain``/``private_key`` (mutual TLS)."""

    cert_chain: str = ""
    private_key: str = ""
    root_cert: str = ""
    server_name: str = ""
    """name to check in the server certificate (defaults to the host of the address)"""
    mutual: bool = False
    """mutual TLS: servers require client certificates and callers present theirs"""
    client_certs: str = ""
    """mutual TLS with one certificate per client: a folder of ``<client id>.pem`` / ``<client id>.key``, each
    naming its client id (common name or a DNS subject alternative name). A client presents its own instead of
    ``cert_chain``, and nodes refuse a client stream whose token's client id is not named by its certificate"""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_chain or self.root_cert)

    def for_client(self, client_id: str) -> "TLSFiles":
        """The files client ``client_id`` connects with: its own certificate and key when ``client_certs`` is set."""
        if not self.client_certs:
            return self
        import dataclasses
        import os.path

        return dataclasses.replace(self, cert_chain=os.path.join(self.client_certs, f"{client_id}.pem"),
                                   private_key=os.path.join(self.client_certs, f"{client_id}.key"))

    def __post_init__(self) -> None:
        if self.mutual and not (self.cert_chain and self.private_key and self.root_cert):
            raise ValueError("tls.mutual: needs cert_chain, private_key and root_cert")
        if self.client_certs and not self.mutual:
            raise ValueError("tls.client_certs: per-client certificates need mutual TLS (tls.mutual)")


def certificate_names(auth_context: Mapping[str, Any]) -> set[str]:
    """Common name and subject alternative names of a peer's verified certificate (gRPC's auth context)."""
    out: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for v in auth_context.get(key, ()) or ():
            out.add(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
    return out


@dataclass(frozen=True)
class StreamLimits:
    """What one node grants a stream before and while it reads the request (see the module docstring)."""

    max_streams_per_peer: int = 8
    """open streams one authenticated peer (client id, cluster member, party) may have"""
    peer_bytes_in_flight: int = 0
    """request bytes one peer may have in flight over all its streams (0 = one maximum-size message)"""
    bytes_in_flight: int = 0
    """request bytes all streams together may have in flight (0 = four maximum-size messages)"""
    max_anonymous_streams: int = 32
    """open streams without credentials, all hosts together"""
    max_anonymous_streams_per_host: int = 8
    """open streams without credentials from one IP address"""
    anonymous_message_bytes: int = 4096
    """largest request of a stream without credentials"""
    request_deadline_s: float = 120.0
    """time an authenticated peer has to deliver its whole request"""
    anonymous_deadline_s: float = 5.0
    """time a stream without credentials has to deliver its request"""
    workers: int = 64
    """threads for requests of clients and anonymous pings"""
    cluster_workers: int = 64
    """threads for cluster members' requests other than health checks (partials, SecAgg relays, models)"""
    health_workers: int = 32
    """threads reserved for the cluster's health checks: servers' sync heartbeats and pings"""
    keepalive_s: float = 30.0
    """server keep-alive ping interval; a peer that does not answer within keepalive_s / 2 is dropped"""

    def __post_init__(self) -> None:
        for name in ("max_streams_per_peer", "max_anonymous_streams", "max_anonymous_streams_per_host",
                     "anonymous_message_bytes", "workers", "cluster_workers", "health_workers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"stream_limits.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("peer_bytes_in_flight", "bytes_in_flight"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"stream_limits.{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("request_deadline_s", "anonymous_deadline_s", "keepalive_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"stream_limits.{name}: must be > 0, got {getattr(self, name)}")


DEFAULT_STREAM_LIMITS = StreamLimits()

HEALTH_KINDS = frozenset({"ping", "sync"})
"""request kinds that run on the health pool when a cluster member sends them"""
KIND_KEY = "fedarena-kind"

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


def _host(peer: str) -> str:
    """'ipv4:127.0.0.1:5555' -> '127.0.0.1'; '[::1]:1' forms keep the address part."""
    addr = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return addr.rsplit(":", 1)[0]


class _Refusal(Exception):
    def __init__(self, code: str, field: str, reason: str) -> None:
        self.code, self.field, self.reason = code, field, reason
        super().__init__(reason)


class _Admission:
    """Counters of open streams and reserved bytes, per peer and in total (guarded by one lock)."""

    def __init__(self, limits: StreamLimits, max_message_bytes: int) -> None:
        self.limits = limits
        self.peer_bytes = limits.peer_bytes_in_flight or max_message_bytes
        self.total_bytes = limits.bytes_in_flight or 4 * max_message_bytes
        self._lock = threading.Lock()
        self.streams: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.anonymous = 0
        self.anonymous_hosts: dict[str, int] = {}
        self.bytes_total = 0
        self.refused: dict[str, int] = {}

    def _refuse(self, code: str, field: str, reason: str) -> _Refusal:
        self.refused[code] = self.refused.get(code, 0) + 1
        return _Refusal(code, field, reason)

    def open(self, key: str, host: str, anonymous: bool, trusted: bool = False) -> None:
        """Count a new stream; ``trusted`` (cluster members) skips the per-peer stream limit."""
        with self._lock:
            if anonymous:
                if self.anonymous >= self.limits.max_anonymous_streams:
                    raise self._refuse("unavailable", "stream", f"{self.anonymous} unauthenticated streams already "
                                       "open (send credentials in the stream metadata)")
                if self.anonymous_hosts.get(host, 0) >= self.limits.max_anonymous_streams_per_host:
                    raise self._refuse("unavailable", "stream", f"too many unauthenticated streams from {host}")
                self.anonymous += 1
                self.anonymous_hosts[host] = self.anonymous_hosts.get(host, 0) + 1
                return
            if not trusted and self.streams.get(key, 0) >= self.limits.max_streams_per_peer:
                raise self._refuse("unavailable", "stream", f"{key} already has {self.limits.max_streams_per_peer} "
                                   "open streams")
            self.streams[key] = self.streams.get(key, 0) + 1

    def close(self, key: str, host: str, anonymous: bool, reserved: int) -> None:
        with self._lock:
            if anonymous:
                self.anonymous -= 1
                left = self.anonymous_hosts[host] - 1
                if left:
                    self.anonymous_hosts[host] = left
                else:
                    del self.anonymous_hosts[host]
            else:
                left = self.streams[key] - 1
                if left:
                    self.streams[key] = left
                else:
                    del self.streams[key]
            if reserved:
                self.bytes_total -= reserved
                left = self.bytes[key] - reserved
                if left:
                    self.bytes[key] = left
                else:
                    del self.bytes[key]

    def reserve(self, key: str, nbytes: int, trusted: bool = False) -> None:
        """Reserve request bytes; ``trusted`` (cluster members) is held to the node's budget only."""
        with self._lock:
            mine = self.bytes.get(key, 0)
            if not trusted and mine + nbytes > self.peer_bytes:
                raise self._refuse("unavailable", "frame.total_bytes", f"{nbytes} more bytes would put {key} over its "
                                   f"{self.peer_bytes} bytes in flight ({mine} already)")
            if self.bytes_total + nbytes > self.total_bytes:
                raise self._refuse("unavailable", "frame.total_bytes", f"node has {self.bytes_total} of "
                                   f"{self.total_bytes} request bytes in flight; retry later")
            self.bytes[key] = mine + nbytes
            self.bytes_total += nbytes


class NodeServer:
    """A running gRPC node: an asyncio event loop on its own thread plus two handler thread pools.

    ``stop(grace)`` ends it; ``error_replies["errors"]`` counts error replies; ``admission`` exposes
    the open-stream and bytes-in-flight counters (read by tests and status pages).
    """

    def __init__(self, handler: Handler, address: str, *, kinds: Iterable[str], limits: wire.Limits,
                 chunk_bytes: int, tls: TLSFiles | None, name: str, authenticator: Any,
                 stream_limits: StreamLimits, pass_identity: bool = False) -> None:
        self.name = name
        self.pass_identity = pass_identity
        self.bind_client_certs = bool(tls is not None and tls.mutual and tls.client_certs)
        self.handler = handler
        self.kinds = frozenset(kinds)
        self.limits = limits
        self.anonymous_limits = wire.Limits(max_message_bytes=min(limits.max_message_bytes,
                                                                  stream_limits.anonymous_message_bytes),
                                            max_elements=limits.max_elements, max_ndim=limits.max_ndim,
                                            max_depth=limits.max_depth, max_frames=limits.max_frames)
        self.chunk_bytes = chunk_bytes
        self.authenticator = authenticator
        self.stream_limits = stream_limits
        self.admission = _Admission(stream_limits, limits.max_message_bytes)
        self.error_replies = {"errors": 0}
        self._count_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(stream_limits.workers, thread_name_prefix=name)
        self._cluster_pool = concurrent.futures.ThreadPoolExecutor(stream_limits.cluster_workers,
                                                                   thread_name_prefix=f"{name}-cluster")
        self._health_pool = concurrent.futures.ThreadPoolExecutor(stream_limits.health_workers,
                                                                  thread_name_prefix=f"{name}-health")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-grpc", daemon=True)
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(address, tls), self._loop).result(timeout=30)
        except BaseException:
            self._shutdown_loop()
            raise

    async def _start(self, address: str, tls: TLSFiles | None) -> int:
        keepalive_ms = int(self.stream_limits.keepalive_s * 1000)
        options = _channel_options(self.chunk_bytes) + [
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", max(1000, keepalive_ms // 2)),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        self._server = grpc.aio.server(options=options)
        method = grpc.stream_stream_rpc_method_handler(self._exchange)  # no (de)serializers: raw bytes
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {METHOD: method})])
        if tls is not None and tls.cert_chain:
            creds = grpc.ssl_server_credentials(
                [(_read(tls.private_key), _read(tls.cert_chain))],
                root_certificates=_read(tls.root_cert) if tls.mutual else None,
                require_client_auth=bool(tls.mutual))
            port = self._server.add_secure_port(address, creds)
        else:
            port = self._server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"{self.name}: could not bind {address}")
        await self._server.start()
        return port

    # ------------------------------------------------------------------ one stream

    def _error_frames(self, code: str, field: str, reason: str) -> list[bytes]:
        with self._count_lock:
            self.error_replies["errors"] += 1
        log.info("%s: refused request: %s %s: %s", self.name, code, field, reason)
        data = wire.encode("error", wire.error_body(field, reason, code))
        return list(wire.split_frames(data, self.chunk_bytes))

    async def _exchange(self, request_iterator, context):
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        try:
            identity = self.authenticator.identify(metadata)
        except auth.Refused as e:  # refused before reading a single frame
            for frame in self._error_frames("unauthenticated", e.field, e.reason):
                yield frame
            return
        if identity.role == "client" and self.bind_client_certs:
            names = certificate_names(context.auth_context() or {})
            if identity.name not in names:  # a client's certificate speaks for one client id only
                shown = ", ".join(sorted(names)[:3]) or "no name"
                for frame in self._error_frames("unauthenticated", "metadata.fedarena-id",
                                                f"client {identity.name!r} presents the TLS certificate of {shown}"):
                    yield frame
                return
        anonymous = identity.anonymous
        trusted = identity.role == "cluster"  # holders of the deployment secret: a server relays for many clients
        key = f"{identity.role}:{identity.name}"
        host = _host(context.peer() or "")
        try:
            self.admission.open(key, host, anonymous, trusted)
        except _Refusal as e:
            for frame in self._error_frames(e.code, e.field, e.reason):
                yield frame
            return
        reserved = 0
        try:
            limits = self.anonymous_limits if anonymous else self.limits
            deadline = self.stream_limits.anonymous_deadline_s if anonymous else self.stream_limits.request_deadline_s
            asm = wire.FrameAssembler(limits)
            try:
                async with asyncio.timeout(deadline):
                    async for frame in request_iterator:
                        done = asm.add(frame)
                        if not reserved and asm.declared_bytes:
                            self.admission.reserve(key, asm.declared_bytes, trusted)
                            reserved = asm.declared_bytes
                        if done:
                            break
                data = asm.result()
            except TimeoutError:
                raise _Refusal("timeout", "stream", f"request not complete within {deadline:g} s") from None
            except wire.WireError as e:
                raise _Refusal("malformed", e.field, e.reason) from None
            if identity.role != "cluster":
                pool = self._pool
            else:
                pool = self._health_pool if metadata.get(KIND_KEY) in HEALTH_KINDS else self._cluster_pool
            reply = await asyncio.get_running_loop().run_in_executor(pool, self._process, identity, metadata, data)
        except _Refusal as e:
            reply = self._error_frames(e.code, e.field, e.reason)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:  # noqa: BLE001 - an internal fault while reading
            log.exception("%s: internal error while reading a request", self.name)
            reply = self._error_frames("internal", "server", f"internal error ({type(e).__name__})")
        finally:
            self.admission.close(key, host, anonymous, reserved)
        for frame in reply:
            yield frame

    def _process(self, identity: auth.Identity, metadata: Mapping[str, str], data: bytes) -> list[bytes]:
        """Check, decode, admit, handle and encode one request (on a pool thread); returns the reply frames."""
        limits = self.anonymous_limits if identity.anonymous else self.limits
        try:
            check = getattr(self.authenticator, "check_message", None)
            bad = check(identity, metadata, data) if check is not None else None
            if bad:
                return self._error_frames("unauthenticated", *bad)
            msg = wire.decode(data, limits, kinds=self.kinds)
            if KIND_KEY in metadata and metadata[KIND_KEY] != msg.kind:
                return self._error_frames("malformed", "metadata.fedarena-kind",
                                          f"stream declared {metadata[KIND_KEY]!r} but carries {msg.kind!r}")
            reason = self.authenticator.admit(identity, msg.kind, msg.body)
            if reason:
                return self._error_frames("unauthenticated", "metadata", reason)
            if self.pass_identity:
                kind, body = self.handler(msg, len(data), identity, metadata)  # type: ignore[call-arg]
            else:
                kind, body = self.handler(msg, len(data))
        except wire.WireError as e:
            kind, body = "error", wire.error_body(e.field, e.reason, "malformed")
        except ProtocolError as e:
            kind, body = "error", wire.error_body(e.field, e.reason, e.code)
        except Exception as e:  # noqa: BLE001 - a node keeps serving whatever a request does
            log.exception("%s: internal error while handling a request", self.name)
            kind, body = "error", wire.error_body("server", f"internal error ({type(e).__name__})", "internal")
        if kind == "error":
            return self._error_frames(str(body.get("code")), str(body.get("field")), str(body.get("reason")))
        try:
            out = wire.encode(kind, body, self.limits)
        except wire.WireError as e:
            log.error("%s: reply could not be encoded: %s", self.name, e)
            return self._error_frames("internal", "server", "reply could not be encoded")
        return list(wire.split_frames(out, self.chunk_bytes))

    # ------------------------------------------------------------------ lifecycle

    def stop(self, grace: float | None = None) -> None:
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop).result(
                    timeout=(grace or 0.0) + 10.0)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("%s: gRPC server did not stop in time", self.name)
        self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cluster_pool.shutdown(wait=False, cancel_futures=True)
        self._health_pool.shutdown(wait=False, cancel_futures=True)


def serve(
    handler: Handler,
    address: str,
    *,
    kinds: Iterable[str],
    limits: wire.Limits = wire.DEFAULT_LIMITS,
    chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
    tls: TLSFiles | None = None,
    name: str = "node",
    secret: bytes | None = None,
    authenticator: Any = None,
    stream_limits: StreamLimits = DEFAULT_STREAM_LIMITS,
    pass_identity: bool = False,
) -> tuple[NodeServer, int]:
    """Start a node running ``handler`` on ``address`` ('host:port', port 0 = any); returns (server, port).

    Streams are authenticated from their metadata by ``authenticator`` (an object with
    ``identify(metadata) -> Identity`` and ``admit(identity, kind, body) -> reason | None``), by
    default :class:`~fedarena.federated.auth.NodeAuthenticator` over ``secret``. One of the two
    must be given: there is no node that skips authentication. An authenticator may also define
    ``check_message(identity, metadata, data) -> (field, reason) | None`` (run on the raw request
    bytes before decoding). With ``pass_identity`` the handler is called as
    ``handler(request, request_bytes, identity, metadata)``.
    """
    if authenticator is None:
        if secret is None:
            raise ValueError("serve: give the deployment secret or an authenticator")
        authenticator = auth.NodeAuthenticator(secret)
    server = NodeServer(handler, address, kinds=kinds, limits=limits, chunk_bytes=chunk_bytes, tls=tls, name=name,
                        authenticator=authenticator, stream_limits=stream_limits, pass_identity=pass_identity)
    return server, server.port


class Peer:
    """Client side of the Exchange method for one address; thread-safe, reuses one channel.

    Each stream's metadata carries ``credentials`` when given, else those the request body already
    holds (``client_id`` + ``token``, or ``cluster_token``), so the receiving node authenticates it
    before reading a frame; :meth:`call` also declares the request kind (``fedarena-kind``).
    """

    def __init__(
        self,
        address: str,
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        chunk_bytes: int = wire.DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
        credentials: auth.Credentials | None = None,
    ) -> None:
        self.address = address
        self.limits = limits
        self.chunk_bytes = chunk_bytes
        self.credentials = credentials
        options = _channel_options(chunk_bytes)
        if tls is not None and tls.root_cert:
            if tls.mutual:
                creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.root_cert),
                                                     private_key=_read(tls.private_key),
                                                     certificate_chain=_read(tls.cert_chain))
            else:
                creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.root_cert))
            if tls.server_name:
                options = options + [("grpc.ssl_target_name_override", tls.server_name)]
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = self._channel.stream_stream(FULL_METHOD)
        self.bytes_sent = 0
        self.bytes_received = 0

    def exchange_frames(self, frames: list[bytes], timeout: float, credentials: auth.Credentials | None = None,
                        metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
        """Send raw frames and return the reassembled reply envelope bytes (used by fuzzers too)."""
        creds = credentials or self.credentials
        md = (creds.metadata() if creds is not None else ()) + tuple(metadata)
        try:
            replies = self._stub(iter(frames), timeout=timeout, metadata=md or None)
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

    def call(self, kind: str, body: Mapping[str, Any], timeout: float = 10.0,
             credentials: auth.Credentials | None = None, metadata: tuple[tuple[str, str], ...] = ()) -> wire.Message:
        """One request/reply; raises RemoteError for an ``error`` reply, TransportError if unreachable."""
        creds = credentials or self.credentials or auth.credentials_from_body(body)
        frames = list(wire.split_frames(wire.encode(kind, body, self.limits), self.chunk_bytes))
        reply = wire.decode(self.exchange_frames(frames, timeout, creds, ((KIND_KEY, kind),) + tuple(metadata)),
                            self.limits)
        if reply.kind == "error":
            b = reply.body
            raise RemoteError(str(b.get("code", "")), str(b.get("field", "")), str(b.get("reason", "")))
        return reply

    def close(self) -> None:
        self._channel.close()
