"""Retention and the size bound cover the model metadata too, and never shed every request to make room for it.

Issue 25 finding 6: 1 MB ``model_info`` rows x 5,000 tags held a 50 MB store at 701 MB, and the size bound then
deleted every stored request (model_info was never shed). Stores written before the poller slimmed /api/show still
hold such rows: the bound sheds those of models no longer installed, and keeps the newest requests whatever is left.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from analysis.records import InstalledModel
from store.ops import KEEP_NEWEST_REQUESTS, ApplyRetention, PutInstalledModels, PutModelInfo, PutRequest
from store.schema import db_path
from store.writer import RetentionPolicy, StoreWriter
from tests.support.records import make_record

NOW = 1_800_000_000.0
SHOW_CHARS = 50_000  # an /api/show stored whole, as before the poller slimmed it
MODELS = 60
INSTALLED = 5  # of which still installed


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _fill(w: StoreWriter, n_requests: int) -> None:
    w.apply([PutRequest(replace(make_record(f"r{i:05d}"), started_at_unix_s=NOW - 3600 + i)) for i in range(n_requests)])
    for i in range(MODELS):
        w.write(PutModelInfo(f"sha256:{i:04d}", f"m{i}:latest", {"model_info": {"x": "y" * SHOW_CHARS}}))
    installed = [
        InstalledModel(NOW, f"m{i}:latest", f"m{i}:latest", f"sha256:{i:04d}", None, None, None, None, None)
        for i in range(INSTALLED)
    ]
    w.write(PutInstalledModels(installed))


def test_the_bound_sheds_metadata_of_models_gone_before_requests(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    _fill(w, n_requests=400)
    requests_bytes = w.used_bytes() - MODELS * SHOW_CHARS
    w.retention = RetentionPolicy(max_bytes=int(requests_bytes + INSTALLED * SHOW_CHARS * 2))
    w.write(ApplyRetention(NOW))
    w.close()
    assert _count(path, "model_info") == INSTALLED  # the metadata of models gone went first...
    assert _count(path, "requests") == 400  # ...and no request had to


def test_the_bound_never_sheds_the_newest_requests_for_metadata(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    _fill(w, n_requests=400)
    w.retention = RetentionPolicy(max_bytes=INSTALLED * SHOW_CHARS // 2)  # the installed models' metadata alone is over
    w.write(ApplyRetention(NOW))
    w.close()
    kept = _count(path, "requests")
    print(f"requests kept: {kept} of 400")
    assert kept == KEEP_NEWEST_REQUESTS
    assert _count(path, "model_info") == INSTALLED  # what the installed models need stays


def test_model_info_of_models_gone_ages_out_like_requests(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path, clock=lambda: NOW - 100 * 86_400.0)  # written 100 days ago
    _fill(w, n_requests=1)
    w.close()
    w = StoreWriter(path)
    w.write(ApplyRetention(NOW))  # requests are kept 90 days
    w.close()
    assert _count(path, "model_info") == INSTALLED
