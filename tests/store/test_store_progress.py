"""Progress readings of running generations: stored with their request, read back in order, gone with it."""

from __future__ import annotations

from pathlib import Path

from analysis.records import Outcome, ProgressSample, ProgressSource, RequestRecord
from store import queries
from store.ops import ApplyRetention, PutProgress, PutRequest
from store.schema import db_path
from store.writer import StoreWriter


def _record(rid: str, started_unix_s: float) -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=started_unix_s,
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model="llama3.2",
        stream=True,
        received_ns=1,
        outcome=Outcome.IN_FLIGHT,
    )


def test_progress_round_trip_and_orphans_dropped(tmp_path: Path) -> None:
    writer = StoreWriter(db_path(tmp_path))
    try:
        writer.write(PutRequest(_record("a", 1000.0)))
        samples = [
            ProgressSample("a", 1000.5, ProgressSource.SLOTS, 512, prompt_tokens=4000, cached_tokens=0, n_ctx=8192),
            ProgressSample("a", 1000.25, ProgressSource.ESTIMATE, 200, prompt_tokens=3900),
            ProgressSample("a", 1001.0, ProgressSource.SLOTS, 1024, prompt_tokens=4000, ctx_used_tokens=1024),
            ProgressSample("ghost", 1001.0, ProgressSource.SLOTS, 1),  # no such request: dropped, no error
        ]
        writer.write(PutProgress(samples))
        with queries.open_reader(db_path(tmp_path)) as conn:
            assert conn is not None
            got = queries.progress_samples(conn, ["a", "ghost", "a"])
        assert list(got) == ["a"]
        assert [s.ts_unix_s for s in got["a"]] == [1000.25, 1000.5, 1001.0]
        assert got["a"][1] == samples[0]
        assert got["a"][0].source is ProgressSource.ESTIMATE
        assert got["a"][2].cached_tokens is None  # unknown stays unknown
        writer.write(ApplyRetention(now_unix_s=1000.0 + 400 * 86_400.0))  # the request ages out, its readings too
        with queries.open_reader(db_path(tmp_path)) as conn:
            assert conn is not None
            assert queries.progress_samples(conn, ["a"]) == {}
    finally:
        writer.close()
