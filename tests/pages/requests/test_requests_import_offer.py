"""The Requests page's empty state (AppTest): nothing recorded, Ollama's log readable, so it offers the log's
history; the button imports it (the H200 run's 13 generations) with a progress bar, and the offer is gone after."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from pages.shared.import_offer import BUTTON_KEY
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.real_gpu import LOG

APP = str(REPO / "app.py")


@pytest.fixture
def empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    StoreWriter(db_path(data)).close()  # a collector ran, recorded nothing
    log = tmp_path / "server.log"
    shutil.copyfile(LOG, log)
    monkeypatch.setenv("PHASEWATCH_DATA", str(data))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.setenv("PHASEWATCH_OLLAMA_LOG", str(log))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ollama of the machine running the tests
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    return data


def _requests_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_empty_state_offers_the_log_and_imports_it(empty_store: Path) -> None:
    at = _requests_page()
    assert any("Ollama's log holds history" in i.value for i in at.info)
    at.button(key=BUTTON_KEY).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("13 recorded" in s.value for s in at.success)
    assert at.get("progress")  # the bar it filled while reading
    conn = sqlite3.connect(db_path(empty_store))
    assert conn.execute("SELECT count(*) FROM requests").fetchone() == (13,)
    conn.close()
    again = _requests_page()
    assert not any("Ollama's log holds history" in i.value for i in again.info)  # something is recorded now


def test_no_offer_without_a_readable_log(empty_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_OLLAMA_LOG", str(empty_store / "missing.log"))
    at = _requests_page()
    assert not any("Ollama's log holds history" in i.value for i in at.info)
    assert all(b.key != BUTTON_KEY for b in at.button)
