"""Hostile clients and upstreams against the relay (issue 12): framing, Host and Origin, bounds, timeouts.

The upstream is a small recorder parsed by h11 (an independent parser), so a request
the relay smuggles, splits or frames wrongly shows up there as an extra request or a
protocol error.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from analysis.chunks import NdjsonSplitter, StreamFormat, new_splitter, split_chunks
from collectors.config import SettingsError, load_limits, load_settings
from collectors.proxy.access import HostPolicy, OriginPolicy
from collectors.proxy.limits import Limits
from collectors.proxy.recording import RECORD_ID_HEADER
from collectors.proxy.request_facts import describe_request
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.raw_http import exchange
from tests.support.recording_upstream import RecordingUpstream, recording_upstream

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with recording_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def proxy(upstream: RecordingUpstream) -> Iterator[ProxyThread]:
    with run_proxy(f"http://127.0.0.1:{upstream.port}") as p:
        yield p


def settle(upstream: RecordingUpstream, proxy: ProxyThread) -> None:
    """Wait until the proxy has no request in flight and the upstream log stops changing."""
    deadline = time.monotonic() + 5
    last = -1
    while time.monotonic() < deadline:
        n = len(upstream.targets())
        if n == last and not proxy.proxy._relay.busy():
            return
        last = n
        time.sleep(0.05)


def head(lines: list[bytes], body: bytes = b"", start: bytes = b"POST /api/generate HTTP/1.1") -> bytes:
    return start + b"\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + body


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


# Request shapes that smuggle a second request past a proxy whose framing disagrees with the server's.
SHAPES = {
    # Finding 1 of the issue: Connection names Content-Length, which was then dropped, leaving the body unframed.
    "connection-names-content-length": head(
        [b"Host: localhost", b"Connection: keep-alive, Content-Length", b"Content-Length: %d" % len(SMUGGLED)], SMUGGLED
    ),
    "connection-names-transfer-encoding": head(
        [b"Host: localhost", b"Connection: Transfer-Encoding", b"Transfer-Encoding: chunked"], chunked(SMUGGLED)
    ),
    # Finding 1: two Transfer-Encoding headers; llhttp used the last, the relay the first.
    "identity-then-chunked": head(
        [b"Host: localhost", b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked"], chunked(SMUGGLED)
    ),
    "chunked-then-identity": head(
        [b"Host: localhost", b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity"], chunked(SMUGGLED)
    ),
    "chunked-twice": head([b"Host: localhost", b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"], chunked(SMUGGLED)),
    "te-list": head([b"Host: localhost", b"Transfer-Encoding: chunked, identity"], chunked(SMUGGLED)),
    "te-gzip-chunked": head([b"Host: localhost", b"Transfer-Encoding: gzip, chunked"], chunked(SMUGGLED)),
    "te-identity": head([b"Host: localhost", b"Transfer-Encoding: identity"], SMUGGLED),
    "te-upper": head([b"Host: localhost", b"Transfer-Encoding: CHUNKED"], chunked(SMUGGLED)),
    "te-lower-name": head([b"Host: localhost", b"transfer-encoding: chunked"], chunked(SMUGGLED)),
    "te-padded": head([b"Host: localhost", b"Transfer-Encoding:  chunked "], chunked(SMUGGLED)),
    "te-in-http-1.0": head(
        [b"Host: localhost", b"Transfer-Encoding: chunked"], chunked(SMUGGLED), start=b"POST /api/generate HTTP/1.0"
    ),
    "te-obs-fold": head([b"Host: localhost", b"Transfer-Encoding:", b" chunked", b"Content-Length: 3"], chunked(SMUGGLED)),
    "te-space-before-colon": head(
        [b"Host: localhost", b"Transfer-Encoding : chunked", b"Content-Length: %d" % len(chunked(SMUGGLED))],
        chunked(SMUGGLED),
    ),
    "cl-and-te": head([b"Host: localhost", b"Content-Length: 3", b"Transfer-Encoding: chunked"], chunked(SMUGGLED)),
    "cl-twice-differ": head([b"Host: localhost", b"Content-Length: 0", b"Content-Length: %d" % len(SMUGGLED)], SMUGGLED),
    "cl-twice-same": head(
        [b"Host: localhost", b"Content-Length: %d" % len(SMUGGLED), b"Content-Length: %d" % len(SMUGGLED)], SMUGGLED
    ),
    "cl-list": head([b"Host: localhost", b"Content-Length: 0, %d" % len(SMUGGLED)], SMUGGLED),
    "cl-plus": head([b"Host: localhost", b"Content-Length: +%d" % len(SMUGGLED)], SMUGGLED),
    "cl-minus": head([b"Host: localhost", b"Content-Length: -1"], SMUGGLED),
    "cl-inner-space": head([b"Host: localhost", b"Content-Length: 4 3"], SMUGGLED),
    "cl-padded": head([b"Host: localhost", b"Content-Length:  %d " % len(SMUGGLED)], SMUGGLED),
    "bare-lf": SMUGGLED.replace(b"/smuggled", b"/api/tags").replace(b"\r\n", b"\n"),
    "chunk-size-bare-lf": head([b"Host: localhost", b"Transfer-Encoding: chunked"], b"2\nhi\n0\n\n" + SMUGGLED),
    "two-hosts": head([b"Host: localhost", b"Host: evil.example", b"Content-Length: 0"]),
    "no-host-1.1": head([b"Content-Length: 0"]),
    "http-0.9": b"GET /smuggled\r\n\r\n",
    "http-2.0-line": b"GET /smuggled HTTP/2.0\r\nHost: localhost\r\n\r\n",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_framing_shapes_never_smuggle_a_request_or_swap_answers(
    upstream: RecordingUpstream, proxy: ProxyThread, shape: str
) -> None:
    upstream.reset()
    attack = exchange(proxy.proxy.port, SHAPES[shape], quiet_s=0.5)
    settle(upstream, proxy)
    # A second client right after, on a new connection (it may get the pooled upstream connection).
    victim = exchange(proxy.proxy.port, b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", want=1)
    settle(upstream, proxy)
    targets = upstream.targets()
    assert upstream.errors == [], f"the relay sent bytes h11 cannot parse: {upstream.errors}"
    assert "/smuggled" not in targets, f"{shape}: a request smuggled in a body reached upstream: {targets}"
    assert len(victim.responses) == 1 and json.loads(victim.responses[0].body)["target"] == "/api/tags"
    assert targets[-1] == "/api/tags" and targets.count("/api/tags") == 1
    forwarded = [r for r in attack.responses if "x-upstream-seq" in r.headers]
    assert len(targets) - 1 == len(forwarded) <= 1, f"{shape}: one client request, {targets[:-1]} upstream"
    if forwarded:  # accepted: one request, its body framed exactly as the client's
        seen = upstream.requests[0]
        assert seen.body in (SMUGGLED, b"", b"hi"), seen
    else:
        assert attack.responses and 400 <= attack.responses[0].status < 600, attack.raw[:200]
        assert attack.closed


def test_connection_naming_content_length_forwards_one_framed_body(upstream: RecordingUpstream, proxy: ProxyThread) -> None:
    upstream.reset()
    reply = exchange(proxy.proxy.port, SHAPES["connection-names-content-length"], want=1)
    settle(upstream, proxy)
    assert [r.status for r in reply.responses] == [200]
    assert upstream.requests[0].body == SMUGGLED and len(upstream.requests) == 1
    assert ("Content-Length", str(len(SMUGGLED))) in [(k.title(), v) for k, v in upstream.requests[0].headers]


def test_an_upstream_sending_two_answers_to_one_request_never_reaches_the_next_client() -> None:
    """Both sides' framing must end exactly before an upstream connection is reused."""
    import asyncio

    from tests.collectors.proxy.test_proxy_relay import LoopThread

    lt = LoopThread()
    served = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            served[0] += 1
            n = b"%d" % served[0]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(n), n))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")  # answers nothing
            await writer.drain()
        writer.close()

    server = lt.run(asyncio.start_server(serve, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    got = b""
    try:
        with run_proxy(f"http://127.0.0.1:{port}") as p, socket.create_connection(("127.0.0.1", p.proxy.port)) as s:
            s.settimeout(0.5)
            for _ in range(3):  # one keep-alive client connection, one request at a time
                s.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
                with contextlib.suppress(TimeoutError):
                    while True:
                        got += s.recv(65536)
    finally:
        server.close()
        lt.close()
    assert b"EVIL!" not in got
    assert [body for body in re.findall(rb"\r\n\r\n(\d)", got)] == [b"1", b"2", b"3"], got


def test_an_upstream_response_head_is_bounded() -> None:
    from tests.collectors.proxy.test_proxy_relay import raw_upstream

    reply = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (8 << 20) + b"\r\nContent-Length: 0\r\n\r\n"
    with raw_upstream(reply) as port, run_proxy(f"http://127.0.0.1:{port}") as p:
        r = httpx.get(p.base_url + "/api/tags", timeout=10)
    assert r.status_code == 502 and "response head over" in r.json()["error"]


# -- Host and Origin ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("localhost:11435", True),
        ("LOCALHOST:1", True),
        ("127.0.0.1:11435", True),
        ("[::1]:11435", True),
        ("[::1]", True),
        ("10.1.2.3", True),
        ("192.168.1.20:80", True),
        ("0.0.0.0:11435", True),
        ("box.local", True),
        ("app.localhost", True),
        ("svc.internal:8080", True),
        ("", True),  # HTTP/1.0 without Host, as Ollama
        ("evil.example", False),
        ("evil.example:11435", False),
        ("localhost.evil.example", False),
        ("8.8.8.8", False),
        ("127.0.0.1.nip.io", False),
    ],
)
def test_host_policy_follows_ollama(host: str, allowed: bool) -> None:
    assert HostPolicy("127.0.0.1").allows(host) is allowed


