"""Generations in an Ollama log already written (server.log, or ``journalctl -u ollama -o cat``), as records.

The live collector believes a runner's log line only once ``/slots`` shows its task (``collectors.ollama.direct``);
a log read afterwards has no ``/slots`` to ask, so ``LogHistory`` takes the runner's lines as they stand, read by
the collector's own parser (``collectors.ollama.log.parse_line``), and the import says so (``docs/import-log.md``).

A generation is one runner task whose ``prompt eval time`` and ``eval time`` lines came before its ``stop
processing`` line: its record carries the runner's own timings (exact to the 0.01 ms they are printed to), the
whole prompt's size (``task.n_tokens``), the load that preceded it on its runner, and, where exactly one of
Ollama's access lines fits it, the route, status, client and total time.

Time: llama-server's lines carry none. Each line is stamped from the nearest preceding line that has one
(Ollama's ``time=…`` lines, its ``[GIN]`` access lines, a journal prefix in ISO form); stamps never go back.
A task's end lies between the stamp before its release line and the next stamp after it: the record's end is
the middle of that window, its ``ends_bound_s`` half the window (an access line that fits narrows it).

The runner: lines name no port, so a task is the newest started runner's (``starting llama-server … --port N``);
with several models loaded at once an older runner's tasks are attributed to the newest (docs/import-log.md).
"""

from __future__ import annotations

import re
import shlex
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import BinaryIO

from analysis.log_grammar import slog_line, slog_time_unix_s
from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from analysis.runner_load_lines import LoadLine
from analysis.runner_placement import PlacementReader, RunnerPlacement
from analysis.runner_wait_fold import WaitJoiner
from analysis.runner_wait_tasks import TaskWaits
from collectors.ollama.access_fit import ACCESS_SLACK_S
from collectors.ollama.direct import GENERATION_PATHS, LOAD_FOLLOWS_S
from collectors.ollama.direct_record import LOG_TIMING_BOUND_S
from collectors.ollama.discovery import runner_from_argv
from collectors.ollama.log import AccessLine, EventKind, LogEvent, parse_line

READ_CHUNK_BYTES = 1 << 20  # the file is read this much at a time: memory stays flat whatever its size
MAX_LINE_BYTES = 64 << 10  # a longer line is skipped whole (the parser looks at none that long)
MAX_OPEN_TASKS = 4096  # tasks begun and not ended at once; past it the oldest is dropped, counted
MAX_UNSTAMPED_EVENTS = 10_000  # events before the log's first stamp, kept until it comes
# A finished task waits for its access line (written when Ollama's HTTP reply ends) this long past its end, in
# the log's own time, and for the next stamp after it (the end of its window).
ACCESS_WAIT_S = ACCESS_SLACK_S + 2.0
# access lines no ended task fitted yet, kept for a release line written after them
MAX_WAITING_ACCESS_LINES = 64
MAX_ENDED_WAITING = 256  # ended tasks waiting for their window's end (a log whose stamps stop advancing holds them)
NO_NEXT_STAMP_BOUND_S = 60.0  # a task after the log's last stamp: its end is within this of it, at most
SLOG_RESOLUTION_S = 1e-3  # Ollama's time= stamps are printed to the millisecond
STAMP_RESOLUTION_S = 1.0  # the coarsest stamp (gin's access line, a journal's short time): whole seconds

# Ollama's slog line: ``time=2026-12-04T18:31:01.404+00:00 level=INFO …``; the journal's ISO prefix:
# ``2026-12-04T18:31:01+0000 host ollama[123]: …`` (journalctl -o short-iso), stripped before parsing.
_JOURNAL_ISO = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:[+-]\d\d:?\d\d|Z)) \S{1,255} [\w.@-]{1,255}\[\d{1,10}\]: "
)
_JOURNAL_SHORT = re.compile(r"[A-Z][a-z]{2} [ 0-3]\d \d\d:\d\d:\d\d \S{1,255} [\w.@-]{1,255}\[\d{1,10}\]: ")
_BLOB_DIGEST = re.compile(r"sha256[-:]([0-9a-f]{64})")


def _iso_s(text: str) -> float | None:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None  # a time without a zone is not one to trust


@dataclass(frozen=True)
class RunnerStart:
    """A runner Ollama started, from its ``starting llama-server`` line: its port and what its command line names."""

    port: int
    model_path: str | None
    digest: str | None  # from an Ollama blob's name (``sha256-<hex>``)
    stamp_unix_s: float


