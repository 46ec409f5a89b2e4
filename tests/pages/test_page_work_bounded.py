"""Each page's SQLite work is bounded whatever the store holds (issue 48): rendered over two stores of one hour,
one with ten times the requests of the other (written with the collector's own writer), a page that reads a bounded
number of rows does about the same work on both; one that scans does ten times as much. Work is counted in SQLite
VM steps (tests/support/page_steps.py), which a busy machine does not change, unlike a time.

The Why basis reads up to ``POINTS_LIMIT`` readings of a model (5,000); it is lowered here so that the smaller store
already fills it, as a day of a busy server does: what is checked is that no page's work follows the store's size
beyond the limits it names.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bench.pages_fixture import Shape, gpu_sample, make_request, status_rows
from pages.shared import basis
from store.ops import PutGpuSamples, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.page_steps import PAGES, full_scans, page_work

pytestmark = pytest.mark.slow  # two stores (22,000 requests) written and four pages rendered over each: ~20-40 s

SPAN_S = 3600.0  # both stores hold one hour of requests; the sidebar's window covers all of it
SMALL, LARGE = 2_000, 20_000
MAX_GROWTH = 2.0  # ten times the requests may cost at most twice the steps
POINTS_LIMIT = 500  # below SMALL / 2 (two models): both stores fill the basis's readings


def _fill(data_dir: Path, n_requests: int, now: float) -> None:
    rng = random.Random(48)
    t0 = now - SPAN_S
    w = StoreWriter(db_path(data_dir))
    try:
        w.apply([PutGpuSamples([gpu_sample(float(t), 50.0)]) for t in range(int(t0), int(now))])
        batch = []
        for i in range(n_requests):
            shape = Shape(prompt_tokens=rng.randint(20, 3000), output_tokens=rng.randint(5, 12), prefill_ms=40.0)
            model = rng.choice(["llama3.2:latest", "llama3.1:8b"])
            batch.append(make_request(t0 + i * SPAN_S / n_requests, t0, model=model, shape=shape))
            if len(batch) == 5000:
                w.apply([PutRequest(r) for r in batch])
                batch = []
        w.apply([PutRequest(r) for r in batch])
        status_rows(w, now, data_dir)
    finally:
        w.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    now = time.time()
    small, large = tmp_path_factory.mktemp("small"), tmp_path_factory.mktemp("large")
    _fill(small, SMALL, now)
    _fill(large, LARGE, now)
    return small, large


def test_no_page_does_work_that_grows_with_the_store(stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(basis, "POINTS_LIMIT", POINTS_LIMIT)
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    work = []
    for data_dir in stores:
        monkeypatch.setenv("PHASEWATCH_DATA", str(data_dir))
        work.append(page_work("1 h"))
    small, large = ({p: w[p].steps for p in PAGES} for w in work)
    assert all(small[p] > 0 for p in PAGES), small  # every page read the store: the count sees its queries
    grown = {p: round(large[p] / small[p], 2) for p in PAGES}
    assert all(g <= MAX_GROWTH for g in grown.values()), (
        f"steps at {LARGE:,} requests ÷ steps at {SMALL:,}, per page: {grown} (small {small}, large {large}); "
        "a page over 2 reads rows in proportion to the store (bench/page_queries.py names its statements)"
    )
    # And no statement any page ran reads all of requests or request_tokens, whatever its LIMIT.
    scans = {p: full_scans(db_path(stores[1]), work[1][p].statements) for p in PAGES}
    assert not any(scans.values()), scans


MARKS_MAX = 4_000  # markers and bars one page's charts draw at most: what a browser mounts in well under a second


def test_no_chart_draws_every_request(stores: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the larger store (10,000 requests of each model in the window), Why's and Live's charts draw a bounded
    sample: 5,000 readings a chart on Why and 2,000 requests' bars on Live took the browser seconds per visit."""
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.setenv("PHASEWATCH_DATA", str(stores[1]))
    work = page_work("1 h")
    marks = {page: work[page].marks for page in ("Live", "pages/why/page.py")}
    assert all(sum(m.values()) > 0 for m in marks.values()), marks  # each page drew its charts: the count sees them
    assert all(sum(m.values()) <= MARKS_MAX for m in marks.values()), marks
    # Each page says that it draws a sample, and of how many.
    live, why = (" ".join(work[p].captions) for p in ("Live", "pages/why/page.py"))
    assert "drawn for the newest 500 requests; 1,500 older ones in the window are not drawn" in live, live
    assert "each kind of point is drawn for at most 1,000 of them" in why, why
