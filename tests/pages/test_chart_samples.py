"""What a chart of a long window draws (issue 48): an even sample of its readings, and the newest requests' bands."""

from __future__ import annotations

import itertools

from analysis.story import Reading, Status
from pages.live.view import newest_bands
from pages.shared.charts import evenly
from pages.shared.derive import Band
from pages.why.figures import POINTS_DRAWN_MAX, points_note, prefill_figure


def test_evenly_keeps_the_ends_and_at_most_the_limit() -> None:
    items = list(range(10_001))
    picked = evenly(items, 1000)
    assert len(picked) == 1000 and picked[0] == 0 and picked[-1] == 10_000
    assert picked == sorted(set(picked))  # in order, none twice
    gaps = {b - a for a, b in itertools.pairwise(picked)}
    assert gaps <= {10, 11}  # evenly spread: no stretch of the readings left out
    assert evenly(items[:5], 1000) == items[:5]
    assert evenly(items, 1) == [10_000] and evenly(items, 0) == []


def _reading(i: int, rate: float, status: Status = Status.COUNTED) -> Reading:
    return Reading(f"r{i:06d}", 100 + i, rate, 200, 10_000.0, 5_000.0, status)


def test_the_prefill_chart_draws_a_sample_but_its_axis_from_every_reading() -> None:
    readings = [_reading(i, 1_000.0 + i % 97) for i in range(4_000)]
    readings[1234] = _reading(1234, 9_000.0)  # the fastest, not on the sample's stride
    fig = prefill_figure(readings, [], None, "m", "GPU", 512)
    (points,) = [t for t in fig.data if t.mode == "markers"]
    assert len(points.x) == POINTS_DRAWN_MAX
    assert fig.layout.yaxis.range[1] > 9_000.0  # the axis still holds the reading not drawn
    assert max(points.x) == 100 + 3_999 and min(points.x) == 100


def test_the_note_says_how_many_are_drawn() -> None:
    assert "one point per request" in points_note({"prefill": 10, "decode": 9}, "the last 5 min")
    note = points_note({"prefill": 5_000, "decode": 4_000}, "the last 24 h")
    assert "5,000 prefill and 4,000 decode readings" in note and f"at most {POINTS_DRAWN_MAX:,}" in note


def test_the_newest_requests_bands_every_phase_of_each() -> None:
    bands = [
        Band(f"q{i}", "m", phase, i + k * 0.1, i + k * 0.1 + 0.1)
        for i in range(100)
        for k, phase in enumerate(("prefill", "decode"))
    ]
    kept = newest_bands(bands, 10)
    assert {b.request_id for b in kept} == {f"q{i}" for i in range(90, 100)}
    assert len(kept) == 20
    assert newest_bands(bands, 0) == [] and len(newest_bands(bands, 500)) == 200