def test_host_policy_allows_the_listen_address_and_named_hosts() -> None:
    assert HostPolicy("my-box.lan", ["llm.example.com"]).allows("my-box.lan:11435")
    assert HostPolicy("", ["llm.example.com"]).allows("LLM.example.com:443")
    assert HostPolicy("", ["*"]).allows("anything.example")
    assert not HostPolicy("", ["llm.example.com"]).allows("example.com")


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost", True),
        ("http://localhost:3000", True),
        ("https://127.0.0.1:8443", True),
        ("http://0.0.0.0:1", True),
        ("app://obsidian.md", True),
        ("file://", True),
        ("tauri://localhost", True),
        ("vscode-webview://abc", True),
        ("vscode-file://vscode-app", True),
        ("http://127.0.0.1:11435", True),  # the request's own origin (Host below)
        ("http://evil.example", False),
        ("http://evil.example:11435", False),
        ("null", False),
        ("chrome-extension://abc", False),
        ("https://sub.example.com", True),  # OLLAMA_ORIGINS entry below
        ("https://example.com", False),
    ],
)
def test_origin_policy_follows_ollama(origin: str, allowed: bool) -> None:
    assert OriginPolicy(["https://*.example.com"]).allows(origin, "127.0.0.1:11435") is allowed


def test_origin_star_allows_any() -> None:
    assert OriginPolicy(["*"]).allows("http://evil.example", "localhost")


