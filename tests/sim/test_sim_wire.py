"""Byte-level shape of sim's answers, against docs/ollama-api.md §3 to §9 (raw HTTP, no client library)."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from typing import Any

import pytest

from tests.support.sim_process import SimProcess, http_json, start_sim

SMALL = "qwen2.5:0.5b"
RFC3339NANO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
METRIC_KEYS = {
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_cached_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
}
DURATION_KEYS = {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"}

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--num-parallel", "2", "--keep-alive", "30s")


def post_raw(sim: SimProcess, path: str, body: dict[str, Any] | bytes) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def ndjson(raw: bytes) -> list[dict[str, Any]]:
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert all(lines), "no blank lines in NDJSON"
    assert all(b"\n" not in ln and b": " not in ln for ln in lines), "compact JSON, one object per line"
    return [json.loads(ln) for ln in lines]


def check_final(final: dict[str, Any]) -> None:
    assert final["done"] is True
    assert final["done_reason"] in ("stop", "length")
    for k in DURATION_KEYS:
        assert type(final[k]) is int and final[k] > 0, k
    assert type(final["prompt_eval_count"]) is int and type(final["eval_count"]) is int


def test_generate_stream_chunk_shapes(sim: SimProcess) -> None:
    # "qwen2.5" means "qwen2.5:latest", which the catalogue does not have.
    assert post_raw(sim, "/api/generate", {"model": "qwen2.5", "prompt": "hello world"})[0] == 404
    body = {"model": SMALL, "prompt": "hello world", "options": {"num_predict": 6}}
    status, headers, raw = post_raw(sim, "/api/generate", body)
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    assert len(headers["x-sim-request-id"]) == 32
    chunks = ndjson(raw)
    assert len(chunks) == 7
    for c in chunks[:-1]:
        assert set(c) == {"model", "created_at", "response", "done"}
        assert c["model"] == SMALL and c["done"] is False and isinstance(c["response"], str) and c["response"]
        assert RFC3339NANO_UTC.match(c["created_at"]), c["created_at"]
    final = chunks[-1]
    assert set(final) == {"model", "created_at", "response", "done", "done_reason", "context"} | METRIC_KEYS
    check_final(final)
    assert final["response"] == "" and final["done_reason"] == "length"
    assert final["eval_count"] == 6  # includes the first token
    assert all(type(t) is int for t in final["context"])
    assert final["prompt_eval_count"] == len(final["context"]) - 6


def test_chat_stream_chunk_shapes(sim: SimProcess) -> None:
    body = {"model": SMALL, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}}
    status, headers, raw = post_raw(sim, "/api/chat", body)
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    chunks = ndjson(raw)
    for c in chunks[:-1]:
        assert set(c) == {"model", "created_at", "message", "done"}
        assert set(c["message"]) == {"role", "content"} and c["message"]["role"] == "assistant"
    final = chunks[-1]
    assert "context" not in final
    assert final["message"] == {"role": "assistant", "content": ""}
    check_final(final)


def test_non_streaming_is_one_json_object(sim: SimProcess) -> None:
    status, headers, raw = post_raw(
        sim, "/api/generate", {"model": SMALL, "prompt": "one two", "stream": False, "options": {"num_predict": 4}}
    )
    assert status == 200 and headers["content-type"] == "application/json; charset=utf-8"
    obj = json.loads(raw)
    check_final(obj)
    assert len(obj["response"].split()) >= 2


def test_omit_when_zero_and_version_gating() -> None:
    with start_sim("--ollama-version", "0.30.1") as old:
        _, _, raw = post_raw(old, "/api/generate", {"model": SMALL, "prompt": "x", "options": {"num_predict": 1}})
        final = ndjson(raw)[-1]
        assert "prompt_eval_cached_count" not in final  # added in 0.33.3
        assert "eval_duration" not in final  # one token: zero span, omitted
        assert final["eval_count"] == 1
        assert http_json(old, "GET", "/api/version") == (200, {"version": "0.30.1"})


def test_cached_count_present_even_when_zero(sim: SimProcess) -> None:
    _, _, raw = post_raw(
        sim, "/api/generate", {"model": "llama3.2", "prompt": "fresh words here", "raw": True, "options": {"num_predict": 2}}
    )
    final = ndjson(raw)[-1]
    assert final["model"] == "llama3.2"  # the request string is echoed, not "llama3.2:latest"
    assert final["prompt_eval_cached_count"] == 0
    assert "context" not in final  # raw mode


def test_load_and_unload_by_empty_prompt(sim: SimProcess) -> None:
    status, headers, raw = post_raw(sim, "/api/generate", {"model": "llama3.2"})
    assert status == 200 and headers["content-type"].startswith("application/json")
    obj = json.loads(raw)
    assert set(obj) == {"model", "created_at", "response", "done", "done_reason"}
    assert obj["done_reason"] == "load" and obj["response"] == "" and obj["done"] is True
    _, ps = http_json(sim, "GET", "/api/ps")
    assert "llama3.2:latest" in [m["name"] for m in ps["models"]]
    status, _, raw = post_raw(sim, "/api/chat", {"model": "llama3.2", "messages": [], "keep_alive": 0})
    obj = json.loads(raw)
    assert obj["done_reason"] == "unload" and obj["message"] == {"role": "assistant", "content": ""}
    _, ps = http_json(sim, "GET", "/api/ps")
    assert "llama3.2:latest" not in [m["name"] for m in ps["models"]]
    # Unloading something not loaded is fine; an unknown model is not.
    assert post_raw(sim, "/api/generate", {"model": "llama3.1:8b", "keep_alive": 0})[0] == 200
    assert post_raw(sim, "/api/generate", {"model": "nope:1b", "keep_alive": 0})[0] == 404


def test_ps_tags_show_shapes(sim: SimProcess) -> None:
    post_raw(sim, "/api/generate", {"model": SMALL})
    _, ps = http_json(sim, "GET", "/api/ps")
    row = next(m for m in ps["models"] if m["name"] == SMALL)
    assert set(row) == {"name", "model", "size", "digest", "details", "expires_at", "size_vram", "context_length"}
    assert re.fullmatch(r"[0-9a-f]{64}", row["digest"])
    assert row["size"] > 397_821_319  # weights plus KV cache and buffers
    assert RFC3339NANO_UTC.match(row["expires_at"])
    _, tags = http_json(sim, "GET", "/api/tags")
    dates = [m["modified_at"] for m in tags["models"]]
    assert dates == sorted(dates, reverse=True)
    tag = next(m for m in tags["models"] if m["name"] == SMALL)
    assert tag["digest"] == row["digest"] and tag["size"] == 397_821_319
    assert tag["details"]["context_length"] == 32768 and tag["details"]["family"] == "qwen2"
    status, show = http_json(sim, "POST", "/api/show", {"model": SMALL})
    assert status == 200
    info = show["model_info"]
    assert info["general.architecture"] == "qwen2" and info["qwen2.block_count"] == 24
    assert info["qwen2.attention.head_count_kv"] == 2 and info["qwen2.context_length"] == 32768
    assert all(not isinstance(v, list) or len(v) <= 5 for v in info.values())


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("/api/generate", b"", 400, "missing request body"),
        ("/api/generate", b"{bad", 400, "invalid character 'b' looking for beginning of value"),
        ("/api/generate", {"model": "ghost:7b", "prompt": "x"}, 404, "model 'ghost:7b' not found"),
        ("/api/generate", {"model": "", "prompt": "x"}, 404, "model '' not found"),
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}, 400, "model is required"),
        ("/api/generate", {"model": SMALL, "prompt": "x", "keep_alive": "10"}, 400, 'time: missing unit in duration "10"'),
        ("/api/show", {"model": "ghost"}, 404, "model 'ghost' not found"),
    ],
)
def test_error_bodies(sim: SimProcess, path: str, body: Any, status: int, error: str) -> None:
    got_status, headers, raw = post_raw(sim, path, body)
    assert got_status == status
    assert headers["content-type"].startswith("application/json")
    assert json.loads(raw) == {"error": error}


def test_queue_full_is_503_with_ollamas_text() -> None:
    # A slow disk makes loads long enough to pile up requests behind them.
    with start_sim("--hardware", "rtx-3090", "--max-queue", "1", "--disk-gbs", "2") as s:
        assert post_raw(s, "/api/generate", {"model": SMALL})[0] == 200  # loaded: bypasses the queue later
        results: dict[str, int] = {}

        def load(name: str) -> None:
            results[name] = post_raw(s, "/api/generate", {"model": name})[0]

        first = threading.Thread(target=load, args=("llama3.1:8b",))  # ~2.5 s load, being processed
        first.start()
        time.sleep(0.5)
        second = threading.Thread(target=load, args=("llama3.2:latest",))  # waits in the queue
        second.start()
        time.sleep(0.3)
        status, _, raw = post_raw(s, "/api/generate", {"model": "llama3.2:latest", "prompt": "x"})
        assert status == 503
        assert json.loads(raw) == {"error": "server busy, please try again.  maximum pending requests exceeded"}
        # A request for the loaded model does not go through the pending queue.
        assert post_raw(s, "/api/generate", {"model": SMALL, "prompt": "x", "options": {"num_predict": 1}})[0] == 200
        first.join(30)
        second.join(30)
        assert results == {"llama3.1:8b": 200, "llama3.2:latest": 200}


def test_wrong_method_and_unknown_route(sim: SimProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    conn.request("GET", "/api/chat")
    r = conn.getresponse()
    assert r.status == 405
    r.read()
    conn.request("POST", "/api/pull/nothing")
    r = conn.getresponse()
    assert (r.status, r.read()) == (404, b"404 page not found")
    conn.close()


def sse_events(raw: bytes) -> list[str]:
    assert raw.endswith(b"\n\n")
    events = raw.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_openai_chat_sse_with_usage(sim: SimProcess) -> None:
    body = {
        "model": SMALL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 4,
        "stream_options": {"include_usage": True},
    }
    status, headers, raw = post_raw(sim, "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert [o["object"] for o in objs] == ["chat.completion.chunk"] * 6
    assert [o["choices"][0]["finish_reason"] for o in objs[:5]] == [None] * 4 + ["length"]
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 4
    u = objs[-1]["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert not any("duration" in k for o in objs for k in o)
    # Without include_usage there is no usage chunk.
    body["stream_options"] = {}
    objs2 = [json.loads(e) for e in sse_events(post_raw(sim, "/v1/chat/completions", body)[2])[:-1]]
    assert all("usage" not in o for o in objs2)


def test_openai_non_streaming_and_errors(sim: SimProcess) -> None:
    status, obj = http_json(
        sim, "POST", "/v1/chat/completions", {"model": SMALL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    )
    assert status == 200 and obj["object"] == "chat.completion"
    assert obj["choices"][0]["message"]["role"] == "assistant" and obj["usage"]["completion_tokens"] == 3
    status, obj = http_json(sim, "POST", "/v1/completions", {"model": SMALL, "prompt": "one two three", "max_tokens": 2})
    assert status == 200 and obj["object"] == "text_completion" and obj["usage"]["prompt_tokens"] == 3
    status, obj = http_json(
        sim, "POST", "/v1/chat/completions", {"model": "ghost", "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 404
    assert obj["error"] == {"message": "model 'ghost' not found", "type": "not_found_error", "param": None, "code": None}


def test_natural_stop_counts_the_end_token(sim: SimProcess) -> None:
    # Without num_predict the answer ends by itself: done_reason "stop", and eval_count includes the
    # end-of-generation token, which has no chunk of its own (llama-server's predicted_n).
    status, _, raw = post_raw(sim, "/api/generate", {"model": SMALL, "prompt": "tell me a story"})
    assert status == 200
    chunks = ndjson(raw)
    final = chunks[-1]
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == len(chunks) - 1 + 1


def test_think_on_a_model_without_thinking_is_400(sim: SimProcess) -> None:
    status, _, raw = post_raw(sim, "/api/chat", {"model": SMALL, "messages": [{"role": "user", "content": "x"}], "think": True})
    assert (status, json.loads(raw)) == (400, {"error": '"qwen2.5:0.5b" does not support thinking'})


def test_gin_log_line_per_request(sim: SimProcess) -> None:
    post_raw(sim, "/api/show", {"model": SMALL})
    line = [ln for ln in sim.log().splitlines() if '"/api/show"' in ln][-1]
    gin = r'\[GIN\] \d{4}/\d\d/\d\d - \d\d:\d\d:\d\d \| 200 \| +[\d.]+(ns|µs|ms|s) \| +127\.0\.0\.1 \| POST +"/api/show"'
    assert re.fullmatch(gin, line), line
