"""Real clients through the proxy in front of sim: each record's phases against sim's truth.

Every call is one a user makes (the official ``ollama`` client, ``openai``, ``langchain-ollama``): the record's
phases are within 5% of what sim really did where they are knowable, None where they are not (never 0.0),
and each says where it came from. sim runs the "cpu" profile, so every phase lasts tens to hundreds of ms and
5% stays far above a busy machine's scheduling jitter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import ollama
import openai
import pytest

from analysis.phases import Phases, PhaseSource, split_record
from analysis.records import RequestKind, RequestRecord
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimProcess, http_json, start_sim, truth

MODEL = "qwen2.5:0.5b"
PROMPT = "word " * 200  # ~0.4 s of prefill on the cpu profile
NUM_PREDICT = 64  # ~0.6 s of decode
REL = 0.05  # the bound: within 5% of sim's truth


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # A slow disk (0.5 GB/s): a cold load takes ~0.8 s, far above the few ms a reply takes to build and send.
    with start_sim("--hardware", "cpu", "--disk-gbs", "0.5") as s:
        yield s


@pytest.fixture(scope="module")
def proxy(sim: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(sim.base_url) as p:
        yield p


def _call(sim: SimProcess, proxy: ProxyThread, call: Callable[[], Any]) -> tuple[RequestRecord, Phases, dict[str, Any]]:
    """Run one client call; its record, the record's phases, and sim's truth about it."""
    status, _ = http_json(sim, "DELETE", "/sim/truth")
    assert status in (200, 204)
    before = len(proxy.records)
    result = call()
    if isinstance(result, Iterator):  # a stream: read it to the end, as the client's user does
        for _ in result:
            pass
    records = proxy.wait_records(before + 1)
    assert len(records) == before + 1, records[before:]
    rec = records[-1]
    (t,) = truth(sim)
    return rec, split_record(rec), t


def _s(a_ns: int, b_ns: int) -> float:
    return (b_ns - a_ns) / 1e9


def _close(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=REL)


def _no_zero_for_unknown(ph: Phases) -> None:
    """A phase without a source is unknown, and then None; a phase with one has a value."""
    for name in ("load", "queue", "prefill", "decode"):
        value, source = getattr(ph, f"{name}_s"), getattr(ph, f"{name}_source")
        assert (value is None) == (source is None), (name, value, source)


def _unload(sim: SimProcess) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=MODEL, keep_alive=0)


def _warm(sim: SimProcess) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=MODEL, prompt="warm", options={"num_predict": 1})


def _check_native(rec: RequestRecord, ph: Phases, t: dict[str, Any], *, stream: bool) -> None:
    """A native reply: Ollama's durations, each within 5% of what sim did; the client's TTFT only when streamed."""
    assert rec.stream is stream and rec.kind is RequestKind.GENERATE
    _no_zero_for_unknown(ph)
    assert ph.load_source == ph.prefill_source == ph.decode_source == ph.queue_source == PhaseSource.OLLAMA
    assert _close(ph.prefill_s, _s(t["prefill_start_ns"], t["prefill_end_ns"]))
    sampled = t["token_sampled_ns"]
    assert _close(ph.decode_s, _s(sampled[0], sampled[-1]))
    assert ph.prompt_tokens == t["prompt_tokens"] and ph.output_tokens == t["reported"]["eval_count"]
    if t["load_start_ns"] is not None:
        assert _close(ph.load_s, _s(t["load_start_ns"], t["load_end_ns"]))
    # Server side: request received → first token sampled.
    assert _close(ph.server_ttft_s, _s(t["received_ns"], t["prefill_end_ns"]))
    if stream:
        assert _close(ph.ttft_s, _s(t["received_ns"], t["token_written_ns"][0]))
        assert ph.token_chunks == len(t["token_written_ns"]) and ph.thinking_tokens == 0
        assert ph.ttfa_s == ph.ttft_s
    else:  # no token reached the client before the whole body: no client TTFT
        assert ph.ttft_s is None and ph.ttfa_s is None and ph.token_chunks == 0 and ph.thinking_tokens is None
        assert "cache_unknown" not in ph.flags  # this sim reports prompt_eval_cached_count


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_ollama_generate(sim: SimProcess, proxy: ProxyThread, stream: bool) -> None:
    _unload(sim)  # a cold load, so load is a real phase to measure
    client = ollama.Client(host=proxy.base_url, timeout=60)
    opts = {"num_predict": NUM_PREDICT}
    if stream:
        rec, ph, t = _call(sim, proxy, lambda: client.generate(model=MODEL, prompt=PROMPT, stream=True, options=opts))
    else:
        rec, ph, t = _call(sim, proxy, lambda: client.generate(model=MODEL, prompt=PROMPT, stream=False, options=opts))
    assert t["load_start_ns"] is not None
    _check_native(rec, ph, t, stream=stream)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_ollama_chat(sim: SimProcess, proxy: ProxyThread, stream: bool) -> None:
    _warm(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    messages = [{"role": "user", "content": PROMPT + str(stream)}]
    opts = {"num_predict": NUM_PREDICT}
    if stream:
        rec, ph, t = _call(sim, proxy, lambda: client.chat(model=MODEL, messages=messages, stream=True, options=opts))
    else:
        rec, ph, t = _call(sim, proxy, lambda: client.chat(model=MODEL, messages=messages, stream=False, options=opts))
    _check_native(rec, ph, t, stream=stream)


def test_langchain_ollama_streaming(sim: SimProcess, proxy: ProxyThread) -> None:
    from langchain_ollama import ChatOllama

    _warm(sim)
    llm = ChatOllama(model=MODEL, base_url=proxy.base_url, num_predict=NUM_PREDICT)
    rec, ph, t = _call(sim, proxy, lambda: iter(list(llm.stream(PROMPT + " langchain"))))
    assert rec.endpoint == "/api/chat"
    _check_native(rec, ph, t, stream=True)


def _openai(proxy: ProxyThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="ollama", timeout=60, max_retries=0)


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "no-usage"])
def test_openai_chat_streamed(sim: SimProcess, proxy: ProxyThread, include_usage: bool) -> None:
    """No durations on /v1: load and prefill unknown (a cold load included), decode and TTFT from the stream."""
    _unload(sim)
    client = _openai(proxy)
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if include_usage else {}
    _rec, ph, t = _call(sim, proxy, lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=NUM_PREDICT, stream=True, **extra))  # fmt: skip
    assert t["load_start_ns"] is not None  # sim loaded the model: still unknown here, not 0.0
    _no_zero_for_unknown(ph)
    assert (ph.load_s, ph.queue_s, ph.prefill_s, ph.total_s) == (None, None, None, None)
    assert "no_server_timings" in ph.flags and "cache_unknown" not in ph.flags
    written = t["token_written_ns"]
    assert _close(ph.ttft_s, _s(t["received_ns"], written[0]))
    assert ph.decode_source == PhaseSource.STREAM and _close(ph.decode_s, _s(written[0], written[-1]))
    assert _close(ph.decode_tok_s, (len(written) - 1) / _s(written[0], written[-1]))
    if include_usage:
        assert (ph.output_tokens, ph.output_tokens_source) == (t["reported"]["eval_count"], PhaseSource.USAGE)
        assert (ph.prompt_tokens, ph.prompt_tokens_source) == (t["prompt_tokens"], PhaseSource.USAGE)
    else:
        assert (ph.output_tokens, ph.output_tokens_source) == (len(written), PhaseSource.COUNTED)
        assert (ph.prompt_tokens, ph.prompt_tokens_source) == (None, None)


def test_openai_completions_not_streamed(sim: SimProcess, proxy: ProxyThread) -> None:
    _warm(sim)
    client = _openai(proxy)
    rec, ph, t = _call(sim, proxy, lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NUM_PREDICT))
    assert rec.stream is False and rec.endpoint == "/v1/completions"
    _no_zero_for_unknown(ph)
    assert (ph.load_s, ph.prefill_s, ph.decode_s, ph.ttft_s, ph.server_ttft_s) == (None, None, None, None, None)
    assert (ph.prompt_tokens, ph.output_tokens) == (t["prompt_tokens"], t["reported"]["eval_count"])
    assert ph.output_tokens_source == PhaseSource.USAGE
    assert _close(ph.client_s, _s(t["received_ns"], t["done_ns"]))


def test_load_and_unload_are_their_own_kind(sim: SimProcess, proxy: ProxyThread) -> None:
    """An empty prompt loads the model: the record carries sim's load time; keep_alive 0 unloads it."""
    client = ollama.Client(host=proxy.base_url, timeout=60)
    _unload(sim)
    rec, ph, t = _call(sim, proxy, lambda: client.generate(model=MODEL, prompt=""))
    assert rec.kind is RequestKind.LOAD and ph.done_reason == "load" and t["kind"] == "load"
    assert ph.load_source == PhaseSource.STREAM  # Ollama's load reply has no durations: its arrival times the load
    assert _close(ph.load_s, _s(t["load_start_ns"], t["load_end_ns"])), (ph.load_s, t)
    assert (ph.prefill_s, ph.decode_s, ph.queue_s, ph.ttft_s) == (None, None, None, None)
    assert ph.load_start_ns is not None and ph.load_end_ns is not None and ph.load_end_ns > ph.load_start_ns

    rec, ph, t = _call(sim, proxy, lambda: client.chat(model=MODEL, messages=[], keep_alive=0))
    assert rec.kind is RequestKind.UNLOAD and ph.done_reason == "unload" and t["kind"] == "unload"
    assert t["load_start_ns"] is None  # nothing loads for an unload: its load is unknown, never 0.0
    assert (ph.load_s, ph.prefill_s, ph.decode_s, ph.ttft_s) == (None, None, None, None)
    assert ph.client_s is not None and ph.client_s > 0
    _no_zero_for_unknown(ph)


