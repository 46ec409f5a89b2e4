"""The store records the migrations it ran (name and sha256, store.schema's applied_migrations) and the writer checks
them on open: a store another build's migrations made is refused with what to do, never migrated on."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.schema import (
    MIGRATIONS,
    RECORDED_FROM_VERSION,
    SCHEMA_VERSION,
    StoreError,
    connect_writer,
    db_path,
    migrate,
)
from tests.support.paths import DATA, REPO

RECORD_SQL = "SELECT version, name, sha256, applied_at_unix_s FROM applied_migrations ORDER BY version"


def _recorded(path: Path) -> list[tuple[int, str, str, float | None]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(RECORD_SQL).fetchall()
    finally:
        conn.close()


def _tamper(path: Path, sql: str, *params: object) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql, params)
    finally:
        conn.close()


def test_a_new_store_records_every_step_as_it_ran(tmp_path: Path) -> None:
    before = time.time()
    connect_writer(db_path(tmp_path)).close()
    rows = _recorded(db_path(tmp_path))
    assert [(v, name, sha) for v, name, sha, _ in rows] == [(v, m.name, m.sha256) for v, m in enumerate(MIGRATIONS, 1)]
    assert all(at is not None and before - 1 <= at <= time.time() + 1 for *_, at in rows)
    connect_writer(db_path(tmp_path)).close()  # opened again: the record agrees, nothing is added
    assert _recorded(db_path(tmp_path)) == rows


def test_a_landed_v3_store_upgrades_and_records_what_ran_when(tmp_path: Path) -> None:
    shutil.copyfile(DATA / "landed_store" / "v3.sqlite3", db_path(tmp_path))
    connect_writer(db_path(tmp_path)).close()
    rows = _recorded(db_path(tmp_path))
    assert [(v, name, sha) for v, name, sha, _ in rows] == [(v, m.name, m.sha256) for v, m in enumerate(MIGRATIONS, 1)]
    # Steps 1-3 ran under the landed version, before there was a record: their time is unknown (NULL, not 0).
    assert [at is None for *_, at in rows] == [v <= 3 for v in range(1, SCHEMA_VERSION + 1)]
    connect_writer(db_path(tmp_path)).close()


def test_a_store_one_step_below_upgrades_and_keeps_no_time_for_its_older_steps(tmp_path: Path) -> None:
    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    migrate(conn, target=RECORDED_FROM_VERSION - 1)
    conn.close()
    connect_writer(db_path(tmp_path)).close()
    rows = _recorded(db_path(tmp_path))
    assert [v for v, *_ in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert [at is None for *_, at in rows] == [v < RECORDED_FROM_VERSION for v in range(1, SCHEMA_VERSION + 1)]


@pytest.mark.parametrize("version", [1, 9, RECORDED_FROM_VERSION])
def test_a_step_recorded_with_another_checksum_is_refused_with_what_to_do(tmp_path: Path, version: int) -> None:
    connect_writer(db_path(tmp_path)).close()
    _tamper(db_path(tmp_path), "UPDATE applied_migrations SET sha256 = ? WHERE version = ?", "0" * 64, version)
    rows = _recorded(db_path(tmp_path))
    with pytest.raises(StoreError) as refused:
        connect_writer(db_path(tmp_path))
    text = str(refused.value)
    ours = MIGRATIONS[version - 1]
    assert f"made by another build of Phasewatch: its step v{version} was applied as {ours.name!r} (sha256 000000000000…)" in text
    assert f"this Phasewatch's v{version} is {ours.name!r} (sha256 {ours.sha256[:12]}…)" in text
    assert f"python -m store export --data {tmp_path}" in text and "move phasewatch.sqlite3 out of the data folder" in text
    assert _recorded(db_path(tmp_path)) == rows  # refused before any step ran or any row changed


def test_a_step_recorded_under_another_name_is_refused(tmp_path: Path) -> None:
    connect_writer(db_path(tmp_path)).close()
    _tamper(db_path(tmp_path), "UPDATE applied_migrations SET name = 'runner_speeds' WHERE version = 20")
    with pytest.raises(StoreError, match=r"its step v20 was applied as 'runner_speeds'"):
        connect_writer(db_path(tmp_path))


def test_a_store_at_this_version_with_no_record_is_another_builds(tmp_path: Path) -> None:
    """A branch's store whose v21 was some other step: user_version agrees, the record is missing."""
    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    migrate(conn, target=RECORDED_FROM_VERSION - 1)
    conn.execute("CREATE TABLE runner_speeds (id INTEGER PRIMARY KEY)")
    conn.execute(f"PRAGMA user_version = {RECORDED_FROM_VERSION}")
    conn.close()
    with pytest.raises(StoreError, match=rf"its schema v{RECORDED_FROM_VERSION} has no record of step v1 "):
        connect_writer(db_path(tmp_path))
    conn = sqlite3.connect(db_path(tmp_path))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert "applied_migrations" not in tables  # not migrated on


@pytest.mark.slow
def test_the_collector_refuses_such_a_store_and_the_export_still_reads_it(tmp_path: Path) -> None:
    connect_writer(db_path(tmp_path)).close()
    _tamper(db_path(tmp_path), "UPDATE applied_migrations SET sha256 = ? WHERE version = 5", "f" * 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    argv = [sys.executable, "-m", "collectors", "--data", str(tmp_path), "--listen", "127.0.0.1:0", "--ollama", "127.0.0.1:9"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 2, done.stderr  # a usage error: this data folder is not this build's (docs/settings.md)
    assert "made by another build of Phasewatch: its step v5 was applied as 'progress_samples'" in done.stderr
    export = subprocess.run(
        [sys.executable, "-m", "store", "export", "--data", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert export.returncode == 0 and export.stdout == "", export.stderr  # what the message offers works
