"""A running request's token times are written by what is new since the last write (schema v22), and a crash keeps
them up to the last write."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.phases import split_record
from analysis.records import Outcome, RequestRecord
from store import queries
from store.ops import MarkInterrupted, PutRequest
from store.rows import encode_token_times
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.records import make_record


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreWriter]:
    w = StoreWriter(db_path(tmp_path))
    yield w
    w.close()


def _running(final: RequestRecord, n: int) -> RequestRecord:
    """The record as the proxy snapshots it while running, ``n`` chunks in."""
    return replace(
        final,
        token_chunk_ns=final.token_chunk_ns[:n],
        final_chunk_ns=None,
        closed_ns=None,
        status_code=None,
        metrics=None,
        outcome=Outcome.IN_FLIGHT,
    )


def _jittered(n_tokens: int, seed: int = 1) -> RequestRecord:
    """A finished reply whose gaps differ, so that percentiles taken from the wrong gaps would show."""
    rng = random.Random(seed)
    rec = make_record(n_tokens=n_tokens)
    t, chunks = rec.received_ns + 200_000_000, []
    for _ in range(n_tokens):
        t += rng.randrange(1_000_000, 90_000_000)
        chunks.append(t)
    end = chunks[-1] + 1_000_000
    return replace(rec, token_chunk_ns=chunks, final_chunk_ns=end, closed_ns=end + 1_000_000)


def _pieces(conn: sqlite3.Connection, rid: str) -> list[tuple[int, int, int]]:
    sql = "SELECT first_chunk, n_chunks, length(gaps_le_i64) FROM request_token_pieces WHERE request_id = ? ORDER BY 1"
    return [tuple(r) for r in conn.execute(sql, (rid,)).fetchall()]


def test_each_running_write_stores_only_the_chunks_new_since_the_last(store: StoreWriter) -> None:
    final = _jittered(3_000)
    conn = queries.open_readonly(store.path)
    for n in (3, 1_000, 1_000, 2_999):  # the same count twice: nothing new, nothing written
        store.write(PutRequest(_running(final, n)))
        (live,) = queries.in_flight_requests(conn, time.time())
        assert live.token_chunk_ns == final.token_chunk_ns[:n]  # Live reads the same times as before
        row = queries.request_detail(conn, final.id)
        assert row is not None and row.phases == split_record(_running(final, n))  # percentiles as a full sort gives
    assert _pieces(conn, final.id) == [(0, 3, 24), (3, 997, 8 * 997), (1_000, 1_999, 8 * 1_999)]
    assert conn.execute("SELECT COUNT(*) FROM request_tokens").fetchone()[0] == 0

    store.write(PutRequest(final))
    assert _pieces(conn, final.id) == []  # the finished row's times are written whole, once
    (blob,) = conn.execute("SELECT gaps_le_i64 FROM request_tokens WHERE request_id = ?", (final.id,)).fetchone()
    assert blob == encode_token_times(final.received_ns, final.token_chunk_ns)
    stored = queries.request_detail(conn, final.id)
    assert stored is not None and stored.record == final and stored.phases == split_record(final)
    store.write(PutRequest(_running(final, 10)))  # a snapshot taken before the end, written after it
    assert _pieces(conn, final.id) == [] and queries.request_detail(conn, final.id) == stored
    assert len(store._running) == 0  # and its gaps are not kept for a request that will not be written again


def test_a_write_dropped_from_a_batch_loses_no_chunk(store: StoreWriter) -> None:
    """The writer keeps one in-flight row per request in a batch (drop_superseded): the later one carries all."""
    final = _jittered(50)
    store.write(PutRequest(_running(final, 5)))
    store.apply([PutRequest(_running(final, 20)), PutRequest(_running(final, 40))])
    conn = queries.open_readonly(store.path)
    assert _pieces(conn, final.id) == [(0, 5, 40), (5, 35, 280)]
    (live,) = queries.in_flight_requests(conn, time.time())
    assert live.token_chunk_ns == final.token_chunk_ns[:40]


def test_a_crash_keeps_the_running_requests_tokens_up_to_the_last_write(tmp_path: Path) -> None:
    a, b = _jittered(500, seed=2), _jittered(30, seed=3)
    b = replace(b, id="req-2")
    writer = StoreWriter(db_path(tmp_path))
    for n in (10, 200, 480):
        writer.write(PutRequest(_running(a, n)))
    writer.write(PutRequest(_running(b, 7)))
    writer.close()  # the collector dies here: no final row

    writer = StoreWriter(db_path(tmp_path))
    assert writer.write(MarkInterrupted("collector stopped before the request finished")) == 2
    writer.close()
    conn = queries.open_readonly(db_path(tmp_path))
    for rec, n in ((a, 480), (b, 7)):
        stored = queries.request_detail(conn, rec.id)
        assert stored is not None and stored.record.outcome is Outcome.UPSTREAM_FAILED
        assert stored.record.token_chunk_ns == rec.token_chunk_ns[:n]
        (count,) = conn.execute("SELECT n_chunks FROM request_tokens WHERE request_id = ?", (rec.id,)).fetchone()
        assert count == n
    assert conn.execute("SELECT COUNT(*) FROM request_token_pieces").fetchone()[0] == 0


def test_retention_deletes_a_running_requests_pieces_with_it(store: StoreWriter) -> None:
    final = _jittered(30)
    store.write(PutRequest(_running(final, 10)))
    store.write(PutRequest(_running(final, 20)))
    conn = sqlite3.connect(store.path)
    conn.execute("PRAGMA foreign_keys = ON")
    with conn:
        conn.execute("DELETE FROM requests WHERE id = ?", (final.id,))
    assert conn.execute("SELECT COUNT(*) FROM request_token_pieces").fetchone()[0] == 0
    conn.close()
