"""The client side of the relay: one client connection, its requests parsed by httptools and relayed one at a
time through an ``UpstreamSide`` (as uvicorn's protocol classes serve theirs), with its bounds and timeouts.

Whose fault: bytes llhttp refuses are the client's (400); an exception raised by our own code (``route``, an
``Exchange`` hook, the relay) is ours: logged with its traceback, answered 500 if no response began (else the
connection is cut), and every other connection goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol, cast

import httptools

from collectors.proxy.limits import Limits
from collectors.proxy.refusals import Refusal, Refusals
from collectors.proxy.relay.exchange import Failure, RelayedRequest, RequestHead, Route, Target
from collectors.proxy.relay.flow_control import FlowControl
from collectors.proxy.relay.states import CLIENT_MOVES, ClientEvent, ClientState, StageEvent, next_state
from collectors.proxy.relay.upstream_side import UpstreamSide
from collectors.proxy.relay.wire import (
    INTERNAL_ERROR,
    Headers,
    Refused,
    StopParsing,
    chunk,
    header,
    json_response,
    parser_problem,
    request_framing,
    request_target,
)

# The relay's one logger for all its modules, named after the package: filters and tests select it by that name.
log = logging.getLogger("collectors.proxy.relay")


class RelayHost(Protocol):
    """The relay that holds client connections (``collectors.proxy.relay.relay.Relay``), as one of them sees it:
    typed here so that this module never imports the relay, which imports it."""

    route: Route
    limits: Limits
    refusals: Refusals
    stopping: bool
    kept_bytes: int

    def admit(self, client: ClientSide) -> None: ...
    def forget(self, client: ClientSide) -> None: ...
    def kept_room(self) -> int: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
    def put_idle(self, up: UpstreamSide) -> None: ...
    def take_idle(self, target: Target) -> UpstreamSide | None: ...
    def forget_idle(self, up: UpstreamSide) -> None: ...


_CONNECTION_NUMBERS = itertools.count(1)


class ClientSide(asyncio.Protocol):
    """One client connection: parses its requests and relays them one at a time."""

    def __init__(self, relay: RelayHost) -> None:
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
        self.requests: deque[RelayedRequest] = deque()  # [0] is active; the rest were pipelined behind it
        self.upstream: UpstreamSide | None = None
        self.queued_bytes = 0
        self.flow = FlowControl(self)
        # STOPPED (a refusal, a broken request, too many pipelined, our own error): answer what is
        # queued, then ``_final_answer`` (if any), then close. Changed only by move().
        self.state = ClientState.BETWEEN
        # Request head being parsed.
        self._url: list[bytes] = []
        self._headers: Headers = []
        self._head_bytes = 0
        self._head_started_ns = 0
        self._head_seen = 0  # bytes read since the read in which the head began
        self._parsing: RelayedRequest | None = None  # headers in, body not complete
        self._final_answer = b""

    def move(self, event: ClientEvent) -> None:
        self.state = next_state(CLIENT_MOVES, self.state, event, "a client connection")

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
                problem = parser_problem(exc)
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
            raise StopParsing
        self._url, self._headers, self._head_bytes = [], [], 0
        self.move(ClientEvent.HEAD_BEGINS)
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
            raise StopParsing

    def _head_too_large(self) -> Refused:
        limit = self.limits.max_head_bytes
        return Refused(431, b"Request Header Fields Too Large", f"request head over {limit} bytes", Refusal.HEAD_TOO_LARGE)

    def on_headers_complete(self) -> None:
        self.move(ClientEvent.HEAD_ENDS)
        url = b"".join(self._url)
        try:
            if self.parser.should_upgrade():
                raise Refused(501, b"Not Implemented", "protocol upgrades are not relayed", Refusal.UPGRADE)
            chunked_in, content_length = request_framing(self._headers, self.parser.get_http_version())
            raw_path, path = request_target(url)
            head = RequestHead(
                method=self.parser.get_method().decode("latin-1"),
                raw_path=raw_path,
                path=path,
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
            raise StopParsing from None
        except httptools.HttpParserInvalidURLError:
            self._stop(Refused(400, b"Bad Request", "malformed request target", Refusal.MALFORMED))
            raise StopParsing from None
        expect = (header(self._headers, b"expect") or b"").strip().lower()
        req = RelayedRequest(
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
            self.relay.kept_bytes += req.keep(piece, room)
        if self.upstream is not None and self.upstream.sending(req):
            self.upstream.write(chunk(piece) if req.chunked_in else piece)
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

    def _start(self, req: RelayedRequest) -> None:
        """Make ``req`` the active request: answer Expect, forward it."""
        self.flow.update_client()
        if req.expect_continue and self.transport is not None:
            # Answered here (as aiohttp's server would); the upstream gets the body without asking.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        req.move(StageEvent.FORWARD)
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
        self.upstream = UpstreamSide(self, req.target)
        self.relay.spawn(self.upstream.connect(req))

    def pending_request_bytes(self, req: RelayedRequest) -> bytes:
        """Body bytes that arrived before the upstream connection was ready: taken, so the client may be read again."""
        body = req.take_pending_body()
        self.flow.update_client()
        return body

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def response_done(self, req: RelayedRequest) -> None:
        """The active request's response is complete: end the exchange, start the next one."""
        req.move(StageEvent.COMPLETE)
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

    def respond_error(self, req: RelayedRequest, status: int, reason: bytes, kind: Failure, message: str) -> None:
        """Answer the active request ourselves (Ollama did not) and end its exchange as failed."""
        if req.finished:
            return
        extra = req.exchange.answered_here(status)
        close = not req.keep_alive or not req.body_complete
        self.write(json_response(status, reason, message, extra, close))
        req.move(StageEvent.RESPOND)
        req.exchange.failed(kind, message, False)
        self.response_done(req)

    def response_cut(self, req: RelayedRequest, detail: str) -> None:
        """Ollama cut the active response after its head went out: the client's is cut the same way (what was relayed
        is flushed, the end of the body never written), and requests pipelined behind it fail with it."""
        self._end(req, Failure.CUT, f"Ollama cut the response mid-way: {detail}")
        for queued in self.requests:
            if not queued.finished:
                self._end(queued, Failure.CUT, f"not sent: Ollama cut the response before it on this connection: {detail}")
        self.requests.clear()
        self._close()

    def forget_upstream(self, up: UpstreamSide) -> None:
        """``up`` closed or could not connect: this connection's next request needs another."""
        if self.upstream is up:
            self.upstream = None

    def reading_resumed(self, now_ns: int, paused_ns: int) -> None:
        """Reading resumes after a pause of ``paused_ns``: a body's silence counts from now, its time less the pause."""
        self.read_ns = now_ns
        if self._parsing is not None:
            self._parsing.body_started_ns += paused_ns
            self._parsing.window_started_ns += paused_ns

    def _end(self, req: RelayedRequest, kind: Failure, detail: str) -> None:
        """End ``req``'s exchange as failed; it must not be finished yet."""
        responded = req.responded
        req.move(StageEvent.FAIL)
        self._release_kept(req)
        try:
            req.exchange.failed(kind, detail, responded)
        finally:  # ended() comes exactly once, whatever failed() did
            req.exchange.ended(time.monotonic_ns())

    def _release_kept(self, req: RelayedRequest) -> None:
        self.relay.kept_bytes -= req.kept_bytes
        req.kept_body, req.kept_bytes = [], 0

    def _stop(self, refused: Refused) -> None:
        """Parse no more of this connection: answer what is queued, then ``refused`` (status 0: nothing), then close.
        The refusal goes on the record (log, counter, the sidebar's last hour)."""
        if self.state is ClientState.STOPPED:
            return
        self.move(ClientEvent.STOP)
        status, message = refused.status, refused.message
        if status:
            self._final_answer = json_response(status, refused.reason, message, [], close=True)
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
            self.move(ClientEvent.STOP)
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
                self._end(req, Failure.INTERNAL, INTERNAL_ERROR)
            except Exception:
                log.exception("ending the exchange of %s %s failed too", req.head.method, req.head.path)
        self.requests.clear()
        self._drop_upstream()
        if answer and self.transport is not None and not self.transport.is_closing():
            self.transport.write(json_response(500, b"Internal Server Error", INTERNAL_ERROR, extra, close=True))
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
            overdue = self._parsing.body_overdue(now_ns, self.read_ns, lim)
            if overdue is not None:
                self._stop(overdue)
        elif not self.requests and now_ns - max(self.read_ns, self.waiting_since_ns) > lim.idle_timeout_s * 1e9:
            self._close()

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
        self.move(ClientEvent.STOP)
        self.relay.refusals.note(503, Refusal.CONNECTION_BOUND, self.client_addr, detail)
        if self.transport is not None:
            self.transport.write(json_response(503, b"Service Unavailable", "too many connections; try again", [], close=True))
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
