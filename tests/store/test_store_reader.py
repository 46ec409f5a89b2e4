"""One way to open a reader, for every state a store can be in: missing, being created, older, newer, corrupt."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from pages.why.view import model_choices
from store import queries
from store.queries import StoreState
from store.schema import MIGRATIONS, SCHEMA_VERSION, StoreError
from store.schema import db_path as store_db_path
from store.writer import StoreWriter


def _v0(path: Path) -> None:
    """What the collector leaves for a moment: the file, WAL on, no schema yet."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()


def _older(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def _newer(path: Path) -> None:
    StoreWriter(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()


def _corrupt(path: Path) -> None:
    path.write_bytes(b"this is not sqlite" * 300)


def test_missing_and_being_created_read_as_no_store_yet(tmp_path: Path) -> None:
    path = store_db_path(tmp_path)
    assert queries.store_state(tmp_path) is StoreState.MISSING
    with queries.open_reader(tmp_path) as conn:
        assert conn is None
    _v0(path)
    assert queries.store_state(tmp_path) is StoreState.CREATING
    with queries.open_reader(tmp_path) as conn:
        assert conn is None
    assert model_choices(path) is None  # the Why page's model list: its empty state, not "schema v0"
    StoreWriter(path).close()
    assert queries.store_state(tmp_path) is StoreState.READY
    with queries.open_reader(tmp_path) as conn:
        assert conn is not None and queries.recent_requests(conn, 0) == []
    assert model_choices(path) == []


def test_a_new_store_is_never_seen_half_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the collector creates its store, a page reading it (another connection, as Streamlit's) sees no
    store yet, then the whole schema: never a part of it, which would read as an older Phasewatch's store
    (CI once caught a page at that moment, and it never drew its charts)."""
    path = store_db_path(tmp_path)
    _v0(path)
    seen: list[StoreState] = []

    def watched(step: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
        def run(conn: sqlite3.Connection) -> None:
            step(conn)
            seen.append(queries.store_state(tmp_path))  # a reader between two steps

        return run

    # Each step wrapped, its name and checksum kept: the store records them (store.schema._record_applied).
    monkeypatch.setattr("store.schema.MIGRATIONS", [dataclasses.replace(m, run=watched(m.run)) for m in MIGRATIONS])
    StoreWriter(path).close()
    assert len(seen) == SCHEMA_VERSION and set(seen) == {StoreState.CREATING}
    assert queries.store_state(tmp_path) is StoreState.READY


@pytest.mark.parametrize(
    ("make", "state", "message"),
    [
        (_older, StoreState.OLDER, "start the collector to migrate"),
        (_newer, StoreState.NEWER, "upgrade Phasewatch"),
        (_corrupt, StoreState.CORRUPT, "not a readable Phasewatch store"),
    ],
)
def test_other_states_say_what_to_do(tmp_path: Path, make: object, state: StoreState, message: str) -> None:
    path = store_db_path(tmp_path)
    make(path)  # type: ignore[operator]
    assert queries.store_state(tmp_path) is state
    with pytest.raises(StoreError, match=message), queries.open_reader(tmp_path):
        pass
