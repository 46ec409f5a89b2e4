"""HTTP/1.1 relay on plain asyncio protocols: the recording proxy's byte layer.

Why not aiohttp's server and client: per streamed chunk they cost about 40 µs of
CPU on our 2-core machines (a future, a task step and re-framing on each side)
against 25 µs for a bare socket relay, and with a batching server every stream
wakes in the same tick. Here both directions are parsed by httptools (llhttp, Node.js's
parser) and each response body piece goes to the client inside the callback of
the read that brought it: one timestamp, one append, one write.

What a request means (which ones are recorded, what the record holds, the error
texts) is the caller's: ``Relay`` asks ``route`` where each request goes and
reports to the ``Exchange`` it gets back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast
from urllib.parse import unquote_to_bytes

import httptools

CONNECT_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024  # one request head; llhttp has no limit of its own
MAX_PIPELINED_BYTES = 1 << 20  # bodies of requests waiting behind the active one before we stop reading
MAX_IDLE_UPSTREAMS = 64  # kept-alive connections to Ollama waiting for the next client connection

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never forwarded.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te"}
    | {b"trailer", b"transfer-encoding", b"upgrade"}
)
_NO_BODY_STATUS = frozenset({204, 304})
Headers = list[tuple[bytes, bytes]]


class Failure(StrEnum):
    """Why an exchange ended early (the caller turns these into outcomes and texts)."""

    UNREACHABLE = "unreachable"  # could not connect: the client got a 502
    NO_ANSWER = "no answer"  # connected, but the connection ended before a response: 502
    CUT = "cut"  # the response body ended early: the client's is cut the same way
    CLIENT_GONE = "client gone"  # the client closed its connection: the upstream one is dropped too
    STOPPED = "stopped"  # the relay stopped with this request running


class Exchange:
    """Hooks for one relayed request. This base records nothing; ``RecordingProxy`` subclasses it.

    ``on_body`` is the hot path: set it to a plain append (or leave it None).
    """

    keep_request_body = False  # True: request_body() gets the whole body once it is in
    on_body: Callable[[tuple[int, bytes]], None] | None = None  # (read time ns, body piece)

    def request_body(self, body: bytes) -> None:
        """The whole request body (only when ``keep_request_body``)."""

    def forwarded(self, t_ns: int) -> None:
        """About to send the request upstream (connecting first when needed)."""

    def response_head(self, t_ns: int, status: int, content_type: str | None) -> Headers:
        """Ollama's response head arrived at ``t_ns``; returns headers to add for the client."""
        return []

    def answered_here(self, status: int) -> Headers:
        """The relay answers this request itself (Ollama could not); returns headers to add."""
        return []

    def failed(self, kind: str, detail: str, responded: bool) -> None:
        """The exchange broke (a ``Failure`` kind); ``responded``: the client already had a response head."""

    def ended(self, t_ns: int) -> None:
        """Called exactly once, last: the response is complete, or the exchange failed."""


@dataclass(frozen=True)
class Target:
    """Where a request goes: the address to connect to and the Host header it gets."""

    host: str
    port: int
    host_header: bytes
    name: str  # for error texts, like "http://127.0.0.1:11434"
    tls: bool = False  # https://
    path_prefix: bytes = b""  # an Ollama served under a path, like http://box/ollama


@dataclass
class RequestHead:
    method: str
    raw_path: bytes  # as the client sent it (path and query, still percent-encoded)
    path: str  # decoded path, no query
    http_version: str
    headers: Headers
    client_addr: str
    received_ns: int


Route = Callable[[RequestHead], tuple[Target, Exchange, frozenset[bytes]]]  # target, hooks, extra headers to drop


def _header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _forwardable(headers: Headers, drop: frozenset[bytes]) -> Headers:
    """Headers without hop-by-hop ones, those named in Connection, and ``drop`` (lower-case names)."""
    named = {t.strip().lower() for k, v in headers if k.lower() == b"connection" for t in v.split(b",")}
    return [(k, v) for k, v in headers if (low := k.lower()) not in HOP_BY_HOP and low not in drop and low not in named]


def _head_bytes(first_line: bytes, headers: Headers) -> bytes:
    return first_line + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"


