"""Recording reverse proxy in front of Ollama.

Every request is forwarded unchanged, and every response streamed back chunk by
chunk as it arrives. For the generation endpoints the proxy also records a
``RequestRecord``: request facts, a timestamp per upstream read, and afterwards
what the chunks said (``analysis.chunks``).

The bytes go through ``collectors.proxy.relay`` (asyncio protocols and httptools). Its
per-chunk hot path only takes a timestamp, appends ``(t_ns, bytes)`` and writes:
with many streams waking in the same tick (a batching server) the cost per chunk
multiplies, so parsing happens later, in small slices that yield to the event
loop (a background pump, ``in_flight()``, and a finaliser per request). A chunk
too large to decode in one slice (a 16 MB embeddings reply), and a request body over
the same bound (a vision request's images), are decoded in a worker process instead
(``collectors.proxy.big_bodies``; the body's facts: ``collectors.proxy.request_facts``).

Privacy: no header is recorded (so no ``Authorization`` or cookie) but the
``User-Agent``'s first product and version (``analysis.client_program``); the
relay keeps no state between clients, and prompt/response text is recorded only
with ``record_text=True``. Which local process a loopback client is, is looked up
once per connection off the event loop (``collectors.proxy.client_process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web
from yarl import URL

from analysis.chunks import StreamParser, stream_format
from analysis.client_program import program_of
from analysis.error_notes import http_error_note, malformed_note, stream_error_note
from analysis.records import AGENT_ENDPOINTS, EMBED_ENDPOINTS, Outcome, RequestKind, RequestRecord
from collectors.proxy.access import HostPolicy, OriginPolicy
from collectors.proxy.big_bodies import BigBodyDecoder, NotParsed
from collectors.proxy.client_process import ClientProcess, ClientProcesses
from collectors.proxy.limits import Limits
from collectors.proxy.refusals import Refusal, Refusals
from collectors.proxy.relay import Exchange, Failure, Headers, Refused, Relay, RequestHead, Target
from collectors.proxy.request_facts import describe_body, describe_request, head_facts

log = logging.getLogger(__name__)

RECORDED_ENDPOINTS = frozenset(
    {"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"} | AGENT_ENDPOINTS | EMBED_ENDPOINTS
)
LOCAL_PREFIX = "/phasewatch/"
ERROR_BODY_CHARS = 2000  # how much of an upstream error body a record keeps
# Added to recorded responses so a client (the Lab page, a test) can find its record.
RECORD_ID_HEADER = "X-Phasewatch-Request-Id"
_PLAIN = Exchange()  # what unrecorded requests report to: nothing

LocalHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
T = TypeVar("T")


class _Exchange(Exchange):
    """One recorded request while it runs: the record, raw reads, and the lazy parser."""

    keep_request_body = True

    def __init__(self, proxy: RecordingProxy, record: RequestRecord) -> None:
        self.proxy = proxy
        self.record = record
        self.reads: list[tuple[int, bytes]] = []  # appended by the relay's hot path
        self.on_body = self.reads.append
        self.fed = 0  # reads[:fed] already given to the parser
        self.parser: StreamParser | None = None  # set once response headers are in
        self.body_head = b""  # start of the body, kept for error records
        self.failure: str | None = None  # set when the exchange broke (not when the body says so)
        self.failure_outcome: Outcome | None = None
        self.decoding = asyncio.Lock()  # one coroutine at a time hands the parser's deferred chunk to the worker
        self.body_facts: asyncio.Task[None] | None = None  # a large request body being described in the worker
        self.body_note: str | None = None  # why the request body's facts are missing (the worker did not parse it)
        # Done once the client's local process is known, or known not to be looked up (collectors.proxy.client_process)
        self.process_known: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def process_found(self, process: ClientProcess | None) -> None:
        _set_process(self.record, process)
        if not self.process_known.done():
            self.process_known.set_result(None)

    # -- relay hooks ------------------------------------------------------------------------------

    def request_body(self, body: bytes, truncated: bool) -> None:
        limits = self.proxy.limits
        if truncated or len(body) <= limits.big_body_bytes:
            facts = describe_request(
                self.record.endpoint or "",  # always set for a proxied request
                body,
                record_text=self.proxy.record_text,
                truncated=truncated,
                max_label_chars=limits.max_label_chars,
            )
            self.apply_facts(facts)
            return
        # Decoding tens of MB (a vision request's images) would stall every other client: the worker does it.
        # Until it answers, the model named at the start stands in (the Live page shows the request meanwhile).
        self.apply_facts(head_facts(self.record.endpoint or "", body, max_label_chars=limits.max_label_chars))
        self.body_facts = self.proxy.spawn_body_facts(self, body)

    def apply_facts(self, facts: dict[str, Any]) -> None:
        for name, value in facts.items():
            setattr(self.record, name, value)

    def forwarded(self, t_ns: int) -> None:
        self.record.forwarded_ns = t_ns

    def response_head(self, t_ns: int, status: int, content_type: str | None) -> Headers:
        self.record.first_byte_ns = t_ns
        self.record.status_code = status
        limits = self.proxy.limits
        self.parser = StreamParser(
            stream_format(content_type),
            keep_text=self.proxy.record_text,
            max_line_bytes=limits.max_line_bytes,
            defer_bytes=limits.big_body_bytes,
        )
        self.proxy.live_work()
        return [(RECORD_ID_HEADER.encode(), self.record.id.encode())]

    def answered_here(self, status: int) -> Headers:
        self.record.status_code = status
        return [(RECORD_ID_HEADER.encode(), self.record.id.encode())]

    def backlog(self, caught_up: Callable[[], None]) -> None:
        self.proxy.spawn_catch_up(self, caught_up)

    def failed(self, kind: Failure, detail: str, responded: bool) -> None:
        if self.failure is not None:
            return
        if kind is Failure.STOPPED:
            self.failure, self.failure_outcome = "proxy stopped", Outcome.CANCELLED
        elif kind is Failure.CLIENT_GONE:
            reason = "client disconnected" if responded else "client disconnected before the response began"
            self.failure, self.failure_outcome = detail or reason, Outcome.CANCELLED
        elif kind in (Failure.EVICTED, Failure.INTERNAL):  # cut by the proxy itself: never Ollama's failure
            self.failure, self.failure_outcome = detail, Outcome.CANCELLED
        else:  # unreachable, no answer, cut: Ollama's side failed
            self.failure, self.failure_outcome = detail, Outcome.UPSTREAM_FAILED

    def ended(self, t_ns: int) -> None:
        self.record.closed_ns = t_ns
        self.proxy.spawn_finaliser(self)

    # -- parsing ----------------------------------------------------------------------------------

    def feed_some(self, max_reads: int) -> bool:
        """Parse up to max_reads pending reads; True when more are pending.

        Synchronous, so concurrent callers (pump, in_flight, finaliser) never
        feed the same read twice.
        """
        parser = self.parser
        if parser is None:
            return False
        reads = self.reads
        end = min(len(reads), self.fed + max_reads)
        for i in range(self.fed, end):
            t_ns, data = reads[i]
            if len(self.body_head) < ERROR_BODY_CHARS:
                self.body_head += data[: ERROR_BODY_CHARS - len(self.body_head)]
            parser.feed(t_ns, data)
        self.fed = end
        if end == len(reads):
            del reads[:end]  # release parsed bytes
            self.fed = 0
            return False
        return True


def _upstream_target(upstream_url: str) -> Target:
    url = URL(upstream_url)
    if not url.is_absolute() or url.scheme not in ("http", "https") or not url.raw_host:
        raise ValueError(f"upstream URL must be absolute, like http://127.0.0.1:11434 (got {upstream_url!r})")
    host = url.raw_host
    host_in_header = f"[{host}]" if ":" in host else host
    port = url.port or (443 if url.scheme == "https" else 80)
    host_header = f"{host_in_header}:{url.explicit_port}" if url.explicit_port else host_in_header
    prefix = url.raw_path.rstrip("/").encode()
    return Target(host, port, host_header.encode(), upstream_url, tls=url.scheme == "https", path_prefix=prefix)


class RecordingProxy:
    """Forward everything to ``upstream_url``; record generation requests through ``on_record``.

    ``on_record`` is called exactly once per recorded request, from the event
    loop, when the request has ended; it should only enqueue.
    """

    PARSE_SLICE = 16  # reads parsed between two yields to the event loop (~50 µs)
    # How often pending reads of running streams are parsed, to bound their memory. Parsing competes with the
    # chunks themselves: at 0.25 s the bench measured +0.6 ms p99 and +3 µs CPU per chunk at 16 streams against
    # 2 s. The collector parses every tick anyway (in_flight_sliced).
    PUMP_INTERVAL_S = 2.0
    STOP_GRACE_S = 2.0  # how long stop() lets running streams finish
    # How long a finished request waits for its client's process to be looked up (a scan took 12-60 ms here, more on a
    # busy machine) before it is handed over with the process unknown.
    PROCESS_WAIT_S = 1.0

    def __init__(
        self,
        upstream_url: str,
        on_record: Callable[[RequestRecord], None],
        *,
        record_text: bool = False,
        limits: Limits | None = None,
        allowed_hosts: tuple[str, ...] = (),
        allowed_origins: tuple[str, ...] = (),
        token: str | None = None,
        on_begin: Callable[[], None] = lambda: None,
    ) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self._on_begin = on_begin  # a recorded request began (the runner reader, quiet, steps now)
        self._upstream = _upstream_target(self.upstream_url)
        self._on_record = on_record
        self.record_text = record_text
        self.limits = limits or Limits()
        self._allowed_hosts = allowed_hosts
        self._hosts = HostPolicy("", allowed_hosts)
        self._origins = OriginPolicy(allowed_origins)
        self._authorization = None if token is None else b"Bearer " + token.encode()
        self._local_routes: dict[tuple[str, str], LocalHandler] = {}
        self._local_target: Target | None = None
        self._local_runner: web.ServerRunner | None = None
        self._live: dict[str, _Exchange] = {}
        self._finalisers: set[asyncio.Task[None]] = set()
        self._relay = Relay(self._route, self.limits)
        self._big_bodies = BigBodyDecoder(self.limits)
        self.client_processes = ClientProcesses()
        self._pump: asyncio.Task[None] | None = None
        self._work: asyncio.Event | None = None
        self._port = 0
        self._stopping = False

    # -- public interface -------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        """Bind host:port (port 0 picks a free one) and start serving."""
        self._hosts = HostPolicy(host, self._allowed_hosts)
        # Local routes are served by a small aiohttp server on a private loopback port, reached through the relay.
        self._local_runner = web.ServerRunner(web.Server(self._local_handle, access_log=None))
        await self._local_runner.setup()
        site = web.TCPSite(self._local_runner, "127.0.0.1", 0)
        await site.start()
        local_port = int(self._local_runner.addresses[0][1])
        self._local_target = Target("127.0.0.1", local_port, b"127.0.0.1:%d" % local_port, "Phasewatch's local routes")
        try:
            self._port = await self._relay.start(host, port)
        except OSError as exc:
            await self._local_runner.cleanup()
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        self._work = asyncio.Event()
        self._pump = asyncio.create_task(self._pump_loop(), name="proxy-parse-pump")

    @property
    def port(self) -> int:
        return self._port

    @property
    def refusals(self) -> Refusals:
        """The requests the relay refused itself (counted, the last hour, logged)."""
        return self._relay.refusals

    async def stop(self) -> None:
        """Stop accepting, let running streams finish for a moment, then cancel them."""
        if self._stopping:
            return
        self._stopping = True
        await self._relay.stop(self.STOP_GRACE_S)
        if self._finalisers:
            await asyncio.wait(set(self._finalisers), timeout=self.STOP_GRACE_S * 2)
        self._big_bodies.close()  # large bodies still being parsed are recorded unparsed, not lost
        self.client_processes.close()
        if self._finalisers:
            await asyncio.wait(set(self._finalisers), timeout=self.STOP_GRACE_S)
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        if self._local_runner is not None:
            await self._local_runner.cleanup()

    def in_flight(self) -> list[RequestRecord]:
        """Snapshots of recorded requests still running, parsed up to now (call it on the proxy's event loop)."""
        return [self._snapshot(ex) for ex in list(self._live.values())]

    async def in_flight_sliced(self) -> list[RequestRecord]:
        """``in_flight()``, parsing pending reads a slice at a time first and yielding between snapshots, so running
        streams never wait on it (64 snapshots taken in one go held the loop for a millisecond or more)."""
        snapshots = []
        for ex in list(self._live.values()):
            while ex.feed_some(self.PARSE_SLICE):
                await asyncio.sleep(0)
            if self._live.get(ex.record.id) is ex:  # still running after the yields
                snapshots.append(self._snapshot(ex))
            await asyncio.sleep(0)
        return snapshots

    def in_flight_heads(self) -> list[RequestRecord]:
        """The running requests as parsed so far, without parsing pending reads or copying: cheap, read-only use."""
        return [ex.record for ex in self._live.values()]

    def add_local_route(self, method: str, path: str, handler: LocalHandler) -> None:
        """Serve ``path`` (under /phasewatch/) here instead of forwarding it."""
        if not path.startswith(LOCAL_PREFIX):
            raise ValueError(f"local routes must live under {LOCAL_PREFIX} so they never hide an Ollama route: {path!r}")
        self._local_routes[(method.upper(), path)] = handler

    # -- routing (called by the relay for every request head) ----------------------------

    def _check_access(self, head: RequestHead) -> None:
        """401 without the token (when one is set); 403 for a foreign Host (DNS rebinding) or a browser Origin Ollama
        would refuse. Nothing is recorded."""
        host = ""
        origin = None
        authorization = b""
        for name, value in head.headers:
            low = name.lower()
            if low == b"host":
                host = value.decode("latin-1").strip()
            elif low == b"origin":
                origin = value.decode("latin-1").strip()
            elif low == b"authorization":
                authorization = value.strip()
        if self._authorization is not None and not hmac.compare_digest(authorization, self._authorization):
            raise Refused(
                401, b"Unauthorized", "this collector needs 'Authorization: Bearer <PHASEWATCH_TOKEN>'", Refusal.UNAUTHORIZED
            )
        if not self._hosts.allows(host):
            raise Refused(
                403,
                b"Forbidden",
                f"Host {host[:100]!r} is not this machine; to allow a name, add it to PHASEWATCH_ALLOWED_HOSTS",
                Refusal.FOREIGN_HOST,
            )
        if origin is not None and not self._origins.allows(origin, host):
            raise Refused(
                403,
                b"Forbidden",
                f"Origin {origin[:100]!r} is not allowed; to allow one, add it to OLLAMA_ORIGINS",
                Refusal.FOREIGN_ORIGIN,
            )

    def _route(self, head: RequestHead) -> tuple[Target, Exchange, frozenset[bytes]]:
        self._check_access(head)
        # Our token is ours: Ollama never sees it.
        drop = frozenset() if self._authorization is None else frozenset({b"authorization"})
        if head.path.startswith(LOCAL_PREFIX) and self._local_target is not None:
            return self._local_target, _PLAIN, drop
        if head.method != "POST" or head.path not in RECORDED_ENDPOINTS:
            return self._upstream, _PLAIN, drop
        native = head.path.startswith("/api/") and head.path not in EMBED_ENDPOINTS
        record = RequestRecord(
            id=uuid.uuid4().hex,
            started_at_unix_s=time.time(),
            client_addr=head.client_addr,
            endpoint=head.path,
            model="",
            stream=native,  # until the body says otherwise
            kind=RequestKind.EMBED if head.path in EMBED_ENDPOINTS else RequestKind.GENERATE,
            received_ns=head.received_ns,
        )
        record.client_program, record.client_program_version = program_of(_user_agent(head))
        ex = _Exchange(self, record)
        if not self.client_processes.find(head.connection, head.peer, head.ours, ex.process_found):
            ex.process_known.set_result(None)  # not looked up: unknown
        self._live[record.id] = ex
        self._on_begin()
        # Ask for an uncompressed body: we parse it (Ollama does not compress anyway).
        return self._upstream, ex, drop | {b"accept-encoding"}

    async def _local_handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # Only the relay (which checked the client's Host) may ask: a page rebinding a name to this private
        # port would send its own Host.
        if self._local_target is None or request.headers.get("Host", "").encode() != self._local_target.host_header:
            return web.json_response({"error": "Phasewatch's local routes are reached through the proxy"}, status=403)
        handler = self._local_routes.get((request.method, request.path))
        if handler is None:
            return web.json_response({"error": f"no such Phasewatch route: {request.method} {request.path}"}, status=404)
        return await handler(request)

    # -- parsing off the hot path -----------------------------------------------------

    def live_work(self) -> None:
        if self._work is not None:
            self._work.set()

    async def _pump_loop(self) -> None:
        """Parse pending reads of running streams a slice at a time (bounded memory, cheap snapshots)."""
        assert self._work is not None
        while True:
            await self._work.wait()
            await asyncio.sleep(self.PUMP_INTERVAL_S)
            if not self._live:
                self._work.clear()
                continue
            for ex in list(self._live.values()):
                await self._parse_pending(ex)
                await asyncio.sleep(0)

    async def _parse_pending(self, ex: _Exchange) -> None:
        """Parse pending reads a slice at a time; a chunk the parser deferred goes to the worker process."""
        while True:
            more = ex.feed_some(self.PARSE_SLICE)
            await self._resolve_deferred(ex)
            if not more:
                return
            await asyncio.sleep(0)

    async def _resolve_deferred(self, ex: _Exchange) -> None:
        parser = ex.parser
        if parser is None or parser.deferred() is None:
            return
        async with ex.decoding:
            while (chunk := parser.deferred()) is not None:
                parser.resolve(await self._big_bodies.decode(chunk))

    def spawn_catch_up(self, ex: _Exchange, caught_up: Callable[[], None]) -> None:
        """Parse a flooding response's pending reads a slice at a time, then let the relay read on."""

        async def catch_up() -> None:
            try:
                await self._parse_pending(ex)
            finally:
                caught_up()

        task = asyncio.get_running_loop().create_task(catch_up())
        self._finalisers.add(task)
        task.add_done_callback(self._finalisers.discard)

    def spawn_body_facts(self, ex: _Exchange, body: bytes) -> asyncio.Task[None]:
        """Describe a large request body in the worker process; the finaliser waits for it."""

        async def describe() -> None:
            try:
                facts = await self._big_bodies.call(
                    describe_body, body, ex.record.endpoint or "", self.record_text, self.limits.max_label_chars
                )
            except NotParsed as why:
                ex.body_note = f"request body not parsed ({why}), {len(body)} bytes: only the model named at its start kept"
                return
            ex.apply_facts(facts)

        return asyncio.get_running_loop().create_task(describe(), name="proxy-request-body")

    def spawn_finaliser(self, ex: _Exchange) -> None:
        task = asyncio.get_running_loop().create_task(self._finalise(ex))
        self._finalisers.add(task)
        task.add_done_callback(self._finalisers.discard)

    async def _finalise(self, ex: _Exchange) -> None:
        """Parse what is left, settle the outcome, hand the record over exactly once."""
        try:
            if ex.body_facts is not None:
                await ex.body_facts
            if not ex.process_known.done():  # a reply faster than the scan: wait for it a moment, no longer
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(ex.process_known), self.PROCESS_WAIT_S)
            await self._parse_pending(ex)
            if ex.parser is not None:
                ex.parser.end()  # a JSON body (or a last unterminated line) is complete only now
                await self._resolve_deferred(ex)
        finally:
            self._live.pop(ex.record.id, None)
            record = self._settle(ex)
            try:
                self._on_record(record)
            except Exception:  # a recording failure must never reach the client's stream
                log.exception("on_record failed for request %s", record.id)

    def _apply_summary(self, record: RequestRecord, ex: _Exchange, *, final: bool) -> None:
        parser = ex.parser
        if parser is None:
            return
        summary = parser.finish() if final else parser.summary.copy()
        record.token_chunk_ns = summary.token_chunk_ns  # final: the parser is done with it; else copy()'s own list
        record.first_token_ns = summary.first_token_ns
        record.final_chunk_ns = summary.final_chunk_ns
        record.metrics = summary.metrics
        record.thinking_chunks = summary.thinking_chunks
        record.last_thinking_ns = summary.last_thinking_ns
        record.first_answer_ns = summary.first_answer_ns
        reason = summary.metrics.done_reason if summary.metrics is not None else None
        if reason in (RequestKind.LOAD, RequestKind.UNLOAD):  # Ollama's word beats our reading of the body
            record.kind = RequestKind(reason)
        if summary.text is not None:
            record.response_text = summary.text

    def _settle(self, ex: _Exchange) -> RequestRecord:
        record = ex.record
        try:
            self._apply_summary(record, ex, final=True)
        except Exception as exc:  # the parser raises only on misuse; never lose the record for it
            log.exception("parsing the response of %s failed", record.id)
            ex.failure = ex.failure or f"parse failure: {exc}"
        summary = ex.parser.summary if ex.parser is not None else None
        notes: list[str] = []
        # What failed first decides: Ollama (unreachable, cut, error status, error line), then the client.
        if ex.failure_outcome is Outcome.UPSTREAM_FAILED:
            record.outcome = Outcome.UPSTREAM_FAILED
            notes.append(ex.failure or "")
        elif record.status_code is not None and record.status_code >= 400:
            record.outcome = Outcome.HTTP_ERROR
            notes.append(http_error_note(record.status_code, ex.body_head, keep_text=self.record_text))
        elif summary is not None and summary.error is not None:
            record.outcome = Outcome.UPSTREAM_FAILED
            notes.append(stream_error_note(summary.error, keep_text=self.record_text))
        elif ex.failure_outcome is Outcome.CANCELLED and record.final_chunk_ns is not None:
            record.outcome = Outcome.OK  # everything arrived; the client left while we closed
        elif ex.failure_outcome is not None:
            record.outcome = ex.failure_outcome
            notes.append(ex.failure or "")
        elif record.final_chunk_ns is None:
            record.outcome = Outcome.UPSTREAM_FAILED
            notes.append("the response ended without a final chunk")
        else:
            record.outcome = Outcome.OK
        if ex.body_note is not None:
            notes.append(ex.body_note)
        if summary is not None and summary.malformed_count:
            notes.append(malformed_note(summary.malformed_count, summary.problems, keep_text=self.record_text))
        record.error = "\n".join(n for n in notes if n)[: ERROR_BODY_CHARS * 2] or None
        return record

    def _snapshot(self, ex: _Exchange) -> RequestRecord:
        ex.feed_some(len(ex.reads))
        record = dataclasses.replace(ex.record, token_chunk_ns=list(ex.record.token_chunk_ns))
        self._apply_summary(record, ex, final=False)
        record.outcome = Outcome.IN_FLIGHT
        return record


def _user_agent(head: RequestHead) -> str | None:
    """The request's first User-Agent header as text (HTTP header bytes are Latin-1); None without one."""
    for name, value in head.headers:
        if name.lower() == b"user-agent":
            return value[:1024].decode("latin-1")  # only its start is read (analysis.client_program)
    return None


def _set_process(record: RequestRecord, process: ClientProcess | None) -> None:
    """The client's local process, once looked up (on the event loop; the record's next write stores it)."""
    # A record already handed over (a reply faster than the scan) is not changed behind the writer's back.
    if process is not None and record.outcome is Outcome.IN_FLIGHT:
        record.client_process, record.client_pid, record.client_user = process.name, process.pid, process.user


# -- running it alone (benchmarks, debugging) ---------------------------------------------


def run_with_best_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (it halves the proxy's CPU per chunk)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
