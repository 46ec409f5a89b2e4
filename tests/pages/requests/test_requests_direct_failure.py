"""The Requests detail of requests the proxy never saw (issue 40 item 3): its time axis says where its times come
from (not "since the proxy received the request"), and a direct request Ollama answered 500, recorded from the
access line alone, reads as a failure with its route, its total the line's latency, every phase unknown."""

from __future__ import annotations

from pathlib import Path

from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from collectors.ollama.access_failures import failed_record
from collectors.ollama.log import AccessLine
from pages.requests.view import build_detail, seen_from
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter

T0 = 1_900_000_000.0
NS = 1_000_000_000


def to_mono(wall_s: float, now_wall_s: float) -> int:
    return 10**12 - round((now_wall_s - wall_s) * NS)


def direct_success() -> RequestRecord:
    """A direct task the runner's log timed: 0.78 s of prefill, 1 s of decode, its access line fitted (29.1 s)."""
    start_ns = to_mono(T0, T0 + 40)
    return RequestRecord(
        id="direct-39511-4242-50-1900000000",
        started_at_unix_s=T0,
        client_addr="10.0.0.5",
        client_unverified=True,
        endpoint="/api/chat",
        model="gemma3:270m",
        stream=None,
        received_ns=start_ns,
        forwarded_ns=start_ns,
        first_token_ns=start_ns + 780_000_000,
        final_chunk_ns=start_ns + 1_780_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(
            total_duration_ns=29_104_000_000,
            prompt_eval_count=40,
            prompt_eval_cached_count=0,
            prompt_eval_duration_ns=780_000_000,
            eval_count=8,
            eval_duration_ns=1_000_000_000,
        ),
        seen_from=SeenFrom.RUNNER,
        runner_port=39511,
        runner_task_id=50,
        runner_source="log",
    )


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
    path = write(tmp_path, direct_success())
    d = build_detail(path, "direct-39511-4242-50-1900000000")
    assert d is not None
    axis = d.waterfall.layout.xaxis.title.text
    assert axis == "ms since the runner started the task", axis
    assert "proxy" not in axis
    assert {t.name for t in d.waterfall.data} >= {"prefill", "decode"}
    assert d.phases.total_s is not None and abs(d.phases.total_s - 29.104) < 1e-6  # the access line's total kept


def test_a_direct_500_reads_as_a_failure_with_its_route(tmp_path: Path) -> None:
    line = AccessLine(ended_unix_s=T0 + 29, status=500, latency_s=28.2, client="10.0.0.6", method="POST", path="/api/chat")
    failed = failed_record(line, T0 + 45, to_mono)
    path = write(tmp_path, direct_success(), failed)
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
