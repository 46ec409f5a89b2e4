"""``analysis.chunks`` on the coding agents' routes: ``/v1/messages`` and ``/v1/responses`` streams and bodies as
Ollama writes them (its ``anthropic`` and ``openai`` packages: an ``event:`` line and a ``data:`` object per event).

Each token event is one token, thinking apart; framing events are none; the end and the runner's counts come from
each API's own usage fields (never Anthropic's estimate in ``message_start``, never the Responses API's fixed 0 of
cached tokens); any split of the bytes into reads gives the same summary.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from analysis.chunks import StreamFormat, parse_stream


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def block_delta(kind: str, text: str) -> dict[str, Any]:
    key = "thinking" if kind == "thinking_delta" else "text"
    return {"type": "content_block_delta", "index": 0, "delta": {"type": kind, key: text}}


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "usage": {"input_tokens": 999, "output_tokens": 0},
    },
}
ANTHROPIC = sse(
    MESSAGE_START,
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    block_delta("thinking_delta", "hmm"),
    block_delta("thinking_delta", " so"),
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    block_delta("text_delta", "Hello"),
    block_delta("text_delta", " there"),
    block_delta("text_delta", "!"),
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 12, "output_tokens": 6}},
    {"type": "message_stop"},
)


def responses_event(kind: str, seq: int, **data: Any) -> dict[str, Any]:
    return {"type": kind, **data, "sequence_number": seq}


COMPLETED = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi you"}]}],
    "usage": {
        "input_tokens": 9,
        "output_tokens": 4,
        "total_tokens": 13,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    },
}
RESPONSES = sse(
    responses_event("response.created", 0, response={**COMPLETED, "status": "in_progress", "output": [], "usage": None}),
    responses_event("response.in_progress", 1, response={**COMPLETED, "status": "in_progress", "output": [], "usage": None}),
    responses_event("response.output_item.added", 2, output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": []}),
    responses_event("response.reasoning_summary_text.delta", 3, item_id="rs_1", delta="think"),
    responses_event("response.reasoning_summary_text.done", 4, item_id="rs_1", text="think"),
    responses_event("response.output_item.added", 5, output_index=1, item={"id": "msg_1", "type": "message", "content": []}),
    responses_event("response.content_part.added", 6, item_id="msg_1", part={"type": "output_text", "text": ""}),
    responses_event("response.output_text.delta", 7, item_id="msg_1", delta="Hi"),
    responses_event("response.output_text.delta", 8, item_id="msg_1", delta=" you"),
    responses_event("response.output_text.done", 9, item_id="msg_1", text="Hi you"),
    responses_event("response.completed", 10, response=COMPLETED),
)


def reads(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(1000 + i, data[i : i + size]) for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_anthropic_stream_tokens_thinking_end_and_usage(size: int) -> None:
    s = parse_stream(reads(ANTHROPIC, size), StreamFormat.SSE, keep_text=True)
    assert len(s.token_chunk_ns) == 5 and s.thinking_chunks == 2  # two thinking deltas, three text deltas
    assert s.first_answer_ns == s.token_chunk_ns[2] and s.last_thinking_ns == s.token_chunk_ns[1]
    assert s.text == "Hello there!"
    assert s.final_chunk_ns is not None and s.error is None and s.malformed_count == 0
    m = s.metrics
    assert m is not None
    # message_delta's counts (the runner's), not message_start's estimate; message_stop keeps them.
    assert (m.prompt_eval_count, m.eval_count, m.done_reason) == (12, 6, "end_turn")
    assert m.prompt_eval_cached_count is None


@pytest.mark.parametrize("size", [1, 13, 1 << 20])
def test_responses_stream_tokens_thinking_end_and_usage(size: int) -> None:
    s = parse_stream(reads(RESPONSES, size), StreamFormat.SSE, keep_text=True)
    assert len(s.token_chunk_ns) == 3 and s.thinking_chunks == 1
    assert s.text == "Hi you"  # the deltas only: the done events and the completed response repeat it
    m = s.metrics
    assert m is not None and (m.prompt_eval_count, m.eval_count, m.done_reason) == (9, 4, "completed")
    assert m.prompt_eval_cached_count is None  # Ollama's cached_tokens is a fixed 0: unknown, not zero
    assert s.final_chunk_ns is not None and s.error is None


def test_whole_bodies() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hello"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 7, "output_tokens": 8},
    }
    s = parse_stream([(5, json.dumps(message).encode())], StreamFormat.JSON, keep_text=True)
    assert s.token_chunk_ns == [] and s.final_chunk_ns == 5 and s.text == "Hello"  # one body times no token
    assert s.metrics is not None and (s.metrics.prompt_eval_count, s.metrics.eval_count, s.metrics.done_reason) == (
        7,
        8,
        "max_tokens",
    )
    s = parse_stream([(6, json.dumps(COMPLETED).encode())], StreamFormat.JSON, keep_text=True)
    assert s.final_chunk_ns == 6 and s.text == "Hi you"
    assert s.metrics is not None and (s.metrics.prompt_eval_count, s.metrics.eval_count) == (9, 4)


def test_errors_in_each_shape() -> None:
    anthropic_err = {"type": "error", "error": {"type": "not_found_error", "message": "model 'x' not found"}}
    assert parse_stream([(1, json.dumps(anthropic_err).encode())], StreamFormat.JSON).error == "model 'x' not found"
    s = parse_stream(reads(sse(MESSAGE_START, anthropic_err), 1 << 20), StreamFormat.SSE)
    assert s.error == "model 'x' not found" and s.final_chunk_ns is None
    s = parse_stream(
        reads(sse({"type": "error", "code": "server_error", "message": "runner stopped"}), 1 << 20), StreamFormat.SSE
    )
    assert s.error == "runner stopped"
    failed = responses_event(
        "response.failed", 3, response={**COMPLETED, "status": "failed", "error": {"code": "x", "message": "boom"}}
    )
    assert parse_stream(reads(sse(failed), 1 << 20), StreamFormat.SSE).error == "boom"


def test_an_estimate_alone_is_no_count_and_hostile_counts_are_unknown() -> None:
    """A stream cut after message_start has no counts (its 999 is Ollama's estimate); counts that are no
    non-negative integer are unknown, never 0."""
    s = parse_stream(reads(sse(MESSAGE_START, block_delta("text_delta", "a")), 1 << 20), StreamFormat.SSE)
    assert s.metrics is None and s.final_chunk_ns is None and len(s.token_chunk_ns) == 1
    bad = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": -3, "output_tokens": "6"}}
    s = parse_stream(reads(sse(bad), 1 << 20), StreamFormat.SSE)
    assert s.metrics is not None and (s.metrics.prompt_eval_count, s.metrics.eval_count) == (None, None)
