"""``analysis.wait_split`` on hand-built intervals: each part of the wait before a prompt, and what another prefill
cost, from the overlap of measured intervals alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analysis.diagnose import INTERFERENCE, diagnose_request
from analysis.phases import Phases, split_record
from analysis.records import Outcome, RequestRecord, SeenFrom
from analysis.wait_split import MAX_NEIGHBOURS, Busy, busy_of, split_wait
from tests.support.records import make_record


def busy(rid: str, arrive: float, prefill: tuple[float, float], end: float, tokens: int = 20, gap: float = 0.0) -> Busy:
    n = int((end - prefill[1]) / gap) if gap else 0
    return Busy(
        id=rid,
        model="m",
        client="127.0.0.1",
        prompt_tokens=tokens,
        wait_start_s=arrive,
        prefill=prefill,
        held=(prefill[0], end),
        tokens_s=tuple(prefill[1] + i * gap for i in range(n + 1)) if gap else (),
        started_s=arrive,
    )


def test_one_slot_the_wait_is_queue_behind_who_held_it() -> None:
    a = busy("a", 0.0, (0.0, 1.0), 10.0)
    b = busy("b", 0.5, (10.0, 10.2), 14.0)
    me = busy("me", 1.0, (14.1, 14.2), 15.0)
    split = split_wait(me, [a, b], n_slots=1, runner_named=True)
    assert split.queue_s == pytest.approx(13.0)  # 1 → 14: a held the slot till 10, b till 14
    assert [o.id for o in split.holders] == ["a", "b"]  # a held it longer
    # The runner's named work gets only the 0.1 s after b let go, not the queue.
    assert split.runner_wait_s == pytest.approx(0.1) and split.unexplained_s == 0.0
    assert split.hits == ()


def test_runner_wait_only_when_its_lines_named_work_and_within_their_span() -> None:
    me = busy("me", 0.0, (2.0, 2.1), 3.0)
    assert split_wait(me, [], n_slots=2).unexplained_s == pytest.approx(2.0)
    assert split_wait(me, [], n_slots=2, runner_named=True).runner_wait_s == pytest.approx(2.0)
    capped = split_wait(me, [], n_slots=2, runner_named=True, runner_span_s=0.5)
    assert (capped.runner_wait_s, capped.unexplained_s) == pytest.approx((0.5, 1.5))
    assert split_wait(me, [], n_slots=None).queue_s is None  # slot count unknown: no queue told


def test_two_slots_a_free_slot_waiting_for_anothers_batches_is_interference() -> None:
    long = busy("long", 0.0, (0.0, 8.0), 9.0, tokens=4000)  # 500 tok/s
    me = busy("me", 1.0, (8.0, 8.2), 12.0, tokens=20, gap=0.1)
    split = split_wait(me, [long], n_slots=2)
    assert split.queue_s == 0.0 and split.batch_wait_s == pytest.approx(7.0)
    (hit,) = split.hits
    assert hit.other.id == "long" and hit.lost_s == pytest.approx(7.0)
    ph = Phases(ttft_s=7.2, prefill_s=0.2, client_s=11.0, total_s=11.0, prompt_tokens=20, output_tokens=40)
    ds = diagnose_request(_rec(), ph, split=split)
    assert [d.code for d in ds] == [INTERFERENCE], [d.sentence for d in ds]
    assert "4,000-token prompt" in ds[0].sentence and "7.00 s" in ds[0].sentence


def test_decode_gaps_beside_anothers_prefill_are_charged_against_its_own_usual_gap() -> None:
    me = busy("me", 0.0, (0.0, 0.1), 5.0, gap=0.05)
    # Gaps of 0.05 s, but the four inside [2, 3] took 0.25 s each in truth: rebuild the token times.
    ts = [0.1 + 0.05 * i for i in range(39)]  # up to 2.0
    ts += [2.0 + 0.25 * i for i in range(1, 5)]  # 2.25 … 3.0
    ts += [3.0 + 0.05 * i for i in range(1, 40)]
    me = Busy(**{**me.__dict__, "tokens_s": tuple(ts), "held": (0.0, ts[-1])})
    other = busy("o", 1.9, (2.0, 3.0), 3.5, tokens=3000)
    (hit,) = split_wait(me, [other], n_slots=2).hits
    assert hit.decode_lost_s == pytest.approx(4 * 0.2, rel=0.05)  # each 0.25 s gap against the usual 0.05 s


def test_a_prefill_before_arrival_and_after_the_end_is_no_hit() -> None:
    before = busy("before", 0.0, (0.0, 2.0), 2.5)
    after = busy("after", 9.0, (9.0, 10.0), 11.0)
    me = busy("me", 3.0, (3.0, 3.1), 6.0, gap=0.1)
    split = split_wait(me, [before, after], n_slots=1)
    assert split.hits == () and split.queue_s == 0.0


def test_neighbours_are_bounded() -> None:
    me = busy("me", 0.0, (100.0, 100.1), 101.0)
    flood = [busy(f"x{i}", 0.0, (i * 0.01, i * 0.01 + 0.005), 100.0) for i in range(MAX_NEIGHBOURS * 4)]
    split = split_wait(me, flood, n_slots=1)
    assert len(split.holders) <= MAX_NEIGHBOURS
    assert split.queue_s == pytest.approx(100.0)


def _rec() -> RequestRecord:
    return RequestRecord(
        id="me",
        started_at_unix_s=1.0,
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model="m",
        stream=True,
        outcome=Outcome.OK,
    )


def test_slots_unknown_a_wait_beside_anothers_prefill_is_not_called_interference() -> None:
    long = busy("long", 0.0, (0.0, 8.0), 9.0, tokens=4000)
    me = busy("me", 1.0, (9.0, 9.2), 12.0)
    split = split_wait(me, [long], n_slots=None)  # one slot or two: not known, so it may have been a queue
    assert split.queue_s is None and split.batch_wait_s == 0.0 and split.hits == ()
    assert split.unexplained_s == pytest.approx(8.0)


def test_many_neighbours_the_sentence_stays_whole() -> None:
    """Five long prompts read beside one chat: the two costliest told in full, the rest counted, under the 600
    characters a page shows of a sentence (pages.shared.fmt.SENTENCE_MAX_CHARS)."""
    others = [busy(f"o{i}", 0.0, (i * 2.0, i * 2.0 + 2.0), 12.0, tokens=4000 + i) for i in range(5)]
    me = busy("me", 0.5, (10.5, 10.6), 20.0, tokens=20)
    split = split_wait(me, others, n_slots=8)
    ph = Phases(ttft_s=10.1, prefill_s=0.1, client_s=19.5, total_s=19.5, prompt_tokens=20, output_tokens=40)
    (d,) = [x for x in diagnose_request(_rec(), ph, split=split) if x.code == INTERFERENCE]
    assert "and 3 more" in d.sentence and len(d.sentence) <= 600, (len(d.sentence), d.sentence)


def test_a_direct_task_with_no_known_phase_still_held_its_slot() -> None:
    """Seen in full runs: a long prompt whose short reply no poll saw (the queued request took the slot at once) is
    stored from /slots with no phase; it still held the one slot from the runner taking it to its release, so the
    request queued behind it names it as the holder, not "the runner's own wait"."""
    seen = replace(make_record("long", 1_700_000_000.0, n_tokens=0), metrics=None, seen_from=SeenFrom.RUNNER)
    proxied = replace(seen, id="proxied", seen_from=SeenFrom.PROXY)
    assert seen.final_chunk_ns is not None and split_record(seen).prefill_start_ns is None
    held = busy_of(seen, split_record(seen)).held
    assert held == (seen.wall_s(seen.received_ns), seen.wall_s(seen.final_chunk_ns))
    assert busy_of(proxied, split_record(proxied)).held is None  # the proxy saw its client: no runner interval assumed
    short = busy("short", held[0] + 0.05, (held[1] + 0.01, held[1] + 0.02), held[1] + 0.3)
    split = split_wait(short, [busy_of(seen, split_record(seen))], n_slots=1)
    assert [o.id for o in split.holders] == ["long"] and split.queue_s == pytest.approx(held[1] - held[0] - 0.05)
