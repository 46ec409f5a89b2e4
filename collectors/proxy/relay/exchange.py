"""What the relay and its caller share about one request: where it goes (``Target``), its head (``RequestHead``),
the caller's hooks (``Exchange``), how it ended early (``Failure``), and the relay's own record of it while it runs
(``RelayedRequest``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from collectors.proxy.limits import Limits
from collectors.proxy.refusals import Refusal
from collectors.proxy.relay.states import DONE, FORWARDED, RESPONDED, STAGE_MOVES, Stage, StageEvent, next_state
from collectors.proxy.relay.wire import Headers, Refused, chunk, forwardable, head_bytes


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


@dataclass(eq=False)
class RelayedRequest:
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

    def move(self, event: StageEvent) -> None:
        self.stage = next_state(STAGE_MOVES, self.stage, event, "a request")

    @property
    def started(self) -> bool:  # forwarding began
        return self.stage >= FORWARDED

    @property
    def responded(self) -> bool:  # a response head went to the client (or none ever will)
        return self.stage >= RESPONDED

    @property
    def finished(self) -> bool:
        return self.stage is DONE

    def keep(self, piece: bytes, room: int) -> int:
        """Keep the start of a body piece for ``request_body()``, at most ``room`` bytes; returns how many were kept."""
        if len(piece) > room:
            self.kept_truncated = True
        kept = piece[:room] if len(piece) > room else piece
        self.kept_body.append(kept)
        self.kept_bytes += len(kept)
        return len(kept)

    def head_for_upstream(self) -> bytes:
        """The request head as it goes to Ollama: its own Host, hop-by-hop headers dropped, framed by the relay."""
        headers = forwardable(self.head.headers, self.drop | {b"host", b"expect"})
        headers.insert(0, (b"Host", self.target.host_header))
        if self.chunked_in:
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif self.content_length is not None:
            headers.append((b"Content-Length", b"%d" % self.content_length))
        path = self.target.path_prefix + self.head.raw_path
        return head_bytes(b"%b %b HTTP/1.1" % (self.head.method.encode("latin-1"), path), headers)

    def take_pending_body(self) -> bytes:
        """Body bytes that arrived before the upstream connection was ready, framed for it; none are kept after."""
        body = b"".join(chunk(p) if self.chunked_in else p for p in self.pending_body)
        self.pending_body = []
        self.pending_bytes = 0
        if self.body_complete and self.chunked_in:
            body += b"0\r\n\r\n"
        return body

    def body_overdue(self, now_ns: int, read_ns: int, lim: Limits) -> Refused | None:
        """Why this body, its last byte read at ``read_ns``, is ended now (a 408 refusal), or None while it keeps time."""
        if now_ns - read_ns > lim.body_timeout_s * 1e9:
            message = f"no request body byte for {lim.body_timeout_s:g} s"
            return Refused(408, b"Request Timeout", message, Refusal.BODY_TIMEOUT)
        if not self.keeps_its_rate(now_ns, lim):
            message = f"request body slower than {lim.min_body_rate_bps} bytes/s"
            return Refused(408, b"Request Timeout", message, Refusal.BODY_TOO_SLOW)
        return None

    def keeps_its_rate(self, now_ns: int, lim: Limits) -> bool:
        """Past its grace (``body_timeout_s`` from the head's end), every window of ``body_rate_window_s``
        must bring ``min_body_rate_bps``: what came before buys no time (unlike Apache's MinRate)."""
        window_ns = now_ns - self.window_started_ns
        if window_ns < lim.body_rate_window_s * 1e9:
            return True
        brought = self.body_bytes - self.window_start_bytes
        if now_ns - self.body_started_ns >= lim.body_timeout_s * 1e9 and brought < lim.min_body_rate_bps * window_ns / 1e9:
            return False
        self.window_started_ns, self.window_start_bytes = now_ns, self.body_bytes
        return True