def test_foreign_host_and_origin_get_403_and_record_nothing(upstream: RecordingUpstream, proxy: ProxyThread) -> None:
    async def metrics(_: object) -> object:
        from aiohttp import web

        return web.Response(text="secret metrics")

    proxy.proxy.add_local_route("GET", "/phasewatch/test-metrics", metrics)  # type: ignore[arg-type]
    upstream.reset()
    before = len(proxy.records)
    body = json.dumps({"model": "m" * 1000, "prompt": "hi"}).encode()
    rebinding = [
        head([b"Host: evil.example:%d" % proxy.proxy.port, b"Content-Length: %d" % len(body)], body),
        b"GET /api/tags HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        b"GET /phasewatch/test-metrics HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        # A page's cross-origin no-cors POST: Host is fine, Origin is not.
        head([b"Host: 127.0.0.1", b"Origin: http://evil.example", b"Content-Length: %d" % len(body)], body),
        b"GET /phasewatch/test-metrics HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\n\r\n",
    ]
    for request in rebinding:
        reply = exchange(proxy.proxy.port, request, want=1)
        assert [r.status for r in reply.responses] == [403], request[:80]
        assert b"secret" not in reply.raw
    settle(upstream, proxy)
    time.sleep(0.2)
    assert upstream.targets() == [] and len(proxy.records) == before
    # The same from allowed places is served.
    ok = httpx.get(proxy.base_url + "/phasewatch/test-metrics", headers={"Origin": "http://localhost:3000"}, timeout=10)
    assert ok.status_code == 200 and ok.text == "secret metrics"
    r = httpx.post(proxy.base_url + "/api/generate", content=body, headers={"Origin": f"http://127.0.0.1:{proxy.proxy.port}"})
    assert r.status_code == 200 and upstream.targets() == ["/api/generate"]
    # The private port that serves the local routes behind the relay refuses anyone else's Host too.
    local = proxy.proxy._local_target
    assert local is not None
    direct = httpx.get(f"http://127.0.0.1:{local.port}/phasewatch/test-metrics", headers={"Host": "evil.example"})
    assert direct.status_code == 403 and "secret" not in direct.text


