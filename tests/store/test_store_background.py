"""BackgroundWriter: batching from an asyncio loop, locked and full stores, bad records, readers alongside."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.records import HostSample, RequestRecord
from store import queries, sample_queries
from store.ops import ApplyRetention, MarkInterrupted, PutHostSample, PutRequest
from store.schema import db_path
from store.writer import BackgroundWriter, StoreWriter
from tests.support.records import make_record


def _record(conn: sqlite3.Connection, id: str) -> RequestRecord | None:
    """The request as recorded (``request_detail`` also carries its stored phases)."""
    stored = queries.request_detail(conn, id)
    return None if stored is None else stored.record


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return db_path(tmp_path)


@pytest.fixture
def bg(path: Path) -> Iterator[BackgroundWriter]:
    w = BackgroundWriter(path, busy_timeout_ms=50, max_backoff_s=0.2)
    yield w
    w.close(timeout_s=5)


def _count(path: Path, table: str = "requests") -> int:
    conn = queries.open_readonly(path)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def test_submits_from_an_asyncio_loop_land_in_few_transactions(bg: BackgroundWriter, path: Path) -> None:
    async def produce() -> None:
        for i in range(300):
            bg.submit(PutRequest(make_record(f"r{i}", final=False, n_tokens=1)))
            bg.submit(PutRequest(make_record(f"r{i}")))  # the final row replaces the progress row
            if i % 50 == 0:
                await asyncio.sleep(0)

    asyncio.run(produce())
    assert bg.flush(timeout_s=20)
    assert bg.pending_count == 0 and bg.last_error is None
    assert 1 <= bg.committed_batches < 20  # 600 submits, batched every 200 ms
    conn = queries.open_readonly(path)
    rows = queries.recent_requests(conn, 0, limit=1000)
    assert len(rows) == 300 and {r.outcome for r in rows} == {"ok"}


def test_locked_store_keeps_records_in_memory_until_it_is_free(bg: BackgroundWriter, path: Path) -> None:
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        for i in range(50):
            bg.submit(PutRequest(make_record(f"r{i}")))  # returns at once although nothing can be written
        assert bg.pending_count == 50
        assert not bg.flush(timeout_s=1.0)
        assert bg.last_error is not None and "locked" in bg.last_error and "50 records waiting" in bg.last_error
        assert _count(path) == 0
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert bg.flush(timeout_s=20)
    assert bg.pending_count == 0 and bg.last_error is None
    assert _count(path) == 50


def test_progress_rows_waiting_for_a_locked_store_collapse_to_the_latest(bg: BackgroundWriter, path: Path) -> None:
    final = make_record("x", n_tokens=30)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        for n in range(1, 30):
            bg.submit(PutRequest(replace(make_record("x", final=False, n_tokens=30), token_chunk_ns=final.token_chunk_ns[:n])))
        bg.submit(PutRequest(final))
        assert not bg.flush(timeout_s=1.0)
        assert bg.pending_count == 1  # only the final row still needs writing
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert bg.flush(timeout_s=20)
    assert _record(queries.open_readonly(path), "x") == final


def test_full_disk_loses_nothing_once_space_returns(bg: BackgroundWriter, path: Path) -> None:
    bg.submit(PutRequest(make_record("before")))
    assert bg.flush(timeout_s=20)
    bg.set_hard_limit_bytes(1)  # the file may not grow any more: SQLITE_FULL, as on a full disk
    big = [replace(make_record(f"r{i}", n_tokens=200), response_text="x" * 4000) for i in range(60)]
    for rec in big:
        bg.submit(PutRequest(rec))
    assert not bg.flush(timeout_s=1.5)
    assert bg.last_error is not None and "full" in bg.last_error
    assert bg.pending_count == 60
    # One transaction per batch: nothing of the failed batch is visible, not even part of it.
    assert _count(path) == 1
    assert _count(path, "request_tokens") == 1

    bg.set_hard_limit_bytes(None)  # space returns
    assert bg.flush(timeout_s=20)
    assert bg.pending_count == 0 and bg.last_error is None
    conn = queries.open_readonly(path)
    for rec in big:
        assert _record(conn, rec.id) == rec
    assert _integrity(path) == "ok"


def test_a_full_disk_backlog_bigger_than_the_room_left_commits_the_part_that_fits(path: Path) -> None:
    bg = BackgroundWriter(path, batch_interval_s=0.5, max_backoff_s=0.2)
    try:
        bg.submit(PutRequest(make_record("before")))
        assert bg.flush(timeout_s=20)
        conn = sqlite3.connect(path)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.close()
        bg.set_hard_limit_bytes((pages + 40) * 4096)  # room for ~160 KB more, as on a disk nearly full
        big = [replace(make_record(f"r{i:03d}", n_tokens=200), response_text="x" * 4000) for i in range(100)]  # ~500 KB
        for rec in big:
            bg.submit(PutRequest(rec))
        deadline = time.monotonic() + 20
        while _count(path) == 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # let it retry what is left a few times
        stored = _count(path) - 1
        # What fits is in (the oldest first), the rest waits in memory, said in last_error; nothing dropped.
        assert 0 < stored < 100
        assert bg.pending_count == 100 - stored and bg.dropped_count == 0
        assert bg.last_error is not None and "full" in bg.last_error and f"{100 - stored} records waiting" in bg.last_error
        reader = queries.open_readonly(path)
        ids = sorted(r.id for r in queries.recent_requests(reader, 0, limit=1000))
        reader.close()
        assert ids == sorted(["before", *(f"r{i:03d}" for i in range(stored))])

        bg.set_hard_limit_bytes(None)  # space returns: the rest goes in
        assert bg.flush(timeout_s=20)
        assert bg.pending_count == 0 and bg.last_error is None and _count(path) == 101
        assert _integrity(path) == "ok"
    finally:
        bg.close()
    print(f"committed {stored} of 100 within the room left")


def test_a_full_disk_backlog_over_its_cap_drops_the_oldest_samples_and_says_so(path: Path) -> None:
    bg = BackgroundWriter(path, max_backoff_s=0.2, max_backlog_records=60, max_backlog_requests=25)
    try:
        bg.set_hard_limit_bytes(1)  # full disk

        def big_request(i: int) -> PutRequest:  # too big for any room left: it waits
            return PutRequest(replace(make_record(f"r{i:02d}", n_tokens=200), response_text="x" * 4000))

        bg.submit(big_request(0))  # the oldest record: what fits behind it cannot commit before it
        for i in range(50):
            bg.submit(PutHostSample(HostSample(1000.0 + i, 5.0, 1, 2)))
        for i in range(1, 30):
            bg.submit(big_request(i))
        deadline = time.monotonic() + 20
        while bg.dropped_count == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not bg.flush(timeout_s=0.5)
        error = bg.last_error
        assert error is not None and "full" in error and "dropped the oldest" in error and "5 PutRequest" in error
        assert "PutHostSample" in error  # samples went first...
        dropped = bg.dropped_count

        bg.set_hard_limit_bytes(None)
        assert bg.flush(timeout_s=20)
        assert bg.dropped_count == dropped and bg.last_error is None
    finally:
        bg.close()
    conn = queries.open_readonly(path)
    ids = sorted(r.id for r in queries.recent_requests(conn, 0, limit=1000))
    samples = [r[0] for r in conn.execute("SELECT ts_unix_s FROM host_samples ORDER BY ts_unix_s")]
    conn.close()
    assert ids == [f"r{i:02d}" for i in range(5, 30)]  # ...requests only past their own cap, the oldest
    assert samples == [1000.0 + i for i in range(20, 50)]  # the newest 30 kept (the backlog held 80, capped at 60)
    assert dropped == 20 + 5


def test_close_drains_everything_submitted(path: Path) -> None:
    bg = BackgroundWriter(path, batch_interval_s=10.0)  # would not write for 10 s on its own
    for i in range(100):
        bg.submit(PutHostSample(HostSample(1000.0 + i, 5.0, 1, 2)))
    bg.submit(PutRequest(make_record()))
    assert bg.close(timeout_s=10)
    assert _count(path, "host_samples") == 100 and _count(path) == 1
    with pytest.raises(RuntimeError, match="closed"):
        bg.submit(PutRequest(make_record("late")))


def test_a_record_sqlite_refuses_is_dropped_alone_and_said(bg: BackgroundWriter, path: Path) -> None:
    bad = replace(make_record("bad"), model=None)  # type: ignore[arg-type]  # NOT NULL model
    bg.submit(PutRequest(make_record("good-1")))
    bg.submit(PutRequest(bad))
    bg.submit(PutRequest(make_record("good-2")))
    assert bg.flush(timeout_s=20)
    assert bg.dropped_count == 1
    assert bg.last_error is not None and "dropped" in bg.last_error
    conn = queries.open_readonly(path)
    assert {r.id for r in queries.recent_requests(conn, 0)} == {"good-1", "good-2"}


def test_readers_query_while_the_writer_writes(bg: BackgroundWriter, path: Path) -> None:
    bg.submit(PutRequest(make_record("seed")))
    assert bg.flush(timeout_s=20)
    stop = threading.Event()
    seen: list[int] = []
    steps, per_step = 3, 1000
    written = 0

    def write() -> None:
        # Three committed steps, each waited on until a reader has seen it: progress is visible on any machine.
        nonlocal written
        t = 1_700_000_000.0
        for _ in range(steps):
            for _ in range(per_step):
                bg.submit(PutRequest(make_record(f"w{written}", t + written)))
                bg.submit(PutHostSample(HostSample(t + written, 10.0, 1, 2)))
                written += 1
            assert bg.flush(timeout_s=60)
            deadline = time.monotonic() + 60
            while not stop.is_set() and (not seen or seen[-1] < written + 1) and time.monotonic() < deadline:
                time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + 120.0
        while writer.is_alive() and time.monotonic() < deadline:
            conn = queries.open_readonly(path)
            try:
                n = len(queries.recent_requests(conn, 0, limit=10_000))
                sample_queries.host_samples(conn, 0, 2e9)
                queries.in_flight_requests(conn, time.time())
            finally:
                conn.close()
            seen.append(n)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert seen == sorted(seen)  # readers see whole batches, never a row go away
    assert {per_step + 1, 2 * per_step + 1} <= set(seen)  # and they saw the writer's progress while it wrote
    assert _count(path) == written + 1 == steps * per_step + 1


def test_startup_ops_through_the_queue(path: Path) -> None:
    # What the collector does on start: mark what a killed predecessor left in flight, then apply retention.
    w = StoreWriter(path)
    w.apply([PutRequest(r) for r in [make_record("left-running", final=False), make_record("ancient", 1_000.0)]])
    w.close()
    bg = BackgroundWriter(path)
    try:
        bg.submit(MarkInterrupted("the collector stopped before this request finished"))
        bg.submit(ApplyRetention(1_700_000_000.0 + 3600))
        assert bg.flush(timeout_s=20)
    finally:
        assert bg.close(timeout_s=10)
    conn = queries.open_readonly(path)
    (row,) = queries.recent_requests(conn, 0)
    assert row.id == "left-running" and row.outcome == "upstream_failed"
    assert row.error == "the collector stopped before this request finished"
    assert row.ended_at_unix_s is not None  # so that time windows still find it


def test_a_submitted_request_is_a_snapshot(bg: BackgroundWriter, path: Path) -> None:
    rec = make_record("live", final=False, n_tokens=3)
    bg.submit(PutRequest(rec))
    rec.token_chunk_ns.append(rec.token_chunk_ns[-1] + 25_000_000)  # the proxy goes on recording
    rec.first_byte_ns = None
    assert bg.flush(timeout_s=20)
    back = _record(queries.open_readonly(path), "live")
    assert back == make_record("live", final=False, n_tokens=3)
