"""Issue 45's capstone: the collector in a Python shaped like Windows' (tests/support/stripped_python.py: no pwd,
grp, fcntl, resource, uvloop; no O_NOFOLLOW, pwrite, geteuid; no loop signal handlers; /proc/net unreadable to
it) against sim running the real llama-server, whose binary is named ``llama-server.exe``, as the same OS user.

It answers on its proxy; records one proxied and one direct generation exactly once each (the direct one from the
runner, found through psutil's socket table, since /proc/net cannot be read); stops on ``--stop`` (the stop file,
no signal) within 10 s with exit code 0; and its store reads back intact.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import ollama
import pytest

from collectors.ollama.discovery import FOUND_SAME_USER
from store.schema import db_path
from tests.support.engine_process import GREEDY, MODEL, require_llama_server, start_server_engine, words_prompt
from tests.support.paths import REPO
from tests.support.stripped_python import listen_address, stripped_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

STOP_WITHIN_S = 10.0
NUM_PREDICT = 48


def rows(data: Path, sql: str) -> list[sqlite3.Row]:
    path = db_path(data)
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql))
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def runners_found(data: Path) -> str | None:
    found = rows(data, "SELECT runners_found FROM collector_heartbeat ORDER BY rowid DESC LIMIT 1")
    return found[0]["runners_found"] if found else None


def finished(data: Path) -> list[sqlite3.Row]:
    return rows(
        data,
        "SELECT seen_from, prompt_tokens, outcome FROM requests WHERE outcome <> 'in_flight' AND prompt_tokens > 0 "
        "ORDER BY started_at_unix_s",
    )


def test_the_stripped_collector_records_and_stops_on_every_os(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary, _ = require_llama_server()
    exe = tmp_path / "bin" / "llama-server.exe"
    exe.parent.mkdir()
    exe.symlink_to(binary)  # a symbolic link: the build's libraries are found beside the real binary
    monkeypatch.setenv("PHASEWATCH_LLAMA_SERVER", str(exe))
    env = {k: v for k, v in stripped_env(tmp_path / "py").items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))}
    data = tmp_path / "data"
    err_path = tmp_path / "collector.log"
    with start_server_engine() as sim, open(err_path, "wb") as err:
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")  # the runner starts
        cmd = [sys.executable, "-m", "collectors", "--data", str(data), "--listen", "127.0.0.1:0"]
        proc = subprocess.Popen([*cmd, "--ollama", sim.base_url, "--interval", "0.2"], cwd=REPO, env=env, stdout=err, stderr=err)
        try:
            listen = wait_until(lambda: listen_address(err_path), timeout_s=60)
            time.sleep(3.0)  # discovery finds the runner (named llama-server.exe) through psutil
            proxied = ollama.Client(host=f"http://{listen}")
            proxied.generate(model=MODEL, prompt=words_prompt(40, 1), options={**GREEDY, "num_predict": NUM_PREDICT})
            direct = ollama.Client(host=sim.base_url)
            direct.generate(model=MODEL, prompt=words_prompt(90, 2), options={**GREEDY, "num_predict": NUM_PREDICT})
            wait_until(lambda: len(finished(data)) >= 2, timeout_s=90)
            time.sleep(2.0)  # a second record of either would have come by now
            got = finished(data)
            assert sorted(r["seen_from"] for r in got) == ["proxy", "runner"], [dict(r) for r in got]
            assert runners_found(data) == f"1 runner found {FOUND_SAME_USER}"  # through psutil: /proc/net is shut
            stop_started = time.monotonic()
            stop = subprocess.run([*cmd[:5], "--stop"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            assert stop.returncode == 0, stop.stderr
            proc.wait(timeout=STOP_WITHIN_S)
            took_s = time.monotonic() - stop_started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    log = err_path.read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert took_s < STOP_WITHIN_S
    assert "Traceback" not in log, log[-3000:]
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert sorted(r["seen_from"] for r in finished(data)) == ["proxy", "runner"]
    print(f"stopped in {took_s:.2f} s; {os.linesep.join(str(dict(r)) for r in finished(data))}")