def test_allowed_hosts_and_origins_settings() -> None:
    with recording_upstream() as up:
        proxy = ProxyThread(f"http://127.0.0.1:{up.port}")
        proxy.proxy = type(proxy.proxy)(
            f"http://127.0.0.1:{up.port}",
            proxy._on_record,
            allowed_hosts=("llm.example.com",),
            allowed_origins=("https://chat.example.com",),
        )
        proxy.start()
        try:
            url = proxy.base_url + "/api/tags"
            assert httpx.get(url, headers={"Host": "llm.example.com"}).status_code == 200
            assert httpx.get(url, headers={"Host": "other.example.com"}).status_code == 403
            assert httpx.get(url, headers={"Origin": "https://chat.example.com"}).status_code == 200
            assert httpx.get(url, headers={"Origin": "https://other.example.com"}).status_code == 403
        finally:
            proxy.stop()


def test_settings_read_hosts_origins_and_limits() -> None:
    env = {
        "PHASEWATCH_ALLOWED_HOSTS": "a.example, b.example",
        "OLLAMA_ORIGINS": '"https://x.example,app://*"',
        "PHASEWATCH_MAX_HEAD_BYTES": "131072",
        "PHASEWATCH_HEAD_TIMEOUT_S": "2.5",
    }
    s = load_settings([], env)
    assert s.allowed_hosts == ("a.example", "b.example")
    assert s.allowed_origins == ("https://x.example", "app://*")
    assert s.limits.max_head_bytes == 131072 and s.limits.head_timeout_s == 2.5
    assert s.limits.max_pipelined == Limits().max_pipelined
    with pytest.raises(SettingsError, match="PHASEWATCH_MAX_PIPELINED"):
        load_limits({"PHASEWATCH_MAX_PIPELINED": "1.5"})
    with pytest.raises(SettingsError, match="PHASEWATCH_BODY_TIMEOUT_S"):
        load_limits({"PHASEWATCH_BODY_TIMEOUT_S": "0"})


# -- bounds ---------------------------------------------------------------------------------------------------


@pytest.fixture()
def tight(upstream: RecordingUpstream) -> Iterator[ProxyThread]:
    limits = Limits(
        max_kept_body_bytes=64 << 10,
        max_pipelined=4,
        max_label_chars=40,
        max_connections_per_client=8,
        head_timeout_s=0.5,
        body_timeout_s=0.5,
        body_rate_window_s=0.5,
        idle_timeout_s=0.5,
    )
    p = ProxyThread(f"http://127.0.0.1:{upstream.port}")
    p.proxy = type(p.proxy)(f"http://127.0.0.1:{upstream.port}", p._on_record, limits=limits)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def test_a_huge_header_is_refused_fast_with_431(proxy: ProxyThread) -> None:
    errors: list[BaseException] = []
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", proxy.proxy.port), timeout=10) as s:

        def send() -> None:
            try:
                s.sendall(b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (20 << 20))
            except OSError as exc:  # the proxy closes once it has answered
                errors.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        reply = s.recv(4096)
        elapsed_s = time.monotonic() - t0
        sender.join(10)
    assert reply.startswith(b"HTTP/1.1 431")
    assert elapsed_s < 2.0  # fails at 64 KiB, not after reading 20 MiB


def test_pipelined_requests_beyond_the_bound_are_not_parsed(upstream: RecordingUpstream, tight: ProxyThread) -> None:
    upstream.reset()
    many = b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n" * 200
    reply = exchange(tight.proxy.port, many, quiet_s=1.0)
    settle(upstream, tight)
    assert 1 <= len(reply.responses) <= 4 and reply.closed
    assert len(upstream.targets()) == len(reply.responses)


