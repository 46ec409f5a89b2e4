"""The dashboard answers only to Host names it knows: a guard against DNS rebinding.

A web page at ``http://evil.example:8501`` whose name its owner re-points at 127.0.0.1 is, to the
browser, same-origin with the dashboard: it could open ``/lab`` and start an experiment. Its requests
still carry ``Host: evil.example:8501``, so the dashboard refuses every Host outside:

* the loopback names ``localhost``, ``127.0.0.1`` and ``[::1]`` (any port),
* Streamlit's configured ``server.address`` and ``browser.serverAddress``,
* the names in ``PHASEWATCH_ALLOWED_HOSTS`` (comma- or space-separated; ``*.example.lan`` for
  its subdomains; ``*`` for any name, which switches the guard off).

Streamlit's own ``server.allowedHosts`` checks only the WebSocket, so this is an ASGI middleware in
front of all of it: pages, static files, ``/_stcore/*`` and the WebSocket (refused before the upgrade:
HTTP 403, with the same text where the server lets the app answer the upgrade itself). ``app.py`` installs it through ``st.App``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

ALLOWED_HOSTS_ENV = "PHASEWATCH_ALLOWED_HOSTS"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD_ADDRESSES = {"", "0.0.0.0", "::"}  # listening everywhere names no host a browser would send

Scope = dict[str, Any]
Message = dict[str, Any]


def host_name(host_header: str | None) -> str | None:
    """The name in a Host header, lower case, without port, brackets or a trailing dot; None when malformed."""
    if not host_header:
        return None
    try:
        parts = urlsplit(f"//{host_header}")
        _ = parts.port  # a port that is not a number in range makes the header malformed
    except ValueError:
        return None
    if parts.hostname is None or parts.username is not None or parts.password is not None:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname.lower().rstrip(".")


def allowed_names(server_addresses: Iterable[str | None], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Loopback names, the configured server addresses (not wildcards) and ``PHASEWATCH_ALLOWED_HOSTS``."""
    env = os.environ if env is None else env
    names = list(LOOPBACK_NAMES)
    for address in server_addresses:
        name = (address or "").strip().strip("[]").lower().rstrip(".")
        if name not in _WILDCARD_ADDRESSES:
            names.append(name)
    names += env.get(ALLOWED_HOSTS_ENV, "").replace(",", " ").lower().split()
    return tuple(dict.fromkeys(n.strip("[]").rstrip(".") for n in names))


def host_allowed(host_header: str | None, names: Iterable[str]) -> bool:
    name = host_name(host_header)
    if name is None:
        return False
    return any(a == "*" or name == a or (a.startswith("*.") and name.endswith(a[1:])) for a in names)


class HostGuard:
    """ASGI middleware: 403 for an HTTP request or WebSocket whose Host is not allowed."""

    def __init__(self, app: Any, names: Iterable[str] | None = None) -> None:
        self.app = app
        self._names = tuple(names) if names is not None else None

    @property
    def names(self) -> tuple[str, ...]:
        if self._names is None:  # Streamlit's config is loaded once the server runs
            from streamlit import config

            self._names = allowed_names([config.get_option("server.address"), config.get_option("browser.serverAddress")])
        return self._names

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if host_allowed(host, self.names):
            await self.app(scope, receive, send)
            return
        body = f"Host {host!r} is not allowed here; add its name to {ALLOWED_HOSTS_ENV} to use it.\n".encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif "websocket.http.response" in scope.get("extensions", {}):  # our own 403, headers included
            await send({"type": "websocket.http.response.start", "status": 403, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})  # before the accept: the server answers 403