# -- embeddings: prefill only ------------------------------------------------------------------


def _check_embed(rec: RequestRecord, ph: Phases, t: dict[str, Any], *, durations: bool) -> None:
    assert rec.kind is RequestKind.EMBED and t["kind"] == "embed" and rec.stream is False
    assert rec.batch_size == t["inputs"]
    _no_zero_for_unknown(ph)
    assert (ph.decode_s, ph.output_tokens, ph.ttft_s, ph.token_chunks) == (None, None, None, 0)
    assert "no_output" not in ph.flags
    if durations:  # Ollama's embed reply: total, load, prompt count; prefill is total − load
        assert ph.prompt_tokens == t["reported"]["prompt_eval_count"] and ph.prompt_tokens_source == PhaseSource.OLLAMA
        assert ph.load_source == ph.prefill_source == PhaseSource.OLLAMA
        assert _close(ph.prefill_s, t["embed_prefill_ns"] / 1e9)
        if t["load_start_ns"] is not None:
            assert _close(ph.load_s, _s(t["load_start_ns"], t["load_end_ns"]))
        assert _close(ph.prefill_tok_s, t["prompt_tokens"] / (t["embed_prefill_ns"] / 1e9))
        assert ph.prefill_start_ns is not None and ph.decode_start_ns == rec.final_chunk_ns
    else:  # nothing but the vector (and, on /v1, usage): every phase unknown
        assert (ph.load_s, ph.prefill_s, ph.prefill_tok_s) == (None, None, None)
    # The client's wait includes sending the vectors (a large body): never shorter than sim's work.
    assert ph.client_s is not None and ph.client_s >= _s(t["received_ns"], t["done_ns"]) * (1 - REL)


