"""No other page may frame the dashboard: a guard against clickjacking.

A page on another origin could show ``/lab`` in an invisible frame over a button of its own and have
one click start an experiment (issue 25 #8). Every answer therefore says that no page may frame it,
in both forms a browser knows: ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``.

An ASGI middleware around the whole app (``app.py`` puts it outside ``HostGuard``), so the headers go on
Streamlit's pages, static files, ``/_stcore/*``, the WebSocket's upgrade answer and the guard's 403s alike.
"""

from __future__ import annotations

from typing import Any

NO_FRAMING_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
)
_NAMES = {name for name, _ in NO_FRAMING_HEADERS}
# The messages that start an answer: HTTP, a WebSocket's 101, and a WebSocket refused with an HTTP answer.
_STARTS = {"http.response.start", "websocket.accept", "websocket.http.response.start"}

Scope = dict[str, Any]
Message = dict[str, Any]


def with_no_framing(headers: list[tuple[bytes, bytes]] | None) -> list[tuple[bytes, bytes]]:
    """``headers`` with ours in place of any of the same names (one value each, never two that disagree)."""
    kept = [(k, v) for k, v in headers or [] if k.lower() not in _NAMES]
    return [*kept, *NO_FRAMING_HEADERS]


class NoFraming:
    """ASGI middleware: ``X-Frame-Options: DENY`` and ``frame-ancestors 'none'`` on every answer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_no_framing(message: Message) -> None:
            if message["type"] in _STARTS:
                message = {**message, "headers": with_no_framing(message.get("headers"))}
            await send(message)

        await self.app(scope, receive, send_no_framing)
