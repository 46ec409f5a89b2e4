"""The runner reader, quiet, steps once a second and is woken by the kernel's notice that Ollama's log was written,
so its line is still read within one busy step; a watch that stays silent while lines come is dropped (issue 44).

Real files and real inotify watches: a hard link written through another folder is a real write the watched folder
is never told of, as with a folder shared into a container."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from collectors.ollama import log_watch
from collectors.ollama.discovery import Discovery
from collectors.ollama.log import LogEvent, LogSource, LogTail
from collectors.ollama.log_watch import LogWatch, open_log_watch
from collectors.ollama.runners import RunnerReader

DONE = "slot update_slots: id  0 | task 7 | prompt processing done, n_tokens = 2048, batch.n_tokens = 0\n"
BUSY_S = 0.05
IDLE_S = 3.0  # far from the busy step: a line read at the idle pace instead of on its notice is seconds late
QUIET_AFTER_S = 0.3

pytestmark = pytest.mark.skipif(log_watch.INotify is None, reason="no inotify on this system")


class StampedTail(LogTail):
    """A log tail that keeps each event with the wall time it was read (the reader stamps lines with it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.events: list[LogEvent] = []

    def read(self, now_unix_s: float) -> list[LogEvent]:
        events = super().read(now_unix_s)
        self.events += events
        return events


class Unwatched(StampedTail):
    """The same tail where no change notice exists (as journalctl's pipe, or a system without inotify)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.watched_path = None


def _reader(source: LogSource) -> RunnerReader:
    return RunnerReader(
        "http://127.0.0.1:1",
        cast(Any, None),
        in_flight=list,
        loaded_models=list,
        log_source=source,
        busy_interval_s=BUSY_S,
        idle_interval_s=IDLE_S,
        quiet_after_s=QUIET_AFTER_S,
        discover_every_s=3600.0,
        discover=lambda _url: Discovery([], None, "not looked for in this test"),
    )


def _append(path: Path, text: str = DONE) -> float:
    with path.open("a") as f:
        f.write(text)
    return time.time()


async def _until_quiet(reader: RunnerReader, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not reader.quiet():
        assert time.monotonic() < deadline, "the reader never fell quiet"
        await asyncio.sleep(0.02)


async def _steps_in_a_second(reader: RunnerReader, settled: Callable[[], Awaitable[None]]) -> int:
    """The reader's steps over one second, once ``settled()`` returned."""
    stop = asyncio.Event()
    task = asyncio.create_task(reader.run(stop))
    await settled()
    before = reader.steps
    await asyncio.sleep(1.0)
    steps = reader.steps - before
    stop.set()
    await task
    return steps


def test_the_watch_tells_of_the_log_and_not_of_its_neighbours(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    watch = open_log_watch(log)
    assert watch is not None
    try:
        assert not watch.changed(), "nothing happened yet"
        (tmp_path / "app.log").write_text("the desktop app's own log\n")
        assert not watch.changed(), "a neighbour's write is not the log's"
        _append(log)
        assert watch.changed()
        assert not watch.changed(), "told once"
        log.rename(tmp_path / "server-1.log")  # Ollama's app rotates at its start
        log.write_text("")
        assert watch.changed(), "a rotated and re-created log is told of"
        assert watch.problem is None
    finally:
        watch.close()


def test_a_watch_whose_folder_goes_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    watch = LogWatch(folder / "server.log")
    try:
        folder.rmdir()
        assert watch.changed()
        assert watch.problem is not None and "removed" in watch.problem
    finally:
        watch.close()


def test_no_watch_where_the_system_or_the_folder_offers_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_log_watch(tmp_path / "missing" / "server.log") is None, "a folder not there yet: look instead"

    class MacLibc:  # libc without inotify_init1: what inotify_simple's INotify() meets on macOS
        def __init__(self, **_kwargs: Any) -> None:
            raise AttributeError("dlsym(RTLD_DEFAULT, inotify_init1): symbol not found")

    monkeypatch.setattr(log_watch, "INotify", MacLibc)
    assert open_log_watch(tmp_path / "server.log") is None
    monkeypatch.setattr(log_watch, "INotify", None)  # no termios: Windows
    assert open_log_watch(tmp_path / "server.log") is None


def test_quiet_the_reader_steps_at_the_idle_pace_and_reads_a_line_when_told(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("before the collector\n")
    tail = StampedTail(log)
    reader = _reader(tail)

    async def scenario() -> tuple[int, float, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        await _until_quiet(reader)
        assert reader.log_notices.working
        steps_before = reader.steps
        await asyncio.sleep(1.0)
        quiet_steps = reader.steps - steps_before
        written = _append(log)
        while not tail.events and time.time() - written < 2 * IDLE_S:
            await asyncio.sleep(0.01)
        late_s = tail.events[0].read_unix_s - written if tail.events else float("inf")
        reader.wake()  # as the proxy does when a request begins
        woken_at = reader.steps
        await asyncio.sleep(0.3)
        woken_steps = reader.steps - woken_at
        stop.set()
        await task
        return quiet_steps, late_s, woken_steps

    quiet_steps, late_s, woken_steps = asyncio.run(scenario())
    # At the busy pace a second is 20 steps; quiet, the idle step of IDLE_S comes at most once.
    assert quiet_steps <= 2, f"{quiet_steps} steps in a quiet second"
    # Without the notice the line waits for the idle step, up to IDLE_S; with it, at most a busy step (+ slack).
    assert late_s < 1.0, f"the line was read {late_s:.2f} s after it was written"
    assert woken_steps >= 1, "wake() steps now"
    assert reader.log_notices.missed == 0


def test_without_a_watch_the_reader_keeps_looking_every_busy_step(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("before the collector\n")
    reader = _reader(Unwatched(log))

    async def settled() -> None:
        await asyncio.sleep(QUIET_AFTER_S + 0.2)
        assert not reader.quiet(), "never quiet without a watch: a line's stamp rests on looking"

    steps = asyncio.run(_steps_in_a_second(reader, settled))
    assert steps >= 5, f"{steps} steps in a second at a {BUSY_S} s busy step"


def test_a_watch_that_stays_silent_while_lines_come_is_dropped(tmp_path: Path) -> None:
    """The reader follows ``watched/server.log``, a hard link to a file another folder's name writes: the write is
    real, the watched folder is never told (a shared or network folder behaves so)."""
    elsewhere = tmp_path / "elsewhere"
    watched = tmp_path / "watched"
    elsewhere.mkdir()
    watched.mkdir()
    writer_path = elsewhere / "server.log"
    writer_path.write_text("before the collector\n")
    os.link(writer_path, watched / "server.log")
    tail = StampedTail(watched / "server.log")
    reader = _reader(tail)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        await _until_quiet(reader)
        _append(writer_path)
        deadline = time.monotonic() + 2 * IDLE_S + 2
        while not tail.events and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert tail.events, "the line is read at the idle step all the same"
        await asyncio.sleep(0.1)
        assert reader.log_notices.missed == 1
        assert not reader.log_notices.working and not reader.quiet(), "back to looking every busy step"
        stop.set()
        await task

    asyncio.run(scenario())


def test_with_no_log_at_all_the_reader_falls_quiet_too() -> None:
    """No log read (demo mode without one, a remote Ollama): no line's stamp rests on looking, so quiet it steps
    at the idle pace."""
    reader = _reader(cast(Any, None))

    steps = asyncio.run(_steps_in_a_second(reader, lambda: _until_quiet(reader)))
    assert steps <= 2, f"{steps} steps in a quiet second"
