"""Per model, how many wait and how many run, and each waiting card's place in line ("waiting: 2 ahead, both slots
busy"): from the proxy's open requests, the runner's readings and its slot count."""

from __future__ import annotations

from analysis.records import ProgressSource
from pages.live.cards import in_flight_cards
from pages.live.queue import SlotCount, queue_caption, queue_cards
from pages.live.ui import queue_lines
from tests.support.live_cards import LOADED, T0, reading, record

MODEL = "llama3.2:latest"


def test_two_slots_busy_three_wait_in_the_order_they_came() -> None:
    now = T0 + 5
    recs = [
        record("a", started=T0, tokens=[0.5 + 0.05 * i for i in range(20)]),
        record("b", started=T0 + 0.1, tokens=[0.6 + 0.05 * i for i in range(20)]),
        *(record(f"w{k}", started=T0 + 0.2 + k) for k in range(3)),
    ]
    # The collector's estimate of each waiting prompt has run to its end: no token came all the same.
    progress = {f"w{k}": [reading(f"w{k}", now - 0.2, 9, ProgressSource.ESTIMATE, prompt=10)] for k in range(3)}
    cards = in_flight_cards(recs, progress, LOADED, now)
    cards, queues = queue_cards(cards, {MODEL: SlotCount(2, "the runner's -np")})
    by_id = {c.request_id: c for c in cards}
    assert [by_id[f"w{k}"].phase for k in range(3)] == ["queued"] * 3
    assert [queue_caption(by_id[f"w{k}"]) for k in range(3)] == [
        "waiting: next in line, both slots busy",
        "waiting: 1 ahead, both slots busy",
        "waiting: 2 ahead, both slots busy",
    ]
    (q,) = queues
    assert (q.model, q.running, q.waiting) == (MODEL, 2, 3)
    assert queue_lines(queues) == [r"**llama3\.2\:latest** · 2 running · **3 waiting** · 2 slots (the runner's -np)"]


def test_a_free_slot_lets_the_first_undecided_read_its_prompt() -> None:
    now = T0 + 5
    recs = [record("a", started=T0, tokens=[0.5, 0.6]), record("b", started=T0 + 1), record("c", started=T0 + 2)]
    cards, queues = queue_cards(in_flight_cards(recs, {}, LOADED, now), {MODEL: SlotCount(2, "the runner's -np")})
    by_id = {c.request_id: c for c in cards}
    assert by_id["b"].phase != "queued"  # a slot is free: it is reading its prompt
    assert by_id["c"].phase == "queued" and queue_caption(by_id["c"]) == "waiting: next in line, both slots busy"
    assert (queues[0].running, queues[0].waiting) == (2, 1)


def test_slots_unknown_a_prompt_still_being_read_is_not_counted_waiting() -> None:
    now = T0 + 5
    recs = [record("a", started=T0, tokens=[0.5, 0.6]), record("b", started=T0 + 4), record("c", started=T0 + 1)]
    progress = {
        "b": [reading("b", T0 + 4.5, 100, ProgressSource.ESTIMATE, prompt=8000)],  # a long prompt, being read
        "c": [reading("c", T0 + 1.5, 49, ProgressSource.ESTIMATE, prompt=50)],  # read long ago: waits
    }
    cards, queues = queue_cards(in_flight_cards(recs, progress, LOADED, now), {})
    by_id = {c.request_id: c for c in cards}
    assert by_id["b"].phase == "prefill" and by_id["c"].phase == "queued"
    assert queue_caption(by_id["c"]) == "waiting: next in line, 2 running (how many slots it has is not known)"
    assert (queues[0].running, queues[0].waiting, queues[0].slots) == (2, 1, None)


def test_one_slot_and_a_model_alone_reading_its_prompt() -> None:
    now = T0 + 3
    cards, queues = queue_cards(in_flight_cards([record("a", started=T0)], {}, LOADED, now), {})
    assert cards[0].phase == "waiting" and queue_caption(cards[0]) is None  # nothing runs: it cannot be queued
    assert (queues[0].running, queues[0].waiting) == (1, 0)
    one = in_flight_cards([record("a", started=T0, tokens=[1.0]), record("b", started=T0 + 1)], {}, LOADED, now)
    cards, _ = queue_cards(one, {MODEL: SlotCount(1, "the runner's -np")})
    assert queue_caption(cards[1]) == "waiting: next in line, its only slot busy"
