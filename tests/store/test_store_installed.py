"""Store v8: the installed models (/api/tags), migrated onto a v7 store, replaced as a whole on each poll."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from analysis.records import InstalledModel
from store import queries
from store.ops import PutInstalledModels, PutModelInfo
from store.schema import SCHEMA_VERSION, StoreError, db_path, migrate
from store.writer import StoreWriter

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64


def model(name: str, digest: str, size: int | None, modified: float | None, caps: tuple[str, ...] = ()) -> InstalledModel:
    return InstalledModel(1000.0, name, name, digest, size, "8.0B", "Q4_K_M", "llama", modified, caps)


def test_a_v7_store_migrates_to_v8_and_keeps_its_rows(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn, target=7)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
    cols = "id, started_at_unix_s, client_addr, endpoint, model, stream, received_ns, outcome, updated_at_unix_s"
    conn.execute(f"INSERT INTO requests ({cols}) VALUES ('old', 1.0, 'c', '/api/generate', 'm:latest', 0, 0, 'ok', 1.0)")
    show = {"model_info": {"general.architecture": "llama"}}
    conn.execute("INSERT INTO model_info VALUES (?, 'm:latest', ?, 5.0)", (DIGEST_A, json.dumps(show)))
    conn.close()
    with pytest.raises(StoreError, match="v7"):
        queries.open_readonly(path)  # readers wait for the collector to migrate it

    w = StoreWriter(path)  # the collector's writer migrates on open
    try:
        w.write(PutInstalledModels([model("m:latest", DIGEST_A, 4_920_753_328, 2.0)]))
    finally:
        w.close()
    with queries.open_reader(path) as rconn:
        assert rconn is not None
        assert rconn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 8
        assert [r.id for r in queries.recent_requests(rconn, 0)] == ["old"]
        info = queries.model_info(rconn, "m")
        assert info is not None and info.show == show
        assert queries.installed_models(rconn) == [model("m:latest", DIGEST_A, 4_920_753_328, 2.0)]


def test_each_poll_replaces_the_list_and_unknown_stays_null(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    try:
        w.write(PutInstalledModels([model("old:1b", DIGEST_A, 10, 1.0), model("new:8b", DIGEST_B, None, None, ("embedding",))]))
        with queries.open_reader(path) as conn:
            assert conn is not None
            # Newest first; a model without a time last. Unknown size is NULL, not 0.
            assert [(m.name, m.size_bytes, m.capabilities) for m in queries.installed_models(conn)] == [
                ("old:1b", 10, ()),
                ("new:8b", None, ("embedding",)),
            ]
            assert conn.execute("SELECT COUNT(*) FROM installed_models WHERE size_bytes IS NULL").fetchone()[0] == 1
        w.write(PutInstalledModels([model("new:8b", DIGEST_B, 20, 3.0)]))  # old:1b was removed from Ollama
        w.write(PutModelInfo(DIGEST_B, "new:8b", {"model_info": {"general.architecture": "qwen2"}, "license": "long"}))
        with queries.open_reader(path) as conn:
            assert conn is not None
            assert [(m.name, m.size_bytes) for m in queries.installed_models(conn)] == [("new:8b", 20)]
            # An alias of the same weights finds the show through the installed list, as through /api/ps.
            w.write(PutInstalledModels([model("new:8b", DIGEST_B, 20, 3.0), model("alias:latest", DIGEST_B, 20, 3.0)]))
            info = queries.model_info(conn, "alias")
            assert info is not None and info.name == "new:8b" and "license" not in info.show
        w.write(PutInstalledModels([]))
        with queries.open_reader(path) as conn:
            assert conn is not None and queries.installed_models(conn) == []
    finally:
        w.close()
