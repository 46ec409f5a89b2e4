"""The log is read and generations end in it, but the runner's per-request lines never come (Ollama writing them
only with OLLAMA_DEBUG, as its open PR #17913 would): the collector says so once, with how to get them back, and
records from /slots meanwhile; when a runner line comes again, it says no more. Shown in the sidebar (every page,
Why included) from the heartbeat."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest

from analysis.records import CollectorInfo
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import RunnerReader
from pages.shared.sidebar import _with_code
from store import queries
from store.ops import PutHeartbeat
from store.schema import db_path
from store.writer import StoreWriter

ACCESS = '[GIN] 2026/12/04 - 21:30:{s:02d} | 200 |     2.331s |       127.0.0.1 | POST     "/api/chat"\n'
TAGS = '[GIN] 2026/12/04 - 21:30:{s:02d} | 200 |      1.2ms |       127.0.0.1 | GET      "/api/tags"\n'
LAUNCH = "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0\n"


def _reader(log: Path, kind: str = "llama-server") -> RunnerReader:
    r = RunnerReader(
        "http://127.0.0.1:1", cast(Any, None), in_flight=list, loaded_models=list, log_source=LogTail(log, from_start=True)
    )
    r.runners[1] = RunnerState(Runner(1, 48613, "/m.gguf", kind=kind), model="gemma3:270m")
    return r


def test_generations_without_runner_lines_are_said_once_with_the_fix(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "ollama.log"
    log.write_text(ACCESS.format(s=1) + TAGS.format(s=2))
    r = _reader(log)
    caplog.set_level(logging.INFO, logger="collectors.ollama.runners")
    r._read_log([])
    assert r.runner_lines_missing is None  # one generation without its lines: not yet a pattern
    with log.open("a") as f:
        f.write(ACCESS.format(s=5) + ACCESS.format(s=9))
    r._read_log([])
    r._read_log([])
    missing = r.runner_lines_missing
    assert missing is not None and "`OLLAMA_DEBUG=1`" in missing and "/slots" in missing
    assert sum("per-request lines" in m for m in caplog.messages) == 1  # said once
    # The sidebar's text keeps the command as code.
    assert "`OLLAMA_DEBUG=1`" in _with_code(missing)
    with log.open("a") as f:
        f.write(LAUNCH + ACCESS.format(s=12))
    r._read_log([])
    assert r.runner_lines_missing is None
    assert any("are back" in m for m in caplog.messages)


def test_lines_that_come_or_a_runner_that_writes_none_are_no_loss(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("".join(ACCESS.format(s=s) + LAUNCH for s in range(4)))
    r = _reader(log)
    r._read_log([])
    assert r.runner_lines_missing is None
    # Ollama's own Go runner never writes llama-server's slot lines: their absence says nothing.
    go = tmp_path / "go.log"
    go.write_text("".join(ACCESS.format(s=s) for s in range(4)))
    g = _reader(go, kind="ollama runner")
    g._read_log([])
    assert g.runner_lines_missing is None


def test_the_notice_reaches_the_store(tmp_path: Path) -> None:
    w = StoreWriter(db_path(tmp_path))
    info = CollectorInfo(1.0, 2, "127.0.0.1:11435", "http://127.0.0.1:11434", str(tmp_path), "none", runner_lines_missing="x")
    w.write(PutHeartbeat(info))
    w.close()
    with queries.open_reader(db_path(tmp_path)) as conn:
        assert conn is not None
        hb = queries.latest_heartbeat(conn)
    assert hb is not None and hb.runner_lines_missing == "x"
