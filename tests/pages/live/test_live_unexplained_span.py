"""Live's "GPU busy with no generation recorded" rests only on requests the page read (issue 48): on a window with
more requests than the timeline reads (``BANDS_LIMIT``, the newest), the GPU's busy time before the oldest read
request is not called unexplained; busy time with no request inside the read span still is.

Stores written with the collector's own writer; the page's view-model (``build_live``) reads them as the page does.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.pages_fixture import gpu_sample, make_request
from pages.live.view import BANDS_LIMIT, build_live
from store.ops import PutGpuSamples, PutRequest
from store.schema import db_path
from store.writer import StoreWriter

WINDOW_S = 3600.0
N_REQUESTS = BANDS_LIMIT + 1000  # more than the page reads
GAP_S = 60.0  # a minute of busy GPU with no request, among the newest requests


def _fill(data_dir: Path, now: float, *, gap: bool) -> None:
    """GPU busy at 50% every second from the window's start to 30 s before now, and ``N_REQUESTS`` requests 1.1 s
    apart (each ~1.6 s long, so one always runs) up to then; with ``gap``, none starts in a minute among the newest
    100."""
    t0 = now - WINDOW_S
    starts = [now - 30 - 1.1 * (N_REQUESTS - i) for i in range(N_REQUESTS)]
    if gap:  # the newest 100 move a minute later, and the minute before them holds no request
        starts = [t if i < N_REQUESTS - 100 else t + GAP_S for i, t in enumerate(starts)]
        starts = [t for t in starts if t < now - 35]
    w = StoreWriter(db_path(data_dir))
    try:
        w.apply([PutGpuSamples([gpu_sample(float(t), 50.0) for t in range(int(t0), int(now - 30))])])
        w.apply([PutRequest(make_request(t, t0)) for t in starts])
    finally:
        w.close()


def test_many_requests_explain_the_busy_gpu_without_a_false_warning(tmp_path: Path) -> None:
    now = time.time()
    _fill(tmp_path, now, gap=False)
    model = build_live(db_path(tmp_path), now, WINDOW_S, flight=False, context=False)
    assert model is not None
    # Before the fix: ~25 min of busy GPU before the newest 2,000 requests was called unexplained.
    assert model.unexplained == []
    checked_from = model.unexplained_checked_from_unix_s
    assert checked_from is not None and now - WINDOW_S < checked_from < now - 30 - 1.1 * (BANDS_LIMIT - 1)


def test_busy_gpu_with_no_request_in_the_read_span_is_still_named(tmp_path: Path) -> None:
    now = time.time()
    _fill(tmp_path, now, gap=True)
    model = build_live(db_path(tmp_path), now, WINDOW_S, flight=False, context=False)
    assert model is not None
    assert model.unexplained_checked_from_unix_s is not None
    # Exactly the gap: one stretch, about a minute long (the requests' 1.5 s slack trimmed at each end).
    assert len(model.unexplained) == 1, model.unexplained
    assert GAP_S - 10 <= model.unexplained[0].duration_s <= GAP_S + 5
