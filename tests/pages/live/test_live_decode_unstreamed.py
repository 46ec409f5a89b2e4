"""A request not streamed to its client shows no chunk to the proxy while its runner decodes: its Live card's phase
and token count come from what the runner says now (/slots n_decoded, else the log's n_gen), as a direct request's
do (issue 40 item 2: such a request stood as "reading the prompt (prefill) · 737 of 737 read" while the runner had
decoded 2,489 tokens at ~15 tok/s). Pure: no store."""

from __future__ import annotations

import pytest

from analysis.records import ProgressSample, ProgressSource
from pages.live.cards import in_flight_cards, now_strip, rate_so_far_tok_s
from tests.support.live_cards import LOADED, T0, reading, record

PROMPT = 737
RATE_TOK_S = 15.0


def unstreamed_decoding(rid: str, decoded_at_end: int, source: ProgressSource = ProgressSource.SLOTS) -> list[ProgressSample]:
    """The prompt read by T0 + 2 (two /slots readings), then one reading a second of the reply's count at 15 tok/s
    until ``decoded_at_end`` tokens."""
    rows = [
        reading(rid, T0 + 1, 512, source, prompt=PROMPT),
        reading(rid, T0 + 2, PROMPT, source, prompt=PROMPT),
    ]
    seconds = int(decoded_at_end / RATE_TOK_S)
    rows += [
        reading(rid, T0 + 3 + k, PROMPT, source, prompt=PROMPT, decoded_tokens=round(RATE_TOK_S * (k + 1)))
        for k in range(seconds)
    ]
    return rows


def test_a_request_not_streamed_is_decoding_with_the_runners_count_and_rate_so_far() -> None:
    rec = record("p1", stream=False, endpoint="/api/chat")
    samples = unstreamed_decoding("p1", 2489)
    now = samples[-1].ts_unix_s + 0.4
    (card,) = in_flight_cards([rec], {"p1": samples}, LOADED, now, lambda m, ctx: 100.0)
    assert card.phase == "decoding", card
    assert card.prefill is None
    assert card.tokens_so_far == samples[-1].decoded_tokens and card.tokens_so_far > 2400
    assert card.counted_by_runner and not card.direct
    assert card.rate_so_far_tok_s == pytest.approx(RATE_TOK_S, rel=0.02)
    assert card.live_tok_s == pytest.approx(RATE_TOK_S, rel=0.05)
    assert card.endpoint == "/api/chat" and card.client == "127.0.0.1:5000"  # the proxy's, kept
    # The "now" strip: this reply's rate, and the last minute's time in decode, not all in prefill.
    strip = now_strip([card], [], now)
    assert strip.decode_tok_s == pytest.approx(RATE_TOK_S, rel=0.05)
    assert strip.decode_share is not None and strip.decode_share > 0.9


def test_the_logs_count_serves_when_slots_are_not_read() -> None:
    rec = record("p2", stream=False)
    samples = unstreamed_decoding("p2", 300, ProgressSource.LOG)
    (card,) = in_flight_cards([rec], {"p2": samples}, LOADED, samples[-1].ts_unix_s + 0.2)
    assert card.phase == "decoding" and card.tokens_so_far == samples[-1].decoded_tokens


def test_before_the_first_decoded_token_it_is_still_prefill() -> None:
    rec = record("p3", stream=False)
    samples = unstreamed_decoding("p3", 0)
    (card,) = in_flight_cards([rec], {"p3": samples}, LOADED, T0 + 2.5)
    assert card.phase == "prefill" and card.prefill is not None and card.prefill.processed_tokens == PROMPT


def test_a_streamed_request_counts_its_own_chunks() -> None:
    """Chunks the proxy saw stay the count (the runner's readings lag them); the rate so far from the chunks."""
    rec = record("s", tokens=[2 + 0.1 * k for k in range(11)])
    samples = unstreamed_decoding("s", 30)
    (card,) = in_flight_cards([rec], {"s": samples}, LOADED, T0 + 3.1)
    assert card.phase == "decoding" and card.tokens_so_far == 11 and not card.counted_by_runner
    assert card.rate_so_far_tok_s == pytest.approx(10.0)


def test_rate_so_far_is_unknown_until_two_counts_apart() -> None:
    assert rate_so_far_tok_s([]) is None
    assert rate_so_far_tok_s([(T0, 5)]) is None
    assert rate_so_far_tok_s([(T0, 5), (T0, 9)]) is None
    assert rate_so_far_tok_s([(T0, 5), (T0 + 2, 5)]) == 0.0  # counted twice, nothing written between: measured
    assert rate_so_far_tok_s([(T0, 5), (T0 + 1, 20), (T0 + 2, 25)]) == pytest.approx(10.0)
