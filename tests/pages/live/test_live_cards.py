"""The Live page's cards and "now" strip from records and progress readings, and the collector's prefill estimate."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.progress import preferred
from analysis.records import FinalMetrics, Outcome, ProgressSource
from collectors.ollama.progress_estimate import (
    DEFAULT_TOKENS_PER_CHAR,
    ProgressEstimator,
    estimate,
    prefill_model,
    size_fit,
)
from collectors.proxy.request_facts import describe_request
from pages.live.cards import finished_cards, in_flight_cards, now_strip, prefill_view, spark
from pages.live.ui import estimate_note, phase_bar, sparkline_svg
from pages.live.view import load_cards
from store import queries
from store.ops import PutProgress, PutRequest
from store.queries import PromptHistoryRow
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.live_cards import BASE_NS, LOADED, NS, T0, reading, record


def test_runner_readings_win_over_estimates_for_the_same_request() -> None:
    samples = [
        reading("a", T0 + 1, 1000, ProgressSource.ESTIMATE, prompt=9000),
        reading("a", T0 + 2, 2000, ProgressSource.ESTIMATE, prompt=9000),
        reading("a", T0 + 1.5, 600, ProgressSource.SLOTS),
        reading("a", T0 + 2.5, 1400, ProgressSource.SLOTS),
    ]
    assert {s.source for s in preferred(samples)} == {ProgressSource.SLOTS}
    view = prefill_view(samples)
    assert view is not None and not view.estimated and view.source == "slots"
    assert view.processed_tokens == 1400 and view.prompt_tokens == 8000
    assert view.rate_tok_s == pytest.approx(800.0)  # between the runner's two readings
    assert view.eta_s == pytest.approx((8000 - 1400) / 800)
    assert view.fraction == pytest.approx(1400 / 8000)
    # Only estimates: they are shown, marked, with the estimate's own rate (a repeated reading does not slow it).
    only = prefill_view([*samples[:2], reading("a", T0 + 3, 2000, ProgressSource.ESTIMATE, prompt=9000)])
    assert only is not None and only.estimated and only.rate_tok_s == pytest.approx(1000.0)


def test_runner_rate_holds_between_its_batches() -> None:
    """/slots moves a batch (512 tokens) at a time and is read at 4 Hz: most readings repeat the last one."""
    steps = [(0.0, 0), (0.25, 0), (0.5, 512), (0.75, 512), (1.0, 512), (1.25, 1024), (1.5, 1024), (1.75, 1024)]
    view = prefill_view([reading("a", T0 + t, n, ProgressSource.SLOTS, prompt=4000) for t, n in steps])
    assert view is not None and not view.estimated and not view.size_estimated
    # From the first reading of progress to the reading that first showed 1,024: not 0 between two repeats, and
    # not slowed by the repeats after the count last moved.
    rate = (1024 - 512) / (1.25 - 0.5)
    assert view.rate_tok_s == pytest.approx(rate)
    assert view.eta_s == pytest.approx((4000 - 1024) / rate - 0.5), "seconds left after the latest reading"


def test_size_from_the_prompts_characters_is_marked_until_the_runner_says_it() -> None:
    """/slots gives no size while the prompt is read: the estimate's (from characters) is shown, marked."""
    samples = [
        reading("a", T0, 0, ProgressSource.ESTIMATE, prompt=4400),
        reading("a", T0 + 0.1, 0, ProgressSource.SLOTS, prompt=None),
        reading("a", T0 + 1.1, 512, ProgressSource.SLOTS, prompt=None),
        reading("a", T0 + 2.1, 1024, ProgressSource.SLOTS, prompt=None),
    ]
    view = prefill_view(samples)
    assert view is not None and view.source == "slots" and view.size_estimated
    assert view.prompt_tokens == 4400 and view.eta_s == pytest.approx((4400 - 1024) / 512)
    sized = prefill_view([*samples, reading("a", T0 + 3.1, 1536, ProgressSource.SLOTS, prompt=4001)])
    assert sized is not None and not sized.size_estimated and sized.prompt_tokens == 4001


def test_cached_prompt_tokens_are_not_left_to_read() -> None:
    view = prefill_view(
        [reading("a", T0, 100, ProgressSource.LOG), reading("a", T0 + 1, 600, ProgressSource.LOG, cached_tokens=3000)]
    )
    assert view is not None and view.prompt_tokens == 5000 and view.eta_s == pytest.approx(4400 / 500)


