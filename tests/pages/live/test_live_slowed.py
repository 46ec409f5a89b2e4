"""Live's "slowed" line (pages.live.slowed): a running card another request's prompt is read beside, named while
it happens; not a queued one, not one on another model, not when the slot count is not known for a waiting one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analysis.phases import Phases
from analysis.records import Outcome, RequestRecord
from pages.live.cards import Card, PrefillView
from pages.live.queue import SlotCount
from pages.live.slowed import finished_phases, slowed_cards
from store.rows import request_row
from store.tables import PHASES_VERSION, RequestSummary

NOW = 1_800_000_100.0
TWO = {"gemma3:270m": SlotCount(2, "the runner's -np")}


def card(rid: str, phase: str, started: float | None, *, model: str = "gemma3:270m", prompt: int | None = None) -> Card:
    view = PrefillView(1000, prompt, 400.0, 10.0, False, "slots") if phase == "prefill" else None
    return Card(rid, model, "127.0.0.1:5000", "/api/chat", phase, 5.0, prefill=view, phase_started_unix_s=started)


def test_a_decoding_reply_beside_a_long_prompt_says_so() -> None:
    long = card("long", "prefill", NOW - 4.0, prompt=5304)
    chat = card("chat", "decoding", NOW - 6.0)
    out = {c.request_id: c for c in slowed_cards([long, chat], TWO, NOW)}
    assert out["chat"].slowed_by == "slowed: another request's 5,304-token prompt is being read"
    assert out["long"].slowed_by is None  # the long prompt is not slowed by itself


def test_a_chat_waiting_with_a_slot_free_says_so_but_not_a_queued_one() -> None:
    long = card("long", "prefill", NOW - 4.0, prompt=5304)
    waiting = card("w", "waiting", None)
    queued = card("q", "queued", None)
    out = {c.request_id: c for c in slowed_cards([long, waiting, queued], TWO, NOW)}
    assert out["w"].slowed_by is not None and out["q"].slowed_by is None
    # Slots not known: a wait beside another prompt may be a queue, so nothing is said.
    assert slowed_cards([long, waiting], {}, NOW)[1].slowed_by is None


def test_another_model_or_no_prompt_being_read_says_nothing() -> None:
    other_model = card("long", "prefill", NOW - 4.0, model="llama3.2:latest", prompt=5304)
    chat = card("chat", "decoding", NOW - 6.0)
    assert slowed_cards([other_model, chat], TWO, NOW)[1].slowed_by is None
    decoding = card("long", "decoding", NOW - 4.0)
    assert slowed_cards([decoding, chat], TWO, NOW)[1].slowed_by is None


def test_of_two_prompts_read_at_once_only_the_newer_is_slowed() -> None:
    long = card("long", "prefill", NOW - 4.0, prompt=5304)
    short = card("short", "prefill", NOW - 1.0, prompt=20)
    out = {c.request_id: c for c in slowed_cards([long, short], TWO, NOW)}
    assert out["short"].slowed_by is not None and out["long"].slowed_by is None


def test_a_finished_cards_wait_is_told_in_its_parts() -> None:
    """The finished card's phase bar: "behind others" for the wait beside another prompt with a slot free, not a
    queue; without a slot count, nothing replaces Ollama's one figure."""
    t0 = NOW - 30.0
    long = summary("long", t0, prefill=(t0, t0 + 20.0), end=t0 + 21.0, tokens=5304)
    short = summary("short", t0 + 2.0, prefill=(t0 + 20.0, t0 + 20.2), end=t0 + 22.0, tokens=9)
    got = finished_phases([long, short], TWO, NOW)
    assert got["short"]["queue"] == 0.0 and got["short"]["behind others"] == pytest.approx(18.0)
    assert finished_phases([long, short], {}, NOW) == {}
    one = {"gemma3:270m": SlotCount(1, "the runner's -np")}
    assert finished_phases([long, short], one, NOW)["short"]["queue"] == pytest.approx(18.0)


def summary(rid: str, started: float, *, prefill: tuple[float, float], end: float, tokens: int) -> RequestSummary:
    rec = RequestRecord(
        id=rid, started_at_unix_s=started, client_addr="127.0.0.1", endpoint="/api/chat", model="gemma3:270m", stream=True
    )
    row = request_row(rec, Phases(), started, PHASES_VERSION)
    return replace(
        row,
        outcome=Outcome.OK,
        ended_at_unix_s=end,
        queue_s=prefill[0] - started,
        prefill_start_unix_s=prefill[0],
        decode_start_unix_s=prefill[1],
        decode_end_unix_s=end,
        prompt_tokens=tokens,
        cached_tokens=0,
    )
