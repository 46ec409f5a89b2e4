"""The phase split on Ollama's documented responses, on proxy records, and as a command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analysis.phases import FLAG_CODES, Flag, PhaseSplitError, split_record, split_response
from analysis.records import FinalMetrics, Outcome, RequestRecord
from tests.support.paths import REPO

# Ollama's ollama/ollama:docs/api.md examples ("Generate a completion", non-streaming; "Chat", final chunk).
GENERATE_EXAMPLE = {
    "model": "llama3.2",
    "created_at": "2023-08-04T19:22:45.499127Z",
    "response": "The sky is blue because it is the color of the sky.",
    "done": True,
    "done_reason": "stop",
    "context": [1, 2, 3],
    "total_duration": 10706818083,
    "load_duration": 6338219291,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 130079000,
    "eval_count": 259,
    "eval_duration": 4232710000,
}
CHAT_FINAL_EXAMPLE = {
    "model": "llama3.2",
    "created_at": "2023-08-04T19:22:45.499127Z",
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "stop",
    "total_duration": 4883583458,
    "load_duration": 1334875,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 342546000,
    "eval_count": 282,
    "eval_duration": 4535599000,
}
# A newer server (>= 0.33.3) after a cache hit: 1000-token prompt, 900 from the KV cache.
CACHED_EXAMPLE = {
    "model": "llama3.2",
    "created_at": "2026-08-22T10:00:00.000000001Z",
    "response": "",
    "done": True,
    "done_reason": "length",
    "total_duration": 1_500_000_000,
    "load_duration": 20_000_000,
    "prompt_eval_count": 1000,
    "prompt_eval_cached_count": 900,
    "prompt_eval_duration": 50_000_000,
    "eval_count": 101,
    "eval_duration": 1_000_000_000,
}
LOAD_REPLY = {"model": "llama3.2", "created_at": "2026-08-21T10:00:00Z", "response": "", "done": True, "done_reason": "load"}


def test_generate_example_phases_and_rates() -> None:
    p = split_response(GENERATE_EXAMPLE)
    assert p.total_s == pytest.approx(10.706818083)
    assert p.load_s == pytest.approx(6.338219291)
    assert p.prefill_s == pytest.approx(0.130079)
    assert p.decode_s == pytest.approx(4.23271)
    # 10706818083 − 6338219291 − 130079000 − 4232710000 = 5809792 ns of queue + templating.
    assert p.queue_s == pytest.approx(0.005809792)
    assert (p.prompt_tokens, p.cached_tokens, p.output_tokens) == (26, None, 259)
    assert p.prefill_tok_s == pytest.approx(26 / 0.130079)  # ≈ 199.9
    assert p.ollama_prefill_tok_s == pytest.approx(26 / 0.130079)
    assert p.decode_tok_s == pytest.approx(258 / 4.23271)  # ≈ 60.95: 259 tokens, 258 intervals
    assert p.ollama_decode_tok_s == pytest.approx(259 / 4.23271)  # ≈ 61.19, what `ollama run --verbose` prints
    assert p.flags == ["cache_unknown"]  # an old server cannot say how much of the prompt was cached


def test_chat_example_phases_and_rates() -> None:
    p = split_response(CHAT_FINAL_EXAMPLE)
    assert p.queue_s == pytest.approx((4883583458 - 1334875 - 342546000 - 4535599000) / 1e9)
    assert p.prefill_tok_s == pytest.approx(26 / 0.342546)
    assert p.decode_tok_s == pytest.approx(281 / 4.535599)
    assert p.ollama_decode_tok_s == pytest.approx(282 / 4.535599)
    assert p.done_reason == "stop"


def test_cache_hit_uses_only_computed_tokens_and_flags_ollamas_rate() -> None:
    p = split_response(CACHED_EXAMPLE)
    assert p.cached_tokens == 900
    assert p.prefill_tok_s == pytest.approx(100 / 0.05)  # 2,000 tok/s really computed
    assert p.ollama_prefill_tok_s == pytest.approx(1000 / 0.05)  # 20,000: ten times too high
    assert p.decode_tok_s == pytest.approx(100.0)
    assert "cache_hit" in p.flags
    assert "900 of 1000" in p.flag_text[Flag.CACHE_HIT]
    assert "cache_unknown" not in p.flags


def test_load_reply_has_no_rates_and_says_why() -> None:
    p = split_response(LOAD_REPLY)
    assert p.prefill_tok_s is None and p.decode_tok_s is None and p.queue_s is None
    assert {"load_only", "missing_metrics"} <= set(p.flags)


def test_one_token_reply_has_no_decode_rate() -> None:
    obj = dict(GENERATE_EXAMPLE, eval_count=1, eval_duration=15_000)
    p = split_response(obj)
    assert p.decode_tok_s is None
    assert p.ollama_decode_tok_s == pytest.approx(1 / 15e-6)  # Ollama's absurd 66,667 tok/s, kept beside
    assert "one_token_reply" in p.flags


def test_phases_longer_than_total_give_negative_queue_flagged_not_hidden() -> None:
    obj = dict(GENERATE_EXAMPLE, total_duration=5_000_000_000)
    p = split_response(obj)
    assert p.queue_s is not None and p.queue_s < 0
    assert "negative_queue" in p.flags


def test_absent_durations_mean_zero_and_missing_total_is_flagged() -> None:
    obj = {k: v for k, v in GENERATE_EXAMPLE.items() if k not in ("load_duration", "total_duration")}
    p = split_response(obj)
    assert p.load_s == 0.0
    assert p.queue_s is None
    assert "missing_total" in p.flags


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([1, 2], "JSON object"),
        ({"done": False, "response": "Hi"}, "not a final chunk"),
        ({"error": "model 'x' not found"}, "error"),
        (dict(GENERATE_EXAMPLE, eval_duration=-5), "negative"),
        (dict(GENERATE_EXAMPLE, total_duration=10**30), "absurd"),
        (dict(GENERATE_EXAMPLE, eval_count="12"), "integer"),
        (dict(GENERATE_EXAMPLE, eval_count=1.5), "integer"),
        (dict(GENERATE_EXAMPLE, eval_count=True), "integer"),
    ],
)
def test_bad_input_raises_the_clear_error(obj: object, message: str) -> None:
    with pytest.raises(PhaseSplitError, match=message):
        split_response(obj)


def _record(**kw: object) -> RequestRecord:
    base: dict[str, object] = dict(
        id="r1",
        started_at_unix_s=1_700_000_000.0,
        client_addr="127.0.0.1:5000",
        endpoint="/api/chat",
        model="llama3.2",
        stream=True,
        received_ns=1_000_000_000,
        forwarded_ns=1_001_000_000,
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_record_places_phases_on_the_proxy_clock() -> None:
    ms = 1_000_000
    received = 1_000_000_000
    # Tokens at +300, +310, +320, +330, +340, +390 ms; final chunk at +391 ms.
    chunks = [received + t * ms for t in (300, 310, 320, 330, 340, 390)]
    metrics = FinalMetrics(
        total_duration_ns=385 * ms,
        load_duration_ns=5 * ms,
        prompt_eval_count=200,
        prompt_eval_duration_ns=200 * ms,
        eval_count=6,
        eval_duration_ns=90 * ms,
        done_reason="stop",
    )
    rec = _record(
        first_byte_ns=chunks[0],
        first_token_ns=chunks[0],
        token_chunk_ns=chunks,
        final_chunk_ns=received + 391 * ms,
        closed_ns=received + 392 * ms,
        status_code=200,
        outcome=Outcome.OK,
        metrics=metrics,
    )
    p = split_record(rec)
    assert p.ttft_s == pytest.approx(0.300)
    assert p.client_s == pytest.approx(0.391)
    assert p.transport_s == pytest.approx(0.006)  # 391 ms seen by the client − 385 ms total_duration
    assert p.queue_s == pytest.approx(0.090)  # 385 − 5 − 200 − 90
    assert p.decode_tok_s == pytest.approx(5 / 0.090)
    assert p.itl_p50_ms == pytest.approx(10.0)
    assert p.itl_max_ms == pytest.approx(50.0)
    assert p.itl_p99_ms == pytest.approx(10 + 40 * 0.96)  # linear between the two largest of 5 gaps
    assert p.token_chunks == 6
    assert p.decode_end_ns == received + 391 * ms
    assert p.decode_start_ns == received + 301 * ms
    assert p.prefill_start_ns == received + 101 * ms
    assert p.load_start_ns == rec.forwarded_ns
    assert p.load_end_ns == rec.forwarded_ns + 5 * ms  # type: ignore[operator]
    assert p.flags == ["cache_unknown"]


def test_record_with_phases_longer_than_the_request_is_flagged() -> None:
    ms = 1_000_000
    received = 1_000_000_000
    metrics = FinalMetrics(
        total_duration_ns=900 * ms,
        prompt_eval_count=10,
        prompt_eval_duration_ns=700 * ms,
        eval_count=3,
        eval_duration_ns=150 * ms,
    )
    rec = _record(final_chunk_ns=received + 500 * ms, outcome=Outcome.OK, metrics=metrics)
    p = split_record(rec)
    assert "negative_transport" in p.flags  # Ollama says 900 ms, the proxy saw 500 ms
    assert "phases_exceed_request" in p.flags  # prefill would have begun before the request arrived
    assert p.transport_s == pytest.approx(-0.4)


def test_in_flight_record_gives_what_the_proxy_saw() -> None:
    received = 1_000_000_000
    rec = _record(first_token_ns=received + 250_000_000, token_chunk_ns=[received + 250_000_000, received + 270_000_000])
    p = split_record(rec)
    assert p.ttft_s == pytest.approx(0.25)
    assert p.token_chunks == 2
    assert p.itl_max_ms == pytest.approx(20.0)
    assert p.decode_tok_s is None
    assert p.flags == ["missing_metrics"]


def test_record_with_impossible_metrics_is_flagged_not_raised() -> None:
    rec = _record(metrics=FinalMetrics(eval_count=-3, eval_duration_ns=10), outcome=Outcome.OK, final_chunk_ns=2_000_000_000)
    p = split_record(rec)
    assert p.flags == ["invalid_metrics"]
    assert p.decode_tok_s is None and p.queue_s is None


# ---------------------------------------------------------------- the command


def _cli(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "analysis.phases", *args], input=stdin, capture_output=True, cwd=REPO, timeout=60, check=False
    )


def test_cli_prints_the_required_keys() -> None:
    proc = _cli(json.dumps(GENERATE_EXAMPLE).encode())
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    required = {
        "total_s",
        "load_s",
        "prefill_s",
        "decode_s",
        "queue_s",
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "prefill_tok_s",
        "decode_tok_s",
        "ollama_prefill_tok_s",
        "ollama_decode_tok_s",
        "flags",
    }
    assert required <= set(out)
    assert out["queue_s"] == pytest.approx(0.005809792)
    assert out["decode_tok_s"] == pytest.approx(258 / 4.23271)
    assert out["flags"] == ["cache_unknown"]


def test_cli_reads_the_last_line_of_an_ndjson_stream() -> None:
    lines = [json.dumps({"model": "m", "created_at": "t", "response": "Hi", "done": False}), json.dumps(CACHED_EXAMPLE)]
    proc = _cli(("\n".join(lines) + "\n").encode())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prefill_tok_s"] == pytest.approx(2000.0)


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        (b"not json", b"not JSON"),
        (b"", b"not JSON"),
        (b"\xff\xfe", b"UTF-8"),
        (json.dumps({"done": False}).encode(), b"not a final chunk"),
        (json.dumps(dict(GENERATE_EXAMPLE, load_duration=-1)).encode(), b"negative"),
        (json.dumps(dict(GENERATE_EXAMPLE, eval_count=10**12)).encode(), b"absurd"),
        (b"[" * 100_000, b"not JSON"),
    ],
)
def test_cli_bad_input_is_one_line_on_stderr_and_exit_2(stdin: bytes, message: bytes) -> None:
    proc = _cli(stdin)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert message in proc.stderr
    assert proc.stderr.count(b"\n") == 1 and proc.stderr.startswith(b"error: ")


def test_openai_endpoint_without_timings_says_why() -> None:
    rec = _record(endpoint="/v1/chat/completions", outcome=Outcome.OK, final_chunk_ns=2_000_000_000)
    p = split_record(rec)
    assert p.flags == ["no_server_timings"]
    assert "OpenAI-compatible" in p.flag_text[Flag.NO_SERVER_TIMINGS]
    assert (p.load_s, p.prefill_s, p.queue_s, p.load_source) == (None, None, None, None)
    cancelled = split_record(_record(outcome=Outcome.CANCELLED))
    assert "ended as cancelled" in cancelled.flag_text[Flag.MISSING_METRICS]


def test_every_flag_is_one_enum_member_with_a_meaning() -> None:
    """Flags come from one enum, each has a meaning, and a stored code reads back as its member."""
    assert set(FLAG_CODES) == set(Flag) and all(FLAG_CODES.values())
    p = split_response(
        {
            "done": True,
            "total_duration": 10,
            "load_duration": 0,
            "prompt_eval_count": 10,
            "prompt_eval_duration": 100,
            "eval_count": 1,
            "eval_duration": 0,
        }
    )
    assert p.flags and all(isinstance(code, Flag) for code in p.flags)
    assert [Flag(json_code) for json_code in json.loads(json.dumps(p.flags))] == p.flags
