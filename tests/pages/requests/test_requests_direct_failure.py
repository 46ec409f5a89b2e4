"""The Requests detail of requests the proxy never saw (issue 40 item 3): its time axis says where its times come
from (not "since the proxy received the request"), and a direct request Ollama answered 500, recorded from the
access line alone, reads as a failure with its route, its total the line's latency, every phase unknown."""

from __future__ import annotations

from pathlib import Path

from analysis.records import Outcome, RequestRecord
from pages.requests.view import build_detail, seen_from
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.direct_records import SUCCESS_ID, direct_failure, direct_success

T0 = 1_900_000_000.0


def write(data: Path, *recs: RequestRecord) -> Path:
    path = db_path(data)
    w = StoreWriter(path)
    try:
        for rec in recs:
            w.write(PutRequest(rec))
    finally:
        w.close()
    return path


def test_a_direct_requests_axis_counts_from_the_runner_not_the_proxy(tmp_path: Path) -> None:
    path = write(tmp_path, direct_success(T0))
    d = build_detail(path, SUCCESS_ID)
    assert d is not None
    axis = d.waterfall.layout.xaxis.title.text
    assert axis == "ms since the runner started the task", axis
    assert "proxy" not in axis
    assert {t.name for t in d.waterfall.data} >= {"prefill", "decode"}
    assert d.phases.total_s is not None and abs(d.phases.total_s - 29.104) < 1e-6  # the access line's total kept


def test_a_direct_500_reads_as_a_failure_with_its_route(tmp_path: Path) -> None:
    failed = direct_failure(T0)
    path = write(tmp_path, direct_success(T0), failed)
    with queries.open_reader(path) as conn:
        assert conn is not None
        rows = {r.id: r for r in queries.recent_requests(conn, T0 - 60)}
    row = rows[failed.id]
    assert row.outcome is Outcome.HTTP_ERROR and row.status_code == 500 and row.endpoint == "/api/chat"
    assert row.client_addr == "10.0.0.6" and row.client_unverified and row.direct
    assert row.total_s is not None and abs(row.total_s - 28.2) < 1e-6
    assert row.prefill_s is None and row.decode_s is None and row.queue_s is None and row.output_tokens is None
    assert seen_from(row) == "direct · Ollama's access line (no runner task)"
    d = build_detail(path, failed.id)
    assert d is not None
    assert d.waterfall.layout.xaxis.title.text == "ms since Ollama received the request (its access line)"
    assert any("answered with an error before any runner task" in s for s in d.sentences), d.sentences
