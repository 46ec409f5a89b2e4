"""The relay's two protocols fed bytes through mock transports, in-process (as uvicorn's tests/protocols/test_http.py).

No socket: ``MockTransport`` keeps what the relay writes and calls ``connection_lost`` on the next loop turn after
a close, as asyncio's transports do; the event loop's ``create_connection`` is replaced so that the relay's own
``connect`` gets a mock upstream. Timeouts are checked with a ``now_ns`` the test chooses.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from collectors.proxy import relay as relay_package
from collectors.proxy.limits import Limits
from collectors.proxy.refusals import Refusal
from collectors.proxy.relay import Exchange, Failure, Headers, Relay, RequestHead, Target
from collectors.proxy.relay.client_side import ClientSide
from collectors.proxy.relay.states import (
    UPSTREAM_MOVES,
    ClientEvent,
    IllegalMove,
    Stage,
    StageEvent,
    UpstreamEvent,
    UpstreamState,
)

OLLAMA = Target("127.0.0.1", 11434, b"127.0.0.1:11434", "http://127.0.0.1:11434")
GET = b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n"
VERSION = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{"version":"0.12.0"}'
RELAY_LOGGER = "collectors.proxy.relay"
REFUSALS_LOGGER = "collectors.proxy.refusals"
RELAY_SOURCES = sorted(Path(relay_package.__file__).parent.glob("*.py"))  # every room of the relay


class MockTransport:
    """Keeps what is written; close and abort end the protocol on the next loop turn."""

    def __init__(self, protocol: asyncio.Protocol, peer: tuple[str, int]) -> None:
        self.protocol: Any = protocol  # a ClientSide or an UpstreamSide
        self.peer = peer
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data

    def close(self) -> None:
        self._end()

    def abort(self) -> None:
        self.aborted = True
        self._end()

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@dataclass
class Hooks(Exchange):
    """An exchange that notes every hook call; ``raises`` names a hook that raises instead."""

    raises: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    keep_request_body = True

    def _note(self, name: str, value: Any = None) -> None:
        self.calls.append((name, value))
        if name == self.raises:
            raise RuntimeError(f"bug in {name}")

    def request_body(self, body: bytes, truncated: bool) -> None:
        self._note("request_body", (len(body), truncated))

    def forwarded(self, t_ns: int) -> None:
        self._note("forwarded")

    def response_head(self, t_ns: int, status: int, content_type: str | None) -> Headers:
        self._note("response_head", status)
        return []

    def failed(self, kind: Failure, detail: str, responded: bool) -> None:
        self._note("failed", kind)

    def ended(self, t_ns: int) -> None:
        self._note("ended")

    def named(self, name: str) -> list[Any]:
        return [value for n, value in self.calls if n == name]


class Harness:
    """A Relay whose route hands out ``Hooks``; client connections and upstreams on mock transports."""

    def __init__(self, limits: Limits | None = None, route_raises: bool = False) -> None:
        self.relay = Relay(self.route, limits or Limits())
        self.relay.max_clients = self.relay.limits.connection_cap(10_000)
        self.exchanges: list[Hooks] = []
        self.upstreams: list[MockTransport] = []
        self.next_raises = ""
        self.route_raises = route_raises
        self.close_at_once = False  # the next upstream connection closes as soon as it is made

    def route(self, head: RequestHead) -> tuple[Target, Exchange, frozenset[bytes]]:
        if self.route_raises:
            self.route_raises = False
            raise KeyError("bug in route")
        ex = Hooks(raises=self.next_raises)
        self.next_raises = ""
        self.exchanges.append(ex)
        return OLLAMA, ex, frozenset()

    def connect(self, peer: str = "127.0.0.1", port: int = 40000) -> tuple[ClientSide, MockTransport]:
        client = ClientSide(self.relay)
        transport = MockTransport(client, (peer, port))
        client.connection_made(transport)  # type: ignore[arg-type]
        return client, transport

    async def create_connection(self, factory: Callable[[], asyncio.Protocol], *_: Any, **__: Any) -> tuple[Any, Any]:
        protocol = factory()
        transport = MockTransport(protocol, ("127.0.0.1", 11434))
        self.upstreams.append(transport)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        if self.close_at_once:
            self.close_at_once = False
            transport.closed = True
            protocol.connection_lost(None)
        return transport, protocol

    async def upstream(self, n: int = 1) -> MockTransport:
        """The ``n``-th upstream connection, once the relay's connect task made it."""
        for _ in range(100):
            if len(self.upstreams) >= n and self.upstreams[n - 1].written:
                return self.upstreams[n - 1]
            await asyncio.sleep(0)
        raise AssertionError("the relay opened no upstream connection")


