"""What the app says about its processes: demo mode comes from the running demo, "down since" from the events.

AppTest in-process over real SQLite stores and a real demo lock (``collectors.demo.DemoLock``,
the flock the demo process holds while it runs).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import OllamaStatus
from bench.pages_fixture import status_rows
from collectors import launch
from collectors.demo import DemoInfo, DemoLock
from pages.shared import fmt
from store import queries
from store.ops import PutOllamaStatus
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
URL = "http://127.0.0.1:11434"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    for name in ("PHASEWATCH_DEMO", "PHASEWATCH_COLLECTOR", "OLLAMA_HOST", "PHASEWATCH_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write_polls(data_dir: Path, polls: list[tuple[float, bool]]) -> None:
    w = StoreWriter(db_path(data_dir))
    try:
        for ts, up in polls:
            w.write(PutOllamaStatus(OllamaStatus(ts, up, URL, "0.33.0" if up else None, None if up else "connection refused")))
    finally:
        w.close()


def test_down_since_is_the_first_failed_poll_after_the_last_answer(data_dir: Path) -> None:
    now = time.time()
    write_polls(
        data_dir,
        [(now - 900, False), (now - 600, True), (now - 300, True), (now - 120, False), (now - 60, False), (now - 1, False)],
    )
    with queries.open_reader(db_path(data_dir)) as conn:
        assert conn is not None
        assert queries.ollama_down_since(conn) == pytest.approx(now - 120)
        assert queries.latest_ollama_status(conn).ts_unix_s == pytest.approx(now - 1)  # type: ignore[union-attr]
    write_polls(data_dir, [(now, True)])
    with queries.open_reader(db_path(data_dir)) as conn:
        assert conn is not None
        assert queries.ollama_down_since(conn) is None  # up again


def test_the_page_says_when_ollama_went_down_not_when_it_was_last_polled(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    now = time.time()
    write_polls(data_dir, [(now - 600, True), (now - 125, False), (now - 2, False)])
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    went_down, last_poll = fmt.clock(now - 125), fmt.clock(now - 2)
    sidebar = "\n".join(m.value for m in at.sidebar.markdown)
    assert f"not answering] since {went_down}" in sidebar and last_poll not in sidebar
    assert any(f"Ollama is not answering since {went_down}" in e.value for e in at.error)


def test_a_running_demo_is_demo_mode_for_every_new_session(data_dir: Path) -> None:
    """No button pressed in this session: the demo's lock alone puts the app in demo mode."""
    demo_dir = data_dir / "demo"
    demo_dir.mkdir()
    w = StoreWriter(db_path(demo_dir))
    try:
        status_rows(w, time.time(), demo_dir, demo=True)
    finally:
        w.close()
    lock = DemoLock(demo_dir)
    lock.acquire(DemoInfo(12345, "http://127.0.0.1:9", "rtx-4090", time.time()))
    try:
        assert launch.demo_runs(demo_dir)
        for _ in range(2):  # two sessions, as two tabs
            at = AppTest.from_file(APP, default_timeout=60).run()
            assert not at.exception, [e.value for e in at.exception]
            assert any("Demo mode" in i.value for i in at.info)
            assert at.session_state["pw_ctx"].data_dir == demo_dir
            assert not any("Ollama is not answering" in e.value for e in at.error)
            assert at.button(key="pw_leave_demo").label == "Leave demo"
    finally:
        lock.release()
    assert not launch.demo_runs(demo_dir)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        ("older", "older Phasewatch"),  # e.g. an upgrade while the old collector still runs
        ("newer", "newer Phasewatch"),
        ("corrupt", "not a readable SQLite store"),
    ],
)
def test_a_store_the_pages_cannot_read_is_said_in_words(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, make: str, words: str
) -> None:
    """Not a traceback on every page: what happened, what to do, and the file left as it is."""
    import sqlite3

    from store.schema import SCHEMA_VERSION, migrate

    db = db_path(data_dir)
    if make == "corrupt":
        db.write_bytes(b"this is not sqlite" * 100)
    else:
        conn = sqlite3.connect(db, isolation_level=None)
        migrate(conn, target=4 if make == "older" else SCHEMA_VERSION)
        if make == "newer":
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.close()
    before = db.read_bytes()
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any(words in e.value and str(db) in e.value.replace("\\", "") for e in at.error), [e.value for e in at.error]
    assert db.read_bytes() == before
