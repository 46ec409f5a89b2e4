"""Records come faster than the store takes them (--record-text, a store at its size bound): what waits in memory
is bounded in bytes, the newest are kept, and what was shed is counted and said.

Issue 25 finding 4: the backlog was bounded by count (200,000) only: 4.2 GB after 27 s of such a flood.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from store import queries
from store.ops import PutRequest, RetentionPolicy
from store.schema import db_path
from store.writer import BackgroundWriter
from tests.support.records import make_record

TEXT_CHARS = 100_000  # a prompt and a reply of 100 KB each
RECORDS = 1_500  # 300 MB offered, far more than the store takes in the time
BOUND_BYTES = 16 * 1024 * 1024
BACKLOG_BYTES = 24 * 1024 * 1024
RECORD_BYTES = 2 * TEXT_CHARS


def test_a_flood_faster_than_the_store_keeps_the_backlog_within_its_bytes_and_the_newest(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    bg = BackgroundWriter(path, retention=RetentionPolicy(max_bytes=BOUND_BYTES), max_backlog_bytes=BACKLOG_BYTES)
    base = make_record("x", n_tokens=50)
    peak_waiting_bytes = 0
    started = time.monotonic()
    try:
        for i in range(RECORDS):
            rec = replace(
                base,
                id=f"r{i:05d}",
                started_at_unix_s=1_700_000_000.0 + i,
                prompt_text="p" * TEXT_CHARS,
                response_text="r" * TEXT_CHARS,
            )
            bg.submit(PutRequest(rec))
            peak_waiting_bytes = max(peak_waiting_bytes, bg.pending_count * RECORD_BYTES)
        offered_s = time.monotonic() - started
        assert bg.flush(60)
        shed, note = bg.shed_count, bg.shed_note
    finally:
        assert bg.close()
    print(f"offered {RECORDS} records in {offered_s:.1f} s; peak waiting {peak_waiting_bytes / 2**20:.0f} MiB; shed {shed}")
    # What waited stayed within the cap (and a batch being written beside it)...
    assert peak_waiting_bytes <= BACKLOG_BYTES + 8 * RECORD_BYTES, f"{peak_waiting_bytes / 2**20:.0f} MiB waited"
    # ...what went is counted and said...
    assert shed > 0 and note is not None and f"{shed} PutRequest" in note and "shed" in note
    # ...and the newest records are the ones stored.
    conn = queries.open_readonly(path)
    try:
        ids = [r.id for r in queries.recent_requests(conn, 0, limit=10_000)]
    finally:
        conn.close()
    assert f"r{RECORDS - 1:05d}" in ids
