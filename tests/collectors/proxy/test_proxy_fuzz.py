"""Byte-level fuzzing of the relay's request framing (issue 12), bounded in time.

Recorded requests (as real clients send them) are mutated byte by byte: inserted
separators, framing headers and digits, deleted or duplicated ranges, flipped case.
Whatever the bytes, each request the relay accepts reaches the upstream (h11, an
independent parser) exactly once and well framed, answered to the client that sent it;
or the client gets a 4xx/5xx and the upstream sees nothing of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.proxy.limits import Limits
from tests.support.proxy_thread import ProxyThread
from tests.support.raw_http import exchange
from tests.support.recording_upstream import RecordingUpstream, recording_upstream

_BODY = json.dumps({"model": "qwen2.5:0.5b", "prompt": "hi", "options": {"num_predict": 3}}).encode()
RECORDED = [  # what the ollama client, curl and a chunked uploader sent
    b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:11435\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"Content-Type: application/json\r\nAccept: application/json\r\nUser-Agent: ollama-python/0.4.7\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(_BODY), _BODY),
    b"GET /api/tags HTTP/1.1\r\nHost: localhost:11435\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
    b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    b"a\r\n" + _BODY[:10] + b"\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(_BODY) - 10, _BODY[10:]),
    b"POST /api/show HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\nGET /api/ps HTTP/1.1\r\nHost: localhost\r\n\r\n",
]
TOKENS = [
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"\t",
    b":",
    b",",
    b"0",
    b"1",
    b"9",
    b"-",
    b"+",
    b"\x00",
    b"chunked",
    b"identity",
    b"Content-Length: ",
    b"Transfer-Encoding: ",
    b"Connection: ",
    b"keep-alive, Content-Length",
    b"Host: ",
    b"\r\nTransfer-Encoding: chunked",
    b"\r\nContent-Length: 5",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    b"GET / HTTP/1.1\r\n",
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(RECORDED)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "delete", "replace", "duplicate", "case"]))
        if kind == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "duplicate":
            n = draw(st.integers(1, 40))
            data[at:at] = data[at : at + n]
        elif kind == "case":
            data[at : at + 16] = data[at : at + 16].swapcase()
    return bytes(data)


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with recording_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def proxy(upstream: RecordingUpstream) -> Iterator[ProxyThread]:
    p = ProxyThread(f"http://127.0.0.1:{upstream.port}")
    # Short timeouts: a mutated length that waits for more body is answered 408 quickly.
    limits = Limits(head_timeout_s=0.3, body_timeout_s=0.3, idle_timeout_s=0.3)
    p.proxy = type(p.proxy)(f"http://127.0.0.1:{upstream.port}", p._on_record, limits=limits)
    p.start()
    yield p
    p.stop()


def _settle(upstream: RecordingUpstream, proxy: ProxyThread) -> None:
    deadline = time.monotonic() + 3
    last = -1
    while time.monotonic() < deadline:
        n = len(upstream.targets()) + upstream.incomplete
        if n == last and not proxy.proxy._relay.busy():
            return
        last = n
        time.sleep(0.03)


@pytest.mark.slow
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=mutated())
def test_mutated_requests_reach_upstream_once_or_not_at_all(upstream: RecordingUpstream, proxy: ProxyThread, data: bytes) -> None:
    upstream.reset()
    reply = exchange(proxy.proxy.port, data, quiet_s=0.6, timeout_s=5)
    _settle(upstream, proxy)
    assert upstream.errors == [], f"bytes the upstream cannot parse: {upstream.errors} from {data!r}"
    seen = [r.seq for r in upstream.requests]
    answered = [int(r.headers["x-upstream-seq"]) for r in reply.responses if "x-upstream-seq" in r.headers]
    # Every request that reached upstream was answered to this client, in order; nothing else reached it.
    assert answered == seen, f"upstream saw {upstream.targets()} for {data!r}, client got {answered}"
    ours = [r for r in reply.responses if "x-upstream-seq" not in r.headers]
    for r in ours:  # the relay's own answers are refusals, and end the connection
        assert 400 <= r.status < 600 and r.headers.get("connection") == "close", (r, data)
    assert len(seen) <= data.count(b"HTTP/1.") + data.count(b"\r\n\r\n"), data
