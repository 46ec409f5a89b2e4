"""Real clients through the proxy in front of sim: each record's phases against sim's truth.

Every call is one a user makes (the official ``ollama`` client, ``openai``, ``langchain-ollama``): the record's
phases are within 5% of what sim really did where they are knowable, None where they are not (never 0.0),
and each says where it came from. sim runs the "cpu" profile, so every phase lasts tens to hundreds of ms and
5% stays far above a busy machine's scheduling jitter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ollama
import openai
import pytest

from analysis.phases import Phases, PhaseSource
from analysis.records import RequestKind
from tests.support.proxy_process import ProxyChild
from tests.support.record_checks import (
    MODEL,
    NUM_PREDICT,
    PROMPT,
    call_recorded,
    check_embed,
    check_native,
    no_zero_for_unknown,
    span_s,
    stamped_within,
    ttft_within,
    unload,
    within_rel,
)
from tests.support.sim_process import SimProcess

pytestmark = pytest.mark.sim_args("--hardware", "cpu", "--disk-gbs", "0.5")


@pytest.fixture(scope="module")
def proxy(proxy_child: ProxyChild) -> ProxyChild:
    """The proxy in its own process: these tests hold its stamps to sim's truth (tests/conftest.py, proxy_child)."""
    return proxy_child


def _warm(sim: SimProcess) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=MODEL, prompt="warm", options={"num_predict": 1})


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_ollama_generate(sim: SimProcess, proxy: ProxyChild, stream: bool) -> None:
    unload(sim)  # a cold load, so load is a real phase to measure
    client = ollama.Client(host=proxy.base_url, timeout=60)
    opts = {"num_predict": NUM_PREDICT}
    if stream:
        rec, ph, t = call_recorded(sim, proxy, lambda: client.generate(model=MODEL, prompt=PROMPT, stream=True, options=opts))
    else:
        rec, ph, t = call_recorded(sim, proxy, lambda: client.generate(model=MODEL, prompt=PROMPT, stream=False, options=opts))
    assert t["load_start_ns"] is not None
    check_native(rec, ph, t, stream=stream)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_ollama_chat(sim: SimProcess, proxy: ProxyChild, stream: bool) -> None:
    _warm(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    messages = [{"role": "user", "content": PROMPT + str(stream)}]
    opts = {"num_predict": NUM_PREDICT}
    if stream:
        rec, ph, t = call_recorded(sim, proxy, lambda: client.chat(model=MODEL, messages=messages, stream=True, options=opts))
    else:
        rec, ph, t = call_recorded(sim, proxy, lambda: client.chat(model=MODEL, messages=messages, stream=False, options=opts))
    check_native(rec, ph, t, stream=stream)


def test_langchain_ollama_streaming(sim: SimProcess, proxy: ProxyChild) -> None:
    from langchain_ollama import ChatOllama

    _warm(sim)
    llm = ChatOllama(model=MODEL, base_url=proxy.base_url, num_predict=NUM_PREDICT)
    rec, ph, t = call_recorded(sim, proxy, lambda: iter(list(llm.stream(PROMPT + " langchain"))))
    assert rec.endpoint == "/api/chat"
    check_native(rec, ph, t, stream=True)


def _openai(proxy: ProxyChild) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="ollama", timeout=60, max_retries=0)


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "no-usage"])
def test_openai_chat_streamed(sim: SimProcess, proxy: ProxyChild, include_usage: bool) -> None:
    """No durations on /v1: load and prefill unknown (a cold load included), decode and TTFT from the stream."""
    unload(sim)
    client = _openai(proxy)
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if include_usage else {}
    _rec, ph, t = call_recorded(
        sim,
        proxy,
        lambda: client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=NUM_PREDICT, stream=True, **extra
        ),
    )
    assert t["load_start_ns"] is not None  # sim loaded the model: still unknown here, not 0.0
    no_zero_for_unknown(ph)
    assert (ph.load_s, ph.queue_s, ph.prefill_s, ph.total_s) == (None, None, None, None)
    assert "no_server_timings" in ph.flags and "cache_unknown" not in ph.flags
    written = t["token_written_ns"]
    assert ttft_within(ph.ttft_s, t)
    assert ph.decode_source == PhaseSource.STREAM and stamped_within(ph.decode_s, span_s(written[0], written[-1]))
    assert ph.decode_s is not None and within_rel(ph.decode_tok_s, (len(written) - 1) / ph.decode_s)
    if include_usage:
        assert (ph.output_tokens, ph.output_tokens_source) == (t["reported"]["eval_count"], PhaseSource.USAGE)
        assert (ph.prompt_tokens, ph.prompt_tokens_source) == (t["prompt_tokens"], PhaseSource.USAGE)
    else:
        assert (ph.output_tokens, ph.output_tokens_source) == (len(written), PhaseSource.COUNTED)
        assert (ph.prompt_tokens, ph.prompt_tokens_source) == (None, None)


