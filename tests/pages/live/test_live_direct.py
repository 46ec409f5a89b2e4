"""A generation sent to Ollama directly (recorded from its runner) gets a card like a proxied one: prompt progress
and tokens written from the runner's readings, marked direct (pure: no store)."""

from __future__ import annotations

import pytest

from analysis.records import ProgressSource, RequestRecord, SeenFrom
from pages.live.cards import in_flight_cards
from pages.live.timeline import UNKNOWN_CLIENT, UNKNOWN_ROUTE
from tests.support.live_cards import LOADED, T0, reading, record

SMALL = "llama3.2:latest"


def direct(rid: str) -> RequestRecord:
    return record(rid, SMALL, seen_from=SeenFrom.RUNNER, client_addr=None, endpoint=None, stream=None)


def test_a_direct_generation_reading_its_prompt_has_the_runners_progress() -> None:
    rec = direct("runner-1")
    progress = {
        "runner-1": [
            reading("runner-1", T0 + 0.5, 512, ProgressSource.SLOTS),
            reading("runner-1", T0 + 1.5, 2560, ProgressSource.SLOTS),
        ]
    }
    (card,) = in_flight_cards([rec], progress, LOADED, T0 + 1.6)
    assert card.direct and card.phase == "prefill" and card.prefill is not None and not card.prefill.estimated
    assert card.prefill.processed_tokens == 2560 and card.prefill.fraction == pytest.approx(2560 / 8000)
    assert card.prefill.rate_tok_s == pytest.approx(2048.0)
    assert card.client == UNKNOWN_CLIENT and card.endpoint == UNKNOWN_ROUTE  # not known, never guessed


def test_a_direct_generation_writing_has_the_runners_token_count_and_rate() -> None:
    rec = direct("runner-2")
    # Read at 4 Hz: 20 tokens a second from T0 + 2 to T0 + 5.
    samples = [reading("runner-2", T0 + 1.9, 8000, ProgressSource.SLOTS, ctx_used_tokens=8000, n_ctx=8192)]
    samples += [
        reading("runner-2", T0 + 2 + 0.25 * k, 8000, ProgressSource.SLOTS, decoded_tokens=1 + 5 * k, ctx_used_tokens=8001 + 5 * k)
        for k in range(13)
    ]
    (card,) = in_flight_cards([rec], {"runner-2": samples}, LOADED, T0 + 5.1, lambda m, ctx: 100.0)
    assert card.direct and card.phase == "decoding"
    assert card.tokens_so_far == 61 and card.ctx_used_tokens == 8061 and card.n_ctx == 8192
    assert card.live_tok_s == pytest.approx(20.0, rel=0.05)
    assert card.decode_ceiling_tok_s == 100.0
    assert sum(card.spark_tok_s) >= 55 and max(card.spark_tok_s) <= 25  # about 20 in each whole second
    assert card.silent_s is None  # gaps between tokens: only the proxy sees them
    # The runner's readings stop (the task stalls, or its polls do): 0 tok/s, not the old rate.
    (stalled,) = in_flight_cards([rec], {"runner-2": samples}, LOADED, T0 + 9, lambda m, ctx: 100.0)
    assert stalled.live_tok_s == 0.0


def test_a_direct_task_makes_a_proxied_request_wait_for_a_slot_not_a_load() -> None:
    """The runner works on a direct task: its model is loaded even before /api/ps says so; a proxied request of
    that model with no reading waits for a free slot."""
    recs = [direct("runner-3"), record("p", SMALL, started=T0 + 1)]
    cards = {c.request_id: c for c in in_flight_cards(recs, {}, {}, T0 + 3)}
    assert cards["runner-3"].phase == "waiting" and cards["runner-3"].direct
    assert cards["p"].phase == "queued" and not cards["p"].direct
