"""Usage totals from the store's per-day summary (``usage_days``, store v23) equal the same totals computed from every
raw request row, whatever the writer did to the rows (finished later, written again, moved to another model, deleted,
retention); and a store made before the summary gets it filled from its rows when it upgrades (issue 48)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from analysis.records import Outcome, RequestKind, RequestRecord, SeenFrom
from pages.requests.usage import (
    DIRECT_CLIENT,
    ENERGY_ROWS_MAX,
    PERIODS_S,
    UNKNOWN_PROGRAM,
    UsageRow,
    client_of,
    gpu_s_of,
    load_usage,
)
from store import queries
from store.ops import ApplyRetention, DeleteDirect, PutRequest
from store.schema import MIGRATIONS, db_path, migrate
from store.tables import RequestSummary
from store.usage_days import day_of
from store.writer import DAY_S, RetentionPolicy, StoreWriter
from tests.support.records import make_record

NOW = 1_800_000_000.0 + 3 * 3600  # 11:00 UTC
N_REQUESTS = 3_000  # more than ENERGY_ROWS_MAX: the energy read stops short of the month
MODELS = ("llama3.2", "qwen3:4b", "gemma3:270m")
CLIENTS = ("127.0.0.1:50000", "10.0.0.5:41000", "[::1]:5000", "::1", "=cmd|' /C calc'!A0:1", "host:")
PROGRAMS = (None, "curl", "ollama-python")


def _record(rng: random.Random, i: int) -> RequestRecord:
    rec = make_record(f"r{i:05d}", NOW - rng.uniform(0, 35 * DAY_S), model=rng.choice(MODELS), n_tokens=rng.randint(1, 30))
    rec.client_addr = rng.choice(CLIENTS)
    rec.client_program = rng.choice(PROGRAMS)
    roll = rng.random()
    if roll < 0.15:  # no reply: no prompt size, no durations
        rec.metrics = None
        rec.outcome = Outcome.CANCELLED
    elif roll < 0.25:
        rec.kind = RequestKind.EMBED
    elif roll < 0.30:
        rec.kind = RequestKind.LOAD
    return rec


def _direct(i: int) -> RequestRecord:
    return RequestRecord(
        id=f"d{i}",
        started_at_unix_s=NOW - 60.0 * i,
        client_addr=None,
        endpoint=None,
        model="gemma3:270m",
        stream=None,
        received_ns=10**12,
        outcome=Outcome.OK,
        seen_from=SeenFrom.RUNNER,
        runner_port=39511,
        runner_task_id=i,
        runner_source="slots",
        final_chunk_ns=10**12 + 10**9,
        closed_ns=10**12 + 10**9,
    )


def _raw(rows: Sequence[RequestSummary]) -> dict[tuple[str, str, str], tuple[object, ...]]:
    """Every total computed from the raw rows alone: (period, by, key) → requests, embeds, and per figure the sum of
    the known values (None when none) with the count of the requests it applies to that lack it."""
    today = day_of(NOW)
    out: dict[tuple[str, str, str], tuple[object, ...]] = {}
    finished = [r for r in rows if r.ended_at_unix_s is not None]
    for period, span_s in PERIODS_S.items():
        since = today - (round(span_s / DAY_S) - 1) * DAY_S
        inside = [r for r in finished if r.started_at_unix_s >= since]
        for by in ("model", "client", "program"):
            groups: dict[str, list[RequestSummary]] = {}
            for r in inside:
                keys = {"model": r.model, "client": client_of(r.client_addr), "program": r.client_program or UNKNOWN_PROGRAM}
                groups.setdefault(keys[by], []).append(r)
            for key, group in groups.items():
                gen = [r for r in group if r.kind is RequestKind.GENERATE]
                work = [r for r in group if r.kind in (RequestKind.GENERATE, RequestKind.EMBED)]
                figures: list[object] = [len(group), sum(r.kind is RequestKind.EMBED for r in group)]
                values: tuple[tuple[list[RequestSummary], Callable[[RequestSummary], float | None]], ...] = (
                    (work, lambda r: r.prompt_tokens),
                    (gen, lambda r: r.output_tokens),
                    (work, gpu_s_of),
                )
                for applies, value in values:
                    known = [v for v in (value(r) for r in applies) if v is not None]
                    figures += [round(sum(known), 6) if known else None, len(applies) - len(known)]
                out[(period, by, key)] = tuple(figures)
    return out


def _shown(rows: Sequence[UsageRow]) -> dict[tuple[str, str, str], tuple[object, ...]]:
    out: dict[tuple[str, str, str], tuple[object, ...]] = {}
    for r in rows:
        figures: list[object] = [r.requests, r.embeddings]
        for t in (r.prompt_tokens, r.output_tokens, r.gpu_s):
            figures += [None if t.value is None else round(t.value, 6), t.unknown]
        out[(r.period, r.by, r.key)] = tuple(figures)
    return out


def _check(path: Path) -> list[UsageRow]:
    with queries.open_reader(path) as conn:
        assert conn is not None
        raw = _raw(queries.recent_requests(conn, 0.0, limit=10**9))
    rows = load_usage(path, NOW)
    assert rows is not None
    assert _shown(rows) == raw
    return rows


def test_the_summary_totals_equal_the_raw_rows_through_every_write(tmp_path: Path) -> None:
    rng = random.Random(48)
    path = db_path(tmp_path)
    w = StoreWriter(path, retention=RetentionPolicy(requests_max_age_s=32 * DAY_S), clock=lambda: NOW)
    try:
        recs = [_record(rng, i) for i in range(N_REQUESTS)]
        # In flight first (not counted), then finished; some written again, as a late write of the log's figures.
        w.apply([PutRequest(make_record(r.id, r.started_at_unix_s, final=False, model=r.model)) for r in recs[:300]])
        w.apply([PutRequest(r) for r in recs])
        w.apply([PutRequest(r) for r in recs[:100]])
        w.apply([PutRequest(make_record("running", NOW - 5.0, final=False))])
        rows = _check(path)
        assert {r.key for r in rows if r.by == "client"} >= {"127.0.0.1", "::1", ":", "host:", "=cmd|' /C calc'!A0"}
        # Corrections move a request to another model, day and program; direct rows come and some are taken back.
        w.apply([PutRequest(replace(r, model="llama3.1:8b", client_program="curl")) for r in recs[100:150]])
        w.apply([PutRequest(replace(r, started_at_unix_s=r.started_at_unix_s - DAY_S)) for r in recs[150:200]])
        w.apply([PutRequest(_direct(i)) for i in range(1, 9)])
        assert w.write(DeleteDirect(tuple(f"d{i}" for i in range(1, 9, 2)))) == 4
        rows = _check(path)
        assert any(r.key == DIRECT_CLIENT for r in rows if r.by == "client")
        # Retention takes the requests past 32 days: the summary follows.
        assert w.write(ApplyRetention(NOW)).deleted["requests"] > 0
        rows = _check(path)
    finally:
        w.close()
    # Energy: no GPU sample in this store, so unknown for every request, never 0; most were not even read.
    month = [r for r in rows if r.period == "30 days" and r.by == "model"]
    assert all(r.energy_wh.value is None for r in month)
    assert sum(r.energy_unread for r in month) >= sum(r.requests for r in month) * 0.3 - ENERGY_ROWS_MAX


def test_a_store_before_the_summary_gets_it_from_its_rows(tmp_path: Path) -> None:
    rng = random.Random(22)
    path = db_path(tmp_path)
    before = next(i for i, m in enumerate(MIGRATIONS) if m.name == "usage_days")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn, target=before)  # a store as the Phasewatch before the summary left it, with its requests
        cols = (
            "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s, "
            "ended_at_unix_s, kind, client_program, prompt_tokens, output_tokens, prefill_s, decode_s"
        )
        conn.execute("BEGIN")
        for i in range(400):
            start = NOW - rng.uniform(0, 35 * DAY_S)
            known = rng.random() < 0.8
            conn.execute(
                f"INSERT INTO requests ({cols}) VALUES (?, ?, ?, '/api/chat', ?, 1, 0, 'ok', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    f"r{i}",
                    start,
                    rng.choice(CLIENTS),
                    rng.choice(MODELS),
                    NOW,
                    None if i % 10 == 0 else start + 2.0,  # one in ten still running
                    rng.choice(["generate", "generate", "embed", "load"]),
                    rng.choice(PROGRAMS),
                    rng.randint(1, 4000) if known else None,
                    rng.randint(1, 300) if known else None,
                    rng.uniform(0.01, 1.0) if known else None,
                    rng.uniform(0.1, 9.0) if rng.random() < 0.9 else None,
                ),
            )
        conn.execute("COMMIT")
        assert migrate(conn) == before
    finally:
        conn.close()
    rows = _check(path)
    assert sum(r.requests for r in rows if r.period == "30 days" and r.by == "model") > 250
