"""Issue 41 item 2 (in part): a cloud model's requests (run on ollama.com) feed no local ceiling on Why: the readings
the story judges and calibrates on leave them out, as written by the collector's own StoreWriter and read back."""

from __future__ import annotations

import time
from pathlib import Path

from pages.shared.basis import rate_samples
from pages.why.view import build_why
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.records import make_record


def test_rate_samples_leave_cloud_requests_out(tmp_path: Path) -> None:
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(make_record("local", now - 60, model="gpt-oss:120b")))
        w.write(PutRequest(make_record("cloud", now - 30, model="gpt-oss:120b-cloud")))
    finally:
        w.close()
    with queries.open_reader(db_path(tmp_path)) as conn:
        assert conn is not None
        rows = queries.recent_requests(conn, now - 3600)
    assert sorted(r.id for r in rows) == ["cloud", "local"]
    generations, embeds = rate_samples(rows)
    assert [s.request_id for s in generations] == ["local"] and embeds == []


def test_why_says_a_cloud_model_ran_elsewhere(tmp_path: Path) -> None:
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(make_record("cloud", now - 30, model="gpt-oss:120b-cloud")))
        w.write(PutRequest(make_record("local", now - 20, model="gpt-oss:120b")))
    finally:
        w.close()
    cloud = build_why(db_path(tmp_path), "gpt-oss:120b-cloud", now)
    local = build_why(db_path(tmp_path), "gpt-oss:120b", now)
    assert cloud is not None and local is not None
    assert any("is a cloud model: it runs on ollama.com" in n for n in cloud.notes)
    assert not any("cloud model" in n for n in local.notes)