def test_openai_completions_not_streamed(sim: SimProcess, proxy: ProxyChild) -> None:
    _warm(sim)
    client = _openai(proxy)
    rec, ph, t = call_recorded(sim, proxy, lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NUM_PREDICT))
    assert rec.stream is False and rec.endpoint == "/v1/completions"
    no_zero_for_unknown(ph)
    assert (ph.load_s, ph.prefill_s, ph.decode_s, ph.ttft_s, ph.server_ttft_s) == (None, None, None, None, None)
    assert (ph.prompt_tokens, ph.output_tokens) == (t["prompt_tokens"], t["reported"]["eval_count"])
    assert ph.output_tokens_source == PhaseSource.USAGE
    assert stamped_within(ph.client_s, span_s(t["received_ns"], t["done_ns"]))


def test_load_and_unload_are_their_own_kind(sim: SimProcess, proxy: ProxyChild) -> None:
    """An empty prompt loads the model: the record carries sim's load time; keep_alive 0 unloads it."""
    client = ollama.Client(host=proxy.base_url, timeout=60)
    unload(sim)
    rec, ph, t = call_recorded(sim, proxy, lambda: client.generate(model=MODEL, prompt=""))
    assert rec.kind is RequestKind.LOAD and ph.done_reason == "load" and t["kind"] == "load"
    assert ph.load_source == PhaseSource.STREAM  # Ollama's load reply has no durations: its arrival times the load
    assert within_rel(ph.load_s, span_s(t["load_start_ns"], t["load_end_ns"])), (ph.load_s, t)
    assert (ph.prefill_s, ph.decode_s, ph.queue_s, ph.ttft_s) == (None, None, None, None)
    assert ph.load_start_ns is not None and ph.load_end_ns is not None and ph.load_end_ns > ph.load_start_ns

    rec, ph, t = call_recorded(sim, proxy, lambda: client.chat(model=MODEL, messages=[], keep_alive=0))
    assert rec.kind is RequestKind.UNLOAD and ph.done_reason == "unload" and t["kind"] == "unload"
    assert t["load_start_ns"] is None  # nothing loads for an unload: its load is unknown, never 0.0
    assert (ph.load_s, ph.prefill_s, ph.decode_s, ph.ttft_s) == (None, None, None, None)
    assert ph.client_s is not None and ph.client_s > 0
    no_zero_for_unknown(ph)


# -- embeddings: prefill only ------------------------------------------------------------------


