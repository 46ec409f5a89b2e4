"""Ollama's log read where the macOS app keeps it, without ``--ollama-log`` (issue 45): ``HOME`` holds
``.ollama/logs/server.log``, which sim (``--log-file … --log-rotate``, the real llama-server behind it) writes and
renames to ``server-1.log`` at each start, as the app does. A generation sent to sim directly is recorded from the
log, exact against llama-server's own timings; and again after sim restarts and the log rotates."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from store.schema import db_path
from tests.support.engine_process import GREEDY, MODEL, THREADS, engine_log, require_llama_server, words_prompt
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.sim_process import SimProcess, start_sim
from tests.support.stripped_python import listen_address
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]

LOG_AGREEMENT = 0.01  # the log's figures vs llama-server's own (the same numbers, printed to 0.01 ms)


@contextlib.contextmanager
def sim_at(port: int, log: Path) -> Iterator[SimProcess]:
    _, gguf = require_llama_server()
    args = ["--engine", "llama-server", "--gguf", str(gguf), "--threads", str(THREADS), "--log-file", str(log), "--log-rotate"]
    with start_sim(*args, port=port) as sim:
        yield sim


def runner_rows(data: Path) -> list[sqlite3.Row]:
    if not db_path(data).exists():
        return []
    conn = sqlite3.connect(f"file:{db_path(data)}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute("SELECT * FROM requests WHERE seen_from = 'runner' AND outcome <> 'in_flight'"))
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def direct_generation(sim: SimProcess, words: int) -> dict[str, Any]:
    """One generation sent to sim directly; llama-server's own account of it."""
    since = time.monotonic_ns()  # sim stamps what it sends to llama-server on the monotonic clock
    ollama.Client(host=sim.base_url).generate(
        model=MODEL, prompt=words_prompt(words, words), options={**GREEDY, "num_predict": 64, "seed": words}
    )
    (rec,) = [r for r in engine_log(sim).values() if r["sent_ns"] >= since and r["timings"]]
    return rec


def exact_from_log(row: sqlite3.Row, engine: dict[str, Any]) -> None:
    t = engine["timings"]
    assert row["runner_source"] == "log", dict(row)
    assert row["prompt_tokens"] == t["cache_n"] + t["prompt_n"] == engine["prompt_tokens"]
    assert row["output_tokens"] == t["predicted_n"]
    assert row["decode_s"] == pytest.approx(t["predicted_ms"] / 1000, rel=LOG_AGREEMENT)


def test_the_log_where_the_mac_app_keeps_it_is_read_and_followed_across_a_rotation(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = home / ".ollama" / "logs" / "server.log"
    port = free_port()
    data = tmp_path / "data"
    err_path = tmp_path / "collector.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))} | {"HOME": str(home)}
    cmd = [sys.executable, "-m", "collectors", "--data", str(data), "--listen", "127.0.0.1:0", "--interval", "0.2"]
    with sim_at(port, log) as sim, open(err_path, "wb") as err:
        collector = subprocess.Popen([*cmd, "--ollama", sim.base_url], cwd=REPO, env=env, stdout=err, stderr=err)
        try:
            wait_until(lambda: listen_address(err_path), timeout_s=60)
            ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")
            time.sleep(3.0)  # the runner is found
            first = direct_generation(sim, 70)
            wait_until(lambda: len(runner_rows(data)) == 1, timeout_s=60)
            exact_from_log(runner_rows(data)[0], first)
            sim.proc.terminate()
            sim.proc.wait(30)
            with sim_at(port, log) as again:
                assert (log.parent / "server-1.log").is_file()  # rotated, as the app does at each start
                ollama.Client(host=again.base_url).generate(model=MODEL, prompt="", keep_alive="10m")
                time.sleep(3.0)
                second = direct_generation(again, 110)
                wait_until(lambda: len(runner_rows(data)) == 2, timeout_s=60)
                time.sleep(2.0)  # a third (a second record of either) would have come by now
                rows = sorted(runner_rows(data), key=lambda r: r["started_at_unix_s"])
                assert len(rows) == 2, [dict(r) for r in rows]
                exact_from_log(rows[1], second)
        finally:
            collector.terminate()
            collector.wait(30)
    assert "Traceback" not in err_path.read_text(errors="replace")
