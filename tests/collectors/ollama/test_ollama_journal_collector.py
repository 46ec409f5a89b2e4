"""``python -m collectors --ollama-journal ollama`` as a real process in front of sim, reading real journal files
(``PHASEWATCH_JOURNAL_DIR``) written by systemd-journal-remote: llama-server's progress lines, appended while a
request is read, are read and parsed, and, with no runner whose /slots shows their task (sim's own engine has
none), dropped and counted, never stored on the request in flight; a journal with nothing in it is said in
words while the collector runs on; journalctl is stopped with the collector."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from analysis.records import ProgressSource
from collectors.ollama.log import parse_line
from collectors.service import METRICS_PATH
from store import queries
from store.schema import db_path
from tests.support.clients import stream_generate
from tests.support.collector_process import MODEL, collector, listen_url, stop, wait_for_ticks
from tests.support.exposition import parse_exposition
from tests.support.journal import JournalFiles, now_us, require_journal_tools, unit_entry
from tests.support.paths import DATA
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

CAPTURED = DATA / "llama_server_logs" / "prompt4k_batch512.log"
STALL_MS = 15_000  # sim holds the first token this long: the request is "reading its prompt" meanwhile


def _journalctls(journal_dir: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if any(arg == f"--directory={journal_dir}" for arg in cmdline):
            found.append(p)
    return found


def _generate(base_url: str, out: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "Why is the sky blue?", "stream": True, "options": {"num_predict": 4}}
    stream_generate(base_url, body, out, timeout_s=120)


def _in_flight_id(data: Path) -> str | None:
    with queries.open_reader(db_path(data)) as conn:
        if conn is None:
            return None
        row = conn.execute("SELECT id FROM requests WHERE outcome = 'in_flight' LIMIT 1").fetchone()
        return row[0] if row else None


@pytest.mark.slow
def test_journal_progress_lines_are_read_and_without_a_runner_to_confirm_them_dropped(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    journal = JournalFiles(journal_dir)
    journal.append([unit_entry("Started ollama.service", ts_us=now_us() - 60_000_000)])
    data = tmp_path / "data"
    env = {"PHASEWATCH_JOURNAL_DIR": str(journal_dir)}
    with start_sim() as sim, collector(data, "--ollama", sim.base_url, "--ollama-journal", "ollama", env_extra=env) as proc:
        base = listen_url(data)
        warm: dict[str, Any] = {}
        _generate(base, warm)  # loads the model: the next request goes straight to its prompt
        assert "final" in warm
        httpx.post(sim.base_url + "/sim/faults", json={"stall_ms": STALL_MS}, timeout=10).raise_for_status()
        out: dict[str, Any] = {}
        thread = threading.Thread(target=_generate, args=(base, out))
        thread.start()
        deadline = time.monotonic() + STALL_MS / 1000 / 2
        while (rid := _in_flight_id(data)) is None:
            assert time.monotonic() < deadline, "the request did not show as in flight"
            time.sleep(0.1)
        lines = [line for line in CAPTURED.read_text().splitlines() if "prompt processing" in line or " time = " in line]
        start_us = now_us()
        written = [(line, start_us + 1000 * i) for i, line in enumerate(lines)]
        journal.append([unit_entry(line, ts_us=ts) for line, ts in written])
        thread.join()
        assert "first_token" in out and out["first_token"] > start_us / 1e6
        wait_for_ticks(data)  # the last rows are written
        metrics = parse_exposition(httpx.get(base + METRICS_PATH, timeout=10).text)
        assert proc.poll() is None
        assert len(_journalctls(journal_dir)) == 1, "one journalctl, following"
        rc, err = stop(proc)
    assert rc == 0, err
    assert _journalctls(journal_dir) == [], "journalctl is stopped with the collector"
    with queries.open_reader(db_path(data)) as conn:
        assert conn is not None
        rows = [s for s in queries.progress_samples(conn, [rid]).get(rid, []) if s.source is ProgressSource.LOG]
    kinds = ("progress", "done", "prompt_eval", "eval")  # a request's progress rows come from these
    events = [e for line, ts in written if (e := parse_line(line, ts / 1e6)) is not None and e.kind in kinds]
    assert rows == [], "a line whose task no runner's /slots showed is no request's"
    assert metrics[("phasewatch_ollama_log_dropped_lines_total", (("reason", "progress"),))] == len(events) > 0
    assert "Ollama's log:" not in err, "nothing to report: the journal was read"


@pytest.mark.slow
def test_a_journal_with_nothing_is_said_and_the_collector_runs_on(tmp_path: Path) -> None:
    require_journal_tools()
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    data = tmp_path / "data"
    env = {"PHASEWATCH_JOURNAL_DIR": str(journal_dir)}
    with start_sim() as sim, collector(data, "--ollama", sim.base_url, "--ollama-journal", "ollama", env_extra=env) as proc:
        out: dict[str, Any] = {}
        _generate(listen_url(data), out)
        assert "final" in out, "the proxy works without the log"
        time.sleep(1.5)  # journalctl started, exited and was started again at least once
        assert proc.poll() is None
        rc, err = stop(proc, signal.SIGTERM)
    assert rc == 0, err
    said = [line for line in err.splitlines() if "Ollama's log:" in line]
    assert said and "journalctl -u ollama exited with status 1" in said[0], err
    assert "no entries" in said[0] and "live progress comes from the runners' /slots alone" in said[0]
    assert _journalctls(journal_dir) == [], "journalctl is stopped with the collector"


@pytest.mark.slow
def test_journalctl_ends_with_a_collector_that_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the collector no time to stop journalctl: it ends on its own once its output pipe closes."""
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    JournalFiles(journal_dir).append([unit_entry("Started ollama.service", ts_us=now_us() - 1_000_000)])
    data = tmp_path / "data"
    env = {"PHASEWATCH_JOURNAL_DIR": str(journal_dir)}
    ollama = f"http://127.0.0.1:{free_port()}"  # nothing listens: the collector runs on without Ollama
    with collector(data, "--ollama", ollama, "--ollama-journal", "ollama", env_extra=env) as proc:
        deadline = time.monotonic() + 30
        while not (found := _journalctls(journal_dir)):
            assert time.monotonic() < deadline, "journalctl was not started"
            time.sleep(0.1)
        [journalctl] = found
        proc.kill()
        proc.wait(timeout=10)
    gone, _alive = psutil.wait_procs([journalctl], timeout=10)
    assert gone, "journalctl outlived its collector"