def test_cards_by_phase() -> None:
    now = T0 + 10
    recs = [
        record("dec", started=T0, tokens=[2 + 0.05 * i for i in range(100)]),  # 20 tok/s from 2 s to 7 s
        record("pre", started=T0 + 1),
        record("que", started=T0 + 2),
        record("load", "qwen2.5:0.5b", started=T0 + 3),
        record("load2", "qwen2.5:0.5b", started=T0 + 4),
    ]
    progress = {
        "dec": [reading("dec", T0 + 1.9, 7999, ProgressSource.SLOTS, ctx_used_tokens=8050, n_ctx=8192)],
        "pre": [reading("pre", now - 2, 1000, ProgressSource.SLOTS), reading("pre", now - 1, 3000, ProgressSource.SLOTS)],
    }
    cards = {c.request_id: c for c in in_flight_cards(recs, progress, LOADED, now, lambda m, ctx: 200.0 if ctx == 8050 else None)}
    dec = cards["dec"]
    assert dec.phase == "decoding" and dec.tokens_so_far == 100
    assert dec.ctx_used_tokens == 8050 and dec.n_ctx == 8192 and dec.decode_ceiling_tok_s == 200.0
    assert dec.silent_s == pytest.approx(now - T0 - (2 + 0.05 * 99), abs=0.01)  # no token for about 5 s
    assert sum(dec.spark_tok_s) == 100 and max(dec.spark_tok_s) == pytest.approx(20, abs=1)
    pre = cards["pre"]
    assert pre.phase == "prefill" and pre.prefill is not None and pre.prefill.rate_tok_s == pytest.approx(2000.0)
    que = cards["que"]  # the runner reads others of its model, not this one: it waits for a slot
    assert que.phase == "queued" and que.queue_position == 1 and que.waits_for == "a free slot of llama3.2:latest"
    assert cards["load"].phase == "loading" and cards["load"].queue_position is None
    assert cards["load2"].phase == "loading" and cards["load2"].queue_position == 2
    assert "qwen2.5:0.5b to load" in (cards["load2"].waits_for or "")
    strip = now_strip(list(cards.values()), [], now)
    assert strip.prefill_tok_s == pytest.approx(2000.0) and strip.waiting == 3
    assert strip.decode_tok_s is not None and strip.decode_tok_s == pytest.approx(0.0)  # silent for 3 s: 0 in the look-back


def test_without_runner_readings_a_token_less_request_waits_or_shows_the_estimate() -> None:
    now = T0 + 5
    recs = [record("a"), record("b", started=T0 + 1)]
    progress = {"a": [reading("a", T0 + 1, 100, ProgressSource.ESTIMATE), reading("a", T0 + 2, 300, ProgressSource.ESTIMATE)]}
    cards = {c.request_id: c for c in in_flight_cards(recs, progress, LOADED, now)}
    assert cards["a"].phase == "prefill" and cards["a"].prefill is not None and cards["a"].prefill.estimated
    assert cards["b"].phase == "waiting"  # neither queued nor prefilling can be told: said so


def test_reply_text_only_when_recorded_and_finished_cards() -> None:
    rec = record("t", tokens=[1, 1.1], response_text="<b>not bold</b>")
    (card,) = in_flight_cards([rec], {}, LOADED, T0 + 2)
    assert card.reply_text == "<b>not bold</b>"  # drawn with st.text: literal
    (plain,) = in_flight_cards([record("u", tokens=[1])], {}, LOADED, T0 + 2)
    assert plain.reply_text is None


def test_finished_cards_stay_a_few_seconds(tmp_path: Path) -> None:
    now = 1_900_000_000.0
    w = StoreWriter(db_path(tmp_path))
    try:
        done = record("f" * 32, started=now - 5, tokens=[1, 2, 3])
        done.outcome, done.final_chunk_ns = Outcome.OK, BASE_NS + 3 * NS
        done.metrics = FinalMetrics(3 * NS, 10_000_000, 500, None, 900_000_000, 3, 2 * NS, "stop")
        old = replace(done, id="o" * 32, started_at_unix_s=now - 60)
        w.write(PutRequest(done))
        w.write(PutRequest(old))
    finally:
        w.close()
    with queries.open_reader(db_path(tmp_path)) as conn:
        assert conn is not None
        rows = queries.recent_requests(conn, now - 600)
    cards = finished_cards(rows, now)
    assert [c.request_id for c in cards] == ["f" * 32]  # ended 2 s ago; the other a minute ago
    assert cards[0].phase == "finished" and set(cards[0].phase_s) >= {"prefill", "decode"}
    assert ":blue[" in phase_bar(cards[0].phase_s) and ":green[" in phase_bar(cards[0].phase_s)
    strip = now_strip([], rows, now)
    assert strip.prefill_share is not None and strip.decode_share is not None
    assert strip.prefill_share + strip.decode_share == pytest.approx(1.0)


