"""A writer process SIGKILLed mid-write leaves a sound store holding every acknowledged request."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store import queries
from store.ops import MarkInterrupted
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

# Writes requests for ever; prints each id once its transaction is committed (the acknowledgement).
CHILD = r"""
import sys, time
from dataclasses import replace
from store.ops import PutRequest
from store.writer import BackgroundWriter, StoreWriter
from tests.support.records import make_record

path, mode = sys.argv[1], sys.argv[2]
if mode == "sync":
    w = StoreWriter(path)
    i = 0
    while True:
        rec = replace(make_record(f"r{i}", time.time(), n_tokens=50), response_text="y" * 2000)
        w.apply([PutRequest(r) for r in [make_record(f"r{i}", time.time(), final=False, n_tokens=5), rec]])
        print(rec.id, flush=True)
        i += 1
else:
    w = BackgroundWriter(path, batch_interval_s=0.01)
    i = 0
    while True:
        ids = []
        for _ in range(20):
            rec = make_record(f"r{i}", time.time(), n_tokens=50)
            w.submit(PutRequest(rec))
            ids.append(rec.id)
            i += 1
        if w.flush(timeout_s=30):
            print("\n".join(ids), flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_sigkill_during_writes_keeps_acknowledged_requests(tmp_path: Path, mode: str) -> None:
    path = db_path(tmp_path)
    StoreWriter(path).close()  # created and migrated before the child starts
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    acked: list[str] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while len(acked) < 300 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(line.decode().strip())
        # Kill it while it is busy writing (it never stops on its own).
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        # Whatever it acknowledged after our last read is still in the pipe.
        acked += [line.decode().strip() for line in child.stdout.readlines() if line.strip()]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        for stream in (child.stdout, child.stderr):
            if stream:
                stream.close()
    assert len(acked) >= 300

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    reader = queries.open_readonly(path)
    stored = {r[0] for r in reader.execute("SELECT id FROM requests WHERE outcome = 'ok'")}
    assert set(acked) <= stored
    # No request without its token times: each batch went in whole or not at all.
    orphans = reader.execute(
        "SELECT COUNT(*) FROM requests r LEFT JOIN request_tokens t ON t.request_id = r.id WHERE t.request_id IS NULL"
    ).fetchone()[0]
    assert orphans == 0
    reader.close()
    # The next writer opens it fine and marks what was in flight as interrupted.
    w = StoreWriter(path)
    w.write(MarkInterrupted("collector was killed"))
    w.close()
