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

Whose fault: bytes llhttp refuses are the client's (400) or Ollama's (502); an
exception raised by our own code (``route``, an ``Exchange`` hook, the relay) is
ours: logged with its traceback, answered 500 if no response began (else that
connection is cut), and every other connection goes on. Every answer the relay writes
itself for the client's fault (and every connection it cuts to make room) is a refusal:
logged, counted and kept for the sidebar by ``collectors.proxy.refusals``.

States: a request's ``Stage``, a client connection's ``ClientState`` and an upstream
connection's ``UpstreamState`` each change only through its object's ``move``, checked
against its table below (as h11 keeps its own); a move the table lacks is a bug of ours,
raised as ``IllegalMove`` (and so logged with its traceback like any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, cast
from urllib.parse import unquote_to_bytes

import httptools

from collectors.proxy.bind import BACKLOG, exclusive_socket
from collectors.proxy.limits import Limits, fd_soft_limit
from collectors.proxy.refusals import Refusal, Refusals

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
MAX_IDLE_UPSTREAMS = 64  # kept-alive connections to Ollama waiting for the next client connection

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never forwarded.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te"}
    | {b"trailer", b"transfer-encoding", b"upgrade"}
)
# Never forwarded as the client or Ollama sent them: the relay frames every body it forwards itself.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
_NO_BODY_STATUS = frozenset({204, 304})
Headers = list[tuple[bytes, bytes]]


class Refused(Exception):
    """Raised by a ``Route`` for a request that must not go anywhere: answered with ``status`` (0: no answer), then
    closed; ``why`` is its reason on the record (``collectors.proxy.refusals``)."""

    def __init__(self, status: int, reason: bytes, message: str, why: Refusal) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.why = status, reason, message, why


class _StopParsing(Exception):
    """Raised inside a parser callback to stop llhttp at this point of the bytes."""


def _parser_problem(exc: Exception) -> Exception | None:
    """What ``feed_data`` raised, sorted: what was wrong with the bytes, or None for a deliberate stop.

    httptools turns an exception raised in a callback into ``HttpParserCallbackError`` with the original
    as its ``__context__``. Ours are told apart here: ``_StopParsing`` is a deliberate stop (None), an
    ``HttpParserError`` raised by a callback is the bytes' fault (returned), and anything else is a bug in
    our own code (route, a recording hook): raised as itself, with its traceback, never blamed on the bytes.
    A protocol upgrade is returned as ``HttpParserUpgrade``.
    """
    if isinstance(exc, httptools.HttpParserCallbackError):
        cause = exc.__context__
        if isinstance(cause, _StopParsing):
            return None
        if cause is None:
            return exc
        if isinstance(cause, httptools.HttpParserError):  # a callback found the bytes wrong: its words, not llhttp's
            return cause
        raise cause from None
    if isinstance(exc, (httptools.HttpParserError, httptools.HttpParserUpgrade)):
        return exc
    raise exc


class Failure(Enum):
    """Why an exchange ended early (the caller turns these into outcomes and texts): the value ``Exchange.failed``
    gets, never a string."""

    UNREACHABLE = "unreachable"  # could not connect: the client got a 502
    NO_ANSWER = "no answer"  # connected, but the connection ended before a response: 502
    CUT = "cut"  # the response body ended early: the client's is cut the same way
    CLIENT_GONE = "client gone"  # the client closed its connection: the upstream one is dropped too
    STOPPED = "stopped"  # the relay stopped with this request running
    INTERNAL = "internal error"  # our own code raised (logged with its traceback): the client got a 500 or a cut
    EVICTED = "evicted"  # its body arrived too slowly while the relay was at its connection bound


class Stage(IntEnum):
    """Where one request is, from its head to the end of its response; it only moves forward."""

    QUEUED = 1  # parsed, waiting behind the active request (or not yet started)
    FORWARDED = 2  # going upstream (connecting first when needed)
    RESPONDED = 3  # a response head went to the client
    DONE = 4  # its exchange ended (complete or failed)

    __hash__ = int.__hash__  # C-level, not Enum's Python-level hash of the name: each move looks its state up


class ClientState(Enum):
    """What one client connection's parser is doing."""

    BETWEEN = 1  # between request heads (a request may be in flight)
    HEAD = 2  # a request head has begun and not ended
    STOPPED = 3  # parses no more (refused, broken, evicted, failed): answers what is queued, then closes

    __hash__ = object.__hash__  # by identity, as members compare: each move looks its state up (3x faster)


class UpstreamState(Enum):
    """One connection to Ollama, through its requests: CONNECTING, then (WAITING, HEAD, BODY, ENDED, IDLE)
    per request, until ABORTED (by us) or CLOSED (by the other end or the loop)."""

    CONNECTING = 1
    WAITING = 2  # the request went out; no byte of its response yet
    HEAD = 3  # response head bytes arriving (interim 1xx answers included)
    BODY = 4  # the final head went to the client; its body follows
    ENDED = 5  # the response is complete; finished once the parser has returned
    IDLE = 6  # open, kept alive for the next request
    ABORTED = 7
    CLOSED = 8

    __hash__ = object.__hash__  # by identity, as members compare: each move looks its state up (3x faster)


class IllegalMove(RuntimeError):
    """A state machine of the relay was asked for a move its table lacks: a bug of ours, never the client's."""