def _json_response(status: int, reason: bytes, message: str, extra: Headers, close: bool) -> bytes:
    body = json.dumps({"error": message}).encode()
    headers = [(b"Content-Type", b"application/json; charset=utf-8"), (b"Content-Length", str(len(body)).encode())]
    headers += extra
    if close:
        headers.append((b"Connection", b"close"))
    return _head_bytes(b"HTTP/1.1 %d %s" % (status, reason), headers) + body


def _chunk(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece)


@dataclass(eq=False)
class _Request:
    """One client request, from its head to the end of its response."""

    head: RequestHead
    keep_alive: bool
    chunked_in: bool  # the client sent its body with chunked framing
    expect_continue: bool
    target: Target
    exchange: Exchange
    drop: frozenset[bytes]  # request headers not to forward (lower-case names)
    pending_body: list[bytes] = field(default_factory=list)  # body bytes not yet sent upstream
    kept_body: list[bytes] = field(default_factory=list)  # the whole body, for request_body()
    body_complete: bool = False
    started: bool = False  # forwarding began
    responded: bool = False  # a response head went to the client
    finished: bool = False


class _ClientSide(asyncio.Protocol):
    """One client connection: parses its requests and relays them one at a time."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client_addr = ""
        self.read_ns = 0
        self.requests: deque[_Request] = deque()  # [0] is active; the rest were pipelined behind it
        self.upstream: _UpstreamSide | None = None
        self.queued_bytes = 0
        # Request head being parsed.
        self._url = b""
        self._headers: Headers = []
        self._head_bytes = 0
        self._parsing: _Request | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peer = transport.get_extra_info("peername")
        self.client_addr = str(peer[0]) if isinstance(peer, tuple) else ""
        self.relay.clients.add(self)

    def data_received(self, data: bytes) -> None:
        self.read_ns = time.monotonic_ns()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(501, b"Not Implemented", "protocol upgrades are not relayed")
        except httptools.HttpParserError as exc:
            if self.requests and self.requests[0].started and not self.requests[0].finished:
                # A broken request body after forwarding began: the upstream request cannot be completed.
                self._drop_upstream()
                req = self.requests[0]
                req.finished = True
                req.exchange.failed(Failure.CLIENT_GONE, f"malformed request from the client: {exc}", req.responded)
                req.exchange.ended(time.monotonic_ns())
            self._refuse(400, b"Bad Request", f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool:
        # Like Go's net/http (Ollama), a client that half-closes is treated as gone.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.clients.discard(self)
        kind = Failure.STOPPED if self.relay.stopping else Failure.CLIENT_GONE
        for req in self.requests:  # the active one, and any pipelined behind it
            if not req.finished:
                req.finished = True
                req.exchange.failed(kind, "", req.responded)
                req.exchange.ended(time.monotonic_ns())
        self.requests.clear()
        if self.upstream is not None and self.upstream.reusable_for(self.upstream.target):
            self.relay.put_idle(self.upstream)  # the next client connection skips the connect
            self.upstream = None
        self._drop_upstream()

    def pause_writing(self) -> None:  # the client reads slower than Ollama writes
        if self.upstream is not None:
            self.upstream.pause()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url, self._headers, self._head_bytes = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("request head too large")

    def on_headers_complete(self) -> None:
        parsed = httptools.parse_url(self._url)
        raw_path = self._url  # origin form, as nearly every client sends it
        if not raw_path.startswith(b"/"):  # absolute form (http://host/path): keep path and query
            raw_path = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        head = RequestHead(
            method=self.parser.get_method().decode("latin-1"),
            raw_path=raw_path,
            path=_unquote(parsed.path or b"/"),
            http_version=self.parser.get_http_version(),
            headers=self._headers,
            client_addr=self.client_addr,
            received_ns=self.read_ns,
        )
        expect = (_header(self._headers, b"expect") or b"").strip().lower()
        target, exchange, drop = self.relay.route(head)
        req = _Request(
            head=head,
            keep_alive=self.parser.should_keep_alive(),
            chunked_in=b"chunked" in (_header(self._headers, b"transfer-encoding") or b"").lower(),
            expect_continue=expect == b"100-continue" and head.http_version == "1.1",
            target=target,
            exchange=exchange,
            drop=drop,
        )
        self._parsing = req
        self.requests.append(req)
        if len(self.requests) == 1:
            self._start(req)

    def on_body(self, piece: bytes) -> None:
        req = self._parsing
        if req is None or req.finished:
            return  # the rest of a body already answered (the connection closes after that answer)
        if req.exchange.keep_request_body:
            req.kept_body.append(piece)
        if self.upstream is not None and self.upstream.sending(req):
            self.upstream.write(_chunk(piece) if req.chunked_in else piece)
        else:
            req.pending_body.append(piece)
            if req is not self.requests[0]:  # queued behind the active one
                self.queued_bytes += len(piece)
                if self.queued_bytes > MAX_PIPELINED_BYTES and self.transport is not None:
                    self.transport.pause_reading()

    def on_message_complete(self) -> None:
        req = self._parsing
        self._parsing = None
        if req is None:
            return
        req.body_complete = True
        if req.exchange.keep_request_body:
            req.exchange.request_body(b"".join(req.kept_body))
            req.kept_body = []
        if req.chunked_in and self.upstream is not None and self.upstream.sending(req):
            self.upstream.write(b"0\r\n\r\n")

    # -- relaying ----------------------------------------------------------------------------------

    def _start(self, req: _Request) -> None:
        """Make ``req`` the active request: answer Expect, forward it."""
        if req.expect_continue and self.transport is not None:
            # Answered here (as aiohttp's server would); the upstream gets the body without asking.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        req.started = True
        req.exchange.forwarded(time.monotonic_ns())
        up = self.upstream
        if up is not None and up.reusable_for(req.target):
            up.send(req)
            return
        if up is not None and up.reusable_for(up.target):
            self.relay.put_idle(up)  # kept for another client: this request goes elsewhere
            self.upstream = None
        self._drop_upstream()
        pooled = self.relay.take_idle(req.target)
        if pooled is not None:
            pooled.client = self
            self.upstream = pooled
            pooled.send(req)
            return
        self.upstream = _UpstreamSide(self, req.target)
        self.relay.spawn(self.upstream.connect(req))

    def request_head_for_upstream(self, req: _Request) -> bytes:
        headers = _forwardable(req.head.headers, req.drop | {b"host", b"expect"})
        headers.insert(0, (b"Host", req.target.host_header))
        if req.chunked_in:
            headers.append((b"Transfer-Encoding", b"chunked"))
        path = req.target.path_prefix + req.head.raw_path
        return _head_bytes(b"%b %b HTTP/1.1" % (req.head.method.encode("latin-1"), path), headers)

    def pending_request_bytes(self, req: _Request) -> bytes:
        """Body bytes that arrived before the upstream connection was ready."""
        body = b"".join(_chunk(p) if req.chunked_in else p for p in req.pending_body)
        req.pending_body = []
        if req.body_complete and req.chunked_in:
            body += b"0\r\n\r\n"
        return body

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def response_done(self, req: _Request) -> None:
        """The active request's response is complete: end the exchange, start the next one."""
        req.finished = True
        req.exchange.ended(time.monotonic_ns())
        if self.requests and self.requests[0] is req:
            self.requests.popleft()
        if not req.keep_alive or not req.body_complete:
            # The client asked to close, or the rest of its body would be read as a new request.
            self._close()
            return
        if self.requests:  # a pipelined request waited behind this one
            self.queued_bytes = 0
            if self.transport is not None:
                self.transport.resume_reading()
            self._start(self.requests[0])
        if self.relay.stopping and not self.requests:
            self._close()

    def respond_error(self, req: _Request, status: int, reason: bytes, kind: str, message: str) -> None:
        """Answer the active request ourselves (Ollama did not) and end its exchange as failed."""
        if req.finished:
            return
        extra = req.exchange.answered_here(status)
        close = not req.keep_alive or not req.body_complete
        self.write(_json_response(status, reason, message, extra, close))
        req.responded = True
        req.exchange.failed(kind, message, False)
        self.response_done(req)

    def _refuse(self, status: int, reason: bytes, message: str) -> None:
        """A request we cannot relay: answer it (when nothing was answered yet) and close."""
        if self.transport is None or self.transport.is_closing():
            return
        if not (self.requests and self.requests[0].responded):
            self.transport.write(_json_response(status, reason, message, [], close=True))
        self._close()

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.abort()
            self.upstream = None

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # flushes what was written first

    def stop(self, now: bool) -> None:
        """Stopping: close when idle; with ``now``, cut whatever runs."""
        if self.transport is None:
            return
        if now:
            self.transport.abort()
        elif not self.requests:
            self._close()


