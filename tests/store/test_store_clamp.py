"""Integers beyond SQLite's 64 bits (a client's num_ctx, an upstream eval_count) are stored clamped and flagged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from analysis.phases import FLAG_CODES, Flag
from analysis.records import FinalMetrics
from store import queries
from store.ops import PutRequest, RederivePhases
from store.rows import INT64_MAX, INT64_MIN
from store.schema import db_path
from store.writer import BackgroundWriter, StoreWriter
from tests.support.records import make_record


def _huge(id: str) -> PutRequest:
    rec = make_record(id)
    rec.num_ctx = 2**70  # a client's option
    rec.num_predict = -(2**64)
    rec.metrics = FinalMetrics(
        total_duration_ns=10**9, prompt_eval_count=5, prompt_eval_duration_ns=10**7, eval_count=2**63, eval_duration_ns=10**8
    )
    return PutRequest(rec)


def test_a_record_with_huge_integers_is_stored_clamped_and_flagged_by_the_background_writer(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = BackgroundWriter(path, batch_interval_s=0.01)
    w.submit(PutRequest(make_record("before")))
    w.submit(_huge("huge"))
    w.submit(PutRequest(make_record("after")))
    assert w.flush(10)
    assert w.dropped_count == 0 and w.last_error is None
    assert w.close()

    conn = sqlite3.connect(path)
    rows = {r[0]: r[1:] for r in conn.execute("SELECT id, num_ctx, num_predict, eval_count FROM requests")}
    conn.close()
    assert set(rows) == {"before", "huge", "after"}  # nothing dropped
    assert rows["huge"] == (INT64_MAX, INT64_MIN, INT64_MAX)
    reader = queries.open_readonly(path)
    stored = {s.record.id: s for s in queries.stored_requests(reader, 0)}
    reader.close()
    assert Flag.CLAMPED in stored["huge"].phases.flags
    text = stored["huge"].phases.flag_text[Flag.CLAMPED]
    assert "num_ctx" in text and "eval_count" in text
    assert Flag.CLAMPED not in stored["before"].phases.flags
    assert Flag.CLAMPED in FLAG_CODES


def test_the_clamped_flag_survives_rederiving_the_phases(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    w.write(_huge("huge"))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE requests SET phases_version = 0")
    conn.commit()
    conn.close()
    assert w.write(RederivePhases()) == 1
    w.close()
    reader = queries.open_readonly(path)
    (stored,) = queries.stored_requests(reader, 0)
    reader.close()
    assert Flag.CLAMPED in stored.phases.flags and "num_ctx" in stored.phases.flag_text[Flag.CLAMPED]