# What each state may move to. Each object's ``move`` is the only place its state changes.
STAGE_MOVES: dict[Stage, frozenset[Stage]] = {
    Stage.QUEUED: frozenset({Stage.FORWARDED, Stage.DONE}),  # DONE: failed before it went upstream
    Stage.FORWARDED: frozenset({Stage.RESPONDED, Stage.DONE}),  # RESPONDED: Ollama's head, or our own 502
    Stage.RESPONDED: frozenset({Stage.DONE}),
    Stage.DONE: frozenset(),
}
CLIENT_MOVES: dict[ClientState, frozenset[ClientState]] = {
    ClientState.BETWEEN: frozenset({ClientState.HEAD, ClientState.STOPPED}),
    ClientState.HEAD: frozenset({ClientState.BETWEEN, ClientState.STOPPED}),
    ClientState.STOPPED: frozenset(),
}
_GONE = frozenset({UpstreamState.ABORTED, UpstreamState.CLOSED})  # reachable from every state but themselves
UPSTREAM_MOVES: dict[UpstreamState, frozenset[UpstreamState]] = {
    UpstreamState.CONNECTING: frozenset({UpstreamState.WAITING}) | _GONE,
    UpstreamState.WAITING: frozenset({UpstreamState.HEAD}) | _GONE,
    UpstreamState.HEAD: frozenset({UpstreamState.BODY}) | _GONE,  # interim 1xx answers stay in HEAD
    UpstreamState.BODY: frozenset({UpstreamState.ENDED}) | _GONE,
    UpstreamState.ENDED: frozenset({UpstreamState.IDLE}) | _GONE,
    UpstreamState.IDLE: frozenset({UpstreamState.WAITING}) | _GONE,  # the next request on a kept-alive connection
    UpstreamState.ABORTED: frozenset(),
    UpstreamState.CLOSED: frozenset(),
}


def checked_move(table: dict[Any, frozenset[Any]], old: Any, new: Any, what: str) -> Any:
    """``new`` if ``table`` lets ``old`` move to it; ``IllegalMove`` otherwise. Runs once per move (a few per request,
    never per chunk)."""
    if new not in table[old]:
        raise IllegalMove(f"{what} cannot move from {old.name} to {new.name}")
    return new


# The members read for every streamed chunk or body piece, by plain names: reading a member off its Enum class costs
# ~0.1 µs in Python 3.11 (a descriptor), a module global a tenth of that.
_FORWARDED, _RESPONDED, _DONE = Stage.FORWARDED, Stage.RESPONDED, Stage.DONE
_WAITING, _HEAD, _ENDED = UpstreamState.WAITING, UpstreamState.HEAD, UpstreamState.ENDED
_ABORTED, _CLOSED = UpstreamState.ABORTED, UpstreamState.CLOSED


class Exchange:
    """Hooks for one relayed request. This base records nothing; ``RecordingProxy`` subclasses it.

    ``on_body`` is the hot path: set it to a plain append (or leave it None).
    """

    keep_request_body = False  # True: request_body() gets the whole body once it is in
    on_body: Callable[[tuple[int, bytes]], None] | None = None  # (read time ns, body piece)

    def request_body(self, body: bytes, truncated: bool) -> None:
        """The request body (only when ``keep_request_body``); ``truncated``: only its first bytes were kept."""

    def forwarded(self, t_ns: int) -> None:
        """About to send the request upstream (connecting first when needed)."""

    def response_head(self, t_ns: int, status: int, content_type: str | None) -> Headers:
        """Ollama's response head arrived at ``t_ns``; returns headers to add for the client."""
        return []

    def answered_here(self, status: int) -> Headers:
        """The relay answers this request itself (Ollama could not); returns headers to add."""
        return []

    def backlog(self, caught_up: Callable[[], None]) -> None:
        """Over ``Limits.max_unparsed_bytes`` of body pieces went to ``on_body`` since the last catch-up: the
        relay stops reading this response until ``caught_up`` is called (this base keeps nothing)."""
        caught_up()

    def failed(self, kind: Failure, detail: str, responded: bool) -> None:
        """The exchange broke; ``responded``: the client already had a response head."""

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
    # Which connection it came on (a number unique in this relay) and the socket's two ends, (host, port): the
    # recording looks up the client's local process once per connection (collectors.proxy.client_process).
    connection: int = 0
    peer: tuple[str, int] | None = None
    ours: tuple[str, int] | None = None


Route = Callable[[RequestHead], tuple[Target, Exchange, frozenset[bytes]]]  # target, hooks, extra headers to drop


def _header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _forwardable(headers: Headers, drop: frozenset[bytes]) -> Headers:
    """Headers without hop-by-hop ones, those named in Connection, framing ones, and ``drop`` (lower-case names).

    Framing headers go whatever Connection says: the relay writes its own (naming
    Content-Length in Connection must never leave a body unframed).
    """
    named = {t.strip().lower() for k, v in headers if k.lower() == b"connection" for t in v.split(b",")}
    return [
        (k, v)
        for k, v in headers
        if (low := k.lower()) not in HOP_BY_HOP and low not in _FRAMING and low not in drop and low not in named
    ]


_DIGITS = re.compile(rb"[0-9]{1,18}")


