"""The Requests page's rates chart: rates too short to time and rates beyond any hardware are drawn apart
(hollow, at the axis edge when beyond it, their value in the hover), counted under the chart, and never set
the axis range. Built from a store written with the collector's own StoreWriter."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from pages.requests.figures import MIN_TIME_SPAN_S, time_range_unix_s
from pages.requests.view import build_history
from store.schema import db_path
from tests.support.why_page import PLAIN, Req, build_store, req_shape, values

ABSURD = Req(req_shape(4000, 0.004, 60, 5), 15)  # a million tok/s: the phase split flags it beyond any hardware
TINY = Req(req_shape(14, 0.0923, 40, 4), 20)  # 151,691 tok/s over 14 tokens


def test_flagged_and_tiny_rates_stay_visible_but_set_no_range(tmp_path: Path) -> None:
    now = time.time()
    build_store(tmp_path, now, reqs=[*PLAIN[:6], TINY, ABSURD])
    h = build_history(db_path(tmp_path), now - 900, now + 1)
    assert h is not None and h.figure is not None and h.figure_note is not None
    fig = h.figure.to_dict()
    lo, hi = fig["layout"]["yaxis"]["range"]
    counted = [r.prefill_tok_s for r in PLAIN[:6]] + [r.decode_tok_s for r in PLAIN[:6] if r.decode_tok_s]
    assert 10**hi < 2 * max(counted) and 10**lo > min(counted) / 2  # the counted rates alone set the range
    apart = next(t for t in fig["data"] if t["name"] == "prefill (prompt) tok/s, set apart (hollow)")
    # customdata: (rate, tokens) per point; the model's name is the trace's (meta), not copied per point.
    hover = sorted(float(c[0]) for t in h.figure.data if t.name == apart["name"] for c in t.customdata)
    assert hover == sorted([TINY.prefill_tok_s, ABSURD.prefill_tok_s])  # their real values, in the hover
    assert all(math.log10(y) <= hi + 1e-9 for y in values(apart["y"]))  # drawn at the edge, inside the range
    assert "1 rate timed over fewer than 32 tokens" in h.figure_note and "1 rate beyond any hardware" in h.figure_note
    assert fig["layout"]["yaxis"]["dtick"] == 1  # decades only: no "2 5 2 5" minor labels


def _x_range_unix_s(fig: dict[str, object]) -> tuple[float, float]:
    """The x axis range as unix seconds in local time's naive dates, as Plotly holds them."""
    lo, hi = fig["layout"]["xaxis"]["range"]  # type: ignore[index]
    return tuple(float(np.datetime64(v, "ms").astype("int64")) / 1000 for v in (lo, hi))  # type: ignore[return-value]


def test_one_request_is_drawn_on_a_minute_not_on_milliseconds(tmp_path: Path) -> None:
    # One request in the window had Plotly zoom its time axis to a millisecond around it ("06:39:51.1665").
    now = time.time()
    build_store(tmp_path, now, reqs=[PLAIN[0]])
    h = build_history(db_path(tmp_path), now - 900, now + 1)
    assert h is not None and h.figure is not None
    x0, x1 = _x_range_unix_s(h.figure.to_dict())
    assert abs((x1 - x0) - MIN_TIME_SPAN_S) < 0.002  # to the millisecond its dates are held in
    point = values(h.figure.to_dict()["data"][0]["x"])[0]
    point_s = float(np.datetime64(point, "ms").astype("int64")) / 1000
    assert x0 < point_s < x1  # the request sits inside it


def test_requests_spread_over_more_than_a_minute_keep_plotlys_range(tmp_path: Path) -> None:
    assert time_range_unix_s([0.0, 30.0]) == (-15.0, 45.0)
    assert time_range_unix_s([0.0, MIN_TIME_SPAN_S]) is None
    assert time_range_unix_s([]) is None
