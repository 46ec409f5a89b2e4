"""HTTP/1.1 corners of the relay: pipelining, HTTP/1.0, chunked uploads, back-pressure, broken upstreams.

Some need an upstream that misbehaves on purpose; those run a small aiohttp or raw
asyncio server on a loopback port in a background thread.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest
import trustme
from aiohttp import web

from analysis.records import Outcome
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimFactory, SimProcess
from tests.support.upstreams import aiohttp_upstream, raw_upstream

SMALL = "qwen2.5:0.5b"


@pytest.fixture(scope="module")
def sim(start_sims: SimFactory) -> SimProcess:
    s = start_sims("--hardware", "rtx-4090", "--num-parallel", "2")
    ollama.Client(host=s.base_url, timeout=30).generate(model=SMALL, prompt="warm up", options={"num_predict": 1})
    return s


def exchange(port: int, data: bytes, *, until_close: bool = True, timeout_s: float = 10.0) -> bytes:
    """Send raw bytes to the proxy; return everything it sends back until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if not until_close:
                break
        return out


def test_pipelined_requests_are_answered_in_order(proxy: ProxyThread) -> None:
    two = (
        b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n"
        b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    reply = exchange(proxy.proxy.port, two)
    assert reply.count(b"HTTP/1.1 200") == 2
    first, second = reply.split(b"HTTP/1.1 200")[1:]
    assert b'"version"' in first and b'"models"' in second


def test_http_1_0_client_gets_a_stream_ended_by_the_close(proxy: ProxyThread) -> None:
    body = json.dumps({"model": SMALL, "prompt": "hi", "options": {"num_predict": 5}}).encode()
    head = f"POST /api/generate HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    reply = exchange(proxy.proxy.port, head + body)
    head_out, _, payload = reply.partition(b"\r\n\r\n")
    assert head_out.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head_out.lower()
    lines = [json.loads(line) for line in payload.splitlines()]  # no chunk framing: an HTTP/1.0 client cannot read it
    assert len(lines) == 6 and lines[-1]["done"] is True
    rec = proxy.wait_record(dict(h.split(b": ", 1) for h in head_out.split(b"\r\n")[1:])[RECORD_ID_HEADER.encode()].decode())
    assert rec.outcome is Outcome.OK and len(rec.token_chunk_ns) == 5


def test_chunked_upload_is_forwarded_and_recorded(proxy: ProxyThread) -> None:
    body = json.dumps({"model": SMALL, "prompt": "chunked", "stream": False, "options": {"num_predict": 3}}).encode()

    def pieces() -> Iterator[bytes]:  # httpx sends a generator with Transfer-Encoding: chunked
        yield body[:10]
        yield body[10:]

    r = httpx.post(proxy.base_url + "/api/generate", content=pieces(), timeout=30)
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert (rec.model, rec.stream, rec.num_predict, rec.outcome) == (SMALL, False, 3, Outcome.OK)


def test_keep_alive_and_new_connections_both_work(proxy: ProxyThread) -> None:
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        assert [client.get("/api/version").status_code for _ in range(3)] == [200, 200, 200]
    for _ in range(3):  # new client connections take the upstream connections the last ones left
        assert httpx.get(proxy.base_url + "/api/version", timeout=30).status_code == 200


def test_malformed_request_gets_400_and_a_close(proxy: ProxyThread) -> None:
    reply = exchange(proxy.proxy.port, b"THIS IS NOT HTTP\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    assert "malformed HTTP request" in json.loads(reply.partition(b"\r\n\r\n")[2])["error"]


def test_upstream_that_closes_idle_connections_is_reconnected() -> None:
    async def hello(_: web.Request) -> web.StreamResponse:
        return web.json_response({"version": "0.0.0"})

    with aiohttp_upstream(hello, keepalive_timeout=0.1) as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        assert httpx.get(proxy.base_url + "/api/version", timeout=10).status_code == 200
        time.sleep(0.5)  # the upstream has closed the pooled connection by now
        assert httpx.get(proxy.base_url + "/api/version", timeout=10).json() == {"version": "0.0.0"}


def test_upstream_path_prefix_is_kept() -> None:
    async def echo(request: web.Request) -> web.StreamResponse:
        return web.json_response({"path": request.path_qs, "host": request.headers["Host"]})

    with aiohttp_upstream(echo) as port, run_proxy(f"http://127.0.0.1:{port}/ollama") as proxy:
        seen = httpx.get(proxy.base_url + "/api/tags?x=1", timeout=10).json()
    assert seen == {"path": "/ollama/api/tags?x=1", "host": f"127.0.0.1:{port}"}


def test_malformed_upstream_response_is_a_clear_502() -> None:
    with raw_upstream(b"SPEAKING GIBBERISH\r\n\r\n") as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        r = httpx.post(proxy.base_url + "/api/generate", json={"model": SMALL, "prompt": "x"}, timeout=10)
        assert r.status_code == 502 and "malformed HTTP response" in r.json()["error"]
        rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.outcome is Outcome.UPSTREAM_FAILED and rec.first_byte_ns is None
    assert rec.error is not None and "malformed HTTP response" in rec.error


def test_upstream_closing_before_answering_is_a_clear_502() -> None:
    with raw_upstream(b"") as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        r = httpx.get(proxy.base_url + "/api/tags", timeout=10)
    assert r.status_code == 502 and "failed before answering" in r.json()["error"]


def test_a_slow_client_holds_back_the_upstream() -> None:
    # Back-pressure: when the client stops reading, the proxy stops reading from Ollama, so its memory stays bounded.
    total_bytes = 64 << 20
    written = [0]

    async def firehose(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/x-ndjson"
        await resp.prepare(request)
        line = b'{"response":"' + b"x" * 1000 + b'","done":false}\n'
        with contextlib.suppress(ConnectionResetError):
            while written[0] < total_bytes:
                await resp.write(line)
                written[0] += len(line)
        return resp

    with aiohttp_upstream(firehose) as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        with socket.create_connection(("127.0.0.1", proxy.proxy.port), timeout=10) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            stalled_at, deadline = -1, time.monotonic() + 10
            while written[0] != stalled_at:  # not reading: wait until the upstream makes no progress for 0.5 s
                assert time.monotonic() < deadline, "the upstream was never held back"
                stalled_at = written[0]
                time.sleep(0.5)
            assert stalled_at < total_bytes // 2  # held a few socket buffers in (their sizes vary with load)
            got = 0
            while got < 8 << 20:  # reading again lets it go on
                got += len(s.recv(1 << 20))
            deadline = time.monotonic() + 5
            while written[0] == stalled_at and time.monotonic() < deadline:
                time.sleep(0.01)
            assert written[0] > stalled_at
        records = proxy.wait_records(1)
    # (Leaving mid-line may also leave a cut last line, noted as malformed.)
    assert records[0].outcome is Outcome.CANCELLED and (records[0].error or "").startswith("client disconnected")


def test_connection_close_is_honoured(proxy: ProxyThread) -> None:
    reply = exchange(proxy.proxy.port, b"GET /api/version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and b"connection: close" in reply.lower()  # and exchange() saw the close


def test_absolute_form_request_line_is_sent_in_origin_form() -> None:
    async def echo(request: web.Request) -> web.StreamResponse:
        return web.json_response({"path": request.path_qs})

    with aiohttp_upstream(echo) as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        reply = exchange(
            proxy.proxy.port, b"GET http://elsewhere:1/api/ps?a=b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"path": "/api/ps?a=b"}


def test_https_upstream_is_verified_and_relayed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # OLLAMA_HOST=https://...: the relay speaks TLS to Ollama and checks its certificate against the system's trust.
    ca = trustme.CA()

    async def version(_: web.Request) -> web.StreamResponse:
        return web.json_response({"version": "tls"})

    with aiohttp_upstream(version, ca) as port:
        with run_proxy(f"https://127.0.0.1:{port}") as proxy:  # the CA is not trusted yet
            r = httpx.get(proxy.base_url + "/api/version", timeout=10)
            assert r.status_code == 502 and "CERTIFICATE_VERIFY_FAILED" in r.json()["error"]
            assert "SSL_CERT_FILE" in r.json()["error"]
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # read when the relay makes its TLS context
        with run_proxy(f"https://127.0.0.1:{port}") as proxy:
            assert httpx.get(proxy.base_url + "/api/version", timeout=10).json() == {"version": "tls"}


def test_an_answer_before_the_whole_upload_reaches_the_client() -> None:
    async def too_big(_: web.Request) -> web.StreamResponse:  # answers without reading the body
        return web.json_response({"error": "too big"}, status=413)

    with aiohttp_upstream(too_big) as port, run_proxy(f"http://127.0.0.1:{port}") as proxy:
        with socket.create_connection(("127.0.0.1", proxy.proxy.port), timeout=10) as s:
            s.sendall(b"POST /api/create HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 1_000_000)
            assert s.recv(65536).startswith(b"HTTP/1.1 413")
        # The proxy dropped that connection, not itself: the next client is served.
        assert httpx.get(proxy.base_url + "/api/version", timeout=10).status_code == 413
