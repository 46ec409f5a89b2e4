"""The table declarations of store.tables equal the schema the migrations write, so they cannot drift."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from analysis.records import Outcome
from store.schema import (
    GPU_MEAN_FIELDS,
    GPU_PEAK_FIELDS,
    HOST_MEAN_FIELDS,
    HOST_PEAK_FIELDS,
    connect_writer,
)
from store.tables import GPU_SAMPLES, HOST_SAMPLES, REQUESTS, TABLES, VIEWS, Column, RequestRow, Table


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> sqlite3.Connection:
    return connect_writer(Path(tmp_path_factory.mktemp("tables")) / "s.sqlite3")


def _schema(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, bool]]:
    """name → (SQL type, may not be NULL); a primary key counts as NOT NULL."""
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    return {name: (sql_type, bool(notnull) or pk > 0) for _, name, sql_type, notnull, _, pk in rows}


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_declaration_equals_the_migrated_schema(conn: sqlite3.Connection, table: Table[object]) -> None:
    declared = {c.name: (c.sql_type, c.not_null) for c in table.columns}
    assert declared == _schema(conn, table.name)


def test_every_table_of_the_schema_is_declared(conn: sqlite3.Connection) -> None:
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    rollups = {"gpu_minutes", "host_minutes", "request_minutes", "usage_days"}  # summaries, kept by upserts and triggers
    assert names - rollups - {"sqlite_sequence"} == {t.name for t in TABLES}


@pytest.mark.parametrize(
    ("table", "samples", "means", "peaks"),
    [
        ("gpu_minutes", GPU_SAMPLES, GPU_MEAN_FIELDS, GPU_PEAK_FIELDS),
        ("host_minutes", HOST_SAMPLES, HOST_MEAN_FIELDS, HOST_PEAK_FIELDS),
    ],
)
def test_rollups_cover_every_measured_field(
    conn: sqlite3.Connection, table: str, samples: Table[object], means: tuple[str, ...], peaks: tuple[str, ...]
) -> None:
    measured = {c.name for c in samples.columns} - {"ts_unix_s", "gpu_index", "name", "uuid", "simulated"}
    assert set(means) | set(peaks) == measured and not set(means) & set(peaks)
    cols = set(_schema(conn, table))
    assert {f"{f}_sum" for f in means} | {f"{f}_n" for f in means} | {f"{f}_peak" for f in peaks} <= cols


def test_values_cross_both_ways() -> None:
    flags = next(c for c in REQUESTS.columns if c.name == "flags")
    assert flags.to_sql is not None and flags.from_sql is not None
    assert flags.from_sql(flags.to_sql(("a", "b"))) == ("a", "b")
    assert flags.from_sql("[]") == ()
    outcome = next(c for c in REQUESTS.columns if c.name == "outcome")
    assert outcome.from_sql is not None and outcome.from_sql("ok") is Outcome.OK
    with pytest.raises(ValueError):
        outcome.from_sql("not an outcome")  # as Outcome("not an outcome") raises
    assert outcome.to_sql is not None and outcome.to_sql(Outcome.OK) == "ok"
    assert [f for f in REQUESTS.column_names][:2] == ["id", "started_at_unix_s"]
    assert REQUESTS.row_type is RequestRow


def test_a_type_with_no_column_is_refused() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Bad:
        x: list[int]

    with pytest.raises(TypeError, match="no SQL type"):
        Table.of("bad", Bad)
    assert Column("a", "TEXT", True).attr is None


@pytest.mark.parametrize("view", VIEWS, ids=lambda t: t.row_type.__name__)
def test_reader_rows_are_columns_of_their_table(view: Table[object]) -> None:
    table = next(t for t in TABLES if t.name == view.name)
    declared = {c.name: (c.sql_type, c.not_null) for c in table.columns}
    assert {c.name: (c.sql_type, c.not_null) for c in view.columns}.items() <= declared.items()