def test_request_body_kept_for_recording_is_bounded_but_forwarded_whole(upstream: RecordingUpstream, tight: ProxyThread) -> None:
    upstream.reset()
    body = json.dumps({"model": "big-model", "prompt": "x" * (1 << 20), "stream": False}).encode()
    r = httpx.post(tight.base_url + "/api/generate", content=body, timeout=30)
    assert r.json()["body_len"] == len(body)  # all of it reached upstream
    rec = tight.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.model == "big-model"  # read from the start of the body kept


def test_model_label_is_bounded(upstream: RecordingUpstream, tight: ProxyThread) -> None:
    r = httpx.post(tight.base_url + "/api/generate", json={"model": "m" * 50_000, "prompt": "x"}, timeout=30)
    rec = tight.wait_record(r.headers[RECORD_ID_HEADER])
    assert len(rec.model) == 40 and rec.model.endswith("…")
    fields = describe_request("/api/generate", b'{"model": "' + b"q" * 5000 + b'"}', record_text=False, max_label_chars=10)
    assert fields["model"] == "q" * 9 + "…"


def test_head_body_and_idle_timeouts(upstream: RecordingUpstream, tight: ProxyThread) -> None:
    port = tight.proxy.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /api/tags HTTP/1.1\r\nHost: loc")  # a head that never ends
        t0 = time.monotonic()
        assert s.recv(4096).startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /api/show HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")  # a body that stalls
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a body trickled a byte at a time
        s.sendall(b"POST /api/show HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2000000000\r\n\r\n")
        t0 = time.monotonic()
        got = b""
        with contextlib.suppress(OSError):
            while not got and time.monotonic() - t0 < 10:
                s.sendall(b"x")  # never silent for body_timeout_s, but far below min_body_rate_bps
                s.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    got = s.recv(4096)
        assert got.startswith(b"HTTP/1.1 408") and b"slower than" in got and time.monotonic() - t0 < 5
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # idle: closed without a word
        t0 = time.monotonic()
        assert s.recv(4096) == b"" and time.monotonic() - t0 < 5


def test_a_slow_answer_is_never_cut_by_the_timeouts() -> None:
    """Idle timeouts only count while no byte moves on the client side: waiting on Ollama is not idle."""
    import asyncio

    from aiohttp import web

    from tests.collectors.proxy.test_proxy_relay import aiohttp_upstream

    async def slow(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1.5)  # a model loading
        return web.json_response({"done": True})

    with aiohttp_upstream(slow) as port:
        p = ProxyThread(f"http://127.0.0.1:{port}")
        limits = Limits(head_timeout_s=0.3, body_timeout_s=0.3, idle_timeout_s=0.3)
        p.proxy = type(p.proxy)(f"http://127.0.0.1:{port}", p._on_record, limits=limits)
        p.start()
        try:
            r = httpx.post(p.base_url + "/api/generate", json={"model": "m", "prompt": "x", "stream": False}, timeout=10)
        finally:
            p.stop()
    assert r.status_code == 200 and r.json() == {"done": True}


def test_connections_beyond_the_bound_evict_idle_ones_not_working_ones(upstream: RecordingUpstream, tight: ProxyThread) -> None:
    held = [socket.create_connection(("127.0.0.1", tight.proxy.port), timeout=10) for _ in range(30)]
    try:
        for s in held:
            s.sendall(b"GET /api/tags HTTP/1.1\r\n")  # partial heads, slowloris-style
        for _ in range(5):
            assert httpx.get(tight.base_url + "/api/version", timeout=10).status_code == 200
        assert len(tight.proxy._relay.clients) <= 8
    finally:
        for s in held:
            s.close()


def test_an_upstream_line_without_newline_is_bounded() -> None:
    splitter = NdjsonSplitter(max_line_bytes=1000)
    out = []
    for _ in range(100):
        out += splitter.feed(1, b"x" * 500)
        assert sum(len(p) for p in splitter._pending) <= 1000
    out += splitter.feed(2, b'x\n{"done": true}\n')
    out += splitter.finish()
    assert out[0].problem is not None and "longer than 1000 bytes" in out[0].problem
    assert out[1].obj == {"done": True} and len(out) == 2
    whole = new_splitter(StreamFormat.JSON, 1000)
    assert whole.feed(1, b"[" * 600) == [] and whole.feed(2, b"]" * 600) == []
    json_body = whole.finish()
    assert len(json_body) == 1 and json_body[0].problem is not None and "longer than 1000" in json_body[0].problem
    assert split_chunks([(1, b'{"a": 1}')], StreamFormat.JSON)[0].obj == {"a": 1}
