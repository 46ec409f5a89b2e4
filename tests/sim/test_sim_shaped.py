"""``format`` and ``tools`` on a real sim: JSON answers and tool calls as Ollama returns them, timed like any answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import pytest

from tests.support.sim_process import SimProcess, http_json, truth_by_id

MODEL = "llama3.2"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
        },
    },
}
ASK = [{"role": "user", "content": "weather in Paris?"}]

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--disk-gbs", "60")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    return ollama.Client(host=sim.base_url, timeout=30)


def test_format_json_and_schema(client: ollama.Client) -> None:
    r = client.generate(model=MODEL, prompt="answer in JSON", format="json")
    assert isinstance(json.loads(r.response or ""), dict)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    c = client.chat(model=MODEL, messages=ASK, format=schema)
    value = json.loads(c.message.content or "")
    assert set(value) == {"name", "age", "tags"}
    assert isinstance(value["age"], int) and isinstance(value["tags"], list)
    # Streamed, the chunks join to the same document, one token per chunk.
    parts = list(client.chat(model=MODEL, messages=ASK, format=schema, stream=True))
    text = "".join(p.message.content or "" for p in parts)
    assert json.loads(text) == value
    assert parts[-1].eval_count == len(parts) - 1 + 1  # chunks, plus the end-of-generation token


def test_tool_call_non_streamed(client: ollama.Client, sim: SimProcess) -> None:
    r = client.chat(model=MODEL, messages=ASK, tools=[WEATHER])
    calls = r.message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    args = calls[0].function.arguments
    assert isinstance(args["city"], str) and isinstance(args["days"], int) and args["unit"] == "celsius"
    assert r.message.content == "" and r.done_reason == "stop"
    assert r.eval_count and r.eval_count > 1 and r.eval_duration


def test_tool_call_streamed(sim: SimProcess) -> None:
    with httpx.stream("POST", sim.base_url + "/api/chat", json={"model": MODEL, "messages": ASK, "tools": [WEATHER]}) as r:
        rid = r.headers["X-Sim-Request-Id"]
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert len(lines) == 2  # the call's tokens are held back until it is whole
    call, final = lines
    assert call["done"] is False and call["message"]["content"] == ""
    tc = call["message"]["tool_calls"][0]
    assert tc["id"].startswith("call_") and len(tc["id"]) == 13
    assert tc["function"]["index"] == 0 and tc["function"]["name"] == "get_weather"
    assert final["done"] is True and "tool_calls" not in final["message"]
    rec = truth_by_id(sim, rid)
    assert len(rec["token_sampled_ns"]) == final["eval_count"] and rec["token_written_ns"] == []


def test_after_a_tool_result_the_model_answers(client: ollama.Client) -> None:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages: list[dict[str, Any]] = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 degrees, sunny"},
    ]
    r = client.chat(model=MODEL, messages=messages, tools=[WEATHER])
    assert not r.message.tool_calls and r.message.content


def test_tools_need_a_chat_model_and_a_function(sim: SimProcess) -> None:
    assert http_json(sim, "POST", "/api/chat", {"model": "nomic-embed-text", "messages": ASK, "tools": [WEATHER]}) == (
        400,
        {"error": '"nomic-embed-text" does not support chat'},
    )
    # A tool without a function name cannot be called: the model answers in words.
    status, body = http_json(
        sim,
        "POST",
        "/api/chat",
        {"model": MODEL, "messages": ASK, "stream": False, "tools": [{"type": "function", "function": {}}]},
    )
    assert status == 200 and body["message"]["content"] and "tool_calls" not in body["message"]


def test_openai_tool_calls_and_response_format(sim: SimProcess) -> None:
    url = sim.base_url + "/v1/chat/completions"
    whole = httpx.post(url, json={"model": MODEL, "messages": ASK, "tools": [WEATHER]}, timeout=30).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    tc = choice["message"]["tool_calls"][0]
    assert tc["type"] == "function" and tc["id"].startswith("call_") and tc["function"]["name"] == "get_weather"
    assert isinstance(json.loads(tc["function"]["arguments"])["city"], str)  # arguments are a JSON string here
    assert whole["usage"]["completion_tokens"] > 1
    with httpx.stream("POST", url, json={"model": MODEL, "messages": ASK, "tools": [WEATHER], "stream": True}) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert len(events) == 2
    assert events[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert events[1]["choices"][0]["finish_reason"] == "tool_calls"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    shaped = httpx.post(
        url,
        json={
            "model": MODEL,
            "messages": ASK,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        },
        timeout=30,
    ).json()
    assert isinstance(json.loads(shaped["choices"][0]["message"]["content"])["n"], int)
    obj = httpx.post(url, json={"model": MODEL, "messages": ASK, "response_format": {"type": "json_object"}}, timeout=30).json()
    assert isinstance(json.loads(obj["choices"][0]["message"]["content"]), dict)
