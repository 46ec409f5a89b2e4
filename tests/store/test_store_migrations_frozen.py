"""Shipped migrations are frozen: each has a name, and the checksum of its SQL steps is recorded here.

A store already past a migration never runs it again, so editing a shipped step's SQL would leave old stores and new
ones with different schemas under the same version (issue 43: "v15" once meant three things across branches).
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from store.schema import MIGRATIONS, SCHEMA_VERSION, Migration, connect_writer, db_path, migrate
from tests.support.paths import DATA

# (version it takes a store to, name, sha256 of its steps): one line per shipped migration, never edited.
SHIPPED: tuple[tuple[int, str, str], ...] = (
    (1, "base", "010d845b6e972bdb828facb47560e91fe84f98b6144877efd99a5375901f76bb"),
    (2, "lab_experiments_and_phase_times", "1845cc69ca0ca8e23878ee890e558ee453776dfbcd9b170067207d1459182de7"),
    (3, "minute_rollups", "0bcd5e8ae871511b0df7d79a179ad286dd7cf7cbe0c31b0608c359e08390b7a9"),
    (4, "phase_split_version_and_host_bandwidth", "5778f4e2bfe67ca4925855d4e105b98e9e140e83582dd5f93f165b5fa83f7d9a"),
    (5, "progress_samples", "d968c9a8f242609b30f492ab678a09a16dc200dfb9ce220f15a9bfed7c82209f"),
    (6, "request_kinds_thinking_and_sources", "006d49da20199b5020c76bdecfe5c07990aaaeff09ac925d02021db672f3c666"),
    (7, "prompt_chars", "769128e0e113742c068b60aa1be770dc4556ff1d8792fa7679185b1e84dbc2f2"),
    (8, "installed_models", "1a87eeb9c62616400cfd9550f476cefbcde646fc8b8b42b871060ef14190ba08"),
    (9, "direct_records", "635d099865aa909e8e4c6c91cd314b78f9953865189a2fb4f83b486a4e17dc39"),
    (10, "heartbeat_runner_and_log_problems", "1edd240099461a64c0b9fc0abe495aa63b18292cda5e8456015c5c6f954d3f34"),
    (11, "runners", "32c88a4de63f159bf76fed142e16879bff81f773c7f86e6e8e89ded5e003e481"),
    (12, "heartbeat_proxy_refused", "a5c70595c5f6ee4ba163758366e632b778b5420b8862787131d4582dda960b50"),
    (13, "runner_devices", "78b0ae64901d445f9949de0ca74296e80dbd64668345f6854db985ab49f85897"),
    (14, "host_apple_chip", "bfa11969a33811dc6f4d9fcea9b8902ac6a32dd2cab17e41945f006c6b457b30"),
    (15, "prompt_fit_and_ollama_settings", "3c96c7c11b27715f0ac1a1d002251de69602217ab3b30cd49b1436aa35f61ac9"),
    (16, "request_waits", "088c9c79f259370731ff92dbb9c7716bde005a63e260d2668ce2802009f1ecd3"),
    (17, "client_unverified", "b41516999a24c06b3b6dce01464133b4817053c717442ae8a6e0c7d457d64eba"),
    (
        18,
        "heartbeat_runner_lines_missing_and_ollama_queued",
        "31683f966412c2471fc0d10da48b1dec6c7d2162ef2bc62d36685712acb2f688",
    ),
    (19, "request_minutes", "e34a1c01837d29794ab1d141c2ed170ce318cd84e9428ca4ac592073453866fd"),
    (20, "client_program", "d71ea2c29193b805f481d881c5a3561ef31ab1495688d1d8eb36594e15564d5c"),
    (21, "applied_migrations", "6bc60df792f579a1e7fd40cc2b65697292e574aa0748deaac43f0ab2d41eb894"),
    (22, "running_token_pieces", "bc704203f5875c5e15818c40694c60377b79d0cdb45433a03d164d8b66148314"),
    (23, "usage_days", "ab79602b5df3e45210819631186b2d7ca793bcba5d981d48acc73a7386fe3f17"),
)


def _frozen_problems(migrations: Sequence[Migration], shipped: Sequence[tuple[int, str, str]]) -> list[str]:
    """What differs between the migrations and the recorded table, each with what to do instead."""
    problems = []
    for version, name, sha in shipped:
        if version > len(migrations):
            problems.append(f"v{version} {name!r} shipped and is gone: never remove a shipped migration")
            continue
        m = migrations[version - 1]
        if m.name != name:
            problems.append(f"v{version} was shipped as {name!r}, is now {m.name!r}: a shipped migration keeps its name")
        if m.sha256 != sha:
            problems.append(
                f"v{version} {name!r}: its SQL steps changed since it shipped (sha256 {m.sha256[:12]}…, recorded "
                f"{sha[:12]}…). Stores already at v{version} will never run the new text: restore the shipped SQL "
                "and append a new migration to store.schema.MIGRATIONS instead."
            )
    for version, m in enumerate(migrations[len(shipped) :], start=len(shipped) + 1):
        problems.append(f"v{version} {m.name!r} is not recorded: add ({version}, {m.name!r}, {m.sha256!r}) to SHIPPED")
    return problems


def test_every_shipped_migration_is_as_it_shipped() -> None:
    problems = _frozen_problems(MIGRATIONS, SHIPPED)
    assert not problems, "\n".join(problems)


def test_the_table_numbers_every_version_once_in_order() -> None:
    assert [version for version, _, _ in SHIPPED] == list(range(1, len(SHIPPED) + 1))


def test_names_are_unique_words() -> None:
    names = [m.name for m in MIGRATIONS]
    assert len(set(names)) == len(names) == SCHEMA_VERSION
    assert all(name.replace("_", "").isalnum() and name.islower() for name in names)


@pytest.mark.parametrize("version", [1, 3, 9, SCHEMA_VERSION])
def test_an_edited_shipped_step_fails_with_what_to_do(version: int) -> None:
    shipped = MIGRATIONS[version - 1]
    first, *rest = shipped.steps
    edited = dataclasses.replace(shipped, steps=(first.replace("TEXT", "BLOB", 1), *rest))
    assert edited.steps != shipped.steps
    migrations = [*MIGRATIONS[: version - 1], edited, *MIGRATIONS[version:]]
    (problem,) = _frozen_problems(migrations, SHIPPED)
    assert problem.startswith(f"v{version} ") and "append a new migration" in problem


def test_a_renamed_removed_or_unrecorded_migration_is_named() -> None:
    renamed = dataclasses.replace(MIGRATIONS[4], name="progress")
    assert _frozen_problems([*MIGRATIONS[:4], renamed, *MIGRATIONS[5:]], SHIPPED) == [
        "v5 was shipped as 'progress_samples', is now 'progress': a shipped migration keeps its name"
    ]
    last = MIGRATIONS[-1].name
    assert _frozen_problems(MIGRATIONS[:-1], SHIPPED) == [
        f"v{SCHEMA_VERSION} {last!r} shipped and is gone: never remove a shipped migration"
    ]
    (unrecorded,) = _frozen_problems(MIGRATIONS, SHIPPED[:-1])
    assert unrecorded.startswith(f"v{SCHEMA_VERSION} {last!r} is not recorded: add ({SCHEMA_VERSION}, ")


def _schema(path: Path) -> list[tuple[str, str, str | None]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()


def test_an_old_store_opens_and_ends_with_a_new_stores_schema(tmp_path: Path) -> None:
    """A store the landed version wrote (v3, tests/data/landed_store) migrates to the same tables as a new store."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    shutil.copyfile(DATA / "landed_store" / "v3.sqlite3", db_path(old))
    connect_writer(db_path(old)).close()
    connect_writer(db_path(new)).close()
    assert _schema(db_path(old)) == _schema(db_path(new))


def test_the_minute_rollups_still_fill_from_an_old_stores_samples(tmp_path: Path) -> None:
    conn = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    migrate(conn, target=2)
    t0 = 1_780_000_040.0  # 20 s into the minute that starts at 1_780_000_020: the third sample is in the next
    for i, util in enumerate((10.0, None, 40.0)):
        conn.execute(
            "INSERT INTO gpu_samples (ts_unix_s, gpu_index, name, uuid, util_gpu_pct, mem_used_bytes) "
            "VALUES (?, 0, 'gpu', 'u', ?, ?)",
            (t0 + 20 * i, util, 100 * (i + 1)),
        )
    migrate(conn)
    rows = conn.execute(
        "SELECT minute_unix_s, n, util_gpu_pct_sum, util_gpu_pct_n, mem_used_bytes_peak FROM gpu_minutes ORDER BY minute_unix_s"
    ).fetchall()
    conn.close()
    assert rows == [(1_780_000_020, 2, 10.0, 1, 200.0), (1_780_000_080, 1, 40.0, 1, 300.0)]
