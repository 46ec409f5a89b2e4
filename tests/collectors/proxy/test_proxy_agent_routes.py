"""The coding agents' routes through the proxy, driven by the official SDKs: Anthropic's ``messages`` (Claude
Code's ``/v1/messages``) and OpenAI's ``responses`` (Codex's ``/v1/responses``), streamed and not, in front of sim.

Each call is recorded once, with its route; a stream's time to first token and every gap are the proxy's timing
of the content events, within 5% of when sim wrote them; prompt and output tokens are the runner's own counts,
read from each API's own usage fields. Thinking (qwen3) is told apart where the events carry it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from analysis.phases import PhaseSource
from tests.support.proxy_process import ProxyChild
from tests.support.record_checks import (
    MODEL,
    NUM_PREDICT,
    PROMPT,
    call_recorded,
    no_zero_for_unknown,
    span_s,
    stamped_within,
    ttft_within,
)
from tests.support.sim_process import SimProcess

pytestmark = pytest.mark.sim_args("--hardware", "cpu", "--disk-gbs", "0.5")
THINKER = "qwen3:0.6b"


@pytest.fixture(scope="module")
def proxy(proxy_child: ProxyChild) -> ProxyChild:
    """The proxy in its own process: these tests hold its stamps to sim's truth (tests/conftest.py, proxy_child)."""
    return proxy_child


def _anthropic(proxy: ProxyChild) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base_url, api_key="ollama", timeout=60, max_retries=0)


def _openai(proxy: ProxyChild) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="ollama", timeout=60, max_retries=0)


def _events(stream: Any) -> Iterator[Any]:
    with stream as events:
        yield from events


def _check_streamed(rec: Any, ph: Any, t: dict[str, Any], endpoint: str) -> None:
    assert (rec.endpoint, rec.stream, rec.outcome) == (endpoint, True, "ok")
    written = t["token_written_ns"]
    assert len(rec.token_chunk_ns) == len(written)  # every token's event, none twice, no framing event counted
    assert ttft_within(ph.ttft_s, t)
    assert ph.decode_source == PhaseSource.STREAM and stamped_within(ph.decode_s, span_s(written[0], written[-1]))
    assert (ph.prompt_tokens, ph.prompt_tokens_source) == (t["reported"]["prompt_eval_count"], PhaseSource.USAGE)
    assert (ph.output_tokens, ph.output_tokens_source) == (t["reported"]["eval_count"], PhaseSource.USAGE)
    assert t["reported"]["prompt_eval_count"] == t["prompt_tokens"] > 0
    no_zero_for_unknown(ph)
    assert ph.cached_tokens is None  # neither API says: unknown, not 0 (Ollama's Responses detail is a fixed 0)


def _check_whole(rec: Any, ph: Any, t: dict[str, Any], endpoint: str) -> None:
    assert (rec.endpoint, rec.stream, rec.outcome) == (endpoint, False, "ok")
    assert rec.token_chunk_ns == [] and ph.ttft_s is None  # one body: no token came before the whole reply
    assert (ph.prompt_tokens, ph.output_tokens) == (t["reported"]["prompt_eval_count"], t["reported"]["eval_count"])
    assert ph.output_tokens_source == PhaseSource.USAGE
    assert stamped_within(ph.client_s, span_s(t["received_ns"], t["done_ns"]))
    no_zero_for_unknown(ph)


def test_anthropic_messages_streamed(sim: SimProcess, proxy: ProxyChild) -> None:
    client = _anthropic(proxy)
    messages = [{"role": "user", "content": "claude " + PROMPT}]
    stream = client.messages.stream(model=MODEL, max_tokens=NUM_PREDICT, system="be brief", messages=messages)  # type: ignore[arg-type]
    rec, ph, t = call_recorded(sim, proxy, lambda: _events(stream))
    _check_streamed(rec, ph, t, "/v1/messages")
    assert rec.prompt_chars == len("claude " + PROMPT) + len("be brief")
    assert rec.num_predict == NUM_PREDICT and rec.metrics is not None and rec.metrics.done_reason == "max_tokens"