def _request_framing(headers: Headers, http_version: str) -> tuple[bool, int | None]:
    """(chunked, Content-Length) of a request head, as strict as nginx and Go's net/http; ``Refused`` otherwise.

    RFC 9112 §6.3: one Transfer-Encoding, and it must be a lone ``chunked`` (in HTTP/1.1);
    one Content-Length of digits; never both; one Host, required in HTTP/1.1.
    """
    if http_version not in ("1.0", "1.1"):
        raise Refused(
            505, b"HTTP Version Not Supported", f"HTTP/{http_version} is not supported; use HTTP/1.1", Refusal.HTTP_VERSION
        )
    hosts = 0
    codings: list[bytes] = []
    lengths: list[bytes] = []
    for key, value in headers:  # one pass: this runs for every request
        low = key.lower()
        if low == b"host":
            hosts += 1
        elif low == b"transfer-encoding":
            codings.append(value)
        elif low == b"content-length":
            lengths.append(value)
    if hosts > 1 or (http_version == "1.1" and not hosts):
        raise Refused(400, b"Bad Request", "an HTTP/1.1 request needs exactly one Host header", Refusal.MALFORMED)
    if len(codings) > 1 or len(lengths) > 1:
        raise Refused(400, b"Bad Request", "more than one Transfer-Encoding or Content-Length header", Refusal.MALFORMED)
    if codings and lengths:
        raise Refused(400, b"Bad Request", "both Transfer-Encoding and Content-Length", Refusal.MALFORMED)
    if codings:
        if http_version != "1.1":
            raise Refused(400, b"Bad Request", "Transfer-Encoding in an HTTP/1.0 request", Refusal.MALFORMED)
        if codings[0].strip(b" \t").lower() != b"chunked":
            raise Refused(501, b"Not Implemented", "only Transfer-Encoding: chunked is supported", Refusal.TRANSFER_CODING)
        return True, None
    if lengths:
        value = lengths[0].strip(b" \t")
        if not _DIGITS.fullmatch(value):
            raise Refused(400, b"Bad Request", "Content-Length is not a number", Refusal.MALFORMED)
        return False, int(value)
    return False, None


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
    content_length: int | None  # the client's valid Content-Length, when it sent one
    expect_continue: bool
    target: Target
    exchange: Exchange
    drop: frozenset[bytes]  # request headers not to forward (lower-case names)
    pending_body: list[bytes] = field(default_factory=list)  # body bytes not yet sent upstream
    pending_bytes: int = 0
    body_started_ns: int = 0  # when the head ended (moved on by the time reading was paused)
    body_bytes: int = 0
    window_started_ns: int = 0  # the body's current rate window (moved on like body_started_ns)
    window_start_bytes: int = 0  # body_bytes when that window began
    kept_body: list[bytes] = field(default_factory=list)  # the body's start, for request_body()
    kept_bytes: int = 0
    kept_truncated: bool = False
    body_complete: bool = False
    stage: Stage = Stage.QUEUED  # changed only by move()

    def move(self, stage: Stage) -> None:
        self.stage = checked_move(STAGE_MOVES, self.stage, stage, "a request")

    @property
    def started(self) -> bool:  # forwarding began
        return self.stage >= _FORWARDED

    @property
    def responded(self) -> bool:  # a response head went to the client (or none ever will)
        return self.stage >= _RESPONDED

    @property
    def finished(self) -> bool:
        return self.stage is _DONE


class _FlowControl:
    """When the two sides of one client connection read: every pause and resume of either transport is
    decided here (as in uvicorn's flow_control.py), from the flags the events below set.

    The client is read while there is room for what it sends: its connection still parses, Ollama takes
    the request body as fast as it comes, and nothing waits beyond the pipelining bounds. Ollama is read
    while the client takes the response as fast as it comes and the recording keeps up with it.
    """

    __slots__ = ("backlogged", "client", "client_full", "client_paused", "paused_at_ns", "upstream_full")

    def __init__(self, client: _ClientSide) -> None:
        self.client = client
        self.upstream_full = False  # Ollama reads the request body slower than the client sends it
        self.client_full = False  # the client reads the response slower than Ollama sends it
        self.backlogged = False  # over Limits.max_unparsed_bytes of response went to the recording unparsed
        self.client_paused = False
        self.paused_at_ns = 0

    def update_client(self) -> None:
        c = self.client
        bound = c.limits.max_pipelined_bytes
        pause = (
            c.state is ClientState.STOPPED
            or self.upstream_full
            or len(c.requests) > 1  # a pipelined request waits: read no further until it is answered
            or c.queued_bytes > bound
            or (bool(c.requests) and c.requests[0].pending_bytes > bound)
        )
        transport = c.transport
        if pause == self.client_paused or transport is None or transport.is_closing():
            return
        self.client_paused = pause
        now_ns = time.monotonic_ns()
        if pause:
            self.paused_at_ns = now_ns
            transport.pause_reading()
        else:
            c.reading_resumed(now_ns, now_ns - self.paused_at_ns)
            transport.resume_reading()

    def update_upstream(self, up: _UpstreamSide) -> None:
        reading = not (self.client_full or self.backlogged)
        if up.transport is None or reading == up.reading or up.state is _ABORTED or up.state is _CLOSED:
            return
        up.reading = reading
        if reading:
            up.transport.resume_reading()
        else:
            up.transport.pause_reading()


_INTERNAL_ERROR = (
    "internal error in Phasewatch's proxy: a bug on our side, not in the request or in Ollama; "
    "the collector's log has the details"
)


_CONNECTION_NUMBERS = itertools.count(1)


