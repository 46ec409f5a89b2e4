"""sim serves the coding agents' routes as Ollama does (its ``anthropic`` and ``openai`` packages): ``/v1/messages``
and ``/v1/responses``, streamed (SSE, an ``event:`` line naming each ``data:`` object's type) and whole, with usage
equal to what the runner counted, thinking blocks for a thinking model, and each API's error shape. The official
SDKs read every reply."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.sim_process import SimProcess, truth_by_id

MODEL = "qwen2.5:0.5b"
QWEN3 = "qwen3:0.6b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--disk-gbs", "60")


def events(sim: SimProcess, path: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(sim's request id, each event's data), checking every event's ``event:`` line names its data's type."""
    with httpx.stream("POST", sim.base_url + path, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        obj = json.loads(data.removeprefix("data: "))
        assert name == f"event: {obj['type']}"
        out.append(obj)
    return r.headers["X-Sim-Request-Id"], out


def test_messages_stream_as_ollama_writes_it(sim: SimProcess) -> None:
    body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    rid, evs = events(sim, "/v1/messages", body)
    kinds = [e["type"] for e in evs]
    deltas = [e for e in evs if e["type"] == "content_block_delta"]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    t = truth_by_id(sim, rid)
    assert len(deltas) == len(t["token_written_ns"]) == 16 and all(d["delta"]["type"] == "text_delta" for d in deltas)
    end = evs[-2]
    assert end["delta"]["stop_reason"] == "max_tokens"
    assert end["usage"] == {"input_tokens": t["prompt_tokens"], "output_tokens": t["reported"]["eval_count"]}


def test_messages_thinking_blocks_then_text(sim: SimProcess) -> None:
    body = {"model": QWEN3, "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "why?"}]}
    rid, evs = events(sim, "/v1/messages", body)
    starts = [e["content_block"]["type"] for e in evs if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"]["type"] for e in evs if e["type"] == "content_block_delta"]
    k = truth_by_id(sim, rid)["thinking_chunks"]
    assert k > 0 and deltas[:k] == ["thinking_delta"] * k and set(deltas[k:]) == {"text_delta"}
    # Thinking off: no thinking block.
    _, evs = events(sim, "/v1/messages", body | {"thinking": {"type": "disabled"}})
    assert [e["content_block"]["type"] for e in evs if e["type"] == "content_block_start"] == ["text"]


def test_responses_stream_as_ollama_writes_it(sim: SimProcess) -> None:
    body = {"model": QWEN3, "input": "why?", "max_output_tokens": 200, "stream": True}
    rid, evs = events(sim, "/v1/responses", body)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    kinds = [e["type"] for e in evs]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    t = truth_by_id(sim, rid)
    assert kinds.count("response.reasoning_summary_text.delta") == t["thinking_chunks"] > 0
    assert kinds.count("response.output_text.delta") == len(t["token_written_ns"]) - t["thinking_chunks"]
    usage = evs[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (t["prompt_tokens"], t["reported"]["eval_count"])
    assert [i["type"] for i in evs[-1]["response"]["output"]] == ["reasoning", "message"]


def test_the_sdks_read_whole_replies(sim: SimProcess) -> None:
    a = anthropic.Anthropic(base_url=sim.base_url, api_key="x", max_retries=0)
    msg = a.messages.create(model=MODEL, max_tokens=8, system="be brief", messages=[{"role": "user", "content": "hi"}])
    assert msg.type == "message" and msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    assert msg.content[0].type == "text" and msg.content[0].text
    o = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0)
    resp = o.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}], max_output_tokens=8)
    assert resp.status == "completed" and resp.output_text and resp.usage is not None and resp.usage.output_tokens == 8


def test_errors_in_each_apis_shape(sim: SimProcess) -> None:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        r = httpx.post(sim.base_url + path, json=body, timeout=30)
        return r.status_code, r.json()

    status, err = post("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and err["type"] == "error" and err["request_id"].startswith("req_")
    assert err["error"] == {"type": "invalid_request_error", "message": "max_tokens is required and must be positive"}
    status, err = post("/v1/messages", {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and err["error"]["type"] == "not_found_error"
    status, err = post("/v1/responses", {"model": "nope", "input": "hi"})
    assert status == 404 and err == {
        "error": {"message": "model 'nope' not found", "type": "not_found_error", "param": None, "code": None}
    }
    status, err = post("/v1/responses", {"model": MODEL, "input": 5})
    assert status == 400 and err["error"]["type"] == "invalid_request_error"
    assert 'POST     "/v1/messages"' in sim.log() and 'POST     "/v1/responses"' in sim.log()  # gin's access lines
