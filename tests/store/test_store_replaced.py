"""A store file deleted or replaced under the running writer (a cleanup script, a restore from a backup).

Issue 25 finding 11: the writer went on writing into the file it had open, which nobody could read any more, and
said nothing. Now it notices before the next batch, says so, and goes on in a fresh file with nothing queued lost.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from collectors.metrics import MetricsSnapshot, render
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import BackgroundWriter, StoreWriter
from tests.support.exposition import parse_exposition
from tests.support.records import make_record


def _ids(path: Path) -> list[str]:
    conn = queries.open_readonly(path)
    try:
        return sorted(r.id for r in queries.recent_requests(conn, 0, limit=10_000))
    finally:
        conn.close()


def _submit(bg: BackgroundWriter, first: int, n: int) -> None:
    for i in range(first, first + n):
        bg.submit(PutRequest(replace(make_record(f"r{i:03d}"), started_at_unix_s=1_700_000_000.0 + i)))


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):  # rm phasewatch.db*
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _replace_with_backup(path: Path) -> None:
    backup = path.with_name("backup.db")
    w = StoreWriter(backup)
    w.write(PutRequest(make_record("from-backup")))
    w.close()
    os.replace(backup, path)


@pytest.mark.parametrize(("change", "said"), [(_remove, "deleted"), (_replace_with_backup, "replaced")])
def test_recording_goes_on_in_the_file_at_the_path(tmp_path: Path, change: object, said: str) -> None:
    path = db_path(tmp_path)
    bg = BackgroundWriter(path, batch_interval_s=0.05)
    try:
        _submit(bg, 0, 10)
        assert bg.flush(10)
        assert callable(change)
        change(path)
        _submit(bg, 10, 10)  # queued while the path names another file, or none
        assert bg.flush(10)
        _submit(bg, 20, 5)
        assert bg.flush(10)
        assert bg.reopened_count == 1 and bg.reopen_note is not None and said in bg.reopen_note
        assert bg.pending_count == 0 and bg.dropped_count == 0
    finally:
        assert bg.close()
    stored = _ids(path)
    assert [i for i in stored if i.startswith("r")] == [f"r{i:03d}" for i in range(10, 25)]  # none of the backlog lost
    assert ("from-backup" in stored) == (said == "replaced")
    print(f"{said}: {len(stored)} rows in the file at the path after the change")


def test_the_collectors_metrics_say_what_the_writer_shed_and_reopened() -> None:
    m = parse_exposition(render(MetricsSnapshot(store_shed=7, store_queued_bytes=1234, store_reopened=1)))
    assert m[("phasewatch_store_shed_records_total", ())] == 7
    assert m[("phasewatch_store_pending_bytes", ())] == 1234
    assert m[("phasewatch_store_reopened_total", ())] == 1
