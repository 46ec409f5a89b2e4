"""Retention: rows past their age go, and an oversized store sheds oldest samples first, then oldest requests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from analysis.records import GpuSample, HostSample, LoadedModel, OllamaStatus
from store import queries, sample_queries
from store.ops import ApplyRetention, PutExperiment, PutGpuSamples, PutHostSample, PutLoadedModels, PutOllamaStatus, PutRequest
from store.schema import ROLLUP_S, db_path
from store.writer import DAY_S, BackgroundWriter, RetentionPolicy, StoreWriter
from tests.support.records import make_record

NOW = 1_800_000_000.0
PAGE_SIZE = 4096  # SQLite's default, the store's


def _gpu(ts: float) -> GpuSample:
    return GpuSample(ts, 0, "NVIDIA GeForce RTX 3090", "GPU-x", util_gpu_pct=50.0, mem_used_bytes=10 * 2**30, power_w=200.0)


def _counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        tables = (
            "gpu_samples",
            "host_samples",
            "loaded_models",
            "ps_snapshots",
            "ollama_events",
            "requests",
            "request_tokens",
            "experiments",
        )
        return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables}
    finally:
        conn.close()


def test_rows_past_their_age_are_deleted(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    old_s, new_s = NOW - 8 * DAY_S, NOW - 6 * DAY_S
    for ts in (old_s, new_s):
        w.write(PutGpuSamples([_gpu(ts)]))
        w.write(PutHostSample(HostSample(ts, 1.0, 1, 2)))
        w.write(PutLoadedModels(ts, [LoadedModel(ts, "m:latest", "m:latest", "d" * 64, 10, 10, 2048, None)]))
        w.write(PutOllamaStatus(OllamaStatus(ts, ts == new_s, "http://127.0.0.1:11434")))
    w.write(PutRequest(make_record("old", NOW - 91 * DAY_S)))
    w.write(PutRequest(make_record("kept", NOW - 89 * DAY_S)))
    w.write(PutExperiment("old-exp", "sweep", {}, NOW - 91 * DAY_S, "done"))
    result = w.write(ApplyRetention(NOW))
    w.close()

    assert result.deleted["gpu_samples"] == 1 and result.deleted["requests"] == 1
    assert _counts(path) == {
        "gpu_samples": 1,
        "host_samples": 1,
        "loaded_models": 1,
        "ps_snapshots": 1,
        "ollama_events": 1,
        "requests": 1,
        "request_tokens": 1,
        "experiments": 0,
    }
    conn = queries.open_readonly(path)
    assert [r.id for r in queries.recent_requests(conn, 0)] == ["kept"]
    assert [s.ts_unix_s for s in sample_queries.gpu_samples(conn, 0, NOW)] == [new_s]


def test_custom_ages_are_honoured(tmp_path: Path) -> None:
    w = StoreWriter(db_path(tmp_path), retention=RetentionPolicy(samples_max_age_s=3600, requests_max_age_s=DAY_S))
    w.write(PutHostSample(HostSample(NOW - 7200, 1.0, 1, 2)))
    w.write(PutHostSample(HostSample(NOW - 60, 1.0, 1, 2)))
    w.write(PutRequest(make_record("a", NOW - 2 * DAY_S)))
    w.write(PutRequest(make_record("b", NOW - 3600)))
    w.write(ApplyRetention(NOW))
    w.close()
    counts = _counts(db_path(tmp_path))
    assert counts["host_samples"] == 1 and counts["requests"] == 1


def _fill(w: StoreWriter, n_samples: int, n_requests: int) -> None:
    """Samples at 1 Hz and requests every 10 s over the last hours, all within the age limits."""
    t0 = NOW - n_samples
    for i in range(0, n_samples, 500):
        w.write(PutGpuSamples([_gpu(t0 + j) for j in range(i, min(i + 500, n_samples))]))
    w.apply([PutRequest(make_record(f"r{i:05d}", t0 + 10 * i, n_tokens=100)) for i in range(n_requests)])


def test_size_bound_sheds_oldest_samples_before_any_request(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    _fill(w, n_samples=10_000, n_requests=300)
    full = w.used_bytes()
    pages_before = sqlite3.connect(path).execute("PRAGMA page_count").fetchone()[0]

    w.retention = RetentionPolicy(max_bytes=int(full * 0.8))
    result = w.write(ApplyRetention(NOW))
    assert result.used_bytes_before == full
    assert result.used_bytes_after <= full * 0.8
    counts = _counts(path)
    assert counts["requests"] == 300  # samples go first
    assert 0 < counts["gpu_samples"] < 10_000
    conn = queries.open_readonly(path)
    oldest, newest = conn.execute("SELECT MIN(ts_unix_s), MAX(ts_unix_s) FROM gpu_samples").fetchone()
    assert newest == NOW - 1  # the newest samples stay; the oldest went
    assert oldest > NOW - 10_000
    # The per-minute rollups are cut at the same point (whole minutes before the oldest sample kept).
    (oldest_minute,) = conn.execute("SELECT MIN(minute_unix_s) FROM gpu_minutes").fetchone()
    assert oldest - 2 * ROLLUP_S < oldest_minute <= oldest
    # Freed pages go back to the file system (incremental auto-vacuum stepped to the end), and the -wal
    # file is cut back: the files on disk hold about what the rows use, not one freed page less.
    assert Path(f"{path}-wal").stat().st_size == 0
    pages_after = sqlite3.connect(path).execute("PRAGMA page_count").fetchone()[0]
    assert pages_after * PAGE_SIZE <= full * 0.8
    assert pages_after < pages_before * 0.85
    assert path.stat().st_size <= full * 0.8
    w.close()


@pytest.mark.slow
def test_size_bound_then_sheds_oldest_requests(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    _fill(w, n_samples=5_000, n_requests=800)
    limit = int(w.used_bytes() * 0.3)
    w.retention = RetentionPolicy(max_bytes=limit)
    result = w.write(ApplyRetention(NOW))
    w.close()
    assert result.used_bytes_after <= limit
    counts = _counts(path)
    assert counts["gpu_samples"] == 0
    assert 0 < counts["requests"] < 800
    assert counts["request_tokens"] == counts["requests"]  # token times go with their requests
    conn = queries.open_readonly(path)
    ids = sorted(r.id for r in queries.recent_requests(conn, 0, limit=10_000))
    assert ids[-1] == "r00799"  # the newest stay
    assert ids == [f"r{i:05d}" for i in range(800 - len(ids), 800)]  # a contiguous newest run


@pytest.mark.slow
@pytest.mark.parametrize("auto_vacuum", ["INCREMENTAL", "NONE"])  # NONE: a store made before incremental auto-vacuum
def test_a_store_far_over_its_bound_at_start_shrinks_on_disk(tmp_path: Path, auto_vacuum: str) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    _fill(w, n_samples=30_000, n_requests=2_000)
    w.close()
    if auto_vacuum == "NONE":
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        conn.close()
    size_before = path.stat().st_size
    bound = size_before // 4

    bg = BackgroundWriter(path, retention=RetentionPolicy(max_bytes=bound))  # what the collector does at start
    bg.submit(ApplyRetention(NOW))
    assert bg.flush(timeout_s=30)
    assert bg.close()
    files = path.stat().st_size + (Path(f"{path}-wal").stat().st_size if Path(f"{path}-wal").exists() else 0)
    assert files <= bound, (size_before, files, bound)
    assert _counts(path)["requests"] > 0
