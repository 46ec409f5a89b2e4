"""Live's cards name the program that sent each generation (User-Agent product and version, the local process),
running and finished, from the stored rows; unknown says nothing (never ""), and a client's text stays text."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from pages.live.cards import finished_cards, in_flight_cards
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.live_cards import LOADED, T0, record
from tests.support.paths import REPO
from tests.support.records import make_record

PROGRAM: dict[str, Any] = dict(client_program="ollama-python", client_program_version="0.6.1", client_process="python")
HOSTILE = "<b>bold</b>*x*[a](http://e.vil)"  # a User-Agent's product is the client's own text
PROCESS: dict[str, Any] = dict(client_pid=4242, client_user="ana")


def test_running_cards_name_the_program() -> None:
    named = record("named", tokens=[0.5], **PROGRAM, **PROCESS)
    agent_only = record("agent", tokens=[0.5], client_program="curl")
    unknown = record("unknown", tokens=[0.5])
    cards = {c.request_id: c for c in in_flight_cards([named, agent_only, unknown], {}, LOADED, T0 + 2)}
    assert cards["named"].program == "ollama-python 0.6.1 · python (pid 4242, user ana)"
    assert cards["agent"].program == "curl"
    assert cards["unknown"].program is None


def _store(data: Path, now: float) -> None:
    w = StoreWriter(db_path(data))
    try:
        w.write(PutRequest(replace(make_record("named", now - 3), **PROGRAM, **PROCESS)))
        w.write(PutRequest(replace(make_record("hostile", now - 2), client_program=HOSTILE)))
        w.write(PutRequest(make_record("plain", now - 1)))
    finally:
        w.close()


def test_finished_cards_name_the_program(tmp_path: Path) -> None:
    now = time.time()
    _store(tmp_path, now)
    conn = sqlite3.connect(db_path(tmp_path))
    try:
        rows = queries.recent_requests(conn, now - 60)
    finally:
        conn.close()
    cards = {c.request_id: c for c in finished_cards(rows, now + 1, keep_s=60)}
    assert cards["named"].program == "ollama-python 0.6.1 · python (pid 4242, user ana)"
    assert cards["plain"].program is None


def test_the_live_page_shows_it_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    _store(tmp_path, time.time())
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    at.switch_page("pages/live/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    texts = [m.value for m in at.markdown]
    assert any("(ollama\\-python 0\\.6\\.1 · python \\(pid 4242, user ana\\))" in t for t in texts), texts
    hostile = next(t for t in texts if "bold" in t)
    assert HOSTILE not in hostile  # never markup: every sign escaped
    assert "\\<b\\>bold\\</b\\>\\*x\\*\\[a\\]\\(http\\:" in hostile
