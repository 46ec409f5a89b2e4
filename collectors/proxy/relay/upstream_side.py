"""The upstream side of the relay: one connection to Ollama, serving one client connection's requests one at a
time (as uvicorn's protocol classes serve theirs), its response parsed by httptools and each body piece written to
the client inside the callback of the read that brought it."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import httptools

from collectors.proxy.limits import Limits
from collectors.proxy.relay.exchange import Failure, RelayedRequest, Target
from collectors.proxy.relay.flow_control import FlowControl
from collectors.proxy.relay.states import (
    ABORTED,
    CLOSED,
    ENDED,
    HEAD,
    UPSTREAM_MOVES,
    WAITING,
    StageEvent,
    UpstreamEvent,
    UpstreamState,
    next_state,
)
from collectors.proxy.relay.wire import (
    NO_BODY_STATUS,
    Headers,
    StopParsing,
    chunk,
    forwardable,
    head_bytes,
    header,
    parser_problem,
    response_framing,
)

CONNECT_TIMEOUT_S = 10.0


class IdlePool(Protocol):
    """The relay's pool of idle upstream connections, as an upstream connection sees it."""

    def forget_idle(self, up: UpstreamSide) -> None: ...


class Downstream(Protocol):
    """The client connection an upstream connection serves (``collectors.proxy.relay.client_side.ClientSide``):
    typed here so that this module never imports the client side, which imports it."""

    limits: Limits
    flow: FlowControl

    @property
    def relay(self) -> IdlePool: ...
    def write(self, data: bytes) -> None: ...
    def pending_request_bytes(self, req: RelayedRequest) -> bytes: ...
    def respond_error(self, req: RelayedRequest, status: int, reason: bytes, kind: Failure, message: str) -> None: ...
    def response_done(self, req: RelayedRequest) -> None: ...
    def response_cut(self, req: RelayedRequest, detail: str) -> None: ...
    def forget_upstream(self, up: UpstreamSide) -> None: ...
    def fail_internal(self, exc: BaseException) -> None: ...


class UpstreamSide(asyncio.Protocol):
    """The connection to Ollama that serves one client connection's requests, one at a time."""

    def __init__(self, client: Downstream, target: Target) -> None:
        self.client = client
        self.target = target
        self.transport: asyncio.Transport | None = None
        self.state = UpstreamState.CONNECTING  # changed only by move()
        self.reading = True  # the transport reads (``FlowControl`` decides)
        self.parser = httptools.HttpResponseParser(self)
        self.req: RelayedRequest | None = None
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

    async def connect(self, req: RelayedRequest) -> None:
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
            self.move(UpstreamEvent.CONNECTION_LOST)  # never opened
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

    def send(self, req: RelayedRequest) -> None:
        """Send ``req`` (head and whatever body is in) on this open, idle connection."""
        self.move(UpstreamEvent.SEND)
        self.req = req
        self._head_seen = 0
        self.parser = httptools.HttpResponseParser(self)
        self._on_body = req.exchange.on_body
        self._unparsed = 0
        self.client.flow.backlogged = False
        self.client.flow.update_upstream(self)
        self.write(req.head_for_upstream() + self.client.pending_request_bytes(req))

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def sending(self, req: RelayedRequest) -> bool:
        """``req``'s head went out on this connection, so its body may follow."""
        return self.req is req and self.state is not ABORTED and self.state is not CLOSED

    def reusable_for(self, target: Target) -> bool:
        return self.state is UpstreamState.IDLE and self.target == target

    def _caught_up(self) -> None:
        self._unparsed = 0
        self.client.flow.backlogged = False
        self.client.flow.update_upstream(self)

    def abort(self) -> None:
        """Drop the connection now (Ollama sees the client leave and cancels the request)."""
        if self.state is not ABORTED and self.state is not CLOSED:
            self.move(UpstreamEvent.ABORT)
        if self.transport is not None:
            self.transport.abort()

    def move(self, event: UpstreamEvent) -> None:
        self.state = next_state(UPSTREAM_MOVES, self.state, event, "an upstream connection")

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
            if state is WAITING or state is HEAD:  # bound the head before llhttp builds its header values with +=
                self._head_seen += len(data)
                if self._head_seen > self.client.limits.max_head_bytes + len(data):
                    self._broken(f"Ollama sent a response head over {self.client.limits.max_head_bytes} bytes")
                    return
            try:
                self.parser.feed_data(data)
                problem = None
            except Exception as exc:
                problem = parser_problem(exc)
            if problem is not None:
                if isinstance(problem, httptools.HttpParserUpgrade):
                    self._broken("Ollama switched protocols, which the relay does not do")
                    return
                if self.state is not ENDED:
                    self._broken(f"Ollama sent a malformed HTTP response: {problem}")
                    return
                self._keep_alive = False  # bytes beyond the end of the response: this connection is never reused
            if self.state is ENDED:  # completed after the parser let go: no later byte is read as the next answer
                self._complete()
        except Exception as exc:  # our own code (a recording hook) raised: never Ollama's fault
            self.abort()
            self.client.fail_internal(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        aborted = self.state is UpstreamState.ABORTED
        if not aborted and self.state is not UpstreamState.CLOSED:
            self.move(UpstreamEvent.CONNECTION_LOST)
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
            raise StopParsing  # and none of it reaches a client
        self._status_reason, self._headers = b"", []
        if self.state is UpstreamState.WAITING:  # its first byte
            self.move(UpstreamEvent.FIRST_BYTE)
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
        self.move(UpstreamEvent.FINAL_HEAD)
        self._keep_alive = self.parser.should_keep_alive()
        ollama_chunked, length = response_framing(self._headers)
        no_body = req.head.method == "HEAD" or status in NO_BODY_STATUS
        has_length = length is not None
        self._close_delimited = not no_body and not has_length and not ollama_chunked
        client_1_1 = req.head.http_version == "1.1"
        self._chunked_out = not no_body and not has_length and client_1_1
        if not no_body and not has_length and not client_1_1:
            req.keep_alive = False  # an HTTP/1.0 client learns the end of such a body from the close
        content_type = header(self._headers, b"content-type")
        extra = req.exchange.response_head(
            self.first_byte_ns, status, content_type.decode("latin-1") if content_type is not None else None
        )
        headers = forwardable(self._headers, frozenset()) + extra
        if self._chunked_out:
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif length is not None:
            headers.append((b"Content-Length", b"%d" % length))
        if not req.keep_alive:
            headers.append((b"Connection", b"close"))
        self.client.write(head_bytes(b"HTTP/1.1 %d %b" % (status, self._status_reason), headers))
        req.move(StageEvent.RESPOND)
        if no_body:
            self.move(UpstreamEvent.RESPONSE_ENDS)
            if req.head.method == "HEAD":
                # llhttp would read a HEAD response's Content-Length bytes as its body: stop it here, and
                # since what follows cannot be told apart, never reuse this connection.
                self._keep_alive = False
                raise StopParsing

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
        self.client.write(chunk(piece) if self._chunked_out else piece)

    def on_message_complete(self) -> None:
        req = self.req
        if req is None or req.finished or not req.responded or self.state is not UpstreamState.BODY:
            return  # an interim 1xx answer (or a connection already dropped)
        self.move(UpstreamEvent.RESPONSE_ENDS)

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
            self.move(UpstreamEvent.KEEP_ALIVE)
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
