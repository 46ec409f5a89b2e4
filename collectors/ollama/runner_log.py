"""Reading Ollama's log for ``RunnerReader`` (``collectors.ollama.runners``): progress and timing lines joined to
the request /slots showed their task for, the MLX runner's lines, and whether the runner's per-request lines reach
the log at all. Anyone can make the runner print text into this log: a line counts only where /slots confirms it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from analysis.records import ProgressSample, ProgressSource, RequestRecord, SeenFrom
from collectors.ollama.direct import GENERATION_PATHS
from collectors.ollama.discovery import MLX_RUNNER
from collectors.ollama.log import EventKind, LogEvent, LogSource
from collectors.ollama.runner_join import RunnerJoin
from collectors.ollama.runner_loads import RunnerLoads

log = logging.getLogger("collectors.ollama.runners")  # the reader's one logger, whichever of its parts speaks

# The runner's per-task lines (a task's start, prompt, progress, timings, end): any one shows they reach the log.
RUNNER_TASK_KINDS = frozenset(
    {
        EventKind.LAUNCH,
        EventKind.NEW_PROMPT,
        EventKind.PROGRESS,
        EventKind.DONE,
        EventKind.PROMPT_EVAL,
        EventKind.EVAL,
        EventKind.TOTAL,
        EventKind.RELEASE,
    }
)
LINES_LOST_AFTER = 2  # generations ended in the log, a llama-server runner serving, none of its lines: they are lost
RUNNER_LINES_MISSING = (
    "generations end in it but the runner's per-request lines (prompt and timing) never come: this Ollama writes "
    "them only with debug logging. Start Ollama with `OLLAMA_DEBUG=1` to get them back (with systemd: "
    '`sudo systemctl edit ollama`, add `Environment="OLLAMA_DEBUG=1"` under [Service], then '
    "`sudo systemctl restart ollama`); meanwhile Phasewatch records from the runner's /slots (progress and token "
    "counts, no exact timings)"
)


class RunnerLog(RunnerJoin, RunnerLoads):
    """Ollama's log, read in a worker thread and joined on the loop."""

    def _mlx_runners_seen(self) -> None:
        self.mlx.runners_seen(s.runner for pid, s in self.runners.items() if pid in self._mlx_answered)

    def _take_mlx_lines(self, events: list[LogEvent], requests: list[RequestRecord]) -> None:
        """The MLX runner's lines: its generations (records, once each) and, while one reads its prompt, progress."""
        lines = [e.mlx for e in events if e.mlx is not None]
        if not lines:
            return
        self._mlx_runners_seen()
        proxied = [r.model for r in requests if r.seen_from is not SeenFrom.RUNNER]
        finished = self.mlx.feed(lines, proxied)
        running = self.mlx.in_flight()
        if running is not None:
            self._mlx_out.append(running)
        self._mlx_out += finished
        if (sample := self.mlx.progress()) is not None:
            self._queue.append(sample)

    def _read_log(self, requests: list[RequestRecord]) -> None:
        """Read the log and join its events now, on the caller's thread (tests; the loop uses the one below)."""
        assert self._log is not None
        target = self._waits_target()
        events = self._log.read(self._clock())
        self._take_log(self._log, events, requests, self._fold_waits(events, *target))

    def _read_log_if_written(self) -> None:
        """Start a read of the log unless one runs; a file is read only once written since (a quiet log costs one
        stat here, not a worker thread's round trip every step)."""
        source = self._log
        if source is None or self._log_read is not None:
            return
        if source.unchanged():  # through FitTap too, as the service wires it (it was read every step before)
            return
        self._log_read = asyncio.ensure_future(self._read_log_in_thread(source))

    async def _read_log_in_thread(self, source: LogSource) -> None:
        """Read and parse the log, and fold the runner's waits, in a worker thread, off the loop that relays every
        proxied request (a flood of lines, up to a read's cap, costs that thread's time, not the clients'); then join
        its events here, on the loop. One read at a time; the lines are stamped with the time the read began."""
        try:
            target = self._waits_target()  # read on the loop: the runners as discovery last found them

            def read_and_fold() -> tuple[list[LogEvent], list[tuple[int | None, int, float]]]:
                events = source.read(self._clock())
                return events, self._fold_waits(events, *target)

            began_s = time.monotonic()
            events, changed = await asyncio.to_thread(read_and_fold)
            self._check_notices(source, began_s, events)
            self._take_log(source, events, list(self._in_flight()), changed)
        except Exception:
            self.errors += 1
            log.exception("reading Ollama's log failed")
        finally:
            self._log_read = None

    def _check_notices(self, source: LogSource, began_s: float, events: list[LogEvent]) -> None:
        """Lines read count as activity (the reader keeps the busy pace a while); with a change watch, lines read
        after a read that reached the log's end must have been told of (else the watch is dropped)."""
        if events:
            self._active_s = time.monotonic()
        notices = self.log_notices
        if self._log_read_to_end_s is not None:
            notices.check_read(self._log_read_to_end_s, bool(events))
        self._log_read_to_end_s = began_s if notices.working and source.unchanged() else None

    def _take_log(
        self,
        source: LogSource,
        events: list[LogEvent],
        requests: list[RequestRecord],
        waits_changed: list[tuple[int | None, int, float]],
    ) -> None:
        if source.problem != self._log_problem:  # say it once, in words, when it changes
            self._log_problem = source.problem
            if self._log_problem:
                log.warning("Ollama's log: %s; live progress comes from the runners' /slots alone meanwhile", self._log_problem)
            else:
                log.info("Ollama's log: reading it")
        for port, task_id, read_s in waits_changed:
            self._waits_unjoined[(port, task_id)] = read_s
        self._join_waits()  # these, and a task /slots joined since
        if not events:
            return
        self._watch_runner_lines(events)
        if any(e.kind in (EventKind.RUNNER_START, EventKind.RUNNER_STARTED) for e in events):
            self._look_now = True  # Ollama started a runner: find it now, not at the next round
        self._fold_load_lines(events)
        self._look_at_launches(events)
        self.direct.log_events(events)
        self._take_mlx_lines(events, requests)
        # A progress line is a request's only when /slots showed its task id on the one runner, joined to that
        # request (or to a direct task), and its count fits that slot's context: anyone can make the runner print
        # text into this log, so a line naming no task, or a task no request holds, is dropped and counted.
        for event in events:
            if event.kind not in (EventKind.PROGRESS, EventKind.DONE, EventKind.PROMPT_EVAL, EventKind.EVAL):
                continue  # a task's start and end, access and load lines: the direct records' (above)
            rid = self._log_request(event)
            if rid is None:
                self.log_lines_dropped += 1
                continue
            self._add_log(rid, event)

    def _look_at_launches(self, events: list[LogEvent]) -> None:
        """A launch line for a task no runner's last reading shows: read the runners now, not at the idle pace. A
        task shorter than a poll interval that a queued one follows at once on its slot is otherwise never shown by
        /slots (its id is passed over), and its lines are dropped as unconfirmed: on one slot at 1 Hz, one of four
        requests sent together was lost so. The line only makes the reader look sooner (at most once a step): what
        it finds is the runner's own answer."""
        shown = {slot.task_id for state in self.runners.values() for slot in state.slots}
        if not any(e.kind == EventKind.LAUNCH and e.task_id not in shown for e in events):
            return
        now = time.monotonic()
        for state in self.runners.values():
            if state.runner.kind != MLX_RUNNER and state.problem is None:
                state.next_poll_s = min(state.next_poll_s, now)

    def _log_request(self, event: LogEvent) -> str | None:
        """The request a progress or timing line is about: the one joined to its task on the one runner whose last
        /slots reading shows that task id (or that task's direct record), when its count fits that slot's context."""
        if event.task_id is None:
            return None
        showing = [(pid, slot) for pid, state in self.runners.items() for slot in state.slots if slot.task_id == event.task_id]
        if len(showing) != 1:
            return None
        pid, slot = showing[0]
        if slot.n_ctx is not None and (event.tokens > slot.n_ctx or (event.prompt_size_tokens or 0) > slot.n_ctx):
            return None  # more than the slot holds: not the runner's count
        rid = self._tasks.get((pid, event.task_id))
        if rid is None and self.direct.unclaimed(event.task_id):
            # A direct client's task: its own record's line (the prompt's size, which /slots does not tell while
            # the prompt is read).
            rid = self.direct.record_id(event.task_id)
        return rid

    def _watch_runner_lines(self, events: list[LogEvent]) -> None:
        """Notice when the log is read, generations end in it, and a llama-server runner serves them, yet none of
        its per-request lines come (nor when they come back); say each change once in the collector's log."""
        for event in events:
            if event.kind in RUNNER_TASK_KINDS:
                self._generations_without_runner_lines = 0
                if self.runner_lines_missing is not None:
                    self.runner_lines_missing = None
                    log.info("Ollama's log: the runner's per-request lines are back")
            elif (
                event.kind == EventKind.ACCESS
                and event.access is not None
                and event.access.status == 200
                and event.access.method == "POST"
                and event.access.path in GENERATION_PATHS
            ):
                self._generations_without_runner_lines += 1
        serves = any(state.runner.kind == "llama-server" for state in self.runners.values())
        if self.runner_lines_missing is None and serves and self._generations_without_runner_lines >= LINES_LOST_AFTER:
            self.runner_lines_missing = RUNNER_LINES_MISSING
            log.warning("Ollama's log: %s", RUNNER_LINES_MISSING)

    def _add_log(self, rid: str, event: LogEvent) -> None:
        track = self._track(rid)
        size = event.prompt_size_tokens
        if size is not None and track.prompt_tokens is None:
            self._sized(track, size, exact=False)  # a slots reading after decoding began replaces it with the exact size
        if event.kind in (EventKind.PROGRESS, EventKind.DONE, EventKind.PROMPT_EVAL):
            self._queue.append(
                ProgressSample(
                    rid,
                    event.read_unix_s,
                    ProgressSource.LOG,
                    event.tokens,
                    prompt_tokens=event.tokens if event.kind == EventKind.DONE else track.prompt_tokens,
                )
            )
        elif event.kind == EventKind.EVAL:
            self._queue.append(
                ProgressSample(
                    rid, event.read_unix_s, ProgressSource.LOG, 0, prompt_tokens=track.prompt_tokens, decoded_tokens=event.tokens
                )
            )

    def log_dropped(self) -> dict[str, int]:
        """Log lines not believed, by why: the direct records' (``DirectTasks.dropped``) and the progress rows'."""
        return {
            **self.direct.dropped,
            "progress": self.log_lines_dropped,
            "wait": self.wait_lines_dropped,
            "placement": self.load_lines_dropped,
        }

    @property
    def log_unknown_lines(self) -> int:
        return self._log.unknown_lines if self._log is not None else 0