def test_ollama_embed_batch(sim: SimProcess, proxy: ProxyChild) -> None:
    unload(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    rec, ph, t = call_recorded(sim, proxy, lambda: client.embed(model=MODEL, input=["word " * 150, "other " * 80, "third " * 40]))
    assert rec.endpoint == "/api/embed" and rec.batch_size == 3 and t["load_start_ns"] is not None
    check_embed(rec, ph, t, durations=True)


def test_ollama_embeddings_legacy(sim: SimProcess, proxy: ProxyChild) -> None:
    _warm(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    rec, ph, t = call_recorded(sim, proxy, lambda: client.embeddings(model=MODEL, prompt="word " * 100))
    assert rec.endpoint == "/api/embeddings" and rec.batch_size == 1
    check_embed(rec, ph, t, durations=False)  # Ollama's older route answers the vector alone


def test_openai_embeddings_and_models(sim: SimProcess, proxy: ProxyChild) -> None:
    _warm(sim)
    client = _openai(proxy)
    rec, ph, t = call_recorded(sim, proxy, lambda: client.embeddings.create(model=MODEL, input=["word " * 100, "other " * 60]))
    assert rec.endpoint == "/v1/embeddings" and rec.batch_size == 2
    check_embed(rec, ph, t, durations=False)
    assert (ph.prompt_tokens, ph.prompt_tokens_source) == (t["prompt_tokens"], PhaseSource.USAGE)
    # Listing models is no generation: forwarded as it is, never recorded.
    before = len(proxy.records)
    assert MODEL in {m.id for m in client.models.list()}
    assert client.models.retrieve(MODEL).id == MODEL
    assert len(proxy.records) == before


# -- thinking: decode split at the first answer token ------------------------------------------

THINKER = "qwen3:0.6b"


def _check_thinking(ph: Phases, t: dict[str, Any]) -> None:
    assert t["thinking_tokens"] > 0
    assert ph.thinking_tokens == t["thinking_tokens"] and ph.thinking_source == PhaseSource.COUNTED
    assert ph.answer_tokens == len(t["token_written_ns"]) - t["thinking_tokens"]
    assert stamped_within(ph.thinking_s, t["thinking_ns"] / 1e9) and stamped_within(ph.answer_s, t["answer_ns"] / 1e9)
    assert ph.thinking_s is not None and within_rel(ph.thinking_tok_s, t["thinking_tokens"] / ph.thinking_s)
    assert stamped_within(ph.ttfa_s, span_s(t["received_ns"], t["first_answer_written_ns"]))
    assert ttft_within(ph.ttft_s, t)
    assert ph.ttfa_s is not None and ph.ttft_s is not None and ph.ttfa_s > ph.ttft_s


@pytest.mark.parametrize("route", ["generate", "chat", "openai"])
def test_thinking_streamed(sim: SimProcess, proxy: ProxyChild, route: str) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=THINKER, prompt="warm", options={"num_predict": 1})
    client = ollama.Client(host=proxy.base_url, timeout=60)
    opts = {"num_predict": 160, "seed": 7}
    calls: dict[str, Callable[[], Any]] = {
        "generate": lambda: client.generate(model=THINKER, prompt=PROMPT + route, stream=True, options=opts),
        "chat": lambda: client.chat(
            model=THINKER, messages=[{"role": "user", "content": PROMPT + route}], stream=True, options=opts
        ),
        "openai": lambda: _openai(proxy).chat.completions.create(
            model=THINKER, messages=[{"role": "user", "content": PROMPT + route}], max_tokens=160, seed=7, stream=True
        ),
    }
    rec, ph, t = call_recorded(sim, proxy, calls[route])
    assert rec.thinking_chunks == t["thinking_tokens"]
    _check_thinking(ph, t)
    if route != "openai":  # Ollama's durations: decode is thinking + answer
        assert ph.decode_s is not None and ph.thinking_s is not None and ph.answer_s is not None
        assert stamped_within(ph.thinking_s + ph.answer_s, ph.decode_s)


def test_thinking_not_streamed_is_unknown_not_zero(sim: SimProcess, proxy: ProxyChild) -> None:
    client = ollama.Client(host=proxy.base_url, timeout=60)
    think = {"num_predict": 160, "seed": 7}
    rec, ph, t = call_recorded(sim, proxy, lambda: client.generate(model=THINKER, prompt=PROMPT, options=think))
    assert t["thinking_tokens"] > 0 and rec.stream is False
    assert (ph.thinking_tokens, ph.thinking_s, ph.ttfa_s, ph.ttft_s) == (None, None, None, None)
    assert ph.output_tokens == t["reported"]["eval_count"]  # thinking and answer together, as Ollama counts them
