"""Thinking models on a real sim: thinking chunks first, then the answer; ``think`` as Ollama takes it; the truth.

qwen3:0.6b takes ``think`` as a bool (on when unset); gpt-oss:20b takes levels and always thinks.
``/sim/truth`` carries the thinking token count, the thinking time and the first answer token's times.
"""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from sim.engine import THINKING_TOKENS
from tests.support.sim_process import SimProcess, http_json, truth_by_id

QWEN3 = "qwen3:0.6b"
GPT_OSS = "gpt-oss:20b"
ASK = [{"role": "user", "content": "why is the sky blue?"}]

pytestmark = pytest.mark.sim_args("--hardware", "rtx-4090", "--disk-gbs", "60")


@pytest.fixture()
def client(sim: SimProcess) -> ollama.Client:
    return ollama.Client(host=sim.base_url, timeout=60)


def _stream(sim: SimProcess, path: str, body: dict) -> tuple[str, list[dict]]:
    with httpx.stream("POST", sim.base_url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        rid = r.headers["X-Sim-Request-Id"]
        lines = [json.loads(line) for line in r.iter_lines() if line]
    return rid, lines


def test_chat_streams_thinking_then_the_answer(sim: SimProcess) -> None:
    rid, lines = _stream(sim, "/api/chat", {"model": QWEN3, "messages": ASK})
    chunks, final = lines[:-1], lines[-1]
    kinds = ["thinking" if c["message"].get("thinking") else "answer" for c in chunks]
    k = kinds.index("answer")
    assert k > 0 and set(kinds[:k]) == {"thinking"} and set(kinds[k:]) == {"answer"}
    assert all(c["message"]["content"] == "" for c in chunks[:k])
    rec = truth_by_id(sim, rid)
    assert rec["thinking_tokens"] == rec["thinking_chunks"] == k
    lo, hi = THINKING_TOKENS["medium"]
    assert lo <= k <= hi
    # eval_count counts thinking, answer and the end-of-generation token
    assert final["eval_count"] == len(chunks) + 1
    assert rec["first_answer_sampled_ns"] == rec["token_sampled_ns"][k]
    assert rec["first_answer_written_ns"] == rec["token_written_ns"][k]
    assert rec["thinking_ns"] == rec["token_sampled_ns"][k] - rec["token_sampled_ns"][0] > 0
    assert rec["thinking_ns"] + rec["answer_ns"] == final["eval_duration"]
    # The person waits for the first answer token, after the thinking.
    assert rec["first_answer_written_ns"] > rec["token_written_ns"][0]


def test_generate_thinking_with_the_official_client(client: ollama.Client, sim: SimProcess) -> None:
    parts = list(client.generate(model=QWEN3, prompt="hello there", stream=True))
    thinking = [p for p in parts if p.thinking]
    answer = [p for p in parts if p.response]
    assert thinking and answer
    assert parts.index(answer[0]) == len(thinking)
    whole = client.generate(model=QWEN3, prompt="hello there", think=True)
    assert whole.thinking and whole.response
    chat = client.chat(model=QWEN3, messages=ASK)
    assert chat.message.thinking and chat.message.content


def test_think_false_and_num_predict(client: ollama.Client, sim: SimProcess) -> None:
    off = client.chat(model=QWEN3, messages=ASK, think=False)
    assert not off.message.thinking and off.message.content
    # num_predict counts thinking tokens too: a tight cap leaves no answer.
    capped = client.chat(model=QWEN3, messages=ASK, options={"num_predict": 5})
    assert capped.message.thinking and not capped.message.content and capped.eval_count == 5


@pytest.mark.slow
def test_think_values_as_ollama_takes_them(sim: SimProcess) -> None:
    chat = {"messages": ASK, "stream": False}
    assert http_json(sim, "POST", "/api/chat", {"model": QWEN3, "think": "low", **chat}) == (
        400,
        {"error": 'think value "low" is not supported for this model'},
    )
    assert http_json(sim, "POST", "/api/chat", {"model": "llama3.2", "think": True, **chat}) == (
        400,
        {"error": '"llama3.2" does not support thinking'},
    )
    assert http_json(sim, "POST", "/api/chat", {"model": "llama3.2", "think": "high", **chat})[0] == 400
    status, body = http_json(sim, "POST", "/api/chat", {"model": "llama3.2", "think": False, **chat})
    assert status == 200 and "thinking" not in body["message"]
    status, body = http_json(sim, "POST", "/api/chat", {"model": GPT_OSS, "think": "huge", **chat})
    assert status == 400 and "invalid think value" in body["error"]
    counts = {}
    for level in ("low", "medium", "high"):
        rid, _ = _stream(sim, "/api/chat", {"model": GPT_OSS, "messages": ASK, "think": level})
        counts[level] = truth_by_id(sim, rid)["thinking_tokens"]
        lo, hi = THINKING_TOKENS[level]
        assert lo <= counts[level] <= hi, level
    assert counts["low"] < counts["high"]
    # gpt-oss always thinks: a bool leaves it at medium
    status, body = http_json(sim, "POST", "/api/chat", {"model": GPT_OSS, "think": False, **chat})
    assert status == 200 and body["message"]["thinking"]


def test_openai_chat_streams_reasoning(sim: SimProcess) -> None:
    with httpx.stream(
        "POST", sim.base_url + "/v1/chat/completions", json={"model": QWEN3, "messages": ASK, "stream": True}, timeout=60
    ) as r:
        rid = r.headers["X-Sim-Request-Id"]
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"] and e["choices"][0]["finish_reason"] is None]
    k = next(i for i, d in enumerate(deltas) if d["content"])
    assert k > 0 and all(d.get("reasoning") and d["content"] == "" for d in deltas[:k])
    assert truth_by_id(sim, rid)["thinking_tokens"] == k
    off = httpx.post(
        sim.base_url + "/v1/chat/completions", json={"model": QWEN3, "messages": ASK, "reasoning_effort": "none"}, timeout=60
    ).json()
    assert "reasoning" not in off["choices"][0]["message"]


def test_openai_completions_think_unseen(sim: SimProcess) -> None:
    """/v1/completions has no reasoning field: the thinking costs time but no chunk is written for it."""
    with httpx.stream(
        "POST", sim.base_url + "/v1/completions", json={"model": QWEN3, "prompt": "hello", "stream": True}, timeout=60
    ) as r:
        rid = r.headers["X-Sim-Request-Id"]
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts = [e["choices"][0]["text"] for e in events if e["choices"][0]["finish_reason"] is None]
    rec = truth_by_id(sim, rid)
    assert rec["thinking_tokens"] > 0 and rec["thinking_chunks"] == 0
    assert len(rec["token_written_ns"]) == len(texts)
    assert rec["first_answer_written_ns"] == rec["token_written_ns"][0]
    assert rec["first_answer_written_ns"] > rec["first_answer_sampled_ns"] > rec["token_sampled_ns"][0]