@dataclass
class _Task:
    port: int | None
    task_id: int
    launched_unix_s: float
    slot_id: int | None = None  # every line of the task names the slot it launched on
    lines_disagree: bool = False  # a line of it named another slot: not one runner's sequence
    prompt_total: int | None = None
    prompt_eval: tuple[float, int] | None = None  # (ms, tokens computed)
    eval: tuple[float, int] | None = None  # (ms, tokens)
    end_lo: float | None = None  # the stamp before its release line
    end_hi: float | None = None  # the first stamp after it
    load_s: float | None = None
    access: AccessLine | None = None
    waits: TaskWaits | None = None  # what the runner said it did for it besides reading the prompt


@dataclass(frozen=True)
class Generation:
    """One generation the log holds: its record, and the runner it ran on (``None``: no runner start was seen)."""

    record: RequestRecord
    runner: RunnerStart | None
    end_lo_unix_s: float  # its end lies in [end_lo, end_hi]
    end_hi_unix_s: float
    waits: TaskWaits | None = None  # the runner's own waits before its prompt (analysis.runner_wait_fold)


@dataclass
class HistoryCounts:
    lines: int = 0
    known_lines: int = 0
    generations: int = 0
    incomplete_tasks: int = 0  # ended without both timing lines (cancelled before decoding, or lines lost)
    dropped_tasks: int = 0  # past MAX_OPEN_TASKS, or lines of a task whose start the log does not hold
    long_lines: int = 0
    loads: int = 0
    # Lines not believed, as the live collector does not believe them: a task whose lines name two slots or whose
    # timings do not fit between the stamps around it (printed at once, as an echo prints them), a load time longer
    # than the time since its runner's start, a load line after the runner listened.
    refused_tasks: int = 0
    refused_loads: int = 0
    refused_load_lines: int = 0


@dataclass
class _Runner:
    start: RunnerStart
    placement: PlacementReader = field(default_factory=PlacementReader)
    placement_unix_s: float | None = None  # the stamp of its last load line
    up: bool = False  # its listening line (or Ollama's "started in") was read: no load line after it is its own
    load: tuple[float, float] | None = None  # (stamp of "started in", seconds) until a task takes it
    waits: WaitJoiner = field(default_factory=WaitJoiner)  # its waits and task lines, folded in the order printed


