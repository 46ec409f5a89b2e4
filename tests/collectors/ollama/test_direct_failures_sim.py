"""A chat sent straight to Ollama (sim) that it answers 500 is recorded as a failed direct request from its access
line, with its route, by a real collector process reading sim's log into a real SQLite store (issue 40 item 3);
a chat answered 500 through the collector's own proxy is recorded once, as the proxy's. sim's fault switch
(``raise_after_tokens: 0``) makes the 500, and sim prints its access line as Ollama's gin logger does."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collectors.ollama.access_failures import FAILED_WAIT_S
from store.schema import db_path
from tests.support.collector_process import MODEL, collector, listen_url
from tests.support.sim_process import SimProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
RECORD_WAIT_S = FAILED_WAIT_S + 30.0  # the line is decided FAILED_WAIT_S after its second; a loaded machine's margin


def post(url: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        e.read()
        return int(e.code)


def fail_next(sim: SimProcess) -> None:
    assert post(sim.base_url + "/sim/faults", {"raise_after_tokens": 0}) == 200


def rows(data: Path) -> list[sqlite3.Row]:
    path = db_path(data)
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute("SELECT * FROM requests WHERE outcome != 'in_flight' ORDER BY started_at_unix_s"))
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def chat() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": False}


def test_a_direct_500_is_recorded_with_its_route_and_a_proxied_one_once(sim: SimProcess, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)):
        assert post(sim.base_url + "/api/chat", chat()) == 200  # loads the model: later requests fail at once
        fail_next(sim)
        sent_unix_s = time.time()
        assert post(sim.base_url + "/api/chat", chat()) == 500  # direct
        assert "| 500 |" in sim.log() and 'POST     "/api/chat"' in sim.log()  # gin's access line, as Ollama prints it

        def failed_direct() -> list[sqlite3.Row]:
            return [r for r in rows(data) if r["seen_from"] == "runner" and r["status_code"] == 500]

        (rec,) = wait_until(failed_direct, RECORD_WAIT_S, "the direct 500 recorded")
        assert rec["outcome"] == "http_error" and rec["endpoint"] == "/api/chat" and rec["runner_source"] == "access"
        assert rec["client_addr"] == "127.0.0.1" and rec["client_unverified"] == 1
        assert sent_unix_s - 2 <= rec["started_at_unix_s"] <= time.time()

        fail_next(sim)
        assert post(listen_url(data) + "/api/chat", chat()) == 500  # through the proxy
        proxied = wait_until(
            lambda: [r for r in rows(data) if r["seen_from"] == "proxy" and r["status_code"] == 500], 30, "the proxied 500"
        )
        time.sleep(FAILED_WAIT_S + 4.0)  # past the wait its access line would have had to become a direct record
        assert len(proxied) == 1 and len(failed_direct()) == 1, [dict(r) for r in rows(data)]
