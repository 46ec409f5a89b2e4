"""Phases are derived once, at write time: readers use the stored values; older rows are derived again."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

from analysis.phases import split_record
from pages.requests.view import build_detail
from store import queries
from store.export import export_rows
from store.ops import REDERIVE_BATCH, PutRequest, RederivePhases
from store.schema import db_path
from store.tables import PHASES_VERSION
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.records import make_record
from tests.support.stale_phases import stale_phases_count

# Every module that shows or counts a request's phases.
READERS = [
    "store/queries.py",
    "store/export.py",
    "collectors/metrics.py",
    *(str(p.relative_to(REPO)) for p in sorted((REPO / "pages").rglob("*.py"))),
]


def _raw(path: Path, sql: str, *args: object) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def test_a_row_of_an_older_split_is_derived_again(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    recs = [make_record(f"r{i:03d}", 1_700_000_000.0 + i) for i in range(REDERIVE_BATCH + 5)]
    w = StoreWriter(path)
    w.apply([PutRequest(r) for r in recs])
    _raw(path, "UPDATE requests SET phases_version = 0, decode_tok_s = 1.0, decode_start_ns = NULL, flag_text = '{}'")
    _raw(path, "UPDATE requests SET outcome = 'in_flight' WHERE id = 'r000'")  # a running request is left to its writer
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None and stale_phases_count(conn) == REDERIVE_BATCH + 4
    assert w.write(RederivePhases()) == REDERIVE_BATCH  # a bounded batch per transaction
    assert w.write(RederivePhases()) == 4
    assert w.write(RederivePhases()) == 0
    w.close()
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None and stale_phases_count(conn) == 0
        for rec in recs[1:]:
            stored = queries.request_detail(conn, rec.id)
            assert stored is not None and stored.phases_version == PHASES_VERSION
            assert stored.phases == split_record(rec) and stored.record == rec
        untouched = queries.request_detail(conn, "r000")
        assert untouched is not None and untouched.phases_version == 0


def test_readers_show_the_stored_phases_not_a_new_split(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    rec = make_record("x")
    w = StoreWriter(path)
    w.write(PutRequest(rec))
    w.close()
    assert split_record(rec).decode_tok_s != pytest.approx(12345.0)
    _raw(path, "UPDATE requests SET decode_tok_s = 12345.0, prefill_s = 9.5")  # as if an older split had said so
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None
        (row,) = list(export_rows(conn))
        assert row["decode_tok_s"] == 12345.0 and row["prefill_s"] == 9.5
        (summary,) = queries.recent_requests(conn, 0)
        assert summary.decode_tok_s == 12345.0
        (window,) = queries.requests_in_window(conn, 0, 2e9, with_tokens=True)
        assert window.phases.decode_tok_s == 12345.0
    detail = build_detail(path, "x")
    assert detail is not None and detail.phases.decode_tok_s == 12345.0 and detail.phases.prefill_s == 9.5


@pytest.mark.parametrize("module", READERS)
def test_readers_never_split(module: str) -> None:
    tree = ast.parse((REPO / module).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "split_record" not in names