def test_spark_and_svg() -> None:
    chunks = [BASE_NS + int(i * NS / 10) for i in range(50)]  # 10 tok/s for 5 s
    values = spark(chunks, BASE_NS + 5 * NS)
    assert values == (10.0,) * 5
    svg = sparkline_svg(values, 40.0)
    assert svg is not None and svg.startswith("<svg") and "stroke-dasharray" in svg  # the ceiling, dashed
    assert sparkline_svg((), 40.0) is None and sparkline_svg((3.0,), 40.0) is None


def test_prompt_chars_counted_without_keeping_text() -> None:
    chat = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "héllo"},
                {"role": "assistant", "content": [{"type": "text", "text": "abc"}]},
            ],
        }
    )
    facts = describe_request("/api/chat", chat.encode(), record_text=False)
    assert facts["prompt_chars"] == 8 and "prompt_text" not in facts
    gen = json.dumps({"model": "m", "prompt": "x" * 100, "system": "y" * 20}).encode()
    assert describe_request("/api/generate", gen, record_text=False)["prompt_chars"] == 120
    assert "prompt_chars" not in describe_request("/api/generate", b'{"model": "m"}', record_text=False)  # unknown: absent


def test_estimate_from_history_and_default() -> None:
    history = [
        PromptHistoryRow(4000, 1000, 0, 2000.0),
        PromptHistoryRow(8000, 2000, 0, 1800.0),
        PromptHistoryRow(None, 50, 0, 900.0),
    ]
    model = prefill_model(history)
    assert model.tokens_per_char_measured and model.tokens_per_char == pytest.approx(0.25)
    assert model.prefill_tok_s(1500) == pytest.approx(1800.0)  # fewer than 3 near ones and no ceilings: median of all
    rec = record("e", prompt_chars=40_000)
    s = estimate(rec, model, T0, T0 + 2, 8192)
    assert s is not None and s.source is ProgressSource.ESTIMATE
    assert s.prompt_tokens == 10_000 and s.processed_tokens == 3600 and s.n_ctx == 8192
    late = estimate(rec, model, T0, T0 + 60, None)
    assert late is not None and late.processed_tokens == 9_999  # never "done" before the first token
    assert estimate(record("t", tokens=[1], prompt_chars=10), model, T0, T0 + 1, None) is None  # decoding: no estimate
    assert estimate(record("n"), model, T0, T0 + 1, None) is None  # no prompt size: no estimate
    fresh = prefill_model([])
    assert not fresh.tokens_per_char_measured and fresh.tokens_per_char == DEFAULT_TOKENS_PER_CHAR
    assert fresh.prefill_tok_s(1000) is None


