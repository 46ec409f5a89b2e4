"""The sidebar and the page's panel say the same of Ollama (issue 42): both drawn from one ``OllamaState`` of one
reading of a real store; and the demo's first screen says the demo fills it, never offering its proxy to a client.

The app runs in-process (AppTest) with ``PHASEWATCH_COLLECTOR=off``: it starts nothing and reads the store."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from bench.pages_fixture import status_rows
from pages.shared import fmt
from store.queries import ollama_down_since, open_reader
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60


def _run() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _ollama_line(at: AppTest) -> str:
    return next(m.value for m in at.sidebar.markdown if m.value.startswith("**Ollama**"))


def test_never_polled_is_not_called_down(data_dir: Path) -> None:
    """No collector runs and none may start: nothing polled Ollama. The sidebar says so and the panel says the
    collector is what is missing, not that Ollama stopped answering."""
    StoreWriter(db_path(data_dir)).close()  # an empty store: no poll recorded
    at = _run()
    assert _ollama_line(at) == "**Ollama** · not polled: no collector runs"
    errors = [e.value for e in at.error]
    assert any(e.startswith("**The collector is not running,**") for e in errors), errors
    assert not any("not answering" in e for e in errors), errors


def test_down_is_said_alike_with_the_same_time(data_dir: Path) -> None:
    now = time.time()
    w = StoreWriter(db_path(data_dir))
    try:
        status_rows(w, now, data_dir, up=False)
    finally:
        w.close()
    at = _run()
    side = re.fullmatch(r"\*\*Ollama\*\* · :red\[not answering\] since (\d\d:\d\d:\d\d)", _ollama_line(at))
    assert side is not None, _ollama_line(at)
    panel = [e.value for e in at.error if "Ollama is not answering" in e.value]
    assert panel and f"since {side[1]}." in panel[0], (panel, side[1])
    with open_reader(db_path(data_dir)) as conn:
        assert conn is not None
        since = ollama_down_since(conn)
    assert since is not None and side[1] == fmt.clock(since)
    # The hint quotes the README's own command.
    text = "\n".join(m.value for m in at.markdown)
    assert ".venv/bin/streamlit run app.py" in text and "`OLLAMA_HOST=192.168.1.20:11434 streamlit" not in text


def test_the_demos_first_screen_says_the_demo_fills_it(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DEMO", "1")
    monkeypatch.setenv("PHASEWATCH_LISTEN", "127.0.0.1:45678")  # a demo's proxy port: never offered
    at = _run()
    infos = [i.value for i in at.info]
    assert any(i.startswith("**Nothing recorded yet: the demo is filling it.**") for i in infos), infos
    shown = "\n".join([*infos, *(m.value for m in at.markdown), *(m.value for m in at.sidebar.markdown)])
    assert "run a prompt with any client" not in shown
    assert not [c.value for c in at.code if "OLLAMA_HOST" in c.value]
    assert not [c.value for c in at.sidebar.code if "OLLAMA_HOST" in c.value]
    assert "**Proxy** · the demo's own, for its synthetic users. To record your clients, leave the demo." in shown
