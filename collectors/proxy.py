"""Recording reverse proxy in front of Ollama.

Every request is forwarded unchanged, and every response streamed back chunk by
chunk as it arrives. For the generation endpoints the proxy also records a
``RequestRecord``: request facts, a timestamp per upstream read, and afterwards
what the chunks said (``analysis.chunks``).

The per-chunk hot path only takes a timestamp, appends ``(t_ns, bytes)`` and
forwards: with many streams waking in the same tick (a batching server) the cost
per chunk multiplies, so parsing happens later, in small slices that yield to
the event loop (a background pump, ``in_flight()``, and a finaliser per request).

Privacy: no header is ever recorded (so no ``Authorization`` or cookie), the
upstream session keeps no cookies, and prompt/response text is recorded only
with ``record_text=True``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from analysis.chunks import StreamParser, stream_format
from analysis.records import Outcome, RequestRecord

log = logging.getLogger(__name__)

RECORDED_ENDPOINTS = frozenset({"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"})
LOCAL_PREFIX = "/phasewatch/"
ERROR_BODY_CHARS = 2000  # how much of an upstream error body a record keeps
# Added to recorded responses so a client (the Lab page, a test) can find its record.
RECORD_ID_HEADER = "X-Phasewatch-Request-Id"

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection, never forwarded.
# Host and Content-Length are recomputed by the client session for the upstream.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)

LocalHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
T = TypeVar("T")


def _filtered(headers: Any, drop: frozenset[str]) -> CIMultiDict[str]:
    """Copy headers without hop-by-hop ones and without those named in Connection."""
    named = {t.strip().lower() for v in headers.getall("Connection", ()) for t in v.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low not in _HOP_BY_HOP and low not in drop and low not in named:
            out.add(name, value)
    return out


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _keep_alive_text(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)[:100]


def _message_text(messages: object) -> str:
    """Chat messages as plain "role: content" lines (OpenAI content parts included)."""
    lines = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, str):
            lines.append(f"{message.get('role', '')}: {content}")
    return "\n".join(lines)


def describe_request(endpoint: str, body: bytes, *, record_text: bool) -> dict[str, Any]:
    """RequestRecord fields that follow from a generation request body.

    Bad JSON is Ollama's to answer (it says 400); we record what we can.
    """
    try:
        obj = json.loads(body) if body else {}
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return {"model": "", "stream": endpoint.startswith("/api/")}
    native = endpoint.startswith("/api/")
    stream_value = obj.get("stream")
    # Ollama's native API streams unless told not to; the OpenAI one only when asked.
    stream = stream_value is not False if native else stream_value is True
    options = obj.get("options") if isinstance(obj.get("options"), dict) else {}
    assert isinstance(options, dict)
    num_predict = _int_or_none(options.get("num_predict"))
    if not native:
        num_predict = _int_or_none(obj.get("max_completion_tokens")) or _int_or_none(obj.get("max_tokens"))
    fields: dict[str, Any] = {
        "model": obj.get("model") if isinstance(obj.get("model"), str) else "",
        "stream": stream,
        "num_ctx": _int_or_none(options.get("num_ctx")),
        "num_predict": num_predict,
        "keep_alive": _keep_alive_text(obj.get("keep_alive")),
    }
    if record_text:
        if "messages" in obj:
            fields["prompt_text"] = _message_text(obj["messages"])
        elif isinstance(obj.get("prompt"), str):
            fields["prompt_text"] = obj["prompt"]
        elif isinstance(obj.get("prompt"), list):
            fields["prompt_text"] = "\n".join(p for p in obj["prompt"] if isinstance(p, str))
    return fields


class _Exchange:
    """One recorded request while it runs: the record, raw reads, and the lazy parser."""

    __slots__ = ("body_head", "failure", "failure_outcome", "fed", "parser", "reads", "record")

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.reads: list[tuple[int, bytes]] = []  # appended by the hot path
        self.fed = 0  # reads[:fed] already given to the parser
        self.parser: StreamParser | None = None  # set once response headers are in
        self.body_head = b""  # start of the body, kept for error records
        self.failure: str | None = None  # set when the exchange broke (not when the body says so)
        self.failure_outcome: Outcome | None = None

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


class RecordingProxy:
    """Forward everything to ``upstream_url``; record generation requests through ``on_record``.

    ``on_record`` is called exactly once per recorded request, from the event
    loop, when the request has ended; it should only enqueue.
    """

    PARSE_SLICE = 64  # reads parsed between two yields to the event loop
    PUMP_INTERVAL_S = 0.25  # how often pending reads of running streams are parsed
    STOP_GRACE_S = 2.0  # how long stop() lets running streams finish

    def __init__(self, upstream_url: str, on_record: Callable[[RequestRecord], None], *, record_text: bool = False) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        if not URL(self.upstream_url).is_absolute():
            raise ValueError(f"upstream URL must be absolute, like http://127.0.0.1:11434 (got {upstream_url!r})")
        self._on_record = on_record
        self._record_text = record_text
        self._local_routes: dict[tuple[str, str], LocalHandler] = {}
        self._live: dict[str, _Exchange] = {}
        self._handlers: set[asyncio.Task[Any]] = set()
        self._finalisers: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._pump: asyncio.Task[None] | None = None
        self._work: asyncio.Event | None = None
        self._port = 0
        self._stopping = False

    # -- public interface -------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        """Bind host:port (port 0 picks a free one) and start serving."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),  # no cap: a cap would queue silently
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),  # a model load may take minutes
            auto_decompress=False,  # bytes pass through untouched
            cookie_jar=aiohttp.DummyCookieJar(),  # one session serves every client: keep no cookies
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            trust_env=False,
        )
        server = web.Server(self._handle, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(server, shutdown_timeout=self.STOP_GRACE_S)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        try:
            await self._site.start()
        except OSError as exc:
            await self._runner.cleanup()
            await self._session.close()
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        self._port = int(self._runner.addresses[0][1])
        self._work = asyncio.Event()
        self._pump = asyncio.create_task(self._pump_loop(), name="proxy-parse-pump")

    @property
    def port(self) -> int:
        return self._port

    async def stop(self) -> None:
        """Stop accepting, let running streams finish for a moment, then cancel them."""
        if self._stopping:
            return
        self._stopping = True
        if self._site is not None:
            await self._site.stop()  # closes the listening socket
        running = {t for t in self._handlers if not t.done()}
        if running:
            _, pending = await asyncio.wait(running, timeout=self.STOP_GRACE_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self.STOP_GRACE_S)
        if self._finalisers:
            await asyncio.wait(set(self._finalisers), timeout=self.STOP_GRACE_S * 2)
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def in_flight(self) -> list[RequestRecord]:
        """Snapshots of recorded requests still running, parsed up to now (call it on the proxy's event loop)."""
        return [self._snapshot(ex) for ex in list(self._live.values())]

    def add_local_route(self, method: str, path: str, handler: LocalHandler) -> None:
        """Serve ``path`` (under /phasewatch/) here instead of forwarding it."""
        if not path.startswith(LOCAL_PREFIX):
            raise ValueError(f"local routes must live under {LOCAL_PREFIX} so they never hide an Ollama route: {path!r}")
        self._local_routes[(method.upper(), path)] = handler

    # -- request handling -------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        if request.path.startswith(LOCAL_PREFIX):
            handler = self._local_routes.get((request.method, request.path))
            if handler is None:
                return web.json_response({"error": f"no such Phasewatch route: {request.method} {request.path}"}, status=404)
            return await handler(request)
        if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
            # We answer it ourselves (as aiohttp's router would); the upstream gets the body at once.
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        if request.method == "POST" and request.path in RECORDED_ENDPOINTS:
            return await self._forward_recorded(request)
        data = request.content if request.body_exists else None
        return await self._forward(request, data, _filtered(request.headers, frozenset({"host", "expect"})), None)

    async def _forward_recorded(self, request: web.BaseRequest) -> web.StreamResponse:
        received_ns = time.monotonic_ns()
        started_at_unix_s = time.time()
        body = await request.content.read()  # generation requests are small; we need the model and options
        facts = describe_request(request.path, body, record_text=self._record_text)
        record = RequestRecord(
            id=uuid.uuid4().hex,
            started_at_unix_s=started_at_unix_s,
            client_addr=request.remote or "",
            endpoint=request.path,
            received_ns=received_ns,
            **facts,
        )
        ex = _Exchange(record)
        self._live[record.id] = ex
        # Ask for an uncompressed body: we parse it (Ollama does not compress anyway).
        headers = _filtered(request.headers, frozenset({"host", "expect", "content-length", "accept-encoding"}))
        try:
            return await self._forward(request, body, headers, ex)
        finally:
            record.closed_ns = time.monotonic_ns()
            self._spawn_finaliser(ex)

    async def _forward(
        self, request: web.BaseRequest, data: Any, headers: CIMultiDict[str], ex: _Exchange | None
    ) -> web.StreamResponse:
        assert self._session is not None
        url = URL(self.upstream_url + request.raw_path, encoded=True)
        if ex is not None:
            ex.record.forwarded_ns = time.monotonic_ns()
        try:
            upstream = await self._session.request(request.method, url, headers=headers, data=data, allow_redirects=False)
        except aiohttp.ClientConnectorError as exc:
            message = (
                f"Ollama is not reachable at {self.upstream_url} ({exc.os_error.strerror or exc.os_error}). "
                "Start it (`ollama serve`), or point Phasewatch at it with --ollama URL or OLLAMA_HOST."
            )
            return self._bad_gateway(message, ex)
        except (TimeoutError, aiohttp.ClientError) as exc:
            message = f"Ollama at {self.upstream_url} failed before answering: {type(exc).__name__}: {exc}"
            return self._bad_gateway(message, ex)
        except asyncio.CancelledError:  # client gone while Ollama queued or loaded; aiohttp drops that connection
            if ex is not None and ex.failure is None:
                ex.failure = "proxy stopped" if self._stopping else "client disconnected before the response began"
                ex.failure_outcome = Outcome.CANCELLED
            raise

        first_byte_ns = time.monotonic_ns()
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.extend(_filtered(upstream.headers, frozenset()))
            early = b""
            if ex is not None:
                # Bytes that came in with the headers (Ollama sends its first chunk with them) arrived then,
                # not after our own bookkeeping below.
                early = upstream.content.read_nowait()
                # When many responses start in the same tick (a batching server), let the others take their
                # timestamps before this one does the heavier work of starting its response.
                await asyncio.sleep(0)
                ex.record.first_byte_ns = first_byte_ns
                response.headers[RECORD_ID_HEADER] = ex.record.id
                ex.record.status_code = upstream.status
                ex.parser = StreamParser(stream_format(upstream.headers.get("Content-Type")), keep_text=self._record_text)
                self._live_work()
            await response.prepare(request)
            # Hot path: timestamp, append, forward. Nothing else per chunk.
            readany = upstream.content.readany
            write = response.write
            monotonic_ns = time.monotonic_ns
            if ex is not None:
                append = ex.reads.append
                if early:
                    append((first_byte_ns, early))
                    await write(early)
                while data := await readany():
                    append((monotonic_ns(), data))
                    await write(data)
            else:
                while data := await readany():
                    await write(data)
            await response.write_eof()
        except aiohttp.ClientPayloadError as exc:
            # Upstream cut the body short: cut the client's too, so it sees the same failure.
            if ex is not None:
                ex.failure, ex.failure_outcome = f"Ollama cut the response mid-way: {exc}", Outcome.UPSTREAM_FAILED
            upstream.close()
            if request.transport is not None:
                request.transport.close()  # flushes what was sent, never writes the end of the body
            return response
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            # The client went away (or we are stopping): drop the upstream connection so Ollama frees the slot.
            upstream.close()
            if ex is not None and ex.failure is None:
                reason = "proxy stopped" if self._stopping else "client disconnected"
                ex.failure, ex.failure_outcome = reason, Outcome.CANCELLED
            if isinstance(exc, asyncio.CancelledError):
                raise
            return response
        except BaseException:
            upstream.close()
            if ex is not None and ex.failure is None:
                ex.failure, ex.failure_outcome = "proxy error while streaming", Outcome.UPSTREAM_FAILED
            raise
        upstream.release()
        return response

    def _bad_gateway(self, message: str, ex: _Exchange | None) -> web.StreamResponse:
        headers = {}
        if ex is not None:
            ex.record.status_code = 502
            ex.failure, ex.failure_outcome = message, Outcome.UPSTREAM_FAILED
            headers[RECORD_ID_HEADER] = ex.record.id
        return web.json_response({"error": message}, status=502, headers=headers)

    # -- parsing off the hot path -----------------------------------------------------

    def _live_work(self) -> None:
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
                while ex.feed_some(self.PARSE_SLICE):
                    await asyncio.sleep(0)
                await asyncio.sleep(0)

    def _spawn_finaliser(self, ex: _Exchange) -> None:
        task = asyncio.get_running_loop().create_task(self._finalise(ex))
        self._finalisers.add(task)
        task.add_done_callback(self._finalisers.discard)

    async def _finalise(self, ex: _Exchange) -> None:
        """Parse what is left, settle the outcome, hand the record over exactly once."""
        try:
            while ex.feed_some(self.PARSE_SLICE):
                await asyncio.sleep(0)
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
        record.token_chunk_ns = summary.token_chunk_ns if final else list(summary.token_chunk_ns)
        record.first_token_ns = summary.first_token_ns
        record.final_chunk_ns = summary.final_chunk_ns
        record.metrics = summary.metrics
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
            notes.append(ex.body_head.decode("utf-8", "replace"))
        elif summary is not None and summary.error is not None:
            record.outcome = Outcome.UPSTREAM_FAILED
            notes.append(f"Ollama reported an error mid-stream: {summary.error}")
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
        if summary is not None and summary.malformed_count:
            problems = "; ".join(summary.problems)
            notes.append(f"{summary.malformed_count} malformed upstream chunk(s), passed on untouched: {problems}")
        record.error = "\n".join(n for n in notes if n)[: ERROR_BODY_CHARS * 2] or None
        return record

    def _snapshot(self, ex: _Exchange) -> RequestRecord:
        ex.feed_some(len(ex.reads))
        record = dataclasses.replace(ex.record, token_chunk_ns=list(ex.record.token_chunk_ns))
        self._apply_summary(record, ex, final=False)
        record.outcome = Outcome.IN_FLIGHT
        return record


# -- running it alone (benchmarks, debugging) ---------------------------------------------


def run_with_best_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (it halves the proxy's CPU per chunk)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _serve(upstream: str, host: str, port: int, record_text: bool, print_records: bool) -> None:
    import signal

    def on_record(record: RequestRecord) -> None:
        if print_records:
            print(json.dumps(dataclasses.asdict(record)), flush=True)

    proxy = RecordingProxy(upstream, on_record, record_text=record_text)
    await proxy.start(host, port)
    print(f"listening on {host}:{proxy.port}, forwarding to {upstream}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Phasewatch's recording proxy, alone (the collector runs it for you).")
    parser.add_argument("--upstream", default="http://127.0.0.1:11434", help="Ollama's URL")
    parser.add_argument("--listen", default="127.0.0.1:11435", help="HOST:PORT to listen on (port 0: any free one)")
    parser.add_argument("--record-text", action="store_true", help="also record prompt and response text")
    parser.add_argument("--print-records", action="store_true", help="print each record as a JSON line on stdout")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen must be HOST:PORT, got {args.listen!r}")
    run_with_best_loop(_serve(args.upstream, host.strip("[]"), int(port), args.record_text, args.print_records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
