"""Client and cluster authentication tokens for the federated runtime (HMAC-SHA256, RFC 2104).

A deployment has one secret (32 bytes from ``secrets``). The token of client ``c`` is
``hex(HMAC-SHA256(secret, "client:" + c))`` and the token of cluster members (servers, the observer)
is ``hex(HMAC-SHA256(secret, "cluster"))``. Any server can check any client's token without shared
per-client state (the loosely coupled property: a client may contact any server), and tokens are
compared in constant time. Client ids are restricted to ``[A-Za-z0-9_.-]{1,64}``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def new_secret() -> bytes:
    """A fresh deployment secret (cryptographic randomness)."""
    return secrets.token_bytes(32)


def client_token(secret: bytes, client_id: str) -> str:
    return hmac.new(secret, b"client:" + client_id.encode("utf-8"), hashlib.sha256).hexdigest()


def cluster_token(secret: bytes) -> str:
    return hmac.new(secret, b"cluster", hashlib.sha256).hexdigest()


def valid_client_id(client_id: object) -> bool:
    return isinstance(client_id, str) and bool(_CLIENT_ID.match(client_id))


def check_client(secret: bytes, client_id: object, token: object) -> str | None:
    """None when ``token`` is ``client_id``'s token, else the reason it is refused."""
    if not valid_client_id(client_id):
        return "client_id must match [A-Za-z0-9_.-]{1,64}"
    if not isinstance(token, str) or not hmac.compare_digest(token.encode("utf-8", "replace"),
                                                             client_token(secret, client_id).encode()):
        return "invalid authentication token"
    return None


def check_cluster(secret: bytes, token: object) -> bool:
    return isinstance(token, str) and hmac.compare_digest(token.encode("utf-8", "replace"),
                                                          cluster_token(secret).encode())