def test_ollama_embed_batch(sim: SimProcess, proxy: ProxyThread) -> None:
    _unload(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    rec, ph, t = _call(sim, proxy, lambda: client.embed(model=MODEL, input=["word " * 150, "other " * 80, "third " * 40]))
    assert rec.endpoint == "/api/embed" and rec.batch_size == 3 and t["load_start_ns"] is not None
    _check_embed(rec, ph, t, durations=True)


def test_ollama_embeddings_legacy(sim: SimProcess, proxy: ProxyThread) -> None:
    _warm(sim)
    client = ollama.Client(host=proxy.base_url, timeout=60)
    rec, ph, t = _call(sim, proxy, lambda: client.embeddings(model=MODEL, prompt="word " * 100))
    assert rec.endpoint == "/api/embeddings" and rec.batch_size == 1
    _check_embed(rec, ph, t, durations=False)  # Ollama's older route answers the vector alone


def test_openai_embeddings_and_models(sim: SimProcess, proxy: ProxyThread) -> None:
    _warm(sim)
    client = _openai(proxy)
    rec, ph, t = _call(sim, proxy, lambda: client.embeddings.create(model=MODEL, input=["word " * 100, "other " * 60]))
    assert rec.endpoint == "/v1/embeddings" and rec.batch_size == 2
    _check_embed(rec, ph, t, durations=False)
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
    assert _close(ph.thinking_s, t["thinking_ns"] / 1e9) and _close(ph.answer_s, t["answer_ns"] / 1e9)
    assert _close(ph.thinking_tok_s, t["thinking_tokens"] / (t["thinking_ns"] / 1e9))
    assert _close(ph.ttfa_s, _s(t["received_ns"], t["first_answer_written_ns"]))
    assert _close(ph.ttft_s, _s(t["received_ns"], t["token_written_ns"][0]))
    assert ph.ttfa_s is not None and ph.ttft_s is not None and ph.ttfa_s > ph.ttft_s


@pytest.mark.parametrize("route", ["generate", "chat", "openai"])
def test_thinking_streamed(sim: SimProcess, proxy: ProxyThread, route: str) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=THINKER, prompt="warm", options={"num_predict": 1})
    client = ollama.Client(host=proxy.base_url, timeout=60)
    opts = {"num_predict": 160, "seed": 7}
    calls: dict[str, Callable[[], Any]] = {
        "generate": lambda: client.generate(model=THINKER, prompt=PROMPT + route, stream=True, options=opts),
        "chat": lambda: client.chat(model=THINKER, messages=[{"role": "user", "content": PROMPT + route}], stream=True,
                                    options=opts),
        "openai": lambda: _openai(proxy).chat.completions.create(
            model=THINKER, messages=[{"role": "user", "content": PROMPT + route}], max_tokens=160, seed=7, stream=True),
    }  # fmt: skip
    rec, ph, t = _call(sim, proxy, calls[route])
    assert rec.thinking_chunks == t["thinking_tokens"]
    _check_thinking(ph, t)
    if route != "openai":  # Ollama's durations: decode is thinking + answer
        assert ph.decode_s is not None and ph.thinking_s is not None and ph.answer_s is not None
        assert _close(ph.thinking_s + ph.answer_s, ph.decode_s)


def test_thinking_not_streamed_is_unknown_not_zero(sim: SimProcess, proxy: ProxyThread) -> None:
    client = ollama.Client(host=proxy.base_url, timeout=60)
    rec, ph, t = _call(sim, proxy, lambda: client.generate(model=THINKER, prompt=PROMPT, options={"num_predict": 160, "seed": 7}))
    assert t["thinking_tokens"] > 0 and rec.stream is False
    assert (ph.thinking_tokens, ph.thinking_s, ph.ttfa_s, ph.ttft_s) == (None, None, None, None)
    assert ph.output_tokens == t["reported"]["eval_count"]  # thinking and answer together, as Ollama counts them