class LogHistory:
    """Feed it an Ollama log's lines in order (``feed``), then ``finish()``; ``emit`` gets each generation once
    its window is known. ``placements()`` gives each runner port's last placement with its stamp."""

    def __init__(self, emit: Callable[[Generation], None]) -> None:
        self._emit = emit
        self.counts = HistoryCounts()
        self._stamp: float | None = None
        self._unstamped: list[tuple[str, LogEvent]] = []
        self._runners: dict[int, _Runner] = {}
        self._port: int | None = None  # the newest started runner's
        self._open: dict[tuple[int | None, int], _Task] = {}
        self._ended: deque[_Task] = deque()  # released, waiting for their window's end and their access line
        self._no_next_stamp: list[_Task] = []  # released since the last stamp: the next one ends their window
        self._lines: deque[AccessLine] = deque(maxlen=MAX_WAITING_ACCESS_LINES)  # generation lines no task took yet
        self._portless_waits = WaitJoiner()
        self._placed: dict[int, tuple[float, RunnerPlacement, RunnerStart]] = {}  # the first placement per port

    # -- lines -----------------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        self.counts.lines += 1
        line = self._strip_journal_prefix(line)
        slog = slog_line(line) if line.startswith("time=") else None  # Ollama's own line, in its exact form only
        if slog is not None and (when := slog_time_unix_s(slog)) is not None:
            self._stamped(when, when + SLOG_RESOLUTION_S)
        event = parse_line(line, self._stamp if self._stamp is not None else 0.0)
        if event is None:
            return
        self.counts.known_lines += 1
        if event.kind == EventKind.ACCESS and event.access is not None:
            self._stamped(event.access.ended_unix_s, event.access.ended_unix_s + 1)  # gin prints whole seconds
            event = LogEvent(EventKind.ACCESS, self._stamp or event.access.ended_unix_s, 0, access=event.access)
        if self._stamp is None:
            if len(self._unstamped) < MAX_UNSTAMPED_EVENTS:
                self._unstamped.append((line, event))
            return
        self._event(line, event)

    def _strip_journal_prefix(self, line: str) -> str:
        m = _JOURNAL_ISO.match(line)
        if m:
            if (when := _iso_s(m.group(1))) is not None:
                self._stamped(when, when + (1.0 if "." not in m.group(1) else 1e-6))
            return line[m.end() :]
        m = _JOURNAL_SHORT.match(line)  # no year in it: stripped, not used as a stamp
        return line[m.end() :] if m else line

    def _stamped(self, when: float, latest: float) -> None:
        """A line with its own time, written at ``when`` at the earliest and before ``latest`` (its stamp's
        resolution): the stamp of the lines after it (never earlier than the last one), and the end of the
        window of the tasks released before it."""
        first = self._stamp is None
        for task in self._no_next_stamp:
            task.end_hi = max(latest, task.end_lo or latest)
        self._no_next_stamp.clear()
        if self._stamp is None or when > self._stamp:
            self._stamp = when
            self._flush(final=False)
        if first and self._unstamped:
            held, self._unstamped = self._unstamped, []
            for line, event in held:
                self._event(line, replace(event, read_unix_s=when))

    # -- events ----------------------------------------------------------------------------------

    def _event(self, line: str, event: LogEvent) -> None:
        kind = event.kind
        if kind == EventKind.RUNNER_START and event.port is not None:
            self._runner_started(line, event)
        elif kind == EventKind.RUNNER_STARTED and self._port is not None and event.duration_ms is not None:
            self._runner_up(self._runners[self._port], event)
        elif kind == EventKind.RUNNER_LISTENING and self._port is not None and event.port == self._port:
            self._runners[self._port].up = True
        elif kind == EventKind.RUNNER_LOAD and event.load is not None:
            self._load_line(event.load, event.read_unix_s)
        elif kind == EventKind.ACCESS and event.access is not None:
            self._access(event.access)
        elif kind == EventKind.RUNNER_WAIT and event.wait is not None:
            self._joiner().wait(event.wait)  # like the load lines, the newest started runner's
        elif event.task_id is not None and kind in (
            EventKind.LAUNCH,
            EventKind.NEW_PROMPT,
            EventKind.PROMPT_EVAL,
            EventKind.EVAL,
            EventKind.RELEASE,
        ):
            self._task_line(event)

    def _load_line(self, fact: LoadLine, read_unix_s: float) -> None:
        """A load line counts only inside the start of the runner started last (before it listened)."""
        runner = self._runners.get(self._port) if self._port is not None else None
        if runner is None or runner.up or not runner.placement.feed(fact):
            self.counts.refused_load_lines += 1
            return
        runner.placement_unix_s = read_unix_s

    def _runner_up(self, runner: _Runner, event: LogEvent) -> None:
        """Ollama's "started in X seconds": believed when X fits between its start line's stamp and this line's."""
        assert event.duration_ms is not None
        runner.up = True
        took_s = event.duration_ms / 1000
        if took_s > event.read_unix_s - runner.start.stamp_unix_s + STAMP_RESOLUTION_S:
            self.counts.refused_loads += 1
            return
        runner.load = (event.read_unix_s, took_s)
        self.counts.loads += 1

    def _joiner(self) -> WaitJoiner:
        """The wait joiner of the runner started last (one for a log that shows no runner start)."""
        runner = self._runners.get(self._port) if self._port is not None else None
        return runner.waits if runner is not None else self._portless_waits

    def _runner_started(self, line: str, event: LogEvent) -> None:
        assert event.port is not None
        model_path = None
        slog = slog_line(line)
        cmd = slog.attrs.get("cmd") if slog is not None else None
        if cmd:
            try:
                argv = shlex.split(cmd)
            except ValueError:
                argv = []
            runner = runner_from_argv(0, "llama-server", argv) if argv else None
            model_path = runner.model_path if runner is not None else None
        digest_m = _BLOB_DIGEST.search(model_path.rsplit("/", 1)[-1]) if model_path else None
        start = RunnerStart(event.port, model_path, digest_m.group(1) if digest_m else None, event.read_unix_s)
        old = self._runners.get(event.port)
        placed = old.placement.placement() if old is not None else None
        if old is not None and placed is not None and old.placement_unix_s is not None:
            # once per port: a start line naming a port whose runner placed its model already (anyone can print
            # one) does not replace that placement (Ollama picks a free port for each runner)
            self._placed.setdefault(event.port, (old.placement_unix_s, placed, old.start))
        self._runners[event.port] = _Runner(start)  # a new load on that port: its tasks and load time
        self._port = event.port

    def _task_line(self, event: LogEvent) -> None:
        assert event.task_id is not None
        key = (self._port, event.task_id)
        task = self._open.get(key)
        if event.kind == EventKind.LAUNCH:
            if task is not None:
                self.counts.incomplete_tasks += 1  # the same id launched again (a restarted runner): the first never ended
            task = self._open[key] = _Task(self._port, event.task_id, event.read_unix_s, event.slot_id)
            launched = self._joiner().launch(event.slot_id, event.task_id)
            task.waits = launched[0] if launched else None
            self._take_load(task)
            if len(self._open) > MAX_OPEN_TASKS:
                del self._open[next(iter(self._open))]
                self.counts.dropped_tasks += 1
            return
        if task is None:
            self.counts.dropped_tasks += event.kind == EventKind.RELEASE  # its start is not in this log
            return
        if event.slot_id is not None and event.slot_id != task.slot_id:
            task.lines_disagree = True
        if event.kind == EventKind.NEW_PROMPT:
            task.prompt_total = event.tokens
            self._joiner().new_prompt(event.task_id)
        elif event.kind == EventKind.PROMPT_EVAL and event.duration_ms is not None:
            task.prompt_eval = (event.duration_ms, event.tokens)
        elif event.kind == EventKind.EVAL and event.duration_ms is not None:
            task.eval = (event.duration_ms, event.tokens)
        elif event.kind == EventKind.RELEASE:
            self._joiner().release(event.slot_id, event.task_id)
            del self._open[key]
            if task.prompt_eval is None or task.eval is None:
                self.counts.incomplete_tasks += 1
                return
            task.end_lo = event.read_unix_s
            self._ended_task(task)

    def _take_load(self, task: _Task) -> None:
        """The first task on a runner right after its load waited for it (a preload runs no task: a later one
        did not)."""
        runner = self._runners.get(task.port) if task.port is not None else None
        if runner is None or runner.load is None:
            return
        loaded_at, seconds = runner.load
        runner.load = None
        if 0 <= task.launched_unix_s - loaded_at <= LOAD_FOLLOWS_S:
            task.load_s = seconds

    def _access(self, line: AccessLine) -> None:
        """An access line of a generation route fits the one ended task (no line yet) that ended within its
        second and ran no longer than it; none when several do (which is whose is not known). A line written
        before its task's release line waits for it among the recent ones."""
        if line.method != "POST" or line.path not in GENERATION_PATHS:
            return
        fits = [t for t in self._ended if t.access is None and _fits(line, t)]
        if len(fits) == 1:
            fits[0].access = line
        elif not fits:
            self._lines.append(line)

    def _ended_task(self, task: _Task) -> None:
        fits = [line for line in self._lines if _fits(line, task)]
        if len(fits) == 1:
            task.access = fits[0]
            self._lines.remove(fits[0])
        self._ended.append(task)
        self._no_next_stamp.append(task)
        if len(self._ended) > MAX_ENDED_WAITING:  # stamps that do not advance: the oldest goes out as it stands
            self._out(self._ended.popleft())

    # -- out -------------------------------------------------------------------------------------

    def _flush(self, *, final: bool) -> None:
        now = self._stamp
        while self._ended:
            task = self._ended[0]
            assert task.end_lo is not None
            if not final and (task.end_hi is None or now is None or now < task.end_lo + ACCESS_WAIT_S):
                return
            self._ended.popleft()
            self._out(task)

    def _out(self, task: _Task) -> None:
        """Emit an ended task as a generation when its lines are one runner's sequence in time: all on the slot it
        launched on, its timings no longer than the time between the stamps around its launch and its release."""
        gen = self._generation(task)
        took_s = _runner_s(task)
        if task.lines_disagree or took_s > gen.end_hi_unix_s - task.launched_unix_s + STAMP_RESOLUTION_S:
            self.counts.refused_tasks += 1
            return
        self._emit(gen)
        self.counts.generations += 1

    def finish(self) -> None:
        """The log ended: every ended task is emitted (tasks still running are not generations yet)."""
        if self._stamp is None and self._unstamped:
            self._stamped(0.0, 0.0)  # a log with no time at all: its generations are placed at the epoch, bounds say so
        self._flush(final=True)
        self.counts.incomplete_tasks += len(self._open)

    def placements(self) -> dict[int, tuple[float, RunnerPlacement, RunnerStart]]:
        """Port → (stamp of its last load line, where its runner put the model, the runner), for loads that said."""
        out: dict[int, tuple[float, RunnerPlacement, RunnerStart]] = {}
        for port, runner in self._runners.items():
            placement = runner.placement.placement()
            if placement is not None and runner.placement_unix_s is not None:
                out[port] = (runner.placement_unix_s, placement, runner.start)
        return {**out, **self._placed}  # a port's first placement stands

    def _generation(self, task: _Task) -> Generation:
        assert task.end_lo is not None and task.prompt_eval is not None and task.eval is not None
        lo = task.end_lo
        hi = task.end_hi if task.end_hi is not None else lo + NO_NEXT_STAMP_BOUND_S
        if task.access is not None:  # the reply ended in that second, a little after the runner's task
            lo, hi = max(lo, task.access.ended_unix_s - ACCESS_SLACK_S), min(hi, task.access.ended_unix_s + 1)
            hi = max(hi, lo)
        runner = self._runners.get(task.port) if task.port is not None else None
        record = _record(task, (lo + hi) / 2, (hi - lo) / 2)
        return Generation(record, runner.start if runner else None, lo, hi, task.waits)


