"""What the runner's readings fill in for a /v1 generation (pure), and the store splitting a finished /v1 row again
when its last readings arrive after it (the collector drains them on the next tick)."""

from __future__ import annotations

from pathlib import Path

from analysis.phases import Flag, PhaseSource
from analysis.records import Outcome, ProgressSample, ProgressSource, RequestRecord
from analysis.runner_fill import split_with_readings
from store import queries
from store.ops import PutProgress, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

MS = 1_000_000
T0 = 10_000 * MS
START_S = 1_780_000_000.0


def _rec(**kw: object) -> RequestRecord:
    """A streamed /v1 chat: forwarded at 1 ms, first token at 1,001 ms, 5 chunks 20 ms apart."""
    chunks = [T0 + (1001 + 20 * i) * MS for i in range(5)]
    base: dict[str, object] = dict(
        id="v1",
        started_at_unix_s=START_S,
        client_addr="127.0.0.1:1",
        endpoint="/v1/chat/completions",
        model="m",
        stream=True,
        received_ns=T0,
        forwarded_ns=T0 + MS,
        first_token_ns=chunks[0],
        token_chunk_ns=chunks,
        final_chunk_ns=chunks[-1],
        outcome=Outcome.OK,
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def _slot(
    at_ms: float, processed: int, decoded: int | None = None, source: ProgressSource = ProgressSource.SLOTS
) -> ProgressSample:
    return ProgressSample("v1", START_S + at_ms / 1e3, source, processed, cached_tokens=100, decoded_tokens=decoded)


# 1,000 uncached tokens (100 cached): 250 read at 401 ms, 1,000 done at the first token (1,001 ms): 600 ms for 750 tokens.
READINGS = [_slot(401, 250), _slot(701, 625), _slot(1101, 1000, decoded=3)]


def test_prefill_runs_from_the_readings_rate_back_to_the_first_reading_and_ends_at_the_first_token() -> None:
    ph = split_with_readings(_rec(), READINGS)
    assert (ph.prompt_tokens, ph.prompt_tokens_source, ph.cached_tokens) == (1100, PhaseSource.SLOTS, 100)
    assert ph.prefill_source is PhaseSource.SLOTS and ph.prefill_s is not None
    assert abs(ph.prefill_s - 0.8) < 1e-6  # 600 ms for the last 750 tokens: 800 ms for 1,000
    assert ph.prefill_tok_s is not None and abs(ph.prefill_tok_s - 1250) < 1e-3
    assert ph.decode_start_ns == T0 + 1001 * MS and ph.prefill_start_ns is not None
    assert abs(ph.prefill_start_ns - (T0 + 201 * MS)) < 1_000  # wall-clock seconds as floats: within a µs
    assert (ph.load_s, ph.queue_s) == (None, None)
    assert "prefill is timed from the runner's slots readings" in ph.flag_text[Flag.NO_SERVER_TIMINGS]


def test_what_the_readings_do_not_bound_stays_unknown() -> None:
    # The first reading already shows the whole prompt read: no start is bounded.
    ph = split_with_readings(_rec(), [_slot(901, 1000), READINGS[-1]])
    assert ph.prompt_tokens == 1100 and ph.prefill_s is None and ph.prefill_source is None
    # A whole body has no first chunk to end prefill at: counts only.
    body = split_with_readings(_rec(stream=False, token_chunk_ns=[], first_token_ns=None), READINGS)
    assert body.prompt_tokens == 1100 and body.prefill_s is None
    # Estimates are not readings; a native route has Ollama's own numbers.
    assert split_with_readings(_rec(), [_slot(401, 250, source=ProgressSource.ESTIMATE)]).prompt_tokens is None
    assert split_with_readings(_rec(endpoint="/api/chat"), READINGS).prompt_tokens is None
    # Never before the request was forwarded: a start extrapolated earlier is held at the forwarding time.
    early = split_with_readings(_rec(), [_slot(10, 10), READINGS[-1]])
    assert early.prefill_start_ns == T0 + MS and early.prefill_s is not None and abs(early.prefill_s - 1.0) < 1e-6


def test_a_reading_of_the_slot_waiting_for_its_first_batch_times_the_start() -> None:
    """llama-server answers /slots between batches: a reading with the request's slot holding it and nothing read
    yet was taken just before its first batch, so prefill starts there rather than where the rate extrapolates."""
    waiting = _slot(151, 0)
    ph = split_with_readings(_rec(), [waiting, *READINGS])
    assert ph.prefill_start_ns is not None and abs(ph.prefill_start_ns - (T0 + 151 * MS)) < 1_000
    assert ph.prefill_s is not None and abs(ph.prefill_s - 0.85) < 1e-6 and ph.prefill_source is PhaseSource.SLOTS
    # With it, a prompt read whole by the next reading is timed too; a waiting reading after progress is not one.
    assert split_with_readings(_rec(), [waiting, _slot(901, 1000), READINGS[-1]]).prefill_s is not None
    late = split_with_readings(_rec(), [READINGS[0], _slot(501, 0), *READINGS[1:]])
    assert late.prefill_s is not None and abs(late.prefill_s - 0.8) < 1e-6
    # Never before the request was forwarded.
    early = split_with_readings(_rec(), [_slot(-50, 0), *READINGS])
    assert early.prefill_start_ns == T0 + MS


def test_readings_written_after_the_finished_row_fill_it_in(tmp_path: Path) -> None:
    w = StoreWriter(db_path(tmp_path))
    w.write(PutRequest(_rec(outcome=Outcome.IN_FLIGHT, final_chunk_ns=None)))
    w.write(PutProgress(READINGS[:2]))  # read while the prompt was read
    w.write(PutRequest(_rec()))  # finished: the prompt's size is not known yet
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None
        before = queries.request_detail(conn, "v1")
    assert before is not None and before.phases.prompt_tokens is None and before.phases.prefill_s is None
    w.write(PutProgress([READINGS[-1]]))  # the next tick: the reading after decoding began
    w.close()
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None
        after = queries.request_detail(conn, "v1")
    assert after is not None and after.phases.prompt_tokens == 1100
    assert after.phases.prefill_s is not None and abs(after.phases.prefill_s - 0.8) < 1e-3
    assert after.phases.prefill_source is PhaseSource.SLOTS
