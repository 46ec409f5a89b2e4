"""The store writer on real SQLite files: round trips, upserts, migrations, status events."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.phases import split_record
from analysis.records import (
    CollectorInfo,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    RequestRecord,
)
from store import queries, sample_queries
from store.ops import (
    MarkInterrupted,
    PutExperiment,
    PutGpuSamples,
    PutHeartbeat,
    PutHostSample,
    PutLoadedModels,
    PutModelInfo,
    PutOllamaStatus,
    PutRequest,
)
from store.rows import decode_token_times, encode_token_times
from store.schema import _V1, DB_FILENAME, MIGRATIONS, SCHEMA_VERSION, StoreError, connect_writer, db_path
from store.tables import PHASES_VERSION
from store.writer import StoreWriter
from tests.support.records import make_record


def _record(conn: sqlite3.Connection, id: str) -> RequestRecord | None:
    stored = queries.request_detail(conn, id)
    return None if stored is None else stored.record


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreWriter]:
    w = StoreWriter(db_path(tmp_path))
    yield w
    w.close()


def test_new_store_is_wal_at_current_version(tmp_path: Path) -> None:
    StoreWriter(db_path(tmp_path)).close()
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental


def test_request_round_trip_is_exact(store: StoreWriter) -> None:
    rec = make_record()
    store.write(PutRequest(rec))
    conn = queries.open_readonly(store.path)
    back = queries.request_detail(conn, rec.id)
    assert back is not None and back.record == rec
    assert back.phases == split_record(rec) and back.phases_version == PHASES_VERSION  # exactly the split, stored
    assert queries.request_detail(conn, "nope") is None


def test_derived_phase_columns_match_the_split(store: StoreWriter) -> None:
    rec = make_record()
    store.write(PutRequest(rec))
    p = split_record(rec)
    (row,) = queries.recent_requests(queries.open_readonly(store.path), since_unix_s=0)
    for key in ("ttft_s", "queue_s", "prefill_tok_s", "decode_tok_s", "itl_p50_ms", "itl_p99_ms", "itl_max_ms"):
        assert getattr(row, key) == pytest.approx(getattr(p, key)), key
    assert row.prefill_tok_s == pytest.approx(100 / 0.150)  # 120 prompt − 20 cached over 150 ms
    assert row.decode_tok_s == pytest.approx(1 / 0.025)
    assert row.flags == ("cache_hit",)
    assert row.tokens_so_far == 20
    assert row.decode_end_unix_s == pytest.approx(rec.wall_s(rec.final_chunk_ns))  # type: ignore[arg-type]


def test_in_flight_rows_are_replaced_by_the_final_one(store: StoreWriter) -> None:
    final = make_record()
    early = replace(make_record(final=False), token_chunk_ns=final.token_chunk_ns[:3])
    store.write(PutRequest(early))
    conn = queries.open_readonly(store.path)
    now = time.time()
    (live,) = queries.in_flight_requests(conn, now_unix_s=now)
    assert live.token_chunk_ns == final.token_chunk_ns[:3]
    store.write(PutRequest(final))
    assert queries.in_flight_requests(conn, now_unix_s=now) == []
    assert _record(conn, final.id) == final
    # A late progress row (written after the final one) must not undo it.
    store.write(PutRequest(early))
    assert _record(conn, final.id) == final
    assert conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1


def test_batch_with_progress_and_final_keeps_the_final(store: StoreWriter) -> None:
    final = make_record()
    batch = [make_record(final=False, n_tokens=2), final, make_record("req-2", final=False, n_tokens=1)]
    store.apply([PutRequest(r) for r in batch])
    conn = queries.open_readonly(store.path)
    assert _record(conn, final.id) == final
    assert [r.id for r in queries.in_flight_requests(conn, time.time())] == ["req-2"]


def test_mark_interrupted_turns_in_flight_into_upstream_failed(store: StoreWriter) -> None:
    store.apply([PutRequest(r) for r in [make_record("a", final=False), make_record("b")]])
    assert store.write(MarkInterrupted("collector stopped before the request finished")) == 1
    conn = queries.open_readonly(store.path)
    a = _record(conn, "a")
    assert a is not None and a.outcome is Outcome.UPSTREAM_FAILED
    assert a.error == "collector stopped before the request finished"
    b = _record(conn, "b")
    assert b is not None and b.outcome is Outcome.OK


def test_token_times_encoding_round_trips_with_negative_gaps() -> None:
    times = [10, 5, 1_000_000_000_000, 2**40]
    blob = encode_token_times(7, times)
    assert len(blob) == 8 * len(times)
    assert decode_token_times(7, blob) == times


def test_samples_models_status_heartbeat_and_experiments_round_trip(store: StoreWriter) -> None:
    t = 1_700_000_000.0
    gpu = GpuSample(
        t,
        0,
        "NVIDIA GeForce RTX 4090",
        "GPU-1",
        util_gpu_pct=97.0,
        mem_used_bytes=20 * 2**30,
        power_w=350.5,
        pstate=0,
        simulated=True,
    )
    gpu2 = replace(gpu, index=1, uuid="GPU-2", util_gpu_pct=None)
    store.write(PutGpuSamples([gpu, gpu2]))
    host = HostSample(t, 12.5, 8 * 2**30, 64 * 2**30, ollama_cpu_pct=3.0, ollama_rss_bytes=2**30, disk_read_bytes_s=None)
    store.write(PutHostSample(host))
    m = LoadedModel(
        t, "llama3.2:latest", "llama3.2:latest", "a" * 64, 3_600_000_000, 3_000_000_000, 4096, t + 300, "3.2B", "Q4_K_M", "llama"
    )
    store.write(PutLoadedModels(t, [m]))
    show = {
        "license": "long text",
        "modelfile": "FROM x",
        "template": "{{ .Prompt }}",
        "model_info": {"llama.block_count": 28},
        "details": {"family": "llama"},
    }
    store.write(PutModelInfo("a" * 64, "llama3.2:latest", show))
    info = CollectorInfo(t, 1234, "127.0.0.1:11435", "http://127.0.0.1:11434", "/data", "simulated", "no NVIDIA GPU", demo=True)
    store.write(PutHeartbeat(info))
    store.write(PutExperiment("e1", "prompt_sweep", {"lengths": [128, 512]}, t, "running"))
    store.write(PutExperiment("e1", "prompt_sweep", {"lengths": [128, 512]}, t, "done", t + 60, {"rows": [1, 2]}))

    conn = queries.open_readonly(store.path)
    assert sample_queries.gpu_samples(conn, t - 1, t + 1) == [gpu, gpu2]
    assert sample_queries.host_samples(conn, t - 1, t + 1) == [host]
    assert queries.latest_loaded_models(conn) == [m]
    got = queries.model_info(conn, "llama3.2")
    assert got is not None
    assert got.show["model_info"] == {"llama.block_count": 28} and got.digest == "a" * 64
    assert not {"license", "modelfile", "template"} & set(got.show)
    assert queries.latest_heartbeat(conn) == info
    (exp,) = queries.experiment_rows(conn)
    assert exp.status == "done" and exp.params == {"lengths": [128, 512]} and exp.results == {"rows": [1, 2]}

    # Nothing loaded any more: the latest snapshot is empty, not the old one.
    store.write(PutLoadedModels(t + 1, []))
    assert queries.latest_loaded_models(conn) == []
    assert queries.latest_ps_snapshot_unix_s(conn) == t + 1


def test_ollama_status_keeps_changes_as_events_and_the_last_poll(store: StoreWriter) -> None:
    url = "http://127.0.0.1:11434"
    polls = [
        OllamaStatus(100.0, True, url, "0.33.0"),
        OllamaStatus(101.0, True, url, "0.33.0"),
        OllamaStatus(102.0, False, url, None, "connection refused"),
        OllamaStatus(103.0, False, url, None, "connection refused"),
        OllamaStatus(104.0, True, url, "0.33.1"),
    ]
    for s in polls:
        store.write(PutOllamaStatus(s))
    conn = queries.open_readonly(store.path)
    assert queries.latest_ollama_status(conn) == polls[-1]
    assert [e.ts_unix_s for e in queries.ollama_events(conn, 0, 200)] == [100.0, 102.0, 104.0]
    # The state in force at the window start comes first.
    assert [e.ts_unix_s for e in queries.ollama_events(conn, 103.0, 200)] == [102.0, 104.0]


def test_migrates_a_v1_store_and_keeps_its_rows(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    cols = "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s"
    conn.execute(f"INSERT INTO requests ({cols}) VALUES ('old', 1.0, 'c', '/api/generate', 'm', 0, 0, 'ok', 1.0)")
    # Six hours of samples at one a minute, utilisation 0 and 100 in turn (rolled up by migration 3).
    t0 = 1_700_000_040.0
    for i in range(360):
        conn.execute(
            "INSERT INTO gpu_samples (ts_unix_s, gpu_index, name, uuid, util_gpu_pct, mem_used_bytes) "
            "VALUES (?, 0, 'G', 'U', ?, ?)",
            (t0 + 60 * i, 100.0 * (i % 2), 1000 + i),
        )
        conn.execute("INSERT INTO host_samples VALUES (?, ?, 1, 2, NULL, NULL, NULL)", (t0 + 60 * i, 50.0))
    conn.close()
    assert "experiments" not in _V1
    with pytest.raises(StoreError, match="v1"):
        queries.open_readonly(path)  # readers refuse an old schema with a clear message

    rec = make_record()
    w = StoreWriter(path)
    w.write(PutRequest(rec))
    w.write(PutExperiment("e", "k", {}, 1.0, "done"))
    w.close()
    rconn = queries.open_readonly(path)
    assert rconn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert {r.id for r in queries.recent_requests(rconn, 0)} == {"old", rec.id}
    assert _record(rconn, rec.id) == rec
    # A six-hour window reads the rollups that migration 3 built from the old samples.
    gpu = sample_queries.gpu_samples(rconn, t0, t0 + 6 * 3600, max_points=180)  # 2-minute buckets: one 0 and one 100
    assert len(gpu) == 180
    assert all(s.util_gpu_pct == pytest.approx(50.0) for s in gpu)
    assert gpu[-1].mem_used_bytes == 1359
    host = sample_queries.host_samples(rconn, t0, t0 + 6 * 3600, max_points=180)
    assert len(host) == 180 and host[0].cpu_pct == pytest.approx(50.0)


def test_refuses_a_store_newer_than_the_code(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    StoreWriter(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        StoreWriter(path)
    with pytest.raises(StoreError, match="newer"):
        queries.open_readonly(path)


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable Phasewatch store"):
        connect_writer(path)


def test_reader_cannot_write(store: StoreWriter) -> None:
    conn = queries.open_readonly(store.path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM requests")


def test_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="python -m collectors"):
        queries.open_readonly(tmp_path)


def test_experiment_params_are_json(store: StoreWriter) -> None:
    store.write(PutExperiment("e2", "decode_vs_context", {"model": "m", "contexts": [1, 2]}, 5.0, "queued"))
    raw = sqlite3.connect(store.path).execute("SELECT params_json FROM experiments").fetchone()[0]
    assert json.loads(raw) == {"model": "m", "contexts": [1, 2]}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**62), st.lists(st.integers(0, 2**62), max_size=50))
def test_token_times_round_trip_any_clock_values(received_ns: int, times: list[int]) -> None:
    assert decode_token_times(received_ns, encode_token_times(received_ns, times)) == times


def test_a_progress_row_queued_after_the_final_one_does_not_replace_it(store: StoreWriter) -> None:
    # The collector's tick may snapshot a request just before it finishes and queue it just after.
    final = make_record()
    progress = replace(make_record(final=False), token_chunk_ns=final.token_chunk_ns[:3])
    store.apply([PutRequest(final), PutRequest(progress)])
    assert _record(queries.open_readonly(store.path), final.id) == final
