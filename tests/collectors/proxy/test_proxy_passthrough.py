"""Clients through the proxy behave as against sim directly; what a recorded request holds."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import ollama
import pytest
from aiohttp import web

from analysis.records import Outcome, RequestKind
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.proxy_thread import ProxyThread, run_proxy, sim_truth
from tests.support.sim_process import SimFactory, SimProcess

SMALL = "qwen2.5:0.5b"
# What legitimately differs between two runs of the same request: clocks and cache-dependent numbers.
_VOLATILE = re.compile(
    rb'"(created_at|expires_at)": ?"[^"]*"|"(total_duration|load_duration|prompt_eval_duration|eval_duration|created)": ?\d+'
    rb'|"id": ?"(chatcmpl|cmpl)-\d+"'
)


def normalize(body: bytes) -> bytes:
    return _VOLATILE.sub(lambda m: m.group(0).split(b":", 1)[0] + b':"_"', body)


@pytest.fixture(scope="module")
def sim(start_sims: SimFactory) -> SimProcess:
    s = start_sims("--hardware", "rtx-4090", "--num-parallel", "2")
    # Load the model and warm the prompt cache, so a direct and a proxied run see the same state.
    ollama.Client(host=s.base_url, timeout=30).generate(model=SMALL, prompt="warm up", options={"num_predict": 1})
    return s


def _twice(sim: SimProcess, proxy: ProxyThread, call: Callable[[ollama.Client], Any]) -> tuple[Any, Any]:
    """The same call direct (after a warming run) and through the proxy."""
    direct_client = ollama.Client(host=sim.base_url, timeout=30)
    call(direct_client)  # brings the prompt cache into the state the next two runs share
    return call(direct_client), call(ollama.Client(host=proxy.base_url, timeout=30))


def _dump(result: Any) -> Any:
    if isinstance(result, list):
        return [_dump(r) for r in result]
    data = result.model_dump(mode="json")
    return json.loads(normalize(json.dumps(data, separators=(",", ":")).encode()))


CALLS: dict[str, Callable[[ollama.Client], Any]] = {
    "generate": lambda c: c.generate(model=SMALL, prompt="Why is the sky blue?", options={"num_predict": 9}),
    "generate-stream": lambda c: list(c.generate(model=SMALL, prompt="Tell me a story", stream=True, options={"num_predict": 9})),
    "chat": lambda c: c.chat(model=SMALL, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 6}),
    "chat-stream": lambda c: list(
        c.chat(model=SMALL, messages=[{"role": "user", "content": "hello"}], stream=True, options={"num_predict": 6})
    ),
    "load-only": lambda c: c.generate(model=SMALL, prompt=""),
    "list": lambda c: c.list(),
    "ps": lambda c: c.ps(),
    "show": lambda c: c.show(SMALL),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_ollama_client_gets_the_same_answers(sim: SimProcess, proxy: ProxyThread, name: str) -> None:
    direct, proxied = _twice(sim, proxy, CALLS[name])
    assert _dump(proxied) == _dump(direct)


ERRORS: dict[str, Callable[[ollama.Client], Any]] = {
    "unknown model": lambda c: c.generate(model="nope:1b", prompt="x"),
    "unknown model, streaming chat": lambda c: list(
        c.chat(model="nope:1b", messages=[{"role": "user", "content": "x"}], stream=True)
    ),
    "show unknown": lambda c: c.show("nope:1b"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_ollama_client_gets_the_same_errors(sim: SimProcess, proxy: ProxyThread, name: str) -> None:
    seen = []
    for host in (sim.base_url, proxy.base_url):
        with pytest.raises(ollama.ResponseError) as err:
            ERRORS[name](ollama.Client(host=host, timeout=30))
        seen.append((err.value.status_code, err.value.error))
    assert seen[0] == seen[1]
    assert seen[0][0] >= 400


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/", None),
        ("HEAD", "/", None),
        ("GET", "/api/version", None),
        ("GET", "/no/such/route", None),
        ("DELETE", "/api/tags", None),
        ("POST", "/api/generate", b"{not json"),
        ("POST", "/api/chat", b""),
        ("POST", "/api/chat", b'{"messages":[]}'),
        ("POST", "/api/generate", json.dumps({"model": SMALL, "prompt": "x", "raw": True, "system": "s"}).encode()),
    ],
)
def test_raw_responses_match(sim: SimProcess, proxy: ProxyThread, method: str, path: str, body: bytes | None) -> None:
    answers = []
    for base in (sim.base_url, proxy.base_url):
        r = httpx.request(method, base + path, content=body, timeout=30)
        answers.append((r.status_code, r.headers.get("content-type"), normalize(r.content)))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"model": SMALL, "prompt": "Count to ten", "options": {"num_predict": 12}}),
        (
            "/api/chat",
            {"model": SMALL, "messages": [{"role": "user", "content": "Name three colours"}], "options": {"num_predict": 12}},
        ),
    ],
)
def test_ndjson_bytes_match_and_arrive_in_chunks(sim: SimProcess, proxy: ProxyThread, path: str, body: dict[str, Any]) -> None:
    def stream(base: str) -> tuple[dict[str, str], list[bytes]]:
        with httpx.stream("POST", base + path, json=body, timeout=30) as r:
            return dict(r.headers), list(r.iter_raw())

    stream(sim.base_url)  # warm the cache
    direct_headers, direct_reads = stream(sim.base_url)
    proxy_headers, proxy_reads = stream(proxy.base_url)
    assert normalize(b"".join(proxy_reads)) == normalize(b"".join(direct_reads))
    assert proxy_headers["content-type"] == direct_headers["content-type"] == "application/x-ndjson"
    assert "x-sim-request-id" in proxy_headers and RECORD_ID_HEADER.lower() in proxy_headers


def test_chunks_reach_the_client_while_the_generation_runs(sim: SimProcess, proxy: ProxyThread) -> None:
    # Not buffered: the first line is in the client's hands while sim is still generating.
    body = {"model": SMALL, "prompt": "a long one", "options": {"num_predict": 3000}}
    with httpx.stream("POST", proxy.base_url + "/api/generate", json=body, timeout=30) as r:
        lines = r.iter_lines()
        first = json.loads(next(lines))
        truth = sim_truth(sim.base_url, r.headers["x-sim-request-id"])
    assert first["done"] is False and first["response"]
    assert truth["done_ns"] is None and len(truth["token_written_ns"]) < 3000


OPENAI_STREAMS = {
    "chat, usage": (
        "/v1/chat/completions",
        {
            "model": SMALL,
            "messages": [{"role": "user", "content": "Hi there"}],
            "stream": True,
            "max_tokens": 10,
            "stream_options": {"include_usage": True},
        },
    ),
    "completions": ("/v1/completions", {"model": SMALL, "prompt": "Once upon a time", "stream": True, "max_tokens": 10}),
}


@pytest.mark.parametrize("name", list(OPENAI_STREAMS))
def test_sse_bytes_match_and_are_recorded(sim: SimProcess, proxy: ProxyThread, name: str) -> None:
    path, body = OPENAI_STREAMS[name]

    def stream(base: str) -> tuple[dict[str, str], list[bytes]]:
        with httpx.stream("POST", base + path, json=body, timeout=30) as r:
            return dict(r.headers), list(r.iter_raw())

    stream(sim.base_url)
    direct_headers, direct_reads = stream(sim.base_url)
    proxy_headers, proxy_reads = stream(proxy.base_url)
    assert normalize(b"".join(proxy_reads)) == normalize(b"".join(direct_reads))
    assert b"".join(proxy_reads).endswith(b"data: [DONE]\n\n")
    assert proxy_headers["content-type"] == direct_headers["content-type"] == "text/event-stream"
    rec = proxy.wait_record(proxy_headers[RECORD_ID_HEADER.lower()])
    assert (rec.endpoint, rec.stream, rec.num_predict, rec.outcome) == (path, True, 10, Outcome.OK)
    assert len(rec.token_chunk_ns) == 10 and rec.final_chunk_ns is not None and rec.final_chunk_ns >= rec.token_chunk_ns[-1]
    assert rec.metrics is not None and rec.metrics.done_reason == "length"
    assert rec.metrics.eval_count == (10 if "usage" in name else None)  # usage only when asked for


def test_openai_non_streaming_is_the_default_and_recorded(sim: SimProcess, proxy: ProxyThread) -> None:
    body = {"model": SMALL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    direct = httpx.post(sim.base_url + "/v1/chat/completions", json=body, timeout=30)
    proxied = httpx.post(proxy.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert normalize(proxied.content) == normalize(direct.content)
    rec = proxy.wait_record(proxied.headers[RECORD_ID_HEADER])
    assert rec.stream is False and rec.outcome is Outcome.OK
    assert (
        rec.metrics is not None
        and rec.metrics.eval_count == 3
        and rec.metrics.prompt_eval_count == direct.json()["usage"]["prompt_tokens"]
    )


def test_a_streamed_generation_is_recorded_with_its_facts(sim: SimProcess, proxy: ProxyThread) -> None:
    body = {
        "model": SMALL,
        "prompt": "Why is the sky blue?",
        "keep_alive": "10m",
        "options": {"num_predict": 15, "num_ctx": 2048},
    }
    with httpx.stream("POST", proxy.base_url + "/api/generate", json=body, timeout=30) as r:
        lines, read_ns = [], []  # each line, and when this client had it
        for line in r.iter_lines():
            read_ns.append(time.monotonic_ns())
            lines.append(json.loads(line))
        record_id, sim_id = r.headers[RECORD_ID_HEADER], r.headers["x-sim-request-id"]
    rec = proxy.wait_record(record_id)
    truth = sim_truth(sim.base_url, sim_id)
    assert (rec.endpoint, rec.model, rec.stream, rec.client_addr) == ("/api/generate", SMALL, True, "127.0.0.1")
    assert (rec.num_ctx, rec.num_predict, rec.keep_alive) == (2048, 15, "10m")
    assert rec.outcome is Outcome.OK and rec.status_code == 200 and rec.error is None
    assert len(rec.token_chunk_ns) == len(truth["token_written_ns"]) == 15
    assert rec.first_token_ns == rec.token_chunk_ns[0]
    assert rec.forwarded_ns is not None and rec.first_byte_ns is not None and rec.final_chunk_ns is not None
    assert rec.closed_ns is not None
    assert rec.received_ns <= rec.forwarded_ns <= truth["received_ns"] <= rec.first_byte_ns <= rec.first_token_ns
    assert rec.token_chunk_ns == sorted(rec.token_chunk_ns) and rec.token_chunk_ns[-1] <= rec.final_chunk_ns <= rec.closed_ns
    # Token i was stamped between sim making it (before its write) and this client reading it (after the proxy's
    # write): an order no load can change. This proxy shares the test's process and GIL, so on a loaded machine its
    # stamp may trail sim's by hundreds of ms (seen: a median of 507 ms); how close it is in production, in its own
    # process, is test_proxy_concurrency's business.
    made, ours = truth["token_sampled_ns"], rec.token_chunk_ns
    assert all(m <= o <= r for m, o, r in zip(made, ours, read_ns[: len(ours)], strict=True)), (made, ours, read_ns)
    final = lines[-1]
    assert rec.metrics is not None
    assert rec.metrics.done_reason == final["done_reason"] == "length"
    assert rec.metrics.eval_count == final["eval_count"] == 15
    assert rec.metrics.total_duration_ns == final["total_duration"] == truth["reported"]["total_duration"]
    assert rec.metrics.prompt_eval_count == final["prompt_eval_count"]
    assert rec.metrics.prompt_eval_cached_count == final["prompt_eval_cached_count"]
    assert rec.metrics.eval_duration_ns == final["eval_duration"]
    assert rec.metrics.load_duration_ns == final.get("load_duration")
    assert 0 < rec.started_at_unix_s <= time.time()


def test_stream_flag_defaults_and_non_streaming_records(proxy: ProxyThread) -> None:
    r = httpx.post(
        proxy.base_url + "/api/chat",
        json={"model": SMALL, "messages": [{"role": "user", "content": "x"}], "stream": False, "options": {"num_predict": 4}},
        timeout=30,
    )
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.stream is False and rec.outcome is Outcome.OK
    # All content came at once, in the whole body: no token reached the client before it (no client TTFT).
    assert rec.token_chunk_ns == [] and rec.first_token_ns is None and rec.final_chunk_ns is not None
    assert rec.metrics is not None and rec.metrics.eval_count == 4
    # A load-only request: one object, done_reason "load", no metrics: still ok.
    r = httpx.post(proxy.base_url + "/api/generate", json={"model": SMALL}, timeout=30)
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.stream is True and rec.outcome is Outcome.OK and rec.metrics is not None and rec.metrics.done_reason == "load"
    assert rec.kind is RequestKind.LOAD


def test_http_errors_are_recorded_with_their_body(proxy: ProxyThread) -> None:
    r = httpx.post(proxy.base_url + "/api/generate", json={"model": "nope:1b", "prompt": "x"}, timeout=30)
    assert r.status_code == 404
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.outcome is Outcome.HTTP_ERROR and rec.status_code == 404
    assert rec.error is not None and "model 'nope:1b' not found" in rec.error
    r = httpx.post(proxy.base_url + "/api/chat", content=b"{oops", timeout=30)
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.outcome is Outcome.HTTP_ERROR and rec.status_code == 400 and rec.model == ""


def test_unrecorded_routes_make_no_record(proxy: ProxyThread) -> None:
    before = len(proxy.records)
    for path in ("/api/tags", "/api/ps", "/api/version"):
        assert httpx.get(proxy.base_url + path, timeout=30).status_code == 200
    assert httpx.post(proxy.base_url + "/api/show", json={"model": SMALL}, timeout=30).status_code == 200
    time.sleep(0.1)
    assert len(proxy.records) == before


def test_large_request_bodies_pass_through(sim: SimProcess, proxy: ProxyThread) -> None:
    # Over aiohttp's default 1 MiB body limit: forwarded as a stream (show) or read whole (generate).
    padding = "x" * 3_000_000
    show = [
        httpx.post(b + "/api/show", json={"model": SMALL, "padding": padding}, timeout=30) for b in (sim.base_url, proxy.base_url)
    ]
    assert show[0].status_code == show[1].status_code == 200 and show[0].content == show[1].content
    r = httpx.post(
        proxy.base_url + "/api/generate",
        json={"model": SMALL, "prompt": "hi", "stream": False, "padding": padding, "options": {"num_predict": 2}},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["eval_count"] == 2


def test_credentials_and_text_are_not_recorded(proxy: ProxyThread) -> None:
    secret = "sk-SECRET-TOKEN-123"
    r = httpx.post(
        proxy.base_url + "/api/generate",
        json={"model": SMALL, "prompt": "my private prompt", "stream": False, "options": {"num_predict": 3}},
        headers={"Authorization": f"Bearer {secret}", "Cookie": f"session={secret}", "X-Api-Key": secret},
        timeout=30,
    )
    rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    dumped = json.dumps(dataclasses.asdict(rec))
    assert secret not in dumped and "private prompt" not in dumped
    assert rec.prompt_text is None and rec.response_text is None
    assert "set-cookie" not in {k.lower() for k in r.headers}


def test_text_is_recorded_when_opted_in(sim: SimProcess) -> None:
    with run_proxy(sim.base_url, record_text=True) as proxy:
        r = httpx.post(
            proxy.base_url + "/api/chat",
            json={"model": SMALL, "messages": [{"role": "user", "content": "say hi"}], "options": {"num_predict": 5}},
            timeout=30,
        )
        answer = "".join(json.loads(line)["message"]["content"] for line in r.text.splitlines())
        rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.prompt_text == "user: say hi"
    assert rec.response_text == answer and answer


def test_in_flight_snapshots_show_progress(sim: SimProcess, proxy: ProxyThread) -> None:
    # The small model writes 400 tokens in under a second, which a busy machine can spend before the snapshot
    # below: sim holds the stream for 3 s after token 20, so the snapshot finds it in flight.
    httpx.post(sim.base_url + "/sim/faults", json={"stall_ms": 3000, "stall_after_tokens": 20}, timeout=10).raise_for_status()
    body = {"model": SMALL, "prompt": "a long answer please", "options": {"num_predict": 400}}
    with httpx.stream("POST", proxy.base_url + "/api/generate", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        snaps = proxy.in_flight()
        record_id = r.headers[RECORD_ID_HEADER]
        mine = [s for s in snaps if s.id == record_id]
        assert len(mine) == 1
        assert mine[0].outcome is Outcome.IN_FLIGHT and mine[0].final_chunk_ns is None
        assert len(mine[0].token_chunk_ns) >= 5 and mine[0].first_token_ns == mine[0].token_chunk_ns[0]
        rest = list(lines)
    rec = proxy.wait_record(record_id)
    assert len(rec.token_chunk_ns) == 400 == len(rest) + 5 - 1  # the last line is the final chunk
    assert all(s.id != record_id for s in proxy.in_flight())


def test_local_routes_are_served_here(proxy: ProxyThread) -> None:
    async def metrics(_: web.BaseRequest) -> web.StreamResponse:
        return web.Response(text="phasewatch_up 1\n")

    proxy.proxy.add_local_route("GET", "/phasewatch/metrics", metrics)
    r = httpx.get(proxy.base_url + "/phasewatch/metrics", timeout=10)
    assert (r.status_code, r.text) == (200, "phasewatch_up 1\n")
    missing = httpx.get(proxy.base_url + "/phasewatch/nothing", timeout=10)
    assert missing.status_code == 404 and "error" in missing.json()
    with pytest.raises(ValueError, match="/phasewatch/"):
        proxy.proxy.add_local_route("GET", "/api/tags", metrics)


def test_expect_100_continue_is_answered(proxy: ProxyThread) -> None:
    # curl sends "Expect: 100-continue" before large bodies and waits for the interim answer.
    body = json.dumps({"model": SMALL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}).encode()
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.proxy.port), timeout=10) as s:
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["eval_count"] == 2
