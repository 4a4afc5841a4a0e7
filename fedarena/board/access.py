"""Who may talk to the board: a ``Host`` / ``Origin`` allowlist (against DNS rebinding) and an access token.

DNS rebinding: a web page on ``evil.example`` re-points its own name at ``127.0.0.1`` and then reads the board
as a same-origin page; its requests carry ``Host: evil.example:8050``.  The board answers only requests whose
``Host`` is one of its names with its port (by default ``localhost``, ``127.0.0.1`` and ``[::1]``; more with
``--allow-host``) and whose ``Origin``, when sent, is ``http://`` one of those.

Token (after Jupyter's): a board bound beyond the loopback interface needs a secret by default, made with
:mod:`secrets` (or given with ``--token``) and printed in the URL at startup (``?token=...``).  A request
carries it in the ``token`` query parameter, an ``Authorization: token ...`` header, or the cookie the board
sets on the first request that had it (``HttpOnly``, ``SameSite=Strict``); it is compared in constant time
(:func:`hmac.compare_digest`).  ``--no-token`` turns it off for such a board, explicitly.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")


def _bracket(name: str) -> str:
    name = name.strip().lower()
    return f"[{name}]" if ":" in name and not name.startswith("[") else name


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on this machine only (``localhost`` or a loopback address)."""
    h = host.strip().strip("[]").lower()
    if h in WILDCARDS:
        return False
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(h, None)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Access:
    """The names the board answers to (with its port) and its token (None: no token needed)."""

    port: int
    names: frozenset[str]
    token: str | None = field(default=None, repr=False)

    @classmethod
    def for_binding(cls, host: str, port: int, token: str | None, allow_hosts: tuple[str, ...] = ()) -> "Access":
        """The loopback names, the bound address itself (unless a wildcard), and ``allow_hosts``."""
        names = {*LOOPBACK_NAMES, *(_bracket(h) for h in allow_hosts if h.strip())}
        if host.strip().strip("[]") not in WILDCARDS:
            names.add(_bracket(host.strip("[]")))
        return cls(port=int(port), names=frozenset(names), token=token)

    @property
    def cookie_name(self) -> str:
        return f"fedarena-board-token-{self.port}"  # cookies ignore the port: one name per board

    def host_allowed(self, host_header: str | None) -> bool:
        """``Host`` is ``name:port`` for one of the names (the port may be left out only on port 80)."""
        if not host_header:
            return False
        h = host_header.strip().lower()
        for name in self.names:
            if h == f"{name}:{self.port}" or (self.port == 80 and h == name):
                return True
        return False

    def origin_allowed(self, origin: str | None) -> bool:
        """No ``Origin`` (a plain navigation), or ``http://`` + an allowed host."""
        if origin is None:
            return True
        o = origin.strip().lower()
        return o.startswith("http://") and self.host_allowed(o[len("http://"):])

    def presented(self, query: str, headers: dict[str, str] | object) -> tuple[str | None, bool]:
        """``(token the request carries, whether it came in the URL)``; ``headers`` has ``get``."""
        q = parse_qs(query).get("token")
        if q:
            return q[0], True
        auth = headers.get("Authorization") or ""  # type: ignore[union-attr]
        if auth.lower().startswith("token "):
            return auth[6:].strip(), False
        raw = headers.get("Cookie")  # type: ignore[union-attr]
        if raw:
            try:
                jar = SimpleCookie(raw)
            except CookieError:
                return None, False
            if self.cookie_name in jar:
                return jar[self.cookie_name].value, False
        return None, False

    def token_ok(self, presented: str | None) -> bool:
        if self.token is None:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8", "replace"), self.token.encode("utf-8"))

    def set_cookie(self) -> str:
        return f"{self.cookie_name}={self.token}; Path=/; HttpOnly; SameSite=Strict"
