"""The split of each kind of request (pure), the store's v6 migration of older rows, and the Requests detail."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from analysis.phases import Flag, PhaseSource, split_record
from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord
from pages.requests.view import headlines, sources_frame, thinking_frame, waterfall_spans
from store import queries
from store.ops import PutRequest, RederivePhases
from store.schema import MIGRATIONS, db_path
from store.tables import PHASES_VERSION
from store.writer import StoreWriter

MS = 1_000_000
T0 = 10_000 * MS


def _rec(**kw: object) -> RequestRecord:
    base: dict[str, object] = dict(
        id="r",
        started_at_unix_s=1_780_000_000.0,
        client_addr="127.0.0.1:1",
        endpoint="/api/generate",
        model="m",
        stream=True,
        received_ns=T0,
        forwarded_ns=T0 + MS,
        outcome=Outcome.OK,
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_cache_unknown_says_what_is_unknown_not_a_version() -> None:
    m = FinalMetrics(
        total_duration_ns=100 * MS,
        load_duration_ns=MS,
        prompt_eval_count=40,
        prompt_eval_duration_ns=20 * MS,
        eval_count=5,
        eval_duration_ns=40 * MS,
    )
    ph = split_record(_rec(metrics=m, final_chunk_ns=T0 + 101 * MS))
    text = ph.flag_text[Flag.CACHE_UNKNOWN]
    assert "0.33.3" not in text and "prompt_eval_cached_count" in text and "40 prompt tokens" in text


def test_a_load_reply_without_durations_is_timed_by_its_arrival_and_nothing_else_is_zero() -> None:
    rec = _rec(kind=RequestKind.LOAD, stream=False, metrics=FinalMetrics(done_reason="load"), final_chunk_ns=T0 + 501 * MS)
    ph = split_record(rec)
    assert (ph.load_s, ph.load_source) == (0.5, PhaseSource.STREAM)
    assert (ph.prefill_s, ph.decode_s, ph.queue_s, ph.total_s, ph.ttft_s) == (None,) * 5
    assert Flag.MISSING_METRICS not in ph.flags and Flag.NO_OUTPUT not in ph.flags
    # With Ollama's load_duration, that one.
    with_duration = split_record(
        _rec(
            kind=RequestKind.LOAD,
            metrics=FinalMetrics(load_duration_ns=420 * MS, done_reason="load"),
            final_chunk_ns=T0 + 501 * MS,
        )
    )
    assert (with_duration.load_s, with_duration.load_source) == (0.42, PhaseSource.OLLAMA)


def test_a_non_streamed_reply_has_a_server_side_first_token_only() -> None:
    m = FinalMetrics(
        total_duration_ns=300 * MS,
        load_duration_ns=10 * MS,
        prompt_eval_count=40,
        prompt_eval_cached_count=0,
        prompt_eval_duration_ns=90 * MS,
        eval_count=21,
        eval_duration_ns=180 * MS,
    )
    # An older row: the whole body was stamped as a token chunk.
    body_ns = T0 + 302 * MS
    rec = _rec(stream=False, metrics=m, first_token_ns=body_ns, token_chunk_ns=[body_ns], final_chunk_ns=body_ns)
    ph = split_record(rec)
    assert ph.ttft_s is None and ph.server_ttft_s == 0.12  # queue 20 + load 10 + prefill 90 ms
    assert headlines(rec, ph)[0].label == "First token (server side)"


def test_v1_thinking_reply_waterfall_and_detail() -> None:
    chunks = [T0 + (100 + 10 * i) * MS for i in range(30)]  # 10 thinking, then 20 answer chunks
    rec = _rec(
        endpoint="/v1/chat/completions",
        token_chunk_ns=chunks,
        first_token_ns=chunks[0],
        final_chunk_ns=chunks[-1] + MS,
        thinking_chunks=10,
        last_thinking_ns=chunks[9],
        first_answer_ns=chunks[10],
        metrics=FinalMetrics(done_reason="stop"),
    )
    ph = split_record(rec)
    assert (ph.thinking_tokens, ph.answer_tokens, ph.output_tokens) == (10, 20, 30)
    assert (round(ph.thinking_s or 0, 6), round(ph.answer_s or 0, 6), round(ph.decode_s or 0, 6)) == (0.1, 0.19, 0.29)
    assert ph.ttfa_s == 0.2 and ph.ttft_s == 0.1 and ph.thinking_tok_s == 100.0
    ollama, client, ttft_ms = waterfall_spans(rec, ph)
    assert ollama == []  # Ollama reported nothing on /v1
    assert [(s.label, s.start_ms, s.end_ms) for s in client] == [
        ("streaming thinking", 100.0, 200.0),
        ("streaming answer", 200.0, 391.0),
    ]
    assert ttft_ms == 100.0
    assert [h.label for h in headlines(rec, ph)][:2] == ["First token", "First answer token"]
    sources = dict(zip(sources_frame(ph)["phase"], sources_frame(ph)["from"], strict=True))
    assert sources["load"] == "not known" and sources["decode"] == "the stream's timing (proxy)"
    assert sources["output tokens"] == "chunks counted by the proxy"
    assert list(thinking_frame(ph)["part"]) == ["thinking", "answer"]


def test_v6_migration_finds_old_load_rows_and_rederives_them(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:5]:
        step(conn)
    conn.execute("PRAGMA user_version = 5")
    cols = (
        "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, forwarded_ns, final_chunk_ns, "
        "outcome, updated_at_unix_s, has_metrics, done_reason, load_s, prefill_s, decode_s"
    )
    # What v5 wrote for a load reply: 0.0 for every phase.
    conn.execute(
        f"INSERT INTO requests ({cols}) VALUES ('old-load', 1.0, 'c', '/api/generate', 'm', 1, {T0}, {T0 + MS}, "
        f"{T0 + 301 * MS}, 'ok', 1.0, 1, 'load', 0.0, 0.0, 0.0)"
    )
    conn.close()
    w = StoreWriter(path)
    w.write(PutRequest(_rec(id="new")))
    while w.write(RederivePhases()):
        pass
    w.close()
    with queries.open_reader(tmp_path) as reader:
        assert reader is not None
        stored = queries.request_detail(reader, "old-load")
        assert stored is not None and stored.phases_version == PHASES_VERSION
        assert stored.record.kind is RequestKind.LOAD and stored.record.thinking_chunks is None
        ph = stored.phases
        assert (ph.load_s, ph.load_source, ph.prefill_s, ph.decode_s) == (0.3, PhaseSource.STREAM, None, None)