def _fits(line: AccessLine, task: _Task) -> bool:
    """The reply ended in the line's second, within the task's end window, and took no less than the task ran."""
    if task.end_lo is None or task.end_lo > line.ended_unix_s + 1 + ACCESS_SLACK_S:
        return False
    if task.end_hi is not None and task.end_hi < line.ended_unix_s - ACCESS_SLACK_S:
        return False
    return _runner_s(task) <= line.latency_s + ACCESS_SLACK_S and line.ended_unix_s <= task.end_lo + ACCESS_WAIT_S


def _runner_s(task: _Task) -> float:
    assert task.prompt_eval is not None and task.eval is not None
    return (task.prompt_eval[0] + task.eval[0]) / 1000


def _record(task: _Task, end: float, end_bound_s: float) -> RequestRecord:
    """The task as a finished direct record, as ``collectors.ollama.direct`` writes one from the runner's timings."""
    assert task.prompt_eval is not None and task.eval is not None
    prefill_s, decode_s = task.prompt_eval[0] / 1000, task.eval[0] / 1000
    computed = task.prompt_eval[1]
    prompt = task.prompt_total if task.prompt_total is not None else computed
    cached = prompt - computed if task.prompt_total is not None and prompt >= computed else None
    start = end - prefill_s - decode_s
    load_s = task.load_s or 0.0
    access = task.access
    outcome = Outcome.OK
    if access is not None and access.status >= 400:
        outcome = Outcome.CANCELLED if access.status == 499 else Outcome.HTTP_ERROR

    def ns(wall_s: float) -> int:  # the record's own clock: wall time in ns (it has no collector's clock)
        return round(wall_s * 1e9)

    return RequestRecord(
        id=f"log-{task.port or 0}-{task.task_id}-{int(end)}",
        started_at_unix_s=start - load_s,
        client_addr=access.client if access is not None else None,
        client_unverified=access is not None,  # Ollama's text, as the live collector stores it
        endpoint=access.path if access is not None else None,
        model="",  # named by the importer from the store's digests and runners
        stream=None,
        kind=RequestKind.GENERATE,
        received_ns=ns(start - load_s),
        forwarded_ns=ns(start - load_s),
        first_token_ns=ns(end - decode_s),
        final_chunk_ns=ns(end),
        status_code=access.status if access is not None else None,
        outcome=outcome,
        metrics=FinalMetrics(
            load_duration_ns=round(task.load_s * 1e9) if task.load_s is not None else None,
            prompt_eval_count=prompt,
            prompt_eval_cached_count=cached,
            prompt_eval_duration_ns=round(prefill_s * 1e9),
            eval_count=task.eval[1],
            eval_duration_ns=round(decode_s * 1e9),
            total_duration_ns=round(access.latency_s * 1e9) if access is not None else None,
        ),
        thinking_chunks=None,
        seen_from=SeenFrom.RUNNER,
        runner_port=task.port,
        runner_task_id=task.task_id,
        runner_source="log",
        ends_bound_s=end_bound_s,
        prefill_bound_s=LOG_TIMING_BOUND_S,
        decode_bound_s=LOG_TIMING_BOUND_S,
        output_tokens_bound=0,
    )


def read_lines(f: BinaryIO, counts: HistoryCounts, progress: Callable[[int], None] | None = None) -> Iterator[str]:
    """The lines of a log file, read ``READ_CHUNK_BYTES`` at a time (flat memory); ``progress(bytes read)``
    after each chunk. A line longer than ``MAX_LINE_BYTES`` is skipped whole, counted."""
    partial = b""
    skipping = False
    done = 0
    while chunk := f.read(READ_CHUNK_BYTES):
        done += len(chunk)
        parts = (partial + chunk).split(b"\n")
        partial = parts.pop()
        for raw in parts:
            if skipping:  # the end of an over-long line
                skipping = False
                continue
            if len(raw) > MAX_LINE_BYTES:
                counts.long_lines += 1
                continue
            yield raw.decode("utf-8", "replace").rstrip("\r")
        if len(partial) > MAX_LINE_BYTES:
            counts.long_lines += 1
            partial, skipping = b"", True
        if progress is not None:
            progress(done)
    if partial and not skipping:
        yield partial.decode("utf-8", "replace").rstrip("\r")
