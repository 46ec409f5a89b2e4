"""Interference between overlapping requests, on hand-built token timelines."""

from __future__ import annotations

import pytest

from analysis.interference import describe, find_interference
from analysis.phases import Phases
from analysis.records import Outcome, RequestRecord

MS = 1_000_000


def record(rid: str, tokens: list[int], model: str = "llama3.1:8b") -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=1.8e9,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model=model,
        stream=True,
        received_ns=tokens[0] - 100 * MS if tokens else 0,
        token_chunk_ns=tokens,
        final_chunk_ns=tokens[-1] if tokens else None,
        outcome=Outcome.OK,
    )


def victim_tokens(window: tuple[int, int], normal_ms: float = 10, slow_ms: float = 50, n: int = 100) -> list[int]:
    """A stream with a token every normal_ms, slowed to slow_ms while a gap would start inside the window."""
    t = 0
    out = [t]
    for _ in range(n - 1):
        gap = slow_ms if window[0] <= t < window[1] else normal_ms
        t += int(gap * MS)
        out.append(t)
    return out


def test_gaps_during_anothers_prefill_are_charged_to_it() -> None:
    window = (300 * MS, 600 * MS)
    a = record("a", victim_tokens(window))
    a_ph = Phases(prefill_start_ns=-50 * MS, decode_start_ns=0, decode_end_ns=a.token_chunk_ns[-1])
    b = record("b", [700 * MS + i * 10 * MS for i in range(5)])
    b_ph = Phases(prefill_start_ns=window[0], decode_start_ns=window[1], prompt_tokens=4096, cached_tokens=0)
    found = find_interference([(a, a_ph), (b, b_ph)])
    assert len(found) == 1
    i = found[0]
    assert (i.victim_id, i.aggressor_id) == ("a", "b")
    assert i.baseline_gap_ms == pytest.approx(10)
    # Gaps starting at 300..550 ms are 50 ms long (6 of them), plus the 10 ms gap that ends at 300 ms touches nothing.
    assert i.affected_gaps == 6
    assert i.extra_ms_per_token == pytest.approx(40)
    assert i.extra_ms_total == pytest.approx(240)
    assert i.significant
    text = describe(i, "your chat", "a 4k-token request")
    assert "4,096-token prompt" in text and "300 ms" in text
    assert "from its usual 10 ms to 50 ms" in text and "40 ms per token" in text and "240 ms in all" in text


def test_no_slowdown_is_reported_as_not_significant() -> None:
    window = (300 * MS, 600 * MS)
    a = record("a", victim_tokens(window, slow_ms=10.5))
    b = record("b", [700 * MS, 710 * MS])
    found = find_interference(
        [(a, Phases()), (b, Phases(prefill_start_ns=window[0], decode_start_ns=window[1], prompt_tokens=100))]
    )
    assert len(found) == 1 and not found[0].significant
    assert "stayed near their usual 10 ms" in describe(found[0])


def test_own_prefill_and_non_overlapping_requests_are_ignored() -> None:
    a = record("a", [i * 10 * MS for i in range(50)])
    a_ph = Phases(prefill_start_ns=0, decode_start_ns=400 * MS)  # its own window never counts against itself
    later = record("c", [2000 * MS + i * MS for i in range(5)])
    c_ph = Phases(prefill_start_ns=1000 * MS, decode_start_ns=2000 * MS)
    assert find_interference([(a, a_ph), (later, c_ph)]) == []


def test_a_gap_over_two_prefills_goes_to_the_bigger_overlap() -> None:
    a = record("a", [0, 10 * MS, 20 * MS, 30 * MS, 230 * MS, 240 * MS, 250 * MS, 260 * MS])
    b = record("b", [500 * MS, 510 * MS])
    c = record("c", [500 * MS, 510 * MS])
    b_ph = Phases(prefill_start_ns=25 * MS, decode_start_ns=60 * MS)  # 30 ms of overlap with the long gap
    c_ph = Phases(prefill_start_ns=60 * MS, decode_start_ns=235 * MS)  # 170 ms
    found = find_interference([(a, Phases()), (b, b_ph), (c, c_ph)])
    charged = {i.aggressor_id: i for i in found if i.victim_id == "a"}
    assert set(charged) == {"b", "c"}
    assert charged["c"].max_gap_ms == pytest.approx(200)
    assert charged["b"].max_gap_ms == pytest.approx(10)  # only the 20→30 ms gap