def run(test: Callable[[Harness], Coroutine[Any, Any, None]], **kw: Any) -> None:
    async def main() -> None:
        h = Harness(**kw)
        asyncio.get_running_loop().create_connection = h.create_connection  # type: ignore[method-assign,assignment]
        await test(h)

    asyncio.run(main())


async def turn() -> None:
    """Let the loop run what the relay scheduled (its connect task takes a few turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == RELAY_LOGGER and r.levelno >= logging.ERROR]


async def served(h: Harness, peer: str = "127.0.0.1") -> bytes:
    """One GET on a new client connection (closed after its answer); what the client got."""
    client, client_t = h.connect(peer)
    client_t.protocol.data_received(GET)
    await turn()
    if client_t.closed:
        return client_t.take()
    assert client.upstream is not None and client.upstream.transport is not None
    up = client.upstream.transport
    assert up.take().startswith(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n")  # type: ignore[attr-defined]
    client.upstream.data_received(VERSION)
    client_t.close()
    await turn()
    return client_t.take()


# -- a request through both protocols -------------------------------------------------------------------------


def test_a_request_goes_through_both_protocols_and_ends_once() -> None:
    async def go(h: Harness) -> None:
        reply = await served(h)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b'{"version":"0.12.0"}')
        ex = h.exchanges[0]
        assert [n for n, _ in ex.calls] == ["forwarded", "request_body", "response_head", "ended"]
        assert h.upstreams[0].protocol.state is UpstreamState.IDLE  # kept for the next request

    run(go)


# -- our own errors: logged, 500, never the client's or Ollama's fault ------------------------------------------


def test_route_raising_answers_500_logs_the_traceback_and_the_next_connection_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            t.protocol.data_received(GET)
        reply = t.take()
        assert status_of(reply) == 500 and b"Connection: close" in reply
        message = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        assert "Phasewatch's proxy" in message and "not in the request or in Ollama" in message
        assert "malformed" not in message and "callback" not in message
        assert t.closed
        [record] = error_records(caplog)
        assert record.exc_info is not None and "bug in route" in str(record.exc_info[1])
        assert "in route" in caplog.text and "Traceback" in caplog.text  # the traceback itself is logged
        await turn()
        assert status_of(await served(h)) == 200  # another connection: served as ever

    run(go, route_raises=True)


@pytest.mark.parametrize("hook", ["forwarded", "request_body", "response_head"])
def test_a_hook_raising_before_the_response_answers_500_not_400_or_502(hook: str, caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        h.next_raises = hook
        _, t = h.connect()
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            t.protocol.data_received(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
            if hook == "response_head":
                up = await h.upstream()
                up.protocol.data_received(VERSION)
                assert up.aborted  # the upstream request is dropped with the client's
        reply = t.take()
        assert status_of(reply) == 500 and t.closed
        assert b'"version"' not in reply  # nothing of Ollama's answer follows ours
        [record] = error_records(caplog)
        assert record.exc_info is not None and f"bug in {hook}" in str(record.exc_info[1])
        ex = h.exchanges[0]
        assert ex.named("failed") == [Failure.INTERNAL] and len(ex.named("ended")) == 1
        await turn()
        assert status_of(await served(h)) == 200

    run(go)


def test_a_hook_raising_mid_response_cuts_that_connection_only(caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        t.protocol.data_received(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
        up = await h.upstream()
        up.protocol.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
        up.protocol.data_received(b'5\r\n{"a":\r\n')
        ex = h.exchanges[0]

        def broken_append(_: tuple[int, bytes]) -> None:
            raise MemoryError("bug in on_body")

        up.protocol._on_body = broken_append
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            up.protocol.data_received(b"2\r\n1}\r\n0\r\n\r\n")
        reply = t.take()
        assert reply.startswith(b"HTTP/1.1 200 OK") and b"HTTP/1.1 500" not in reply  # the response had begun: cut
        assert not reply.endswith(b"0\r\n\r\n") and t.closed and up.aborted
        assert len(error_records(caplog)) == 1 and "bug in on_body" in caplog.text
        assert ex.named("failed") == [Failure.INTERNAL] and len(ex.named("ended")) == 1
        await turn()
        assert status_of(await served(h)) == 200

    run(go)


def test_hooks_failing_again_while_ending_still_close_and_log(caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        h.next_raises = "request_body"
        _, t = h.connect()
        h_ex_failed = Hooks.failed

        def failed_too(self: Hooks, kind: Failure, detail: str, responded: bool) -> None:
            h_ex_failed(self, kind, detail, responded)
            raise RuntimeError("bug in failed")

        Hooks.failed = failed_too  # type: ignore[method-assign]
        try:
            with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
                t.protocol.data_received(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
        finally:
            Hooks.failed = h_ex_failed  # type: ignore[method-assign]
        assert status_of(t.take()) == 500 and t.closed
        assert len(error_records(caplog)) == 2 and "bug in failed" in caplog.text
        assert len(h.exchanges[0].named("ended")) == 1  # the recording still gets its end, exactly once

    run(go)


def test_stopping_the_parser_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        h.relay.limits = Limits(max_pipelined=2)
        with caplog.at_level(logging.DEBUG, logger=RELAY_LOGGER):
            _, t = h.connect()  # an upgrade: refused, not relayed
            t.protocol.data_received(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            assert status_of(t.take()) == 501
            _, t = h.connect()  # malformed: the client's fault, said so
            t.protocol.data_received(b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n")
            reply = t.take()
            assert status_of(reply) == 400 and b"malformed HTTP request" in reply
            _, t = h.connect()  # more pipelined than held: those are answered, the rest never parsed
            t.protocol.data_received(GET * 5)
            await turn()
            assert len(h.exchanges) == 2
            _, t = h.connect()
            t.protocol.data_received(b"\x16\x03\x01garbage\r\n\r\n")
            assert status_of(t.take()) == 400
        assert error_records(caplog) == []

    run(go)


def test_a_malformed_response_is_still_ollamas(caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        t.protocol.data_received(GET)
        up = await h.upstream()
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            up.protocol.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
        reply = t.take()
        assert status_of(reply) == 502 and b"malformed HTTP response" in reply
        assert error_records(caplog) == []

    run(go)


def test_a_second_response_to_one_request_never_reaches_a_client_and_its_connection_is_dropped() -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        t.protocol.data_received(GET)
        up = await h.upstream()
        up.protocol.data_received(VERSION + VERSION)
        assert t.take().count(b"HTTP/1.1 200") == 1
        assert up.aborted and up.protocol.state is UpstreamState.ABORTED  # never reused for another request

    run(go)


# -- flow control -------------------------------------------------------------------------------------------


def test_flow_control_pauses_each_side_for_the_other() -> None:
    async def go(h: Harness) -> None:
        client, t = h.connect()
        t.protocol.data_received(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n{}")
        up = await h.upstream()
        up.protocol.pause_writing()  # Ollama reads the body slower than the client sends it
        assert not t.reading
        up.protocol.resume_writing()
        assert t.reading
        client.pause_writing()  # the client reads the answer slower than Ollama sends it
        assert not up.reading
        client.resume_writing()
        assert up.reading

    run(go)


def test_a_pipelined_request_pauses_reading_until_its_turn() -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        t.protocol.data_received(GET + GET)
        assert not t.reading  # the second waits: nothing more is read until it is the active one
        up = await h.upstream()
        up.protocol.data_received(VERSION)
        assert t.reading  # the second is active now
        up.protocol.data_received(VERSION)
        assert t.reading and t.take().count(b"HTTP/1.1 200") == 2

    run(go)


# -- slow bodies (issue 25, finding 5) ------------------------------------------------------------------------

SLOW = Limits(body_timeout_s=2.0, min_body_rate_bps=1000, body_rate_window_s=1.0, slow_body_s=1.0)


def _post_head(length: int) -> bytes:
    return b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % length


def test_a_fast_start_buys_no_time_for_a_trickle() -> None:
    """The old rule allowed body_timeout_s + 1 s per min_body_rate_bps already received (9.4 h after 33 MB)."""

    async def go(h: Harness) -> None:
        client, t = h.connect()
        t0 = time.monotonic_ns()
        t.protocol.data_received(_post_head(50_000_000) + b"x" * 1_000_000)  # 1 MB at once: 1,000 s under the old rule
        s = 1_000_000_000
        for second in range(1, 3):  # then a byte a second, never silent
            client.read_ns = t0 + second * s
            client._parsing.body_bytes += 1  # type: ignore[union-attr]
            client.check_timeouts(t0 + second * s)
            assert not t.closed, f"cut at {second} s, within its grace"
        client.read_ns = t0 + 3 * s
        client._parsing.body_bytes += 1  # type: ignore[union-attr]
        client.check_timeouts(t0 + 3 * s + s // 2)  # the window after the grace brought 1 byte: too slow
        reply = t.take()
        assert status_of(reply) == 408 and b"slower than 1000 bytes/s" in reply
        assert h.exchanges[0].named("failed") == [Failure.CLIENT_GONE]

    run(go, limits=SLOW)


def test_a_body_that_keeps_its_rate_is_never_cut() -> None:
    async def go(h: Harness) -> None:
        client, t = h.connect()
        t0 = time.monotonic_ns()
        t.protocol.data_received(_post_head(10_000_000))
        for tenth in range(1, 200):  # 20 s at 1,500 bytes/s, above the 1,000 needed
            now = t0 + tenth * 100_000_000
            client.read_ns = now
            client._parsing.body_bytes += 150  # type: ignore[union-attr]
            client.check_timeouts(now)
        assert not t.closed and t.take() == b""

    run(go, limits=SLOW)


def test_memory_kept_for_slow_bodies_is_bounded_all_together() -> None:
    async def go(h: Harness) -> None:
        clients = [h.connect(port=40000 + i) for i in range(10)]
        for _, t in clients:
            t.protocol.data_received(_post_head(1 << 30) + b"x" * (300 << 10))
        await turn()
        assert h.relay.kept_bytes == 1 << 20  # 10 x 300 KiB arrived; 1 MiB kept
        for _, t in clients:
            t.abort()
        await turn()
        assert h.relay.kept_bytes == 0
        _, t = h.connect()  # room again
        t.protocol.data_received(_post_head(2) + b"{}")
        assert h.exchanges[-1].named("request_body") == [(2, False)]

    run(go, limits=Limits(max_kept_body_bytes=512 << 10, max_kept_bodies_bytes=1 << 20))


def test_at_the_bound_the_oldest_slow_body_makes_room() -> None:
    async def go(h: Harness) -> None:
        h.relay.max_clients = 4
        slow = [h.connect("127.0.0.2", 40000 + i) for i in range(4)]
        for i, (client, t) in enumerate(slow):
            t.protocol.data_received(_post_head(1 << 30) + b"x" * 100)
            client._parsing.body_started_ns -= (10 - i) * 1_000_000_000  # type: ignore[union-attr]  # 10 s, 9 s...
        await turn()
        assert len(h.relay.clients) == 4
        _, young_t = h.connect("127.0.0.3")  # a body younger than slow_body_s is never cut
        young_t.protocol.data_received(_post_head(1 << 30))
        assert slow[0][1].aborted and not slow[1][1].aborted  # the oldest made room
        assert h.exchanges[0].named("failed") == [Failure.EVICTED]
        assert status_of(await served(h, "127.0.0.3")) == 200  # the next oldest made room
        assert slow[1][1].aborted and not slow[2][1].aborted
        for client, _ in slow[2:]:
            client._parsing.body_started_ns = time.monotonic_ns()
        _, t = h.connect("127.0.0.4")
        t.protocol.data_received(_post_head(1 << 30))
        _, t = h.connect("127.0.0.5")  # now every body is young: refused, said so
        assert status_of(t.take()) == 503 and t.closed and not young_t.closed
        # Each cut and the refusal on the record (issue 30): two bodies cut without an answer, one 503.
        assert h.relay.refusals.counts == {("none", Refusal.EVICTED): 2, ("503", Refusal.CONNECTION_BOUND): 1}

    run(go, limits=dataclasses.replace(SLOW, max_client_share=1.0))


def test_one_address_never_holds_the_whole_cap() -> None:
    async def go(h: Harness) -> None:
        h.relay.max_clients = 8
        assert h.relay.per_client_cap() == 4
        crowd = []
        for i in range(6):
            _, t = h.connect("127.0.0.2", 40000 + i)
            if not t.closed:
                t.protocol.data_received(_post_head(1 << 30))  # young bodies: not evictable
            crowd.append((_, t))
        refused = [t for _, t in crowd if t.closed]
        assert len(refused) == 2 and all(status_of(t.take()) == 503 for t in refused)
        for _ in range(4):  # another address still finds room
            assert status_of(await served(h, "127.0.0.3")) == 200

    run(go, limits=SLOW)


# -- refusals on the record (issue 30) ------------------------------------------------------------------------


def refusal_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == REFUSALS_LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("sent", "status", "why"),
    [
        (b"GARBAGE /\r\n\r\n", 400, Refusal.MALFORMED),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, Refusal.MALFORMED),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 2000 + b"\r\n\r\n", 431, Refusal.HEAD_TOO_LARGE),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501, Refusal.UPGRADE),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, Refusal.TRANSFER_CODING),
    ],
)
def test_each_request_the_relay_refuses_is_one_warning_with_the_address_and_counted(
    sent: bytes, status: int, why: Refusal, caplog: pytest.LogCaptureFixture
) -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect("192.0.2.7")
        with caplog.at_level(logging.WARNING):
            t.protocol.data_received(sent)
        assert status_of(t.take()) == status and t.closed
        [line] = refusal_warnings(caplog)
        text = line.getMessage()
        assert "192.0.2.7" in text and f"answered {status}" in text, text
        assert h.relay.refusals.counts == {(str(status), why): 1}
        assert h.exchanges == []  # nothing went upstream

    run(go, limits=Limits(max_head_bytes=1024))


def test_a_body_that_stalls_is_refused_408_on_the_record_with_its_request_line(caplog: pytest.LogCaptureFixture) -> None:
    async def go(h: Harness) -> None:
        client, t = h.connect("192.0.2.8")
        t.protocol.data_received(_post_head(100) + b"{")
        with caplog.at_level(logging.WARNING):
            client.check_timeouts(time.monotonic_ns() + 10 * 1_000_000_000)
        assert status_of(t.take()) == 408
        [line] = refusal_warnings(caplog)
        assert "192.0.2.8" in line.getMessage() and "POST '/api/generate'" in line.getMessage()
        assert h.relay.refusals.counts == {("408", Refusal.BODY_TIMEOUT): 1}

    run(go, limits=SLOW)


def test_a_flood_of_refusals_writes_at_most_the_named_limit_of_lines_and_counts_them_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go(h: Harness) -> None:
        with caplog.at_level(logging.WARNING):
            for i in range(12):
                _, t = h.connect(port=41000 + i)
                t.protocol.data_received(b"GARBAGE\r\n\r\n")
                assert status_of(t.take()) == 400
        assert len(refusal_warnings(caplog)) == 3
        assert h.relay.refusals.counts == {("400", Refusal.MALFORMED): 12}

    run(go, limits=Limits(refusal_warnings_per_minute=3))


def test_an_upstream_that_closes_before_the_request_went_out_is_a_502_not_a_hang_or_our_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go(h: Harness) -> None:
        h.close_at_once = True
        _, t = h.connect()
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            t.protocol.data_received(GET)
            await turn()
        reply = t.take()
        assert status_of(reply) == 502 and b"closed the connection" in reply
        assert h.exchanges[0].named("failed") == [Failure.NO_ANSWER] and len(h.exchanges[0].named("ended")) == 1
        assert error_records(caplog) == []

    run(go)


def test_a_cut_response_ends_the_requests_pipelined_behind_it_too() -> None:
    async def go(h: Harness) -> None:
        _, t = h.connect()
        t.protocol.data_received(GET + GET)
        up = await h.upstream()
        up.protocol.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{")
        up.protocol.connection_lost(None)  # Ollama went away mid-body
        await turn()
        assert t.closed
        first, second = h.exchanges
        assert first.named("failed") == [Failure.CUT] and len(first.named("ended")) == 1
        assert second.named("failed") == [Failure.CUT] and len(second.named("ended")) == 1  # never left running

    run(go)


# -- the relay's states: one checked move each, against its table (issue 30; the tables: test_relay_states.py) ------


def test_the_objects_move_only_through_their_tables() -> None:
    async def go(h: Harness) -> None:
        client, t = h.connect()
        t.protocol.data_received(GET)
        up = await h.upstream()
        req = client.requests[0]
        up.protocol.data_received(VERSION)
        assert req.stage is Stage.DONE and up.protocol.state is UpstreamState.IDLE
        with pytest.raises(IllegalMove):
            req.move(StageEvent.FORWARD)  # a finished request never starts again
        with pytest.raises(IllegalMove):
            up.protocol.move(UpstreamEvent.FINAL_HEAD)  # an idle connection has no response to read
        client.move(ClientEvent.STOP)
        with pytest.raises(IllegalMove):
            client.move(ClientEvent.HEAD_BEGINS)  # a stopped connection parses no more

    run(go)


def test_an_illegal_move_inside_a_callback_is_logged_as_our_bug_and_answered_500(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def go(h: Harness) -> None:
        broken = {UpstreamEvent.ABORT: UpstreamState.ABORTED}  # a table that lost HEAD's FINAL_HEAD
        monkeypatch.setitem(UPSTREAM_MOVES, UpstreamState.HEAD, broken)
        _, t = h.connect()
        t.protocol.data_received(GET)
        up = await h.upstream()
        with caplog.at_level(logging.ERROR, logger=RELAY_LOGGER):
            up.protocol.data_received(VERSION)
        assert status_of(t.take()) == 500
        [record] = error_records(caplog)
        assert isinstance(record.exc_info[1], IllegalMove) if record.exc_info else False
        assert "cannot move from HEAD on FINAL_HEAD" in caplog.text

    run(go)


def _functions_with_bare_state_writes(tree: ast.AST) -> list[str]:
    """Functions of the relay that assign ``.state``/``.stage`` other than ``move`` (and ``__init__``'s first value)."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name in ("move", "__init__"):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr in ("state", "stage") and isinstance(t.ctx, ast.Store):
                        found.append(f"{fn.name}:{t.lineno}")
    return found


def test_no_state_changes_outside_the_checked_moves_and_no_private_calls_across_objects() -> None:
    assert len(RELAY_SOURCES) >= 7  # the package's rooms, not an empty glob
    trees = {path.name: ast.parse(path.read_text()) for path in RELAY_SOURCES}
    assert [f"{name}:{where}" for name, tree in trees.items() for where in _functions_with_bare_state_writes(tree)] == []
    across = [
        f"{name}:{node.attr}:{node.lineno}"
        for name, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert across == []