def test_the_templates_own_tokens_are_fitted_apart_from_the_texts() -> None:
    # Chats of 100 to 2,000 characters, each 30 template tokens + 0.25 a character. The ratio of the sums
    # (0.286) put a 40,000-character document at 11,440 tokens; it has 10,030.
    history = [PromptHistoryRow(c, 30 + c // 4, 0, 900.0) for c in (100, 400, 2000, 400)]
    model = prefill_model(history)
    assert model.template_tokens == pytest.approx(30) and model.tokens_per_char == pytest.approx(0.25)
    assert model.prompt_tokens(40_000) == 10_030
    s = estimate(record("d", prompt_chars=40_000), model, T0, T0 + 1, None)
    assert s is not None and s.prompt_tokens == 10_030  # the Live card's size is this one
    assert size_fit([(55, 100)]) is None  # one size: template and text cannot be told apart
    assert size_fit([(55, 100), (60, 120)]) is None  # sizes too alike (under MIN_FIT_SPREAD apart)
    assert size_fit([(10, 100), (300, 1000)]) is None  # a template of -22 tokens: not believed
    assert size_fit([(40, 100), (20, 1000)]) is None  # fewer tokens for more text: no fit
    fallback = prefill_model([PromptHistoryRow(100, 55, 0, 900.0)])
    assert fallback.template_tokens == 0 and fallback.tokens_per_char == pytest.approx(0.55)  # the ratio, as before


def test_estimator_writes_readings_the_store_keeps(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    now = [T0 + 3.0]
    w = StoreWriter(path)
    try:
        for i in range(3):
            done = record(f"{i}" * 32, started=T0 - 100 + i, tokens=[1], prompt_chars=4000)
            done.outcome, done.final_chunk_ns = Outcome.OK, BASE_NS + NS
            done.metrics = FinalMetrics(NS, 1, 1000, 0, 500_000_000, 1, 1, "stop")  # 1000 tokens at 2000 tok/s
            w.write(PutRequest(done))
        running = record("r" * 32, started=T0, prompt_chars=8000)
        running.forwarded_ns = BASE_NS
        w.write(PutRequest(running))
        est = ProgressEstimator(path, clock=lambda: now[0])
        (sample,) = est.samples([running], LOADED, [])
        assert sample.prompt_tokens == 2000 and sample.processed_tokens == 1999  # 3 s at 2000 tok/s, capped
        assert est.samples([running], {}, []) != []  # once started, an unloaded poll does not stop it
        assert est.samples([record("x" * 32, prompt_chars=10)], {}, []) == []  # its model is loading: nothing yet
        spelled: dict[str, int | None] = {"registry.ollama.ai/library/Llama3.2": 4096}  # by Ollama's name rules
        (other,) = est.samples([replace(running, id="s" * 32)], spelled, [])
        assert other.n_ctx == 4096
        w.write(PutProgress([sample]))
    finally:
        w.close()
    with queries.open_reader(path) as conn:
        assert conn is not None
        stored = queries.progress_samples(conn, ["r" * 32])["r" * 32]
        assert stored == [sample]
        assert queries.prompt_history(conn, "llama3.2:latest")[0].prompt_chars == 4000


def test_estimate_note_says_how_the_prompt_size_was_had() -> None:
    rec = record("e", prompt_chars=40_000)
    progress = {"e": [reading("e", T0 + 1, 100, ProgressSource.ESTIMATE, prompt=10_000)]}
    (card,) = in_flight_cards([rec], progress, LOADED, T0 + 2)
    assert "40,000 characters × 0.25 tokens per character (the default" in estimate_note(card, False)
    assert "(measured on this model's requests)" in estimate_note(card, True)
    runner = {"e": [reading("e", T0 + 1, 100, ProgressSource.LOG)]}
    (read,) = in_flight_cards([rec], runner, LOADED, T0 + 2)
    assert estimate_note(read, True) == ""  # the runner's reading: nothing estimated


def test_load_cards_reads_what_the_cards_need(tmp_path: Path) -> None:
    now = time.time()  # the writer stamps rows with the wall clock; in-flight rows older than 30 s are left out
    w = StoreWriter(db_path(tmp_path))
    try:
        done = record("d" * 32, started=now - 30, tokens=[4, 5], prompt_chars=400)
        done.outcome, done.final_chunk_ns = Outcome.OK, BASE_NS + 5 * NS
        done.metrics = FinalMetrics(5 * NS, 3 * NS, 100, None, NS // 2, 2, NS, "stop")  # a 3 s load
        w.write(PutRequest(done))
        running = record("r" * 32, started=now - 1, prompt_chars=800)
        w.write(PutRequest(running))
    finally:
        w.close()
    snap = load_cards(db_path(tmp_path), now, 300.0)
    assert snap is not None and [r.id for r in snap.in_flight] == ["r" * 32]
    assert snap.in_flight[0].prompt_chars == 800  # the v7 column, read back
    assert snap.last_load_s == {"llama3.2:latest": pytest.approx(3.0)}  # not loaded now: its last load is shown
    assert snap.chars_measured == {"llama3.2:latest": True}
    assert snap.requests_in_window == 2


def test_a_model_spelled_otherwise_is_still_the_loaded_one() -> None:
    """Ollama's name rules (analysis.model_names), not a ``:latest`` suffix: case, host and namespace left out."""
    loaded: dict[str, int | None] = {"registry.ollama.ai/library/llama3.2:latest": 4096}
    (card,) = in_flight_cards([record("a", "Llama3.2")], {}, loaded, T0 + 2)
    assert card.phase == "waiting" and card.n_ctx == 4096  # not "loading"; its context is the loaded one's