def test_anthropic_messages_not_streamed(sim: SimProcess, proxy: ProxyChild) -> None:
    client = _anthropic(proxy)
    messages = [{"role": "user", "content": [{"type": "text", "text": "whole " + PROMPT}]}]
    rec, ph, t = call_recorded(sim, proxy, lambda: client.messages.create(model=MODEL, max_tokens=NUM_PREDICT, messages=messages))  # type: ignore[arg-type]
    _check_whole(rec, ph, t, "/v1/messages")


def test_openai_responses_streamed(sim: SimProcess, proxy: ProxyChild) -> None:
    client = _openai(proxy)

    def call() -> Any:
        return client.responses.create(model=MODEL, input="codex " + PROMPT, max_output_tokens=NUM_PREDICT, stream=True)

    rec, ph, t = call_recorded(sim, proxy, call)
    _check_streamed(rec, ph, t, "/v1/responses")
    assert rec.num_predict == NUM_PREDICT and rec.metrics is not None and rec.metrics.done_reason == "completed"


def test_openai_responses_not_streamed(sim: SimProcess, proxy: ProxyChild) -> None:
    client = _openai(proxy)

    def call() -> Any:
        return client.responses.create(
            model=MODEL, input="whole " + PROMPT, instructions="be brief", max_output_tokens=NUM_PREDICT
        )

    rec, ph, t = call_recorded(sim, proxy, call)
    _check_whole(rec, ph, t, "/v1/responses")
    assert rec.prompt_chars == len("whole " + PROMPT) + len("be brief")


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/responses"])
def test_thinking_apart(sim: SimProcess, proxy: ProxyChild, route: str) -> None:
    """qwen3 thinks first (32 to 96 tokens): its thinking events are tokens apart from the answer's, the first
    answer timed."""
    ask = route + " why is the sky blue? " + PROMPT  # a long prompt: TTFT ~0.4 s, so 5% is tens of ms

    def call() -> Any:
        if route == "/v1/messages":
            messages: Any = [{"role": "user", "content": ask}]
            return _events(_anthropic(proxy).messages.stream(model=THINKER, max_tokens=120, messages=messages))
        return _openai(proxy).responses.create(model=THINKER, input=ask, max_output_tokens=120, stream=True)

    rec, ph, t = call_recorded(sim, proxy, call)
    k = t["thinking_chunks"]
    assert k > 0 and rec.thinking_chunks == k
    assert rec.first_answer_ns is not None and ttft_within(ph.ttft_s, t)
    assert stamped_within(span_s(rec.received_ns, rec.first_answer_ns), span_s(t["received_ns"], t["first_answer_written_ns"]))
    assert ph.output_tokens == t["reported"]["eval_count"] >= len(rec.token_chunk_ns)  # it counts an end token, never sent


def test_errors_are_recorded_in_each_apis_shape(sim: SimProcess, proxy: ProxyChild) -> None:
    """An unknown model: each SDK raises its own NotFoundError (the body parsed in its API's shape), and the
    record keeps the route, the status and the message."""
    before = len(proxy.records)
    with pytest.raises(anthropic.NotFoundError) as a_err:
        _anthropic(proxy).messages.create(model="no-such:model", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert a_err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as o_err:
        _openai(proxy).responses.create(model="no-such:model", input="hi")
    assert o_err.value.body["type"] == "not_found_error"  # type: ignore[index]
    records = proxy.wait_records(before + 2)[before:]
    assert [(r.endpoint, r.status_code, r.outcome) for r in records] == [
        ("/v1/messages", 404, "http_error"),
        ("/v1/responses", 404, "http_error"),
    ]
    assert all("no-such:model" in (r.error or "") for r in records)
