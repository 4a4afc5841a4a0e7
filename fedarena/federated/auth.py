"""Authentication for the federated runtime: HMAC-SHA256 tokens (RFC 2104) checked from stream metadata.

A deployment has one secret (32 bytes from ``secrets``). The token of client ``c`` is
``hex(HMAC-SHA256(secret, "client:" + c))`` and the token of cluster members (servers, the observer)
is ``hex(HMAC-SHA256(secret, "cluster"))``. Any server can check any client's token without shared
per-client state (the loosely coupled property: a client may contact any server), and tokens are
compared in constant time. Client ids are restricted to ``[A-Za-z0-9_.-]{1,64}``.

Every gRPC stream carries its credentials in its *metadata* (:class:`Credentials`: role, id,
token), which a node checks before it reads the first frame of the request
(:mod:`fedarena.federated.transport`); the tokens inside message bodies are checked again by the
handlers. Vertical-FL parties use :func:`party_token`, which binds a party name to one session id.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

ROLE_KEY = "fedarena-role"
ID_KEY = "fedarena-id"
TOKEN_KEY = "fedarena-token"
SEQ_KEY = "fedarena-seq"
MAC_KEY = "fedarena-mac"


def new_secret() -> bytes:
    """A fresh deployment secret (cryptographic randomness)."""
    return secrets.token_bytes(32)


def client_token(secret: bytes, client_id: str) -> str:
    return hmac.new(secret, b"client:" + client_id.encode("utf-8"), hashlib.sha256).hexdigest()


def cluster_token(secret: bytes) -> str:
    return hmac.new(secret, b"cluster", hashlib.sha256).hexdigest()


def party_token(secret: bytes, session: str, party: str) -> str:
    """Token of vertical-FL party ``party`` in session ``session`` (a token of one session is useless in another)."""
    return hmac.new(secret, f"party:{session}:{party}".encode("utf-8"), hashlib.sha256).hexdigest()


def valid_client_id(client_id: object) -> bool:
    return isinstance(client_id, str) and bool(_CLIENT_ID.match(client_id))


def _same(token: object, expected: str) -> bool:
    return isinstance(token, str) and hmac.compare_digest(token.encode("utf-8", "replace"), expected.encode())


def check_client(secret: bytes, client_id: object, token: object) -> str | None:
    """None when ``token`` is ``client_id``'s token, else the reason it is refused."""
    if not valid_client_id(client_id):
        return "client_id must match [A-Za-z0-9_.-]{1,64}"
    if not _same(token, client_token(secret, client_id)):  # type: ignore[arg-type]
        return "invalid authentication token"
    return None


def check_cluster(secret: bytes, token: object) -> bool:
    return _same(token, cluster_token(secret))


# ----------------------------------------------------------------------------- stream credentials


@dataclass(frozen=True)
class Credentials:
    """What a caller puts in a stream's metadata: its role (``client``, ``cluster``, ``party``), id and token."""

    role: str
    name: str
    token: str

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ROLE_KEY, self.role), (ID_KEY, self.name), (TOKEN_KEY, self.token))


@dataclass(frozen=True)
class Identity:
    """Who a node accepted a stream from; ``role == "anonymous"`` for a stream without credentials."""

    role: str
    name: str

    @property
    def anonymous(self) -> bool:
        return self.role == "anonymous"


ANONYMOUS = Identity("anonymous", "")


def client_credentials(secret: bytes, client_id: str) -> Credentials:
    return Credentials("client", client_id, client_token(secret, client_id))


def cluster_credentials(secret: bytes, member: str = "cluster") -> Credentials:
    return Credentials("cluster", member, cluster_token(secret))


def credentials_from_body(body: Mapping[str, Any]) -> Credentials | None:
    """The credentials a request body already carries (``client_id`` + ``token`` or ``cluster_token``)."""
    if isinstance(body.get("cluster_token"), str):
        sid = body.get("server_id")
        return Credentials("cluster", sid if valid_client_id(sid) else "cluster", body["cluster_token"])
    if isinstance(body.get("client_id"), str) and isinstance(body.get("token"), str):
        return Credentials("client", body["client_id"], body["token"])
    return None