class _UpstreamSide(asyncio.Protocol):
    """The connection to Ollama that serves one client connection's requests, one at a time."""

    def __init__(self, client: _ClientSide, target: Target) -> None:
        self.client = client
        self.target = target
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.idle = False
        self.parser = httptools.HttpResponseParser(self)
        self.req: _Request | None = None
        self.read_ns = 0
        self.first_byte_pending = False
        self.first_byte_ns = 0
        self._status_reason = b""
        self._headers: Headers = []
        self._chunked_out = False
        self._close_delimited = False
        self._keep_alive = True
        self._on_body: Callable[[tuple[int, bytes]], None] | None = None
        self._paused = False
        self._aborted = False

    async def connect(self, req: _Request) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: self,
                    self.target.host,
                    self.target.port,
                    ssl=True if self.target.tls else None,
                    server_hostname=self.target.host if self.target.tls else None,
                ),
                timeout=CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            if self._aborted or req.finished:
                return
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            if self.client.upstream is self:
                self.client.upstream = None
            if isinstance(exc, ssl.SSLError):
                message = (
                    f"TLS with Ollama at {self.target.name} failed ({exc}). Check its certificate; "
                    "for a self-signed one, point SSL_CERT_FILE at its CA before starting Phasewatch."
                )
            else:
                message = (
                    f"Ollama is not reachable at {self.target.name} ({reason}). "
                    "Start it (`ollama serve`), or point Phasewatch at it with --ollama URL or OLLAMA_HOST."
                )
            self.client.respond_error(req, 502, b"Bad Gateway", Failure.UNREACHABLE, message)
            return
        if self._aborted or req.finished:
            self.abort()
            return
        self.send(req)

    def send(self, req: _Request) -> None:
        """Send ``req`` (head and whatever body is in) on this open, idle connection."""
        self.req = req
        self.idle = False
        self.first_byte_pending = True
        self.parser = httptools.HttpResponseParser(self)
        self._on_body = req.exchange.on_body
        self.write(self.client.request_head_for_upstream(req) + self.client.pending_request_bytes(req))

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def sending(self, req: _Request) -> bool:
        """``req``'s head went out on this connection, so its body may follow."""
        return self.req is req and self.connected and not self._aborted

    def reusable_for(self, target: Target) -> bool:
        return self.connected and self.idle and not self._aborted and self.target == target

    def pause(self) -> None:
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and self._paused:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        """Drop the connection now (Ollama sees the client leave and cancels the request)."""
        self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connected = True

    def data_received(self, data: bytes) -> None:
        self.read_ns = time.monotonic_ns()
        if self.req is None:  # bytes on an idle connection answer nothing we sent
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(f"Ollama sent a malformed HTTP response: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.connected = False
        self.client.relay.forget_idle(self)
        if self.client.upstream is self:
            self.client.upstream = None
        req = self.req
        if req is None or req.finished or self._aborted:
            return
        if req.responded and self._close_delimited:
            self._complete()  # the end of a body without length or chunks is the close itself
            return
        self._broken(f"connection closed ({exc})" if exc else "connection closed")

    def pause_writing(self) -> None:  # Ollama reads a large request body slower than the client sends it
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._status_reason, self._headers = b"", []
        if self.first_byte_pending:
            self.first_byte_pending = False
            self.first_byte_ns = self.read_ns

    def on_status(self, reason: bytes) -> None:
        self._status_reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        req = self.req
        if req is None or req.finished:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # interim answers (we never send Expect upstream) are not passed on
        self._keep_alive = self.parser.should_keep_alive()
        has_length = _header(self._headers, b"content-length") is not None
        chunked_in = b"chunked" in (_header(self._headers, b"transfer-encoding") or b"").lower()
        no_body = req.head.method == "HEAD" or status in _NO_BODY_STATUS
        self._close_delimited = not no_body and not has_length and not chunked_in
        client_1_1 = req.head.http_version == "1.1"
        self._chunked_out = not no_body and not has_length and client_1_1
        if not no_body and not has_length and not client_1_1:
            req.keep_alive = False  # an HTTP/1.0 client learns the end of such a body from the close
        content_type = _header(self._headers, b"content-type")
        extra = req.exchange.response_head(
            self.first_byte_ns, status, content_type.decode("latin-1") if content_type is not None else None
        )
        headers = _forwardable(self._headers, frozenset()) + extra
        if self._chunked_out:
            headers.append((b"Transfer-Encoding", b"chunked"))
        if not req.keep_alive:
            headers.append((b"Connection", b"close"))
        self.client.write(_head_bytes(b"HTTP/1.1 %d %b" % (status, self._status_reason), headers))
        req.responded = True
        if no_body:
            # llhttp would wait for a HEAD response's Content-Length bytes; this response has ended.
            self.parser = httptools.HttpResponseParser(self)
            self._complete()

    def on_body(self, piece: bytes) -> None:
        # Hot path: one append, one write.
        if self._on_body is not None:
            self._on_body((self.read_ns, piece))
        self.client.write(_chunk(piece) if self._chunked_out else piece)

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or req.finished or not req.responded:
            return  # an interim 1xx answer, or a response that already ended (HEAD)
        self._complete()

    # -- endings -----------------------------------------------------------------------------------

    def _complete(self) -> None:
        req = self.req
        if req is None or req.finished:
            return
        if self._chunked_out:
            self.client.write(b"0\r\n\r\n")
        self.req = None
        self.idle = True
        if not self._keep_alive or not req.body_complete:
            self.abort()  # Ollama closes, or answered before the whole request body went out: not reusable
        self.client.response_done(req)

    def _broken(self, detail: str) -> None:
        """The upstream failed: before a response, the client gets a 502; after, its body is cut."""
        req = self.req
        self.abort()
        if req is None or req.finished:
            return
        if not req.responded:
            message = f"Ollama at {self.target.name} failed before answering: {detail}"
            self.client.respond_error(req, 502, b"Bad Gateway", Failure.NO_ANSWER, message)
            return
        req.finished = True
        req.exchange.failed(Failure.CUT, f"Ollama cut the response mid-way: {detail}", True)
        req.exchange.ended(time.monotonic_ns())
        self.client.requests.clear()
        self.client._close()  # flushes what was relayed, never writes the end of the body


def _unquote(path: bytes) -> str:
    return unquote_to_bytes(path).decode("utf-8", "replace")


class Relay:
    """Listen on host:port and relay every request to where ``route`` says."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.clients: set[_ClientSide] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: dict[Target, list[_UpstreamSide]] = {}

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; returns the port (``port`` 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ClientSide(self), host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def busy(self) -> bool:
        return any(c.requests for c in self.clients)

    # -- idle upstream connections, shared by client connections ------------------------------------

    def put_idle(self, up: _UpstreamSide) -> None:
        pool = self._idle.setdefault(up.target, [])
        if self.stopping or len(pool) >= MAX_IDLE_UPSTREAMS:
            up.abort()
        else:
            pool.append(up)

    def take_idle(self, target: Target) -> _UpstreamSide | None:
        pool = self._idle.get(target, [])
        while pool:
            up = pool.pop()
            if up.reusable_for(target):
                return up
        return None

    def forget_idle(self, up: _UpstreamSide) -> None:
        pool = self._idle.get(up.target)
        if pool and up in pool:
            pool.remove(up)

    async def stop(self, grace_s: float) -> None:
        """Stop listening, let running requests finish for ``grace_s``, then cut the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.stop(now=False)
        for pool in self._idle.values():
            for up in list(pool):
                up.abort()
        self._idle.clear()
        deadline = time.monotonic() + grace_s
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for client in list(self.clients):
            client.stop(now=True)
        deadline = time.monotonic() + 1.0
        while self.clients and time.monotonic() < deadline:  # connection_lost runs on a later loop turn
            await asyncio.sleep(0.01)
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
