"""Read queries: filters, windows, downsampling in SQL, rate points, stale in-flight rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.phases import split_record
from analysis.records import GpuSample, HostSample, LoadedModel, Outcome
from store import queries, sample_queries
from store.ops import PutGpuSamples, PutHostSample, PutLoadedModels, PutModelInfo, PutRequest
from store.schema import ROLLUP_S, db_path
from store.writer import StoreWriter
from tests.support.records import make_record

T0 = 1_750_000_000.0


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[StoreWriter]:
    w = StoreWriter(db_path(tmp_path), clock=lambda: T0 + 10_000)
    yield w
    w.close()


@pytest.fixture
def conn(writer: StoreWriter) -> Iterator[sqlite3.Connection]:
    c = queries.open_readonly(writer.path)
    yield c
    c.close()


def test_recent_requests_filters(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    writer.apply(
        [
            PutRequest(r)
            for r in [
                make_record("a", T0, model="llama3.2"),
                replace(make_record("b", T0 + 10, model="qwen3"), endpoint="/api/generate"),
                replace(make_record("c", T0 + 20, model="qwen3", final=False), outcome=Outcome.CANCELLED),
                make_record("d", T0 - 100, model="qwen3"),
            ]
        ]
    )
    assert [r.id for r in queries.recent_requests(conn, T0)] == ["c", "b", "a"]  # newest first, since T0
    assert [r.id for r in queries.recent_requests(conn, T0, model="qwen3")] == ["c", "b"]
    assert [r.id for r in queries.recent_requests(conn, T0, endpoint="/api/generate")] == ["b"]
    assert [r.id for r in queries.recent_requests(conn, T0, outcome="cancelled")] == ["c"]
    assert [r.id for r in queries.recent_requests(conn, 0, limit=2)] == ["c", "b"]
    assert [r.id for r in queries.recent_requests(conn, 0, until_unix_s=T0)] == ["a", "d"]
    assert queries.request_models(conn) == ["llama3.2", "qwen3"]
    assert queries.request_models(conn, T0 + 5) == ["qwen3"]
    with pytest.raises(ValueError):
        queries.recent_requests(conn, 0, outcome="bogus")


def test_requests_in_window_finds_those_alive_in_it(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    # Each record lasts 200 ms + 19 × 25 ms + 2 ms ≈ 0.68 s.
    writer.apply(
        [
            PutRequest(r)
            for r in [
                make_record("before", T0 - 100),
                make_record("overlapping", T0 - 0.5),
                make_record("inside", T0 + 10),
                make_record("after", T0 + 100),
                make_record("running", T0 - 50, final=False),  # started before the window, still in flight
            ]
        ]
    )
    got = queries.requests_in_window(conn, T0, T0 + 60)
    assert [r.record.id for r in got] == ["running", "overlapping", "inside"]
    assert all(r.record.token_chunk_ns == [] for r in got)
    with_tokens = queries.requests_in_window(conn, T0, T0 + 60, with_tokens=True)
    assert with_tokens[1].record == make_record("overlapping", T0 - 0.5)
    assert with_tokens[1].phases == split_record(make_record("overlapping", T0 - 0.5))


def test_in_flight_leaves_out_rows_nobody_updates(tmp_path: Path) -> None:
    now = [T0]
    w = StoreWriter(db_path(tmp_path), clock=lambda: now[0])
    w.write(PutRequest(make_record("old", T0 - 600, final=False)))
    now[0] = T0 + 600
    w.write(PutRequest(make_record("live", T0 + 590, final=False)))
    w.close()
    conn = queries.open_readonly(tmp_path)
    assert [r.id for r in queries.in_flight_requests(conn, T0 + 601, stale_after_s=30)] == ["live"]


def _gpu(ts: float, index: int, util: float) -> GpuSample:
    return GpuSample(
        ts,
        index,
        f"GPU {index}",
        f"GPU-{index}",
        util_gpu_pct=util,
        mem_used_bytes=int(ts - T0) * 1000,
        power_w=100.0 + index,
        sm_clock_mhz=1500,
    )


def test_long_windows_are_averaged_into_buckets_in_sql(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    # One hour at 1 Hz on two GPUs; utilisation alternates 0/100 so each bucket's mean is 50.
    samples = [_gpu(T0 + i, g, 100.0 * (i % 2)) for i in range(3600) for g in (0, 1)]
    writer.write(PutGpuSamples(samples))
    writer.write(PutHostSample(HostSample(T0, 10.0, 100, 1000)))
    raw = sample_queries.gpu_samples(conn, T0, T0 + 99)
    assert len(raw) == 200  # 100 s × 2 GPUs, under the limit: untouched
    assert raw[:2] == samples[:2]
    coarse = sample_queries.gpu_samples(conn, T0, T0 + 3600, max_points=60)
    for g in (0, 1):
        mine = [s for s in coarse if s.index == g]
        assert 55 <= len(mine) <= 61
        assert all(s.util_gpu_pct == pytest.approx(50.0) for s in mine)
        assert all(s.name == f"GPU {g}" and s.power_w == pytest.approx(100.0 + g) for s in mine)
        # Memory keeps its peak per bucket, as an int.
        assert all(isinstance(s.mem_used_bytes, int) for s in mine)
        assert mine[-1].mem_used_bytes == 3599 * 1000
    assert [s.ts_unix_s for s in coarse] == sorted(s.ts_unix_s for s in coarse)


def test_rollups_keep_unsupported_fields_missing(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    # A GPU whose driver reports no utilisation and no power: the summary says "unknown", not 0.
    writer.write(PutGpuSamples([GpuSample(T0 + i, 0, "G", "U", mem_used_bytes=i) for i in range(7200)]))
    coarse = sample_queries.gpu_samples(conn, T0, T0 + 7200, max_points=60)
    assert coarse and all(s.util_gpu_pct is None and s.power_w is None for s in coarse)
    assert coarse[-1].mem_used_bytes == 7199


def test_host_samples_downsample(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    for i in range(0, 1000, 100):
        for j in range(i, i + 100):
            writer.write(PutHostSample(HostSample(T0 + j, float(j % 2) * 20, 5_000 + j, 10_000)))
    # 100 buckets of 10 s: averaged from the raw samples.
    fine = sample_queries.host_samples(conn, T0, T0 + 1000, max_points=100)
    assert len(fine) == 100
    assert all(s.cpu_pct == pytest.approx(10.0) for s in fine)
    assert fine[0].mem_used_bytes == 5_009  # peak of the first 10 s
    # Buckets of 100 s or more: whole minutes (2 here) from the per-minute rollups.
    coarse = sample_queries.host_samples(conn, T0, T0 + 1000, max_points=10)
    assert 9 <= len(coarse) <= 10
    assert all(s.cpu_pct == pytest.approx(10.0) for s in coarse)
    first_minute = (int(T0) // ROLLUP_S) * ROLLUP_S
    last_in_first_bucket = first_minute + 2 * ROLLUP_S - 1 - int(T0)
    assert coarse[0].mem_used_bytes == 5_000 + last_in_first_bucket
    assert coarse[-1].mem_used_bytes == 5_999


def test_rate_points_for_the_why_page(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    writer.apply(
        [
            PutRequest(r)
            for r in [
                make_record("a", T0, n_tokens=40),
                make_record("b", T0 + 1, model="other"),
                replace(make_record("c", T0 + 2), outcome=Outcome.CANCELLED),
                make_record("d", T0 + 3, final=False),
            ]
        ]
    )
    (p,) = queries.rate_rows(conn, "llama3.2", T0 - 1)
    assert p.id == "a"
    assert p.prompt_tokens == 120 and p.cached_tokens == 20 and p.output_tokens == 40
    assert p.prefill_tok_s == pytest.approx(100 / 0.15)
    assert p.decode_tok_s == pytest.approx(40.0)
    assert p.decode_context_tokens == pytest.approx(140.0)
    assert p.num_ctx == 4096 and list(p.flags) == ["cache_hit"]


def test_model_info_name_variants(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    writer.write(PutModelInfo("d1" * 32, "qwen3:8b", {"details": {"family": "qwen3"}}))
    writer.write(PutModelInfo("d2" * 32, "llama3.2:latest", {"details": {"family": "llama"}}))
    info = queries.model_info(conn, "qwen3:8b")
    assert info is not None and info.show["details"]["family"] == "qwen3"
    assert queries.model_info(conn, "qwen3") is None  # :latest is implied, not :8b
    latest = queries.model_info(conn, "llama3.2")
    assert latest is not None and latest.digest == "d2" * 32
    assert queries.model_info(conn, "llama3.2:latest") == latest
    # Another name for the same weights, known from /api/ps: found by digest.
    writer.write(PutLoadedModels(T0, [LoadedModel(T0, "llama3.2:3b", "llama3.2:3b", "d2" * 32, 10, 10, 4096, None)]))
    alias = queries.model_info(conn, "llama3.2:3b")
    assert alias is not None and alias.digest == "d2" * 32


def test_empty_store_answers_with_nothing(conn: sqlite3.Connection) -> None:
    assert queries.recent_requests(conn, 0) == []
    assert sample_queries.gpu_samples(conn, 0, 2e9) == []
    assert sample_queries.host_samples(conn, 0, 2e9) == []
    assert queries.latest_loaded_models(conn) == []
    assert queries.latest_ps_snapshot_unix_s(conn) is None
    assert queries.latest_ollama_status(conn) is None
    assert queries.ollama_events(conn, 0, 2e9) == []
    assert queries.latest_heartbeat(conn) is None
    assert queries.model_info(conn, "x") is None
    assert queries.experiment_rows(conn) == []
    assert queries.rate_rows(conn, "x", 0) == []
    assert queries.in_flight_requests(conn, T0) == []


def test_model_info_and_loaded_model_use_the_one_rule_for_names(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    writer.write(PutModelInfo("d3" * 32, "localhost:5000/llama:latest", {"details": {"family": "llama"}}))
    writer.write(
        PutLoadedModels(
            T0, [LoadedModel(T0, "localhost:5000/llama:latest", "localhost:5000/llama:latest", "d3" * 32, 1, 1, 2048, None)]
        )
    )
    info = queries.model_info(conn, "localhost:5000/llama")  # a registry host with a port, no tag: :latest
    assert info is not None and info.digest == "d3" * 32
    assert queries.model_info(conn, "localhost:5000/llama:7b") is None
    loaded = queries.loaded_model(conn, "LOCALHOST:5000/llama")
    assert loaded is not None and loaded.context_length == 2048
    assert "localhost:5000/llama:latest" in queries.model_choices(conn)


def test_requests_in_window_keeps_the_newest_when_cut(writer: StoreWriter, conn: sqlite3.Connection) -> None:
    # Inside the window: more than the limit; the newest by start time are kept, whichever way they are picked.
    inside = [make_record(f"in{i:02d}", T0 + 1 + i) for i in range(12)]
    writer.apply([PutRequest(r) for r in [make_record("overlapping", T0 - 0.5), *inside]])
    cut = queries.requests_in_window(conn, T0, T0 + 60, limit=5)
    assert [r.record.id for r in cut] == [r.id for r in inside[-5:]]  # oldest first
    # A limit above what the window holds: the one that started before the window comes in too.
    whole = queries.requests_in_window(conn, T0, T0 + 60, limit=50)
    assert [r.record.id for r in whole] == ["overlapping", *[r.id for r in inside]]
    assert queries.requests_in_window(conn, T0 + 1000, T0 + 2000) == []
