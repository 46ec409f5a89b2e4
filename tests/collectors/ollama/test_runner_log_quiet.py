"""The runner reader reads Ollama's log file in a worker thread only when the file changed: a quiet log costs one
stat per step on the loop, not a thread's round trip four times a second (issue 33)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

from collectors.ollama.discovery import Discovery
from collectors.ollama.log import LogEvent, LogSource, LogTail
from collectors.ollama.prompt_fit import FitBook, FitTap
from collectors.ollama.runners import RunnerReader

STEP_S = 0.02
DONE = "slot update_slots: id  0 | task 7 | prompt processing done, n_tokens = 2048, batch.n_tokens = 0\n"


class CountingTail(LogTail):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0
        self.events: list[LogEvent] = []

    def read(self, now_unix_s: float) -> list[LogEvent]:
        self.reads += 1
        events = super().read(now_unix_s)
        self.events += events
        return events


def _reader(source: LogSource) -> RunnerReader:
    """A runner reader that only reads the log, stepping every STEP_S (no runner to find or poll)."""
    return RunnerReader(
        "http://127.0.0.1:1",
        cast(Any, None),
        in_flight=list,
        loaded_models=list,
        log_source=source,
        busy_interval_s=STEP_S,
        discover_every_s=3600.0,
        discover=lambda _url: Discovery([], None, "not looked for in this test"),
    )


async def _run_for(reader: RunnerReader, seconds: float, during: Any = None) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(reader.run(stop))
    await asyncio.sleep(seconds / 2)
    if during is not None:
        during()
    await asyncio.sleep(seconds / 2)
    stop.set()
    await task


def test_a_quiet_log_is_not_read_again_and_a_written_one_is(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("before the collector\n")
    tail = CountingTail(log)
    reader = _reader(tail)
    t0 = time.monotonic()
    asyncio.run(_run_for(reader, 1.0))
    steps = (time.monotonic() - t0) / STEP_S
    assert tail.reads <= 3, f"{tail.reads} reads of a quiet log in ~{steps:.0f} steps"

    def write() -> None:
        with log.open("a") as f:
            f.write(DONE)

    asyncio.run(_run_for(reader, 1.0, write))
    assert [e.kind for e in tail.events] == ["done"], "a line written is still read"


def test_a_quiet_log_behind_the_prompt_fit_tap_is_not_read_again(tmp_path: Path) -> None:
    """As the service wires it: the log source is a FitTap around the tail. It was read every step (the runner
    reader asked only a bare LogTail whether it changed): four worker-thread round trips a second, idle."""
    log = tmp_path / "server.log"
    log.write_text("before the collector\n")
    tail = CountingTail(log)
    reader = _reader(FitTap(tail, FitBook()))

    def write() -> None:
        with log.open("a") as f:
            f.write(DONE)

    t0 = time.monotonic()
    asyncio.run(_run_for(reader, 1.0, write))
    steps = (time.monotonic() - t0) / STEP_S
    assert tail.reads <= 4, f"{tail.reads} reads of a log written once in ~{steps:.0f} steps"
    assert [e.kind for e in tail.events] == ["done"], "the line written is read"
