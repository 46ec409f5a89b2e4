"""analysis.progress: read readings win over estimates; the prefill rate and ETA from readings; unknown stays None."""

from __future__ import annotations

import pytest

from analysis.progress import preferred, prefill_eta_unix_s, prefill_rate_tok_s, prompt_size_tokens
from analysis.records import ProgressSample, ProgressSource

S, L, E = ProgressSource.SLOTS, ProgressSource.LOG, ProgressSource.ESTIMATE


def row(ts: float, source: ProgressSource, processed: int, **kw: int | None) -> ProgressSample:
    return ProgressSample("r", ts, source, processed, **kw)


def test_read_readings_win_over_the_estimate() -> None:
    est = [row(1.0, E, 100, prompt_tokens=4100), row(2.0, E, 300, prompt_tokens=4100)]
    slots = [row(1.5, S, 512), row(2.5, S, 1024)]
    assert preferred(est) == est
    assert preferred(est + slots) == slots
    assert preferred([row(3.0, L, 512, prompt_tokens=3657), *est]) == [row(3.0, L, 512, prompt_tokens=3657)]
    assert preferred([]) == []


def test_prompt_size_read_before_estimated() -> None:
    assert prompt_size_tokens([row(1.0, E, 0, prompt_tokens=4100)]) == (4100, False)
    assert prompt_size_tokens([row(1.0, E, 0, prompt_tokens=4100), row(0.5, L, 512, prompt_tokens=3657)]) == (3657, True)
    assert prompt_size_tokens([row(1.0, S, 512)]) == (None, False)


def test_rate_and_eta() -> None:
    rows = [row(10.0, S, 0), row(11.0, S, 512), row(12.0, S, 1024), row(13.0, S, 1536, prompt_tokens=4096)]
    assert prefill_rate_tok_s(rows) == pytest.approx(512.0)  # the reading before any progress is left out
    assert prefill_eta_unix_s(rows) == pytest.approx(13.0 + (4096 - 1536) / 512)
    assert prefill_eta_unix_s(rows, prompt_tokens=2048) == pytest.approx(14.0)
    cached = [row(11.0, S, 512, cached_tokens=1000), row(12.0, S, 1024, cached_tokens=1000)]
    assert prefill_eta_unix_s(cached, prompt_tokens=3048) == pytest.approx(14.0), "cached tokens are not read again"


def test_a_count_is_dated_by_its_first_reading() -> None:
    """The count moves a batch at a time and repeats between batches (a CI run's readings, rounded)."""
    rows = [row(0.1, S, 0), row(2.1, S, 512), row(3.1, S, 1024), row(3.35, S, 1024), row(3.6, S, 1024)]
    assert prefill_rate_tok_s(rows) == pytest.approx(512.0), "from the first progress to 1,024 first seen, not 410"
    assert prefill_eta_unix_s(rows, prompt_tokens=4001) == pytest.approx(3.1 + (4001 - 1024) / 512)
    # A log reading comes only with progress, and decoding readings are not prefill.
    log = [row(1.0, L, 1536), row(2.0, L, 2048), row(3.0, L, 0, decoded_tokens=5)]
    assert prefill_rate_tok_s(log) == pytest.approx(512.0)


def test_unknown_stays_unknown() -> None:
    assert prefill_rate_tok_s([row(11.0, S, 512)]) is None  # one reading: no rate
    assert prefill_eta_unix_s([row(11.0, S, 512), row(12.0, S, 1024)]) is None  # no size
    assert prefill_rate_tok_s([row(11.0, S, 512), row(11.0, S, 1024)]) is None  # no time between them
