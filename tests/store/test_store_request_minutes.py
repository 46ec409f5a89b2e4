"""Store v19: requests per minute kept beside the requests, and the model lists read by index seeks.

Whatever the writer commits (new requests, the same request written again, a request written in flight then
finished, a start time that moves, deleted direct rows, interrupted rows, retention by age, the size bound, a store
migrated with rows already in it), ``request_minutes`` holds exactly the requests' count per minute, and the
pages' counts and model lists answer as a full scan of the requests would.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import replace
from pathlib import Path

from analysis.records import Outcome, RequestRecord, SeenFrom
from store import queries
from store.ops import ApplyRetention, DeleteDirect, MarkInterrupted, PutRequest, ShedToBound
from store.schema import MIGRATIONS, REQUEST_MINUTE_S, db_path, migrate, request_minutes_step
from store.writer import DAY_S, RetentionPolicy, StoreWriter
from tests.support.records import make_record

NOW = 1_800_000_000.0
MODELS = ("llama3.2:latest", "llama3.1:8b", "qwen3:4b", "gemma3:270m")


def _minutes(conn: sqlite3.Connection) -> dict[int, int]:
    return {int(m): int(n) for m, n in conn.execute("SELECT minute_unix_s, n FROM request_minutes")}


def _scanned(conn: sqlite3.Connection) -> dict[int, int]:
    """The count per minute as a full scan of the requests gives it."""
    rows = conn.execute(
        f"SELECT CAST(started_at_unix_s / {REQUEST_MINUTE_S}.0 AS INTEGER) * {REQUEST_MINUTE_S}, COUNT(*) "
        "FROM requests GROUP BY 1"
    )
    return {int(m): int(n) for m, n in rows}


def _check(path: Path, rng: random.Random) -> int:
    """The summary equals the scan, and counts over random windows (and minute-edged ones) equal COUNT(*)."""
    with queries.open_reader(path) as conn:
        assert conn is not None
        assert _minutes(conn) == _scanned(conn)
        starts = [float(r[0]) for r in conn.execute("SELECT started_at_unix_s FROM requests")]
        lo, hi = (min(starts), max(starts)) if starts else (NOW - DAY_S, NOW)
        edges = [lo, hi, *rng.sample(starts, min(len(starts), 6))]
        windows = [(a, b) for a in edges for b in edges] + [
            (rng.uniform(lo - 90, hi + 90), rng.uniform(lo - 90, hi + 90)) for _ in range(60)
        ]
        windows += [(m * 60.0, m * 60.0 + 60.0) for m in range(int(lo // 60) - 1, int(lo // 60) + 3)]
        for a, b in windows:
            (want,) = conn.execute("SELECT COUNT(*) FROM requests WHERE started_at_unix_s BETWEEN ? AND ?", (a, b)).fetchone()
            assert queries.requests_started_count(conn, a, b) == want, (a, b)
        for since in [0.0, lo, hi, *rng.sample(starts, min(len(starts), 5))]:
            sql = "SELECT DISTINCT model FROM requests WHERE started_at_unix_s >= ? ORDER BY 1"
            want_models = [r[0] for r in conn.execute(sql, (since,))]
            assert queries.request_models(conn, since) == want_models
        last_use = conn.execute("SELECT model, MAX(started_at_unix_s) FROM requests GROUP BY model ORDER BY 2 DESC, 1")
        assert queries.models_by_last_use(conn) == [r[0] for r in last_use]
        return len(starts)


def _direct(rid: str, started_at_unix_s: float) -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=started_at_unix_s,
        client_addr=None,
        endpoint=None,
        model="gemma3:270m",
        stream=None,
        received_ns=10**12,
        outcome=Outcome.OK,
        seen_from=SeenFrom.RUNNER,
        runner_port=39511,
        runner_task_id=3,
        runner_source="slots",
    )


def test_the_minutes_follow_every_write_retention_and_the_size_bound(tmp_path: Path) -> None:
    rng = random.Random(15)
    path = db_path(tmp_path)
    w = StoreWriter(path, retention=RetentionPolicy(requests_max_age_s=DAY_S), clock=lambda: NOW)
    try:
        # Starts spread over two days, several in the same minute, some exactly on a minute's edge.
        starts = [NOW - rng.uniform(0, 2 * DAY_S) for _ in range(300)]
        starts += [NOW - 3600.0 - 60.0 * k for k in range(5)] + [NOW - 3600.0 + 1e-6, NOW - 7200.0 - 1e-6]
        recs = [make_record(f"r{i:04d}", s, model=rng.choice(MODELS)) for i, s in enumerate(starts)]
        # In flight first, then finished: the second write of a request updates its row and counts it once.
        w.apply([PutRequest(make_record(r.id, r.started_at_unix_s, final=False, model=r.model)) for r in recs[:50]])
        w.apply([PutRequest(r) for r in recs])
        w.apply([PutRequest(r) for r in recs[:20]])  # written again, as the rederive or a late write does
        assert _check(path, rng) == len(recs)

        # A start time corrected by a later write moves the request to its minute.
        w.write(PutRequest(replace(recs[0], started_at_unix_s=recs[0].started_at_unix_s - 600.0)))
        w.write(PutRequest(replace(recs[1], started_at_unix_s=recs[1].started_at_unix_s + 0.001)))
        assert _check(path, rng) == len(recs)

        # Direct rows taken back, and in-flight rows a killed collector left.
        w.apply([PutRequest(_direct(f"d{i}", NOW - 30.0 * i)) for i in range(8)])
        w.write(PutRequest(make_record("left", NOW - 5.0, final=False)))
        assert _check(path, rng) == len(recs) + 9
        assert w.write(DeleteDirect(tuple(f"d{i}" for i in range(0, 8, 2)))) == 4
        assert w.write(MarkInterrupted("the collector stopped")) == 1
        assert _check(path, rng) == len(recs) + 5

        # Retention by age takes the older day; the size bound then takes the oldest requests.
        result = w.write(ApplyRetention(NOW))
        assert result.deleted["requests"] > 100
        kept = _check(path, rng)
        assert 0 < kept < len(recs)
        w.retention = RetentionPolicy(requests_max_age_s=DAY_S, max_bytes=int(w.used_bytes() * 0.5))
        w.write(ShedToBound(NOW))
        assert 0 < _check(path, rng) < kept
    finally:
        w.close()


def test_a_store_with_requests_migrates_with_its_minutes_counted(tmp_path: Path) -> None:
    rng = random.Random(14)
    path = db_path(tmp_path)
    before = MIGRATIONS.index(request_minutes_step)
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=before)  # a store as the Phasewatch before the minutes left it, with its requests
    cols = "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s"
    conn.execute("BEGIN")
    for i in range(200):
        conn.execute(
            f"INSERT INTO requests ({cols}) VALUES (?, ?, 'c', '/api/chat', ?, 1, 0, 'ok', ?)",
            (f"r{i}", NOW - rng.uniform(0, DAY_S), rng.choice(MODELS), NOW),
        )
    conn.execute("COMMIT")
    assert migrate(conn) == before
    conn.close()
    assert _check(path, rng) == 200
