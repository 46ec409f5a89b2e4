"""Store v9: generations sent to Ollama directly, recorded from the runner, beside proxied ones.

A v8 store migrates with its rows (all proxied); a direct record with its route, client and ``stream`` unknown
is stored as NULL and read back as None (never "" or 0); its sources and bounds round-trip; the export and the
Why page's rate rows carry it; DeleteDirect takes back only rows seen from the runner.
"""

from __future__ import annotations

import io
import sqlite3
from dataclasses import replace
from pathlib import Path

from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from store import queries
from store.export import export_rows, write_csv
from store.ops import DeleteDirect, PutRequest
from store.schema import SCHEMA_VERSION, db_path, migrate
from store.writer import StoreWriter


def direct(rid: str, source: str, *, bound_s: float) -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=1000.0,
        client_addr=None,
        endpoint=None,
        model="gemma3:270m",
        stream=None,
        received_ns=10**12,
        forwarded_ns=10**12,
        first_token_ns=10**12 + 2 * 10**9,
        final_chunk_ns=10**12 + 5 * 10**9,
        outcome=Outcome.OK,
        thinking_chunks=None,
        metrics=FinalMetrics(
            prompt_eval_count=400,
            prompt_eval_cached_count=0,
            prompt_eval_duration_ns=2 * 10**9,
            eval_count=31,
            eval_duration_ns=3 * 10**9,
        ),
        seen_from=SeenFrom.RUNNER,
        runner_port=39511,
        runner_task_id=12,
        runner_source=source,
        ends_bound_s=bound_s,
        prefill_bound_s=bound_s,
        decode_bound_s=bound_s,
        output_tokens_bound=0,
    )


def test_a_v8_store_migrates_to_v9_its_rows_proxied(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn, target=8)
    cols = "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s"
    conn.execute(f"INSERT INTO requests ({cols}) VALUES ('old', 1.0, 'c', '/api/generate', 'm:latest', 0, 0, 'ok', 1.0)")
    conn.close()
    w = StoreWriter(path)
    try:
        w.write(PutRequest(direct("d1", "log", bound_s=5e-6)))
    finally:
        w.close()
    with queries.open_reader(path) as rconn:
        assert rconn is not None
        assert rconn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert rconn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = dict(rconn.execute("SELECT id, seen_from FROM requests").fetchall())
        assert rows == {"old": "proxy", "d1": "runner"}
        nulls = rconn.execute("SELECT client_addr, endpoint, stream FROM requests WHERE id = 'd1'").fetchone()
        assert tuple(nulls) == (None, None, None)


def test_a_direct_record_round_trips_and_is_exported_and_charted(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    try:
        w.write(PutRequest(direct("exact", "log", bound_s=5e-6)))
        w.write(PutRequest(direct("rough", "slots", bound_s=0.25)))  # ±0.25 s over 2 and 3 s: past 5%
    finally:
        w.close()
    with queries.open_reader(path) as conn:
        assert conn is not None
        stored = queries.request_detail(conn, "exact")
        assert stored is not None and stored.record == direct("exact", "log", bound_s=5e-6)
        assert stored.phases.prefill_s == 2.0 and stored.phases.prefill_source == "log"
        assert stored.phases.client_s is None and stored.phases.ttft_s is None
        rough = queries.request_detail(conn, "rough")
        assert rough is not None and rough.phases.decode_source == "slots"
        assert [r.id for r in queries.rate_rows(conn, "gemma3:270m", 0.0)] == ["exact"]  # exact figures only
        exported = {row["id"]: row for row in export_rows(conn)}
        assert exported["rough"]["seen_from"] == "runner" and exported["rough"]["runner_source"] == "slots"
        assert exported["rough"]["prefill_bound_s"] == 0.25 and exported["rough"]["endpoint"] is None
        out = io.StringIO()
        write_csv(export_rows(conn), out)
        assert ",runner,slots,39511,12,0.25,0.25,0.25,0" in out.getvalue()


def test_delete_direct_takes_back_only_rows_seen_from_the_runner(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    proxied = RequestRecord(
        id="p",
        started_at_unix_s=1000.0,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model="gemma3:270m",
        stream=True,
        received_ns=0,
        outcome=Outcome.OK,
    )
    w = StoreWriter(path)
    try:
        w.write(PutRequest(direct("d", "slots", bound_s=0.25)))
        w.write(PutRequest(proxied))
        assert w.write(DeleteDirect(("d", "p"))) == 1
    finally:
        w.close()
    with queries.open_reader(path) as conn:
        assert conn is not None
        assert [r[0] for r in conn.execute("SELECT id FROM requests")] == ["p"]


def test_v17_keeps_whether_the_client_is_unverified(tmp_path: Path) -> None:
    """A direct record whose client came from Ollama's access line is stored unverified; a v16 store's direct rows
    with a client become so, its proxied rows not."""
    path = db_path(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn, target=16)
    cols = "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s, seen_from"
    conn.execute(f"INSERT INTO requests ({cols}) VALUES ('p', 1.0, 'c', '/api/chat', 'm', 0, 0, 'ok', 1.0, 'proxy')")
    conn.execute(f"INSERT INTO requests ({cols}) VALUES ('d', 1.0, 'c', '/api/chat', 'm', NULL, 0, 'ok', 1.0, 'runner')")
    conn.close()
    told = replace(direct("d2", "log", bound_s=5e-6), client_addr="10.0.0.7", endpoint="/api/chat", client_unverified=True)
    w = StoreWriter(path)
    try:
        w.write(PutRequest(told))
        w.write(PutRequest(direct("d3", "slots", bound_s=0.5)))
    finally:
        w.close()
    with queries.open_reader(path) as rconn:
        assert rconn is not None
        rows = dict(rconn.execute("SELECT id, client_unverified FROM requests").fetchall())
    assert rows == {"p": 0, "d": 1, "d2": 1, "d3": 0}
