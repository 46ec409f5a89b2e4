"""What a generation waits for, told apart on its card: a free slot, another model's load, room (another model must
finish and be unloaded), or its own model's load; each with the time spent in that state (pure: no store)."""

from __future__ import annotations

import pytest

from analysis.records import ProgressSource, RequestRecord
from pages.live.cards import Card, LoadContext, in_flight_cards
from tests.support.live_cards import T0, reading, record

GB = 10**9
SMALL = "llama3.2:latest"
BIG = "llama3.1:8b"


def cards_at(
    now: float, recs: list[RequestRecord], loaded: dict[str, int | None], loads: LoadContext | None = None
) -> dict[str, Card]:
    return {c.request_id: c for c in in_flight_cards(recs, {}, loaded, now, loads=loads)}


def test_a_request_behind_another_models_load_waits_for_it_then_loads_its_own() -> None:
    """The case a new user met: 20 s behind another model's load, the card said "loading the model · 21 s"."""
    recs = [record("a", BIG, started=T0), record("b", SMALL, started=T0 + 1)]
    # 21 s in: BIG still loading, nothing loaded.
    cards = cards_at(T0 + 22, recs, {})
    assert cards["a"].phase == "loading" and cards["a"].state_s == pytest.approx(22)
    b = cards["b"]
    assert b.phase == "other_load" and b.state_s == pytest.approx(21)
    assert b.waits_for is not None and BIG in b.waits_for and SMALL not in b.waits_for
    # BIG appeared in /api/ps at T0 + 21 and decodes; SMALL's own load began then: 0.7 s of loading, not 21.7 s.
    recs[0] = record("a", BIG, started=T0, tokens=[21.5])
    loads = LoadContext(loaded_since_unix_s={BIG: T0 + 21})
    cards = cards_at(T0 + 21.7, recs, {BIG: 8192}, loads)
    b = cards["b"]
    assert b.phase == "loading" and b.state_s == pytest.approx(0.7) and b.elapsed_s == pytest.approx(20.7)
    assert b.phase_started_unix_s == pytest.approx(T0 + 21)
    # BIG writes before the next /api/ps poll lists it: its first token already says its load ended.
    b = cards_at(T0 + 21.7, recs, {})["b"]
    assert b.phase == "loading" and b.state_s == pytest.approx(0.2)


def test_a_wait_that_ended_with_a_short_generation_is_not_counted_as_the_own_load() -> None:
    """BIG loaded at T0 + 21, wrote its few tokens and finished before any /api/ps listing of it was stored: its
    finished request's first token says when its load ended (a CI run showed 6.9 s of "loading" 0.35 s in)."""
    recs = [record("b", SMALL, started=T0 + 1)]
    assert cards_at(T0 + 21.7, recs, {})["b"].state_s == pytest.approx(20.7), "without it: the whole wait"
    finished = LoadContext(served_unix_s=((BIG, T0 + 21.1, T0 + 21.3),))
    b = cards_at(T0 + 21.7, recs, {}, finished)["b"]
    assert b.phase == "loading" and b.state_s == pytest.approx(0.6) and b.phase_started_unix_s == pytest.approx(T0 + 21.1)
    # A request that finished before the running ones came says nothing of their waits.
    earlier = LoadContext(served_unix_s=((BIG, T0 - 60, T0 - 59),))
    assert cards_at(T0 + 21.7, recs, {}, earlier)["b"].state_s == pytest.approx(20.7)


def test_requests_for_the_model_being_loaded_wait_for_that_load() -> None:
    recs = [record("a", BIG, started=T0), record("a2", BIG, started=T0 + 2), record("c", SMALL, started=T0 + 3)]
    cards = cards_at(T0 + 5, recs, {})
    assert cards["a2"].phase == "loading" and cards["a2"].queue_position == 2
    assert cards["c"].phase == "other_load"  # behind BIG, whichever of BIG's requests came first


def test_waiting_for_a_free_slot_is_not_a_load() -> None:
    recs = [record("a", SMALL, started=T0, tokens=[0.5, 0.6]), record("b", SMALL, started=T0 + 1)]
    cards = cards_at(T0 + 4, recs, {SMALL: 8192})
    assert cards["b"].phase == "queued" and cards["b"].state_s == pytest.approx(3)
    assert cards["b"].waits_for == f"a free slot of {SMALL}"


def test_no_room_while_another_model_is_busy_is_a_wait_for_its_unload() -> None:
    """BIG needs 4.9 GB at least, 2 GB were free when its turn came, SMALL is loaded and writing: Ollama waits for
    SMALL's generation to end to unload it."""
    recs = [record("s", SMALL, started=T0, tokens=[0.3, 0.4]), record("big", BIG, started=T0 + 1)]
    loads = LoadContext(model_size_bytes={BIG: int(4.9 * GB)}, vram_free_bytes=((T0 + 0.5, 2 * GB), (T0 + 3, 2 * GB)))
    cards = cards_at(T0 + 6, recs, {SMALL: 8192}, loads)
    big = cards["big"]
    assert big.phase == "unload_wait" and big.state_s == pytest.approx(5)
    assert big.waits_for is not None and SMALL in big.waits_for
    assert big.room_bytes == (int(4.9 * GB), 2 * GB)
    # Room enough: it is its own load.
    roomy = LoadContext(model_size_bytes={BIG: int(4.9 * GB)}, vram_free_bytes=((T0, 20 * GB),))
    assert cards_at(T0 + 6, recs, {SMALL: 8192}, roomy)["big"].phase == "loading"
    # Memory unknown (no GPU reading, or no size): never claimed.
    assert cards_at(T0 + 6, recs, {SMALL: 8192}, LoadContext(model_size_bytes={BIG: 5 * GB}))["big"].phase == "loading"
    # The other model idle (nothing of it running): Ollama unloads it at once, no wait for it.
    idle = [record("big", BIG, started=T0 + 1)]
    assert cards_at(T0 + 6, idle, {SMALL: 8192}, loads)["big"].phase == "loading"


def test_free_memory_is_read_when_the_load_began_not_while_it_fills_the_gpu() -> None:
    loads = LoadContext(model_size_bytes={BIG: 5 * GB}, vram_free_bytes=((T0, 20 * GB), (T0 + 3, 1 * GB)))
    assert loads.free_at(T0 + 1) == 20 * GB and loads.free_at(T0 + 4) == GB and loads.free_at(T0 - 5) == 20 * GB
    assert LoadContext().free_at(T0) is None
    recs = [record("s", SMALL, started=T0, tokens=[0.3]), record("big", BIG, started=T0 + 1)]
    assert cards_at(T0 + 5, recs, {SMALL: 8192}, loads)["big"].phase == "loading"  # its own load fills the GPU


def test_a_runner_reading_means_loaded_even_before_api_ps_lists_it() -> None:
    """/api/ps is polled; the runner's progress arrives sooner: a request being read is not waiting for a load."""
    rec = record("a", BIG, started=T0)
    progress = {"a": [reading("a", T0 + 1, 512, ProgressSource.SLOTS), reading("a", T0 + 2, 1024, ProgressSource.SLOTS)]}
    (card,) = in_flight_cards([rec], progress, {}, T0 + 2.5)
    assert card.phase == "prefill"