class Refused(Exception):
    """Credentials that do not authenticate; ``field`` and ``reason`` go into the error reply."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


class NodeAuthenticator:
    """Checks FL stream metadata against a deployment secret (clients and cluster members).

    ``identify`` runs before any request frame is read; ``admit`` runs on the decoded request and
    refuses anonymous streams other than ``ping`` and a client whose body names another client.
    """

    anonymous_kinds = frozenset({"ping"})

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def identify(self, metadata: Mapping[str, str]) -> Identity:
        role = metadata.get(ROLE_KEY)
        if role is None:
            return ANONYMOUS
        name, token = metadata.get(ID_KEY, ""), metadata.get(TOKEN_KEY, "")
        if role == "client":
            reason = check_client(self._secret, name, token)
            if reason:
                raise Refused("metadata.fedarena-token" if valid_client_id(name) else "metadata.fedarena-id", reason)
            return Identity("client", name)
        if role == "cluster":
            if not valid_client_id(name):
                raise Refused("metadata.fedarena-id", "must match [A-Za-z0-9_.-]{1,64}")
            if not check_cluster(self._secret, token):
                raise Refused("metadata.fedarena-token", "invalid cluster token")
            return Identity("cluster", name)
        raise Refused("metadata.fedarena-role", f"unknown role {role!r} (client or cluster)")

    def admit(self, identity: Identity, kind: str, body: Mapping[str, Any]) -> str | None:
        """None when ``identity`` may send this request, else the reason it is refused."""
        if identity.anonymous:
            return None if kind in self.anonymous_kinds else \
                f"request {kind!r} needs credentials in the stream metadata (only ping is open)"
        if identity.role == "client" and "client_id" in body:
            cid = body["client_id"]
            if not (isinstance(cid, str) and cid == identity.name):  # any type may arrive here (a fuzzer sent arrays)
                shown = repr(cid) if isinstance(cid, str) else f"of type {type(cid).__name__}"
                return f"body.client_id {shown} is not the stream's authenticated client {identity.name!r}"
        return None


def message_mac(secret: bytes, session: str, sender: str, receiver: str, seq: int, data: bytes) -> str:
    """HMAC-SHA256 binding one vertical-FL message to its session, direction and position in the stream."""
    head = f"msg:{session}:{sender}:{receiver}:{seq}:".encode("utf-8")
    return hmac.new(secret, head + hashlib.sha256(data).digest(), hashlib.sha256).hexdigest()


def message_seq(metadata: Mapping[str, str]) -> int | None:
    """The stream's ``fedarena-seq`` as an int (None when missing or malformed)."""
    text = metadata.get(SEQ_KEY, "")
    return int(text) if text.isdigit() and len(text) <= 18 else None


class PartyAuthenticator:
    """Checks vertical-FL party streams arriving at party ``me``; no anonymous access.

    ``identify`` (before any frame is read): role ``party``, a party name of this session and its
    session-bound token (:func:`party_token`). ``check_message`` (after the request is read, before
    it is decoded): the stream's ``fedarena-seq`` must be the next number from that sender and
    ``fedarena-mac`` must be the :func:`message_mac` of exactly these bytes at the stream's
    ``fedarena-seq``, so a message of another session or direction, or altered, is refused; the
    receiver (:class:`~fedarena.federated.vertical.channel.GrpcLink`) takes each sender's sequence
    numbers strictly in order, which refuses replays and reorderings.
    """

    anonymous_kinds: frozenset[str] = frozenset()

    def __init__(self, secret: bytes, session: str, parties: tuple[str, ...], me: str) -> None:
        self._secret, self.session, self.me = secret, session, me
        self._tokens = {p: party_token(secret, session, p) for p in parties if p != me}

    def identify(self, metadata: Mapping[str, str]) -> Identity:
        role, name = metadata.get(ROLE_KEY), metadata.get(ID_KEY, "")
        if role != "party":
            raise Refused("metadata.fedarena-role", "a vertical-FL party must authenticate as role 'party'")
        expected = self._tokens.get(name)
        if expected is None:
            raise Refused("metadata.fedarena-id", f"{name!r} is not a peer party of this session")
        if not _same(metadata.get(TOKEN_KEY, ""), expected):
            raise Refused("metadata.fedarena-token", "invalid party token for this session")
        return Identity("party", name)

    def check_message(self, identity: Identity, metadata: Mapping[str, str], data: bytes) -> tuple[str, str] | None:
        """None when the stream's MAC covers exactly these bytes at its sequence number, else (field, reason)."""
        seq = message_seq(metadata)
        if seq is None:
            return "metadata.fedarena-seq", "missing or not a sequence number"
        mac = message_mac(self._secret, self.session, identity.name, self.me, seq, data)
        if not _same(metadata.get(MAC_KEY, ""), mac):
            return "metadata.fedarena-mac", "message MAC does not match (wrong session, direction or content)"
        return None

    def admit(self, identity: Identity, kind: str, body: Mapping[str, Any]) -> str | None:
        return None
