"""Usage totals per model and per client over 1, 7 and 30 days, from a store with known records: what no record
gave stays unknown (an empty total, its records counted), never 0; energy from the GPU samples over each request's
GPU time; the CSV carries the same, with client-chosen names made safe for a spreadsheet."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import GpuSample, Outcome, RequestRecord
from pages.requests.usage import (
    CLUSTER_MAX_S,
    DIRECT_CLIENT,
    SAMPLE_PAD_S,
    client_of,
    energies_j,
    load_usage,
    usage_csv,
    usage_frame,
)
from store.ops import PutGpuSamples, PutRequest
from store.queries import recent_requests
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.records import make_record

NOW = 1_800_000_000.0
DAY = 86_400.0
POWER_W = 100.0
GPU_S = 0.150 + 19 * 0.025  # make_record's prefill (150 ms) and decode (19 gaps of 25 ms) at 20 tokens


def _no_reply(rec: RequestRecord) -> RequestRecord:
    """Cut before Ollama's final chunk: no prompt size, no durations (its streamed tokens were counted)."""
    rec.metrics = None
    rec.outcome = Outcome.CANCELLED
    return rec


@pytest.fixture
def store(tmp_path: Path) -> Path:
    w = StoreWriter(db_path(tmp_path))
    a = make_record("a", NOW - 3600)  # llama3.2 from 127.0.0.1, 2 GPU-sampled: energy known
    b = make_record("b", NOW - 3 * DAY, n_tokens=10)  # no GPU sample then: energy unknown
    b.client_addr = "10.0.0.5:41000"
    c = _no_reply(make_record("c", NOW - 10 * DAY, model="qwen2.5:0.5b"))
    c.client_addr = "=cmd|' /C calc'!A0:1"  # text that a spreadsheet would run
    old = make_record("old", NOW - 40 * DAY)
    for rec in (a, b, c, old):
        w.write(PutRequest(rec))
    # Constant power around a's run, one sample a second.
    w.write(PutGpuSamples([GpuSample(NOW - 3600 + t, 0, "G", "U", power_w=POWER_W) for t in range(-5, 10)]))
    w.close()
    return db_path(tmp_path)


def test_totals_per_model_keep_unknown_apart(store: Path) -> None:
    rows = load_usage(store, NOW)
    assert rows is not None
    by = {(r.period, r.by, r.key): r for r in rows}
    day = by[("1 day", "model", "llama3.2")]
    assert day.requests == 1 and day.prompt_tokens.value == 120 and day.output_tokens.value == 20
    assert day.gpu_s.value == pytest.approx(GPU_S)
    assert day.energy_wh.value == pytest.approx(POWER_W * GPU_S / 3600, rel=0.02) and day.energy_wh.unknown == 0
    week = by[("7 days", "model", "llama3.2")]
    assert week.requests == 2 and week.prompt_tokens.value == 240 and week.output_tokens.value == 30
    # b ran with no GPU sample: its energy is unknown, counted apart; the total is a's alone, not a's plus 0.
    assert week.energy_wh.unknown == 1 and week.energy_wh.value == pytest.approx(day.energy_wh.value)
    month_qwen = by[("30 days", "model", "qwen2.5:0.5b")]
    assert month_qwen.requests == 1
    assert month_qwen.prompt_tokens.value is None and month_qwen.prompt_tokens.unknown == 1  # unknown, not 0
    assert month_qwen.gpu_s.value is None and month_qwen.energy_wh.value is None
    assert ("30 days", "model", "llama3.2") in by and by[("30 days", "model", "llama3.2")].requests == 2  # not the 40-day one


def test_totals_per_client_by_host(store: Path) -> None:
    rows = load_usage(store, NOW) or []
    clients = {r.key: r.requests for r in rows if r.period == "30 days" and r.by == "client"}
    assert clients == {"127.0.0.1": 1, "10.0.0.5": 1, "=cmd|' /C calc'!A0": 1}  # the port is no part of it
    assert client_of("[::1]:5000") == "::1" and client_of(None) == DIRECT_CLIENT


def test_the_table_and_the_csv(store: Path) -> None:
    rows = load_usage(store, NOW) or []
    frame = usage_frame(rows, "model", "30 days")
    qwen = frame[frame["model"] == "qwen2.5:0.5b"].iloc[0]
    assert pd.isna(qwen["prompt tokens"]) and qwen["prompt tokens: records without"] == 1
    table = list(csv.DictReader(io.StringIO(usage_csv(rows).decode())))
    q = next(r for r in table if r["period"] == "30 days" and r["key"] == "qwen2.5:0.5b")
    assert q["prompt_tokens"] == "" and q["prompt_tokens_records_without"] == "1"  # empty, never 0
    hostile = next(r for r in table if r["by"] == "client" and "calc" in r["key"])
    assert hostile["key"].startswith("'=")  # a spreadsheet reads it as text, not a formula


def test_the_requests_page_shows_usage_per_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    for i, rec in enumerate((make_record("x", now - 200), _no_reply(make_record("y", now - 150)))):
        rec.client_addr = f"10.0.0.{i + 1}:5000"
        w.write(PutRequest(rec))
    w.close()
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [c for c in at.segmented_control if c.key == "usage_by"]  # built only when asked
    at.toggle(key="usage_show").set_value(True).run()
    at.segmented_control(key="usage_by").set_value("client").run()
    assert not at.exception, [e.value for e in at.exception]
    frame = next(d.value for d in at.dataframe if "requests" in d.value.columns)  # the usage table
    assert sorted(frame["client"]) == ["10.0.0.1", "10.0.0.2"]
    y = frame[frame["client"] == "10.0.0.2"].iloc[0]
    assert y["prompt tokens"] == "—" and y["prompt tokens: records without"] == "1"  # unknown, shown as such
    assert frame[frame["client"] == "10.0.0.1"].iloc[0]["prompt tokens"] != "—"


def test_a_busy_month_is_read_in_clusters_of_bounded_span(store: Path) -> None:
    """30,000 requests with no gap between them (a busy server's day) are one cluster by the gap rule: its end was
    found again for every request (quadratic: minutes), and its samples were read as one long window's per-minute
    rollups. Now the end is kept as the cluster grows, and a cluster spans CLUSTER_MAX_S at most."""
    with contextlib.closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        (base,) = [r for r in recent_requests(conn, NOW - 2 * DAY, limit=10) if r.id == "a"]
        rows = [replace(base, id=f"busy-{i}", prefill_start_unix_s=NOW - 3 * DAY + i * 0.5) for i in range(30_000)]
        reads: list[str] = []
        conn.set_trace_callback(reads.append)
        started = time.perf_counter()
        energies_j(conn, rows)
        elapsed_s = time.perf_counter() - started
    spans = [float(b) - float(a) for a, b in re.findall(r"BETWEEN ([\d.]+) AND ([\d.]+)", " ".join(reads))]
    assert len(spans) >= 30_000 * 0.5 / CLUSTER_MAX_S  # one read per cluster, each cluster a minute at most
    assert max(spans) <= CLUSTER_MAX_S + 2 * SAMPLE_PAD_S + GPU_S + 1
    assert elapsed_s < 20.0  # ~1 s here; the quadratic search took minutes
