"""Send raw bytes to a server and read back the HTTP responses, for tests of hostile clients."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field

import httptools


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class _Collector:
    responses: list[Response] = field(default_factory=list)
    _headers: dict[str, str] = field(default_factory=dict)
    _body: list[bytes] = field(default_factory=list)
    parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        self._headers, self._body = {}, []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, piece: bytes) -> None:
        self._body.append(piece)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.responses.append(Response(self.parser.get_status_code(), self._headers, b"".join(self._body)))


@dataclass
class Reply:
    responses: list[Response]
    closed: bool  # the server closed the connection
    raw: bytes


def exchange(port: int, data: bytes, *, quiet_s: float = 0.5, timeout_s: float = 10.0, want: int = 0) -> Reply:
    """Send ``data``; read until the server closes, ``want`` responses came, or nothing arrives for ``quiet_s``."""
    collector = _Collector()
    parser = httptools.HttpResponseParser(collector)
    collector.parser = parser
    raw = bytearray()
    closed = False
    deadline = time.monotonic() + timeout_s
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        with contextlib.suppress(OSError):  # the server may refuse before reading everything
            s.sendall(data)
        s.settimeout(quiet_s)
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            raw += chunk
            try:
                parser.feed_data(chunk)
            except httptools.HttpParserError:
                break
            if want and len(collector.responses) >= want:
                break
    return Reply(collector.responses, closed, bytes(raw))