class _ClientSide(asyncio.Protocol):
    """One client connection: parses its requests and relays them one at a time."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.limits = relay.limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client_addr = ""
        self.connection = next(_CONNECTION_NUMBERS)
        self.peer: tuple[str, int] | None = None
        self.ours: tuple[str, int] | None = None
        self.read_ns = time.monotonic_ns()  # last byte from the client
        self.waiting_since_ns = self.read_ns  # when this connection last had no request in flight
        self.requests: deque[_Request] = deque()  # [0] is active; the rest were pipelined behind it
        self.upstream: _UpstreamSide | None = None
        self.queued_bytes = 0
        self.flow = _FlowControl(self)
        # STOPPED (a refusal, a broken request, too many pipelined, our own error): answer what is
        # queued, then ``_final_answer`` (if any), then close. Changed only by move().
        self.state = ClientState.BETWEEN
        # Request head being parsed.
        self._url: list[bytes] = []
        self._headers: Headers = []
        self._head_bytes = 0
        self._head_started_ns = 0
        self._head_seen = 0  # bytes read since the read in which the head began
        self._parsing: _Request | None = None  # headers in, body not complete
        self._final_answer = b""

    def move(self, state: ClientState) -> None:
        self.state = checked_move(CLIENT_MOVES, self.state, state, "a client connection")

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peer = transport.get_extra_info("peername")
        self.client_addr = str(peer[0]) if isinstance(peer, tuple) else ""
        ours = transport.get_extra_info("sockname")
        self.peer = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        self.ours = (str(ours[0]), int(ours[1])) if isinstance(ours, tuple) and len(ours) >= 2 else None
        self.relay.admit(self)

    def data_received(self, data: bytes) -> None:
        self.read_ns = time.monotonic_ns()
        if self.state is ClientState.STOPPED:
            return
        try:
            if self.state is ClientState.HEAD:  # llhttp builds a header value with +=: bound the head first
                self._head_seen += len(data)
                if self._head_seen > self.limits.max_head_bytes:
                    self._stop(self._head_too_large())
                    return
            try:
                self.parser.feed_data(data)
                return
            except Exception as exc:
                problem = _parser_problem(exc)
            if problem is None or self.state is ClientState.STOPPED:  # stopped on purpose
                return
            if isinstance(problem, httptools.HttpParserUpgrade):
                self._stop(Refused(501, b"Not Implemented", "protocol upgrades are not relayed", Refusal.UPGRADE))
            else:
                self._stop(Refused(400, b"Bad Request", f"malformed HTTP request: {problem}", Refusal.MALFORMED))
        except Exception as exc:  # our own code (route, a hook) raised: never the client's fault
            self.fail_internal(exc)

    def eof_received(self) -> bool:
        # Like Go's net/http (Ollama), a client that half-closes is treated as gone.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.forget(self)
        kind = Failure.STOPPED if self.relay.stopping else Failure.CLIENT_GONE
        for req in self.requests:  # the active one, and any pipelined behind it
            if not req.finished:
                self._end(req, kind, "")
        self.requests.clear()
        if self.upstream is not None and self.upstream.reusable_for(self.upstream.target):
            self.relay.put_idle(self.upstream)  # the next client connection skips the connect
            self.upstream = None
        self._drop_upstream()

    def pause_writing(self) -> None:  # the client reads slower than Ollama writes
        self.flow.client_full = True
        if self.upstream is not None:
            self.flow.update_upstream(self.upstream)

    def resume_writing(self) -> None:
        self.flow.client_full = False
        if self.upstream is not None:
            self.flow.update_upstream(self.upstream)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if len(self.requests) >= self.limits.max_pipelined:
            # More pipelined in one read than we hold: answer those, then close (the client retries the rest).
            limit = self.limits.max_pipelined
            self._stop(Refused(0, b"", f"over {limit} requests pipelined: closed after those", Refusal.TOO_MANY_PIPELINED))
            raise _StopParsing
        self._url, self._headers, self._head_bytes = [], [], 0
        self.move(ClientState.HEAD)
        self._head_started_ns, self._head_seen = self.read_ns, 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state is not ClientState.HEAD:
            return  # a chunked body's trailer fields: not forwarded (our own chunked framing ends without any)
        self._headers.append((name, value))
        self._count_head(len(name) + len(value))

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_head_bytes:
            self._stop(self._head_too_large())
            raise _StopParsing

    def _head_too_large(self) -> Refused:
        limit = self.limits.max_head_bytes
        return Refused(431, b"Request Header Fields Too Large", f"request head over {limit} bytes", Refusal.HEAD_TOO_LARGE)

    def on_headers_complete(self) -> None:
        self.move(ClientState.BETWEEN)
        url = b"".join(self._url)
        try:
            if self.parser.should_upgrade():
                raise Refused(501, b"Not Implemented", "protocol upgrades are not relayed", Refusal.UPGRADE)
            chunked_in, content_length = _request_framing(self._headers, self.parser.get_http_version())
            parsed = httptools.parse_url(url)
            raw_path = url  # origin form, as nearly every client sends it
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
                connection=self.connection,
                peer=self.peer,
                ours=self.ours,
            )
            target, exchange, drop = self.relay.route(head)
        except Refused as refused:
            self._stop(refused)
            raise _StopParsing from None
        except httptools.HttpParserInvalidURLError:
            self._stop(Refused(400, b"Bad Request", "malformed request target", Refusal.MALFORMED))
            raise _StopParsing from None
        expect = (_header(self._headers, b"expect") or b"").strip().lower()
        req = _Request(
            head=head,
            keep_alive=self.parser.should_keep_alive(),
            chunked_in=chunked_in,
            content_length=content_length,
            expect_continue=expect == b"100-continue" and head.http_version == "1.1",
            target=target,
            exchange=exchange,
            drop=drop,
        )
        req.body_started_ns = req.window_started_ns = self.read_ns
        self._parsing = req
        self.requests.append(req)
        if len(self.requests) == 1:
            self._start(req)
        else:
            self.flow.update_client()

    def on_body(self, piece: bytes) -> None:
        req = self._parsing
        if req is None or req.finished:
            return  # the rest of a body already answered (the connection closes after that answer)
        req.body_bytes += len(piece)
        if req.exchange.keep_request_body and not req.kept_truncated:
            # Bounded per body and for all bodies still arriving together: a crowd of slow bodies pins no more.
            room = min(self.limits.max_kept_body_bytes - req.kept_bytes, self.relay.kept_room())
            if len(piece) > room:
                req.kept_truncated = True
            kept = piece[:room] if len(piece) > room else piece
            req.kept_body.append(kept)
            req.kept_bytes += len(kept)
            self.relay.kept_bytes += len(kept)
        if self.upstream is not None and self.upstream.sending(req):
            self.upstream.write(_chunk(piece) if req.chunked_in else piece)
        else:
            req.pending_body.append(piece)
            req.pending_bytes += len(piece)
            if req is not self.requests[0]:  # queued behind the active one
                self.queued_bytes += len(piece)
            if req.pending_bytes > self.limits.max_pipelined_bytes:
                self.flow.update_client()

    def on_message_complete(self) -> None:
        req = self._parsing
        self._parsing = None
        if req is None:
            return
        req.body_complete = True
        if req.exchange.keep_request_body:
            body = b"".join(req.kept_body)
            self._release_kept(req)
            req.exchange.request_body(body, req.kept_truncated)
        if req.chunked_in and self.upstream is not None and self.upstream.sending(req):
            self.upstream.write(b"0\r\n\r\n")

    # -- relaying ----------------------------------------------------------------------------------

    def _start(self, req: _Request) -> None:
        """Make ``req`` the active request: answer Expect, forward it."""
        self.flow.update_client()
        if req.expect_continue and self.transport is not None:
            # Answered here (as aiohttp's server would); the upstream gets the body without asking.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        req.move(Stage.FORWARDED)
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
        elif req.content_length is not None:
            headers.append((b"Content-Length", b"%d" % req.content_length))
        path = req.target.path_prefix + req.head.raw_path
        return _head_bytes(b"%b %b HTTP/1.1" % (req.head.method.encode("latin-1"), path), headers)

    def pending_request_bytes(self, req: _Request) -> bytes:
        """Body bytes that arrived before the upstream connection was ready."""
        body = b"".join(_chunk(p) if req.chunked_in else p for p in req.pending_body)
        req.pending_body = []
        req.pending_bytes = 0
        if req.body_complete and req.chunked_in:
            body += b"0\r\n\r\n"
        self.flow.update_client()
        return body

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def response_done(self, req: _Request) -> None:
        """The active request's response is complete: end the exchange, start the next one."""
        req.move(Stage.DONE)
        req.exchange.ended(time.monotonic_ns())
        if self.requests and self.requests[0] is req:
            self.requests.popleft()
        self.waiting_since_ns = time.monotonic_ns()
        if not req.keep_alive or not req.body_complete:
            # The client asked to close, or the rest of its body would be read as a new request.
            self._close()
            return
        if self.requests:  # a pipelined request waited behind this one
            self.queued_bytes = 0
            self._start(self.requests[0])
            return
        if self.state is ClientState.STOPPED or self.relay.stopping:
            self._finish_stopped()
            return
        self.flow.update_client()

    def respond_error(self, req: _Request, status: int, reason: bytes, kind: Failure, message: str) -> None:
        """Answer the active request ourselves (Ollama did not) and end its exchange as failed."""
        if req.finished:
            return
        extra = req.exchange.answered_here(status)
        close = not req.keep_alive or not req.body_complete
        self.write(_json_response(status, reason, message, extra, close))
        req.move(Stage.RESPONDED)
        req.exchange.failed(kind, message, False)
        self.response_done(req)

    def response_cut(self, req: _Request, detail: str) -> None:
        """Ollama cut the active response after its head went out: the client's is cut the same way (what was relayed
        is flushed, the end of the body never written), and requests pipelined behind it fail with it."""
        self._end(req, Failure.CUT, f"Ollama cut the response mid-way: {detail}")
        for queued in self.requests:
            if not queued.finished:
                self._end(queued, Failure.CUT, f"not sent: Ollama cut the response before it on this connection: {detail}")
        self.requests.clear()
        self._close()

    def forget_upstream(self, up: _UpstreamSide) -> None:
        """``up`` closed or could not connect: this connection's next request needs another."""
        if self.upstream is up:
            self.upstream = None

    def reading_resumed(self, now_ns: int, paused_ns: int) -> None:
        """Reading resumes after a pause of ``paused_ns``: a body's silence counts from now, its time less the pause."""
        self.read_ns = now_ns
        if self._parsing is not None:
            self._parsing.body_started_ns += paused_ns
            self._parsing.window_started_ns += paused_ns

    def _end(self, req: _Request, kind: Failure, detail: str) -> None:
        """End ``req``'s exchange as failed; it must not be finished yet."""
        responded = req.responded
        req.move(Stage.DONE)
        self._release_kept(req)
        try:
            req.exchange.failed(kind, detail, responded)
        finally:  # ended() comes exactly once, whatever failed() did
            req.exchange.ended(time.monotonic_ns())

    def _release_kept(self, req: _Request) -> None:
        self.relay.kept_bytes -= req.kept_bytes
        req.kept_body, req.kept_bytes = [], 0

    def _stop(self, refused: Refused) -> None:
        """Parse no more of this connection: answer what is queued, then ``refused`` (status 0: nothing), then close.
        The refusal goes on the record (log, counter, the sidebar's last hour)."""
        if self.state is ClientState.STOPPED:
            return
        self.move(ClientState.STOPPED)
        status, message = refused.status, refused.message
        if status:
            self._final_answer = _json_response(status, refused.reason, message, [], close=True)
        detail = message
        req, self._parsing = self._parsing, None
        if req is not None and not req.finished:  # its body broke off (or timed out) midway
            detail = f"{req.head.method} {req.head.path[:200]!a}: {message}"  # the path as ASCII: no line breaks in the log
            if req.started:  # the upstream request cannot be completed
                self._drop_upstream()
            if req.responded:  # the client already has part of an answer: nothing more can follow
                self._final_answer = b""
                status = 0
            self._end(req, Failure.CLIENT_GONE, f"the client's request broke off: {message}")
            if req in self.requests:
                self.requests.remove(req)
        self.relay.refusals.note(status or None, refused.why, self.client_addr, detail)
        self.flow.update_client()
        if not self.requests:
            self._finish_stopped()

    def _finish_stopped(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and self._final_answer:
            self.transport.write(self._final_answer)
        self._final_answer = b""
        self._close()

    def fail_internal(self, exc: BaseException) -> None:
        """Our own code raised while serving this connection: log it with its traceback; answer 500 unless a
        response began (then cut it), end every exchange on it, and close. Other connections go on."""
        active = self.requests[0] if self.requests else None
        what = f"{active.head.method} {active.head.path}" if active is not None else "a request head"
        log.error("the proxy failed on %s from %s", what, self.client_addr or "an unknown address", exc_info=exc)
        answer = active is None or not active.responded
        if self.state is not ClientState.STOPPED:
            self.move(ClientState.STOPPED)
        self._parsing = None
        self._final_answer = b""
        extra: Headers = []
        for req in list(self.requests):
            if req.finished:
                continue
            # The hooks that failed may fail again: logged, and every exchange still ends.
            if req is active and answer:
                try:
                    extra = req.exchange.answered_here(500)
                except Exception:
                    log.exception("answered_here failed too for %s %s", req.head.method, req.head.path)
            try:
                self._end(req, Failure.INTERNAL, _INTERNAL_ERROR)
            except Exception:
                log.exception("ending the exchange of %s %s failed too", req.head.method, req.head.path)
        self.requests.clear()
        self._drop_upstream()
        if answer and self.transport is not None and not self.transport.is_closing():
            self.transport.write(_json_response(500, b"Internal Server Error", _INTERNAL_ERROR, extra, close=True))
        self._close()

    def check_timeouts(self, now_ns: int) -> None:
        """Called every so often: end a head, body or idle connection that took too long."""
        if self.transport is None or self.transport.is_closing():
            return
        lim = self.limits
        if self.state is ClientState.STOPPED:
            return
        timeout = b"Request Timeout"
        if self.state is ClientState.HEAD:
            if now_ns - self._head_started_ns > lim.head_timeout_s * 1e9:
                message = f"request head not complete within {lim.head_timeout_s:g} s"
                self._stop(Refused(408, timeout, message, Refusal.HEAD_TIMEOUT))
        elif self._parsing is not None and not self.flow.client_paused:
            req = self._parsing
            if now_ns - self.read_ns > lim.body_timeout_s * 1e9:
                message = f"no request body byte for {lim.body_timeout_s:g} s"
                self._stop(Refused(408, timeout, message, Refusal.BODY_TIMEOUT))
            elif not self._body_keeps_its_rate(req, now_ns):
                message = f"request body slower than {lim.min_body_rate_bps} bytes/s"
                self._stop(Refused(408, timeout, message, Refusal.BODY_TOO_SLOW))
        elif not self.requests and now_ns - max(self.read_ns, self.waiting_since_ns) > lim.idle_timeout_s * 1e9:
            self._close()

    def _body_keeps_its_rate(self, req: _Request, now_ns: int) -> bool:
        """Past its grace (``body_timeout_s`` from the head's end), every window of ``body_rate_window_s``
        must bring ``min_body_rate_bps``: what came before buys no time (unlike Apache's MinRate)."""
        lim = self.limits
        window_ns = now_ns - req.window_started_ns
        if window_ns < lim.body_rate_window_s * 1e9:
            return True
        brought = req.body_bytes - req.window_start_bytes
        if now_ns - req.body_started_ns >= lim.body_timeout_s * 1e9 and brought < lim.min_body_rate_bps * window_ns / 1e9:
            return False
        req.window_started_ns, req.window_start_bytes = now_ns, req.body_bytes
        return True

    def evictable(self) -> bool:
        """Nothing in flight: an idle keep-alive connection or a head still arriving."""
        return not self.requests and self.transport is not None and not self.transport.is_closing()

    def slow_body_since_ns(self, now_ns: int) -> int | None:
        """When the body of this connection's only request began arriving, if that is over
        ``Limits.slow_body_s`` ago and no answer began: such a connection may be cut to make room."""
        req = self._parsing
        if (
            req is None
            or len(self.requests) != 1
            or self.requests[0] is not req
            or req.responded
            or self.flow.client_paused  # waiting on Ollama (or the pipeline), not slow by its own doing
            or self.transport is None
            or self.transport.is_closing()
            or now_ns - req.body_started_ns < self.limits.slow_body_s * 1e9
        ):
            return None
        return req.body_started_ns

    def evict(self) -> None:
        """Cut this connection now to make room for a new one; a body still arriving fails as evicted. A request cut
        (a body or a head still arriving) is a refusal on the record; an idle connection closed is not."""
        req = self._parsing
        if req is not None and not req.finished:
            self._parsing = None
            detail = "the request body was still arriving, slowly, when the proxy needed room"
            self.relay.refusals.note(
                None,
                Refusal.EVICTED,
                self.client_addr,
                f"{req.head.method} {req.head.path[:200]!a}: {detail} ({req.body_bytes} bytes in)",
            )
            self._end(req, Failure.EVICTED, detail)
            self.requests.clear()
        elif self.state is ClientState.HEAD:
            detail = "a request head still arriving when the proxy needed room"
            self.relay.refusals.note(None, Refusal.EVICTED, self.client_addr, detail)
        self.stop(now=True)

    def refuse_at_bound(self, detail: str) -> None:
        """No connection can be closed to make room for this new one: answer 503 at once, then close."""
        self.move(ClientState.STOPPED)
        self.relay.refusals.note(503, Refusal.CONNECTION_BOUND, self.client_addr, detail)
        if self.transport is not None:
            self.transport.write(_json_response(503, b"Service Unavailable", "too many connections; try again", [], close=True))
            self.transport.close()

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
        self.state = UpstreamState.CONNECTING  # changed only by move()
        self.reading = True  # the transport reads (``_FlowControl`` decides)
        self.parser = httptools.HttpResponseParser(self)
        self.req: _Request | None = None
        self.read_ns = 0
        self.first_byte_ns = 0
        self._status_reason = b""
        self._headers: Headers = []
        # How the current response is framed, once its head is in.
        self._chunked_out = False
        self._close_delimited = False
        self._keep_alive = True
        self._head_seen = 0  # bytes read while the response head is incomplete
        self._on_body: Callable[[tuple[int, bytes]], None] | None = None
        self._unparsed = 0  # body bytes given to _on_body since the exchange last caught up
        self._max_unparsed = client.limits.max_unparsed_bytes

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
            if self.state is UpstreamState.ABORTED or req.finished:
                return
            self.move(UpstreamState.CLOSED)  # never opened
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            self.client.forget_upstream(self)
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
            self._guarded(self.client.respond_error, req, 502, b"Bad Gateway", Failure.UNREACHABLE, message)
            return
        if self.state is UpstreamState.CLOSED and not req.finished:  # Ollama closed it before the request went out
            self.client.forget_upstream(self)
            message = f"Ollama at {self.target.name} failed before answering: it closed the connection at once"
            self._guarded(self.client.respond_error, req, 502, b"Bad Gateway", Failure.NO_ANSWER, message)
            return
        if self.state is not UpstreamState.CONNECTING or req.finished:
            self.abort()
            return
        self._guarded(self.send, req)

    def _guarded(self, step: Callable[..., None], *args: Any) -> None:
        """Run ``step`` outside a protocol callback (a task): an exception of ours fails the client connection."""
        try:
            step(*args)
        except Exception as exc:
            self.abort()
            self.client.fail_internal(exc)

    def send(self, req: _Request) -> None:
        """Send ``req`` (head and whatever body is in) on this open, idle connection."""
        self.move(UpstreamState.WAITING)
        self.req = req
        self._head_seen = 0
        self.parser = httptools.HttpResponseParser(self)
        self._on_body = req.exchange.on_body
        self._unparsed = 0
        self.client.flow.backlogged = False
        self.client.flow.update_upstream(self)
        self.write(self.client.request_head_for_upstream(req) + self.client.pending_request_bytes(req))

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def sending(self, req: _Request) -> bool:
        """``req``'s head went out on this connection, so its body may follow."""
        return self.req is req and self.state is not _ABORTED and self.state is not _CLOSED

    def reusable_for(self, target: Target) -> bool:
        return self.state is UpstreamState.IDLE and self.target == target

    def _caught_up(self) -> None:
        self._unparsed = 0
        self.client.flow.backlogged = False
        self.client.flow.update_upstream(self)

    def abort(self) -> None:
        """Drop the connection now (Ollama sees the client leave and cancels the request)."""
        if self.state is not _ABORTED and self.state is not _CLOSED:
            self.move(UpstreamState.ABORTED)
        if self.transport is not None:
            self.transport.abort()

    def move(self, state: UpstreamState) -> None:
        self.state = checked_move(UPSTREAM_MOVES, self.state, state, "an upstream connection")

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # connect() sends the request next

    def data_received(self, data: bytes) -> None:
        self.read_ns = time.monotonic_ns()
        if self.req is None:  # bytes on an idle connection answer nothing we sent
            self.abort()
            return
        try:
            state = self.state
            if state is _WAITING or state is _HEAD:  # bound the head before llhttp builds its header values with +=
                self._head_seen += len(data)
                if self._head_seen > self.client.limits.max_head_bytes + len(data):
                    self._broken(f"Ollama sent a response head over {self.client.limits.max_head_bytes} bytes")
                    return
            try:
                self.parser.feed_data(data)
                problem = None
            except Exception as exc:
                problem = _parser_problem(exc)
            if problem is not None:
                if isinstance(problem, httptools.HttpParserUpgrade):
                    self._broken("Ollama switched protocols, which the relay does not do")
                    return
                if self.state is not _ENDED:
                    self._broken(f"Ollama sent a malformed HTTP response: {problem}")
                    return
                self._keep_alive = False  # bytes beyond the end of the response: this connection is never reused
            if self.state is _ENDED:  # completed after the parser let go: no later byte is read as the next answer
                self._complete()
        except Exception as exc:  # our own code (a recording hook) raised: never Ollama's fault
            self.abort()
            self.client.fail_internal(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        aborted = self.state is UpstreamState.ABORTED
        if not aborted and self.state is not UpstreamState.CLOSED:
            self.move(UpstreamState.CLOSED)
        self.client.relay.forget_idle(self)
        self.client.forget_upstream(self)
        req = self.req
        if req is None or req.finished or aborted:
            return
        try:
            if req.responded and self._close_delimited:
                self._complete()  # the end of a body without length or chunks is the close itself
                return
            self._broken(f"connection closed ({exc})" if exc else "connection closed")
        except Exception as error:  # a recording hook raised
            self.client.fail_internal(error)

    def pause_writing(self) -> None:  # Ollama reads a large request body slower than the client sends it
        self.client.flow.upstream_full = True
        self.client.flow.update_client()

    def resume_writing(self) -> None:
        self.client.flow.upstream_full = False
        self.client.flow.update_client()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state is UpstreamState.ENDED or self.req is None:
            self._keep_alive = False  # a second response to one request: this connection is never reused,
            raise _StopParsing  # and none of it reaches a client
        self._status_reason, self._headers = b"", []
        if self.state is UpstreamState.WAITING:  # its first byte
            self.move(UpstreamState.HEAD)
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
        self.move(UpstreamState.BODY)
        self._keep_alive = self.parser.should_keep_alive()
        lengths: list[bytes] = []
        codings: list[bytes] = []
        for key, value in self._headers:
            low = key.lower()
            if low == b"content-length":
                lengths.append(value)
            elif low == b"transfer-encoding":
                codings.append(value)
        if codings and (len(codings) > 1 or codings[0].strip(b" \t").lower() != b"chunked"):
            raise httptools.HttpParserError("a transfer coding other than a lone chunked")
        length = int(lengths[0].strip(b" \t")) if lengths and not codings else None  # llhttp checked the digits
        no_body = req.head.method == "HEAD" or status in _NO_BODY_STATUS
        has_length = length is not None
        self._close_delimited = not no_body and not has_length and not codings
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
        elif length is not None:
            headers.append((b"Content-Length", b"%d" % length))
        if not req.keep_alive:
            headers.append((b"Connection", b"close"))
        self.client.write(_head_bytes(b"HTTP/1.1 %d %b" % (status, self._status_reason), headers))
        req.move(Stage.RESPONDED)
        if no_body:
            self.move(UpstreamState.ENDED)
            if req.head.method == "HEAD":
                # llhttp would read a HEAD response's Content-Length bytes as its body: stop it here, and
                # since what follows cannot be told apart, never reuse this connection.
                self._keep_alive = False
                raise _StopParsing

    def on_body(self, piece: bytes) -> None:
        # Hot path: one append, one write.
        if self._on_body is not None:
            self._on_body((self.read_ns, piece))
            self._unparsed += len(piece)
            flow = self.client.flow
            if self._unparsed > self._max_unparsed and not flow.backlogged and self.req is not None:
                flow.backlogged = True  # a flood from upstream: read on once the recording caught up
                flow.update_upstream(self)
                self.req.exchange.backlog(self._caught_up)
        self.client.write(_chunk(piece) if self._chunked_out else piece)

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or req.finished or not req.responded or self.state is not UpstreamState.BODY:
            return  # an interim 1xx answer (or a connection already dropped)
        self.move(UpstreamState.ENDED)

    # -- endings -----------------------------------------------------------------------------------

    def _complete(self) -> None:
        req = self.req
        if req is None or req.finished:
            return
        if self._chunked_out:
            self.client.write(b"0\r\n\r\n")
        self.req = None
        if not self._keep_alive or not req.body_complete or self._close_delimited:
            # Ollama closes, answered before the whole request body went out, or sent more than one answer.
            self.abort()
        else:
            self.move(UpstreamState.IDLE)
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
        self.client.response_cut(req, detail)


def _unquote(path: bytes) -> str:
    return unquote_to_bytes(path).decode("utf-8", "replace")


def _victim(crowd: set[_ClientSide]) -> _ClientSide | None:
    """Whom to cut for a new connection: the longest-waiting idle one, else the oldest slow body, else none."""
    waiting = [c for c in crowd if c.evictable()]
    if waiting:
        return min(waiting, key=lambda c: c.waiting_since_ns)
    now_ns = time.monotonic_ns()
    oldest: _ClientSide | None = None
    oldest_ns = now_ns
    for c in crowd:
        since_ns = c.slow_body_since_ns(now_ns)
        if since_ns is not None and since_ns <= oldest_ns:
            oldest, oldest_ns = c, since_ns
    return oldest


class Relay:
    """Listen on host:port and relay every request to where ``route`` says."""

    def __init__(self, route: Route, limits: Limits | None = None) -> None:
        self.route = route
        self.limits = limits or Limits()
        self.clients: set[_ClientSide] = set()
        self.by_addr: dict[str, set[_ClientSide]] = {}
        self.max_clients = self.limits.connection_cap(fd_soft_limit())
        self.kept_bytes = 0  # request body bytes kept for recording, of all bodies still arriving
        self.refusals = Refusals(self.limits.refusal_warnings_per_minute)
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: dict[Target, list[_UpstreamSide]] = {}

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; returns the port (``port`` 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self.max_clients = self.limits.connection_cap(fd_soft_limit())
        sock = exclusive_socket(host, port)  # Windows: no second process may bind the port (collectors/proxy/bind.py)
        if sock is not None:
            self._server = await loop.create_server(lambda: _ClientSide(self), sock=sock, backlog=BACKLOG)
        else:
            self._server = await loop.create_server(lambda: _ClientSide(self), host, port, reuse_address=True, backlog=BACKLOG)
        self.spawn(self._watch_timeouts())
        return int(self._server.sockets[0].getsockname()[1])

    # -- connection bounds --------------------------------------------------------------------------

    def per_client_cap(self) -> int:
        """Connections one address may hold: never the whole cap, so other addresses always find room."""
        share = int(self.max_clients * self.limits.max_client_share)
        return max(1, min(self.limits.max_connections_per_client, share))

    def kept_room(self) -> int:
        """Bytes more that bodies still arriving may keep for recording, all together."""
        return max(0, self.limits.max_kept_bodies_bytes - self.kept_bytes)

    def admit(self, client: _ClientSide) -> None:
        """Take a new client connection; at a bound, make room by closing the longest-waiting idle one, or
        else the one whose request body has been arriving the longest (``Limits.slow_body_s`` at least)."""
        same_addr = self.by_addr.setdefault(client.client_addr, set())
        for crowd, cap in ((same_addr, self.per_client_cap()), (self.clients, self.max_clients)):
            if len(crowd) >= cap:
                victim = _victim(crowd)
                if victim is None:  # every connection has a request running: this one cannot be served
                    whose = "this address's" if crowd is same_addr else "the proxy's"
                    client.refuse_at_bound(f"{len(crowd)} connections open ({whose} bound), each with a request running")
                    return
                self.forget(victim)
                victim.evict()
        self.clients.add(client)
        same_addr.add(client)

    def forget(self, client: _ClientSide) -> None:
        self.clients.discard(client)
        same_addr = self.by_addr.get(client.client_addr)
        if same_addr is not None:
            same_addr.discard(client)
            if not same_addr:
                del self.by_addr[client.client_addr]

    async def _watch_timeouts(self) -> None:
        lim = self.limits
        shortest_s = min(lim.head_timeout_s, lim.body_timeout_s, lim.body_rate_window_s, lim.idle_timeout_s)
        interval_s = min(1.0, max(0.05, shortest_s / 4))
        while True:
            await asyncio.sleep(interval_s)
            now_ns = time.monotonic_ns()
            for client in list(self.clients):
                try:
                    client.check_timeouts(now_ns)
                except Exception as exc:  # a hook raised as a request timed out: that connection fails, not this watch
                    client.fail_internal(exc)

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
