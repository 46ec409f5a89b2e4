"""A client call through the proxy in front of sim, and checks of its record's phases against sim's truth
(within REL where knowable, None where not): shared by the Python and the JavaScript client tests."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import ollama

from analysis.phases import Phases, PhaseSource, split_record
from analysis.records import RequestKind, RequestRecord
from tests.support.proxy_process import ProxyChild
from tests.support.proxy_thread import ProxyThread
from tests.support.sim_process import SimProcess, http_json, truth

MODEL = "qwen2.5:0.5b"
PROMPT = "word " * 200  # ~0.4 s of prefill on the cpu profile
NUM_PREDICT = 64  # ~0.6 s of decode
REL = 0.05  # the bound: within 5% of sim's truth
# A span the proxy stamps itself (a stream's chunks, its request's arrival) meets sim's truth within REL and, at each
# end, the proxy process's wait for a CPU: on the loaded 2-core machine, a wakeup waits up to a scheduler period or
# two (seen: 35 ms at load 4.5 with two CPU-bound processes beside it). Durations Ollama reports are copied, so they
# stay within REL alone.
HOP_S = 0.05


def call_recorded(
    sim: SimProcess, proxy: ProxyThread | ProxyChild, call: Callable[[], Any]
) -> tuple[RequestRecord, Phases, dict[str, Any]]:
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


def span_s(a_ns: int, b_ns: int) -> float:
    return (b_ns - a_ns) / 1e9


def within_rel(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=REL)


def ttft_within(got: float | None, t: dict[str, Any]) -> bool:
    """The proxy's time to first token against sim's, within REL of the bracket sim's truth gives (and HOP_S for the
    proxy's wakeups): sim stamps its first token before its write (sampled) and after it (written), and a loaded
    machine may pause sim between the two while the proxy already reads the chunk, so the proxy's span may be shorter
    than sim's written one."""
    made_s = span_s(t["received_ns"], t["token_sampled_ns"][0])
    written_s = span_s(t["received_ns"], t["token_written_ns"][0])
    return got is not None and made_s * (1 - REL) <= got <= written_s * (1 + REL) + HOP_S


def stamped_within(got: float | None, want_s: float) -> bool:
    """A span the proxy timed from its own stamps against sim's: within REL, and HOP_S for the proxy's wakeups."""
    return got is not None and abs(got - want_s) <= want_s * REL + HOP_S


def no_zero_for_unknown(ph: Phases) -> None:
    """A phase without a source is unknown, and then None; a phase with one has a value."""
    for name in ("load", "queue", "prefill", "decode"):
        value, source = getattr(ph, f"{name}_s"), getattr(ph, f"{name}_source")
        assert (value is None) == (source is None), (name, value, source)


def unload(sim: SimProcess) -> None:
    ollama.Client(host=sim.base_url, timeout=60).generate(model=MODEL, keep_alive=0)


def check_native(rec: RequestRecord, ph: Phases, t: dict[str, Any], *, stream: bool) -> None:
    """A native reply: Ollama's durations, each within 5% of what sim did; the client's TTFT only when streamed."""
    assert rec.stream is stream and rec.kind is RequestKind.GENERATE
    no_zero_for_unknown(ph)
    assert ph.load_source == ph.prefill_source == ph.decode_source == ph.queue_source == PhaseSource.OLLAMA
    assert within_rel(ph.prefill_s, span_s(t["prefill_start_ns"], t["prefill_end_ns"]))
    sampled = t["token_sampled_ns"]
    assert within_rel(ph.decode_s, span_s(sampled[0], sampled[-1]))
    assert ph.prompt_tokens == t["prompt_tokens"] and ph.output_tokens == t["reported"]["eval_count"]
    if t["load_start_ns"] is not None:
        assert within_rel(ph.load_s, span_s(t["load_start_ns"], t["load_end_ns"]))
    # Server side: request received → first token sampled.
    assert within_rel(ph.server_ttft_s, span_s(t["received_ns"], t["prefill_end_ns"]))
    if stream:
        assert ttft_within(ph.ttft_s, t)
        assert ph.token_chunks == len(t["token_written_ns"]) and ph.thinking_tokens == 0
        assert ph.ttfa_s == ph.ttft_s
    else:  # no token reached the client before the whole body: no client TTFT
        assert ph.ttft_s is None and ph.ttfa_s is None and ph.token_chunks == 0 and ph.thinking_tokens is None
        assert "cache_unknown" not in ph.flags  # this sim reports prompt_eval_cached_count


def check_embed(rec: RequestRecord, ph: Phases, t: dict[str, Any], *, durations: bool) -> None:
    assert rec.kind is RequestKind.EMBED and t["kind"] == "embed" and rec.stream is False
    assert rec.batch_size == t["inputs"]
    no_zero_for_unknown(ph)
    assert (ph.decode_s, ph.output_tokens, ph.ttft_s, ph.token_chunks) == (None, None, None, 0)
    assert "no_output" not in ph.flags
    if durations:  # Ollama's embed reply: total, load, prompt count; prefill is total − load
        assert ph.prompt_tokens == t["reported"]["prompt_eval_count"] and ph.prompt_tokens_source == PhaseSource.OLLAMA
        assert ph.load_source == ph.prefill_source == PhaseSource.OLLAMA
        assert within_rel(ph.prefill_s, t["embed_prefill_ns"] / 1e9)
        if t["load_start_ns"] is not None:
            assert within_rel(ph.load_s, span_s(t["load_start_ns"], t["load_end_ns"]))
        assert within_rel(ph.prefill_tok_s, t["prompt_tokens"] / (t["embed_prefill_ns"] / 1e9))
        assert ph.prefill_start_ns is not None and ph.decode_start_ns == rec.final_chunk_ns
    else:  # nothing but the vector (and, on /v1, usage): every phase unknown
        assert (ph.load_s, ph.prefill_s, ph.prefill_tok_s) == (None, None, None)
    # The client's wait includes sending the vectors (a large body): never shorter than sim's work.
    assert ph.client_s is not None and ph.client_s >= span_s(t["received_ns"], t["done_ns"]) * (1 - REL)
