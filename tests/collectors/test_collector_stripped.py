"""The collector in the stripped Python (tests/support/stripped_python.py: shaped like Windows' — no pwd, grp,
fcntl, resource, uvloop; no O_NOFOLLOW, pwrite, geteuid; no loop signal handlers; /proc/net unreadable to it),
against sim: it answers on its proxy, records a proxied generation once, stops on ``--stop`` (the stop file, no
signal) within 10 s with exit code 0, and its store reads back intact (issue 45). The real runner's direct
generation is in test_collector_stripped_engine.py."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import ollama
import pytest

from store.schema import db_path
from tests.support.collector_process import MODEL
from tests.support.paths import REPO
from tests.support.sim_process import start_sim
from tests.support.stripped_python import listen_address, stripped_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # two processes start, one stops: ~10 s on the shared machine

STOP_WITHIN_S = 10.0


def test_the_stripped_collector_answers_records_and_stops_on_the_stop_file(tmp_path: Path) -> None:
    env = {k: v for k, v in stripped_env(tmp_path / "py").items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    data = tmp_path / "data"
    err_path = tmp_path / "collector.log"
    base = [sys.executable, "-m", "collectors", "--data", str(data)]
    with start_sim() as sim, open(err_path, "wb") as err:
        cmd = [*base, "--listen", "127.0.0.1:0", "--ollama", sim.base_url, "--interval", "0.2"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=err)
        try:
            listen = wait_until(lambda: listen_address(err_path), timeout_s=60)
            reply = ollama.Client(host=f"http://{listen}").generate(model=MODEL, prompt="hello there", stream=False)
            assert reply.response
            conn_sql = "SELECT seen_from, outcome FROM requests WHERE endpoint = '/api/generate'"

            def recorded() -> list[tuple[str, str]]:
                if not db_path(data).exists():
                    return []
                conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
                try:
                    return list(conn.execute(conn_sql))
                except sqlite3.OperationalError:
                    return []
                finally:
                    conn.close()

            wait_until(lambda: recorded() == [("proxy", "ok")], timeout_s=30)
            started = time.monotonic()
            stop = subprocess.run([*base, "--stop"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            assert stop.returncode == 0, stop.stderr
            proc.wait(timeout=STOP_WITHIN_S)
            took_s = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    log = err_path.read_text(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert took_s < STOP_WITHIN_S
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert list(conn.execute(conn_sql)) == [("proxy", "ok")]
    finally:
        conn.close()
    print(f"stopped in {took_s:.2f} s")
