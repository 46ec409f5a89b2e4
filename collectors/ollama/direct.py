"""Generations clients send Ollama directly, recorded from its runner: a runner task no proxied request claims.

``RunnerReader`` reads each runner's ``/slots`` and Ollama's log; it hands both to ``DirectTasks``, which keeps
one ``_Task`` per (runner pid, task id) and turns each unclaimed one into a ``RequestRecord`` with
``seen_from = runner`` ("direct"): model, start and end, outcome, prompt and cached tokens, prefill time, decode
tokens and time, and the load just before it.

Where the figures come from, best first:

* **the log** (``runner_source = "log"``): the runner's own timings, ``prompt eval time = X ms / N tokens``
  (N computed, the cached part not), ``eval time = Y ms / M tokens``, with ``task.n_tokens`` of its ``new
  prompt`` line (the whole prompt): exact, as Ollama's own API reports them (bounds: the 0.01 ms they are
  printed to). The end is when the ``slot release`` line was read (or the poll that saw the slot let go).
* **/slots readings** (``runner_source = "slots"``): the prompt's size is exact once decoding began
  (processed + cached); the start, the first token and the end each lie between two polls, so the prefill
  and decode times are kept with the half-widths of those intervals as their bounds; the output count is
  exact when the slot is read again after its release (its context then holds prompt + output − 1), else
  extrapolated from the decode rate, with its bound.

A task that ran wholly between two polls shows as a step of the slot's ``id_task`` (/slots counts its polls
as tasks too, so only a slot's own change means a generation): it is still recorded, filled from the log
where there is one, else with its counts unknown.

Never twice: a task claimed by a proxied request (``RunnerReader._join``) is the proxy's. Every ended task
waits ``GRACE_S`` for the proxy to finish its requests; then one that the log timed is matched to a finished
proxied request by its exact figures (the same numbers Ollama put in that reply), which also corrects a live
claim that paired the wrong two; one without log figures, by model, time and prompt size. Only what no proxied
request accounts for is written as direct. Route, status and client come from Ollama's access line only when
exactly one generation access line and one ended task fit each other; otherwise they stay unknown (None).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from analysis.model_names import same_model
from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.log import AccessLine, LogEvent
from collectors.ollama.slots import SlotReading

GRACE_S = 2.0  # after a task ends: time for the proxy to finish the request it may belong to
LOG_WAIT_S = 3.0  # after /slots saw a task end, while the log is readable: time for its timing lines to be read
CLAIM_WAIT_MAX_S = 120.0  # a task claimed by a proxied request still running this long after it ended: the proxy's
FINISHED_KEPT_S = 120.0  # finished proxied requests kept to match ended tasks against...
MAX_FINISHED = 4096  # ...at most this many (a flood of proxied requests keeps the latest)
MAX_TASKS = 4096  # tasks tracked at once (per collector); past it the oldest ended ones are decided first
MAX_LOG_ONLY = 256  # log lines of tasks no runner has shown yet, kept while they wait for one
LOG_TIMING_BOUND_S = 5e-6  # the runner prints its timings to 0.01 ms
ACCESS_SLACK_S = 1.5  # an access line's second and a task's end: how far apart they may be and still fit
# A task starting within this of a load's end on its runner (a log read or a poll later) is the one that waited for
# it; a load for an empty prompt (a client's preload) runs no task, and the next task is not its.
LOAD_FOLLOWS_S = 1.0
GENERATION_PATHS = frozenset({"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"})
DURATION_MATCH_NS = 20_000  # the log's 0.01 ms rounding, twice


@dataclass
class RunnerRef:
    """The runner a task ran on."""

    pid: int
    port: int
    model: str | None


@dataclass
class _Task:
    runner: RunnerRef
    task_id: int
    slot_id: int | None
    first_seen_unix_s: float  # when this collector first knew of it (a poll or a log line)
    # /slots: each moment lies between the last poll that did not see it and the first that did
    start: tuple[float, float] | None = None
    decode_start: tuple[float, float] | None = None
    end: tuple[float, float] | None = None
    last_prefill_s: float | None = None  # the last poll that saw it reading its prompt
    prompt_tokens: int | None = None  # exact (processed + cached, once decoding began)
    cached_tokens: int | None = None
    decoded: list[tuple[float, int]] = field(default_factory=list)  # (poll time, tokens decoded): first and last
    output_exact: int | None = None  # from the slot's context after its release
    seen_processing: bool = False
    # the log
    log_prompt_total: int | None = None  # task.n_tokens
    log_prompt_eval: tuple[float, int] | None = None  # (ms, tokens computed)
    log_eval: tuple[float, int] | None = None  # (ms, tokens)
    log_release_unix_s: float | None = None
    load_s: float | None = None
    # deciding
    claimed_by: str | None = None  # a proxied request's id, from the live join
    emitted: bool = False  # an in-flight direct row was written
    unclaimed_polls: int = 0
    access: AccessLine | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.runner.pid, self.task_id)

    @property
    def ended_unix_s(self) -> float | None:
        ends = [t for t in (self.end[1] if self.end else None, self.log_release_unix_s) if t is not None]
        return min(ends) if ends else None

    @property
    def log_done(self) -> bool:
        return self.log_prompt_eval is not None and self.log_eval is not None and self.log_release_unix_s is not None

    @property
    def id(self) -> str:
        return f"direct-{self.runner.port}-{self.runner.pid}-{self.task_id}-{int(self.first_seen_unix_s)}"


def _mid(interval: tuple[float, float]) -> float:
    return (interval[0] + interval[1]) / 2


def _half(interval: tuple[float, float]) -> float:
    return (interval[1] - interval[0]) / 2


class DirectTasks:
    """Runner tasks → direct request records (module doc). Fed by ``RunnerReader``; ``drain()`` gives what to write."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        grace_s: float = GRACE_S,
        log_wait_s: float = LOG_WAIT_S,
        log_read_bound_s: float = 0.25,
    ) -> None:
        self._clock = clock
        self._mono_ns = mono_ns
        self.grace_s = grace_s
        self.log_wait_s = log_wait_s
        self.log_read_bound_s = log_read_bound_s  # how late a log line is stamped: the reader's pace
        self.log_readable = False  # the reader says whether Ollama's log is being read now
        self._tasks: dict[tuple[int, int], _Task] = {}
        self._last_task: dict[tuple[int, int], int | None] = {}  # (pid, slot) → the id_task it showed last
        self._last_poll: dict[int, float] = {}  # pid → time of its last /slots reading
        self._finished: deque[tuple[float, RequestRecord]] = deque()  # proxied, (end wall time, record)
        self._owned: set[str] = set()  # proxied request ids already matched to a task
        self._log_only: dict[int, list[LogEvent]] = {}  # task id → its lines, while no runner has shown it
        self._access: deque[AccessLine] = deque(maxlen=1024)
        self._loads: dict[int, tuple[float, float]] = {}  # port → (load finished wall time, load seconds)
        self._starting_port: int | None = None
        self.newest_port: int | None = None  # of the runner Ollama started last (its log's "starting llama-server")
        self._decided_ends: deque[float] = deque(maxlen=1024)  # ends of the tasks decided lately (access-line rivals)
        self._out: list[RequestRecord] = []
        self._retracted: list[str] = []
        self.recorded = 0  # direct records written (finished)
        self.matched_proxied = 0  # ended tasks found to be a proxied request's

    # -- what the reader feeds -------------------------------------------------------------------

    def claimed(self, runner: RunnerRef, task_id: int, request_id: str) -> None:
        """The live join paired this task with a proxied request."""
        task = self._tasks.get((runner.pid, task_id))
        if task is not None:
            task.claimed_by = request_id
            if task.emitted:  # written as direct before the proxy's request showed up: take it back
                task.emitted = False
                self._retracted.append(task.id)

    def proxied_finished(self, rec: RequestRecord) -> None:
        """A proxied request finished: it may account for a task that ended unclaimed."""
        end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
        end = rec.wall_s(end_ns) if end_ns is not None else self._clock()
        if len(self._finished) >= MAX_FINISHED:
            self._owned.discard(self._finished.popleft()[1].id)
        # Kept slim: its stamps, model and figures are what a match needs, not its tokens or text.
        self._finished.append((end, replace(rec, token_chunk_ns=[], prompt_text=None, response_text=None, error=None)))

    def slots_read(
        self, runner: RunnerRef, readings: Iterable[SlotReading], ts: float, claims: Mapping[int, str]
    ) -> list[tuple[str, SlotReading]]:
        """One /slots reading of a runner; returns the (direct request id, reading) pairs to keep as progress rows."""
        prev = self._last_poll.get(runner.pid)
        self._last_poll[runner.pid] = ts
        progress: list[tuple[str, SlotReading]] = []
        for slot in readings:
            key = (runner.pid, slot.slot_id)
            before = self._last_task.get(key, -1)
            self._last_task[key] = slot.task_id
            if slot.task_id is None:
                continue
            if before != slot.task_id and before not in (-1, None):
                self._ended_unseen_after(runner, before, ts, prev)
            task = self._tasks.get((runner.pid, slot.task_id))
            if not slot.is_processing and (task is None or not task.seen_processing):
                if before not in (-1, slot.task_id) and prev is not None:
                    # a task that ran wholly between two polls: the slot shows its id and final context only
                    task = task or self._new(runner, slot.task_id, slot.slot_id, ts)
                    task.runner.model = task.runner.model or runner.model
                    task.start = task.start or (prev, ts)
                    task.end = task.end or (prev, ts)
                    if slot.task_id in claims:
                        self.claimed(runner, slot.task_id, claims[slot.task_id])
                continue
            if task is None:
                task = self._new(runner, slot.task_id, slot.slot_id, ts)
            if slot.task_id in claims and task.claimed_by is None:
                self.claimed(runner, slot.task_id, claims[slot.task_id])
            task.runner.model = task.runner.model or runner.model
            self._read_slot(task, slot, ts, prev)
            if slot.is_processing and task.claimed_by is None:
                task.unclaimed_polls += 1
                if task.unclaimed_polls >= 2 or task.emitted:  # a proxied request arriving meanwhile had a poll to claim it
                    task.emitted = True
                    self._out.append(self._record(task))
                    progress.append((task.id, slot))
        return progress

    def runner_gone(self, pid: int) -> None:
        """A runner is no more (unloaded, killed): its running tasks ended between its last reading and now."""
        last = self._last_poll.pop(pid, None)
        now = self._clock()
        for task in self._tasks.values():
            if task.runner.pid == pid and task.ended_unix_s is None:
                task.end = (last if last is not None else task.first_seen_unix_s, now)
        self._last_task = {k: v for k, v in self._last_task.items() if k[0] != pid}

    def log_events(self, events: Iterable[LogEvent], runner_of: Callable[[int], RunnerRef | None]) -> None:
        """Ollama's log lines, in order. ``runner_of(task id)`` names the runner a task id belongs to, or None
        while that is not known (several runners, none showing it yet)."""
        for event in events:
            if event.kind == "access" and event.access is not None:
                if event.access.method == "POST" and event.access.path in GENERATION_PATHS:
                    self._access.append(event.access)
                continue
            if event.kind == "runner_start":
                self._starting_port = self.newest_port = event.port
                continue
            if event.kind == "runner_started":
                if self._starting_port is not None and event.duration_ms is not None:
                    self._loads[self._starting_port] = (event.read_unix_s, event.duration_ms / 1000)
                self._starting_port = None
                continue
            if event.task_id is None or event.kind not in ("launch", "new_prompt", "prompt_eval", "eval", "release"):
                continue
            runner = runner_of(event.task_id)
            if runner is None:
                if len(self._log_only) < MAX_LOG_ONLY or event.task_id in self._log_only:
                    self._log_only.setdefault(event.task_id, []).append(event)
                continue
            self._apply_log(runner, event)

    def adopt_log_only(self, runner_of: Callable[[int], RunnerRef | None]) -> None:
        """Lines kept for tasks no runner had shown: apply them once one does."""
        for task_id in list(self._log_only):
            runner = runner_of(task_id)
            if runner is not None:
                for event in self._log_only.pop(task_id):
                    self._apply_log(runner, event)

    def active_ids(self) -> set[str]:
        """Ids of the direct records written as in flight and not decided yet."""
        return {t.id for t in self._tasks.values() if t.emitted}

    def unclaimed(self, task_id: int) -> bool:
        """A task of that id is tracked and no proxied request claimed it (its log lines are not a proxied one's)."""
        return any(tid == task_id and t.claimed_by is None for (_, tid), t in self._tasks.items())

    def record_id(self, task_id: int) -> str | None:
        """The direct record id of the one unclaimed task with this id (None: none, or several runners have one)."""
        ids = {t.id for (_, tid), t in self._tasks.items() if tid == task_id and t.claimed_by is None}
        return ids.pop() if len(ids) == 1 else None

    def known_runner_of(self, task_id: int) -> RunnerRef | None:
        """The runner whose slots showed this task id, when exactly one did."""
        found = {t.runner.pid: t.runner for (pid, tid), t in self._tasks.items() if tid == task_id}
        return next(iter(found.values())) if len(found) == 1 else None

    # -- deciding and writing ------------------------------------------------------------------

    def step(self) -> None:
        """Decide the ended tasks whose wait is over: proxied (dropped) or direct (written as finished)."""
        now = self._clock()
        while self._finished and self._finished[0][0] < now - FINISHED_KEPT_S:
            _, rec = self._finished.popleft()
            self._owned.discard(rec.id)
        due = sorted((t for t in self._tasks.values() if self._due(t, now)), key=lambda t: t.ended_unix_s or 0.0)
        if len(self._tasks) > MAX_TASKS:
            ended = sorted((t for t in self._tasks.values() if t.ended_unix_s is not None), key=lambda t: t.ended_unix_s or 0.0)
            due += [t for t in ended[: len(self._tasks) - MAX_TASKS] if t not in due]
        for task in due:
            del self._tasks[task.key]
            if (ended_s := task.ended_unix_s) is not None:
                self._decided_ends.append(ended_s)
            owner = self._proxied_owner(task, now)
            if owner is not None:
                self.matched_proxied += 1
                self._owned.add(owner)
                if task.emitted:
                    self._retracted.append(task.id)
                continue
            self._fit_access(task)
            self._out.append(self._record(task, final=True))
            self.recorded += 1

    def drain(self) -> tuple[list[RequestRecord], list[str]]:
        """(records to write, in order: in-flight updates and finished ones; ids of direct rows to delete)."""
        out, self._out = self._out, []
        gone, self._retracted = self._retracted, []
        return out, gone

    # -- inside ----------------------------------------------------------------------------------

    def _new(self, runner: RunnerRef, task_id: int, slot_id: int | None, ts: float) -> _Task:
        task = self._tasks[(runner.pid, task_id)] = _Task(RunnerRef(runner.pid, runner.port, runner.model), task_id, slot_id, ts)
        load = self._loads.get(runner.port)
        if load is not None and 0 <= ts - load[0] <= LOAD_FOLLOWS_S:
            task.load_s = load[1]
            del self._loads[runner.port]
        return task

    def _ended_unseen_after(self, runner: RunnerRef, task_id: int | None, ts: float, prev: float | None) -> None:
        """The slot moved on from ``task_id``: if it was still running at the last poll, it ended since."""
        task = self._tasks.get((runner.pid, task_id)) if task_id is not None else None
        if task is not None and task.end is None and task.seen_processing and prev is not None:
            task.end = (prev, ts)

    def _read_slot(self, task: _Task, slot: SlotReading, ts: float, prev: float | None) -> None:
        if slot.is_processing:
            if not task.seen_processing:
                task.seen_processing = True
                task.start = (prev if prev is not None else ts, ts)
            if slot.decoding:
                if task.decode_start is None:
                    since = task.last_prefill_s if task.last_prefill_s is not None else task.start[0] if task.start else ts
                    task.decode_start = (since, ts)
                if slot.prompt_size_tokens is not None:
                    task.prompt_tokens = max(task.prompt_tokens or 0, slot.prompt_size_tokens)
                    task.cached_tokens = slot.cached_tokens
                if slot.decoded_tokens is not None:
                    point = (ts, slot.decoded_tokens)
                    task.decoded = [task.decoded[0], point] if task.decoded else [point]
            else:
                task.last_prefill_s = ts
            task.end = None
        elif task.seen_processing and task.end is None:
            task.end = (prev if prev is not None else ts, ts)
            if slot.ctx_tokens is not None and task.prompt_tokens is not None and slot.ctx_tokens >= task.prompt_tokens:
                task.output_exact = slot.ctx_tokens - task.prompt_tokens + 1  # the last token is not put in the context

    def _apply_log(self, runner: RunnerRef, event: LogEvent) -> None:
        assert event.task_id is not None
        task = self._tasks.get((runner.pid, event.task_id))
        if task is None:
            if event.kind not in ("launch", "new_prompt"):
                return  # lines of a task before this collector began: its start is not known
            task = self._new(runner, event.task_id, event.slot_id, event.read_unix_s)
        if event.kind == "new_prompt":
            task.log_prompt_total = event.tokens
        elif event.kind == "prompt_eval" and event.duration_ms is not None:
            task.log_prompt_eval = (event.duration_ms, event.tokens)
        elif event.kind == "eval" and event.duration_ms is not None:
            task.log_eval = (event.duration_ms, event.tokens)
        elif event.kind == "release":
            task.log_release_unix_s = event.read_unix_s

    def _due(self, task: _Task, now: float) -> bool:
        ended = task.ended_unix_s
        if ended is None:
            return False
        if task.log_done:
            wait = self.grace_s
        elif self.log_readable:
            wait = max(self.grace_s, self.log_wait_s)
        else:
            wait = self.grace_s
        if task.claimed_by is not None and not any(rec.id == task.claimed_by for _, rec in self._finished):
            wait = max(wait, CLAIM_WAIT_MAX_S)  # its request is still running: decide once it has finished
        return now >= ended + wait

    def _proxied_owner(self, task: _Task, now: float) -> str | None:
        """The proxied request this ended task was, or None: it was a direct one."""
        model = task.runner.model
        finished = [rec for _, rec in self._finished if rec.id not in self._owned]
        if task.log_done:
            for rec in finished:
                if model is not None and same_model(rec.model, model) and self._same_figures(task, rec):
                    return rec.id
            if task.claimed_by is not None:
                claimer = next((rec for rec in finished if rec.id == task.claimed_by), None)
                if claimer is None or not self._has_durations(claimer):
                    return task.claimed_by  # still running, or a /v1 reply without durations: trust the live join
            return None
        if task.claimed_by is not None:
            return task.claimed_by
        start = task.start[0] if task.start else task.first_seen_unix_s
        end = task.end[1] if task.end else (task.ended_unix_s or now)
        for rec in finished:
            if model is None or not same_model(rec.model, model) or not self._has_no_task(rec):
                continue
            rec_end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
            rec_end = rec.wall_s(rec_end_ns) if rec_end_ns is not None else now
            if rec.started_at_unix_s > end + 0.5 or rec_end < start - 0.5:
                continue  # not at the same time
            counted = rec.metrics.prompt_eval_count if rec.metrics is not None else None
            if task.prompt_tokens is not None and counted is not None and counted != task.prompt_tokens:
                continue  # another prompt
            return rec.id
        return None

    def _has_no_task(self, rec: RequestRecord) -> bool:
        return not any(t.claimed_by == rec.id for t in self._tasks.values())

    @staticmethod
    def _has_durations(rec: RequestRecord) -> bool:
        return rec.metrics is not None and rec.metrics.prompt_eval_duration_ns is not None

    @staticmethod
    def _same_figures(task: _Task, rec: RequestRecord) -> bool:
        m = rec.metrics
        if m is None or task.log_prompt_eval is None or task.log_eval is None:
            return False
        computed = task.log_prompt_eval[1]
        total = task.log_prompt_total if task.log_prompt_total is not None else computed
        if m.prompt_eval_count != total or m.eval_count is None or abs(m.eval_count - task.log_eval[1]) > 1:
            return False
        if m.prompt_eval_duration_ns is None or m.eval_duration_ns is None:
            return True  # a /v1 reply: its counts are all it has
        return (
            abs(m.prompt_eval_duration_ns - task.log_prompt_eval[0] * 1e6) <= DURATION_MATCH_NS
            and abs(m.eval_duration_ns - task.log_eval[0] * 1e6) <= DURATION_MATCH_NS
        )

    def _fit_access(self, task: _Task) -> None:
        """The access line of this task, only when exactly one fits it and it fits no other ended task."""
        end = task.ended_unix_s
        if end is None:
            return
        fits = [a for a in self._access if a.ended_unix_s - ACCESS_SLACK_S <= end <= a.ended_unix_s + 1 + ACCESS_SLACK_S]
        if len(fits) != 1:
            return
        line = fits[0]
        lo, hi = line.ended_unix_s - ACCESS_SLACK_S, line.ended_unix_s + 1 + ACCESS_SLACK_S
        ends = [t.ended_unix_s for t in self._tasks.values()] + [e for e, _ in self._finished] + list(self._decided_ends)
        if sum(1 for e in ends if e is not None and lo <= e <= hi) > 1:  # this task's own end is among the decided
            return  # another generation ended then too: which line is whose is not known
        task.access = line
        self._access.remove(line)

    def _record(self, task: _Task, *, final: bool = False) -> RequestRecord:
        """The task as a request record (in flight until ``final``)."""
        now = self._clock()
        exact = task.log_done
        prompt = task.log_prompt_total if exact else task.prompt_tokens
        cached: int | None
        if exact:
            assert task.log_prompt_eval is not None and task.log_eval is not None
            prefill_s: float | None = task.log_prompt_eval[0] / 1000
            decode_s: float | None = task.log_eval[0] / 1000
            output: int | None = task.log_eval[1]
            computed = task.log_prompt_eval[1]
            if prompt is None:
                prompt, cached = computed, None
            else:
                cached = prompt - computed if prompt >= computed else None
            end = task.log_release_unix_s if task.end is None else min(_mid(task.end), task.log_release_unix_s or _mid(task.end))
            ends_bound = _half(task.end) if task.end is not None else self.log_read_bound_s
            assert end is not None and prefill_s is not None and decode_s is not None
            start = end - prefill_s - decode_s
            decode_start: float | None = end - decode_s
            prefill_bound: float | None = LOG_TIMING_BOUND_S
            decode_bound: float | None = LOG_TIMING_BOUND_S
            output_bound: int | None = 0
        else:
            cached = task.cached_tokens
            start = _mid(task.start) if task.start else task.first_seen_unix_s
            start_bound = _half(task.start) if task.start else 0.0
            decode_start = _mid(task.decode_start) if task.decode_start else None
            ds_bound = _half(task.decode_start) if task.decode_start else 0.0
            end = _mid(task.end) if task.end else task.log_release_unix_s
            ends_bound = max(start_bound, _half(task.end) if task.end else self.log_read_bound_s)
            prefill_s = decode_start - start if decode_start is not None else None
            prefill_bound = start_bound + ds_bound if prefill_s is not None else None
            decode_s = (end - decode_start) if end is not None and decode_start is not None else None
            decode_bound = ds_bound + (_half(task.end) if task.end else 0.0) if decode_s is not None else None
            output, output_bound = self._slots_output(task, end)
        if not final:
            end = None
        metrics = None
        if final and (prompt is not None or output is not None):
            metrics = FinalMetrics(
                load_duration_ns=round(task.load_s * 1e9) if task.load_s is not None else None,
                prompt_eval_count=prompt,
                prompt_eval_cached_count=cached,
                prompt_eval_duration_ns=round(prefill_s * 1e9) if prefill_s is not None else None,
                eval_count=output,
                eval_duration_ns=round(decode_s * 1e9) if decode_s is not None and decode_s >= 0 else None,
                total_duration_ns=round(task.access.latency_s * 1e9) if task.access is not None else None,
            )
        load_s = task.load_s or 0.0
        received_ns = self._to_mono(start - load_s, now)
        access = task.access
        outcome = Outcome.IN_FLIGHT
        if final:
            outcome = Outcome.OK
            if access is not None and access.status >= 400:
                outcome = Outcome.CANCELLED if access.status == 499 else Outcome.HTTP_ERROR
        return RequestRecord(
            id=task.id,
            started_at_unix_s=start - load_s,
            client_addr=access.client if access is not None else None,
            endpoint=access.path if access is not None else None,
            model=task.runner.model or "",
            stream=None,
            kind=RequestKind.GENERATE,
            received_ns=received_ns,
            forwarded_ns=received_ns,
            first_token_ns=self._to_mono(decode_start, now) if decode_start is not None else None,
            final_chunk_ns=self._to_mono(end, now) if end is not None else None,
            status_code=access.status if access is not None else None,
            outcome=outcome,
            metrics=metrics,
            thinking_chunks=None,
            seen_from=SeenFrom.RUNNER,
            runner_port=task.runner.port,
            runner_task_id=task.task_id,
            runner_source="log" if exact else "slots",
            ends_bound_s=ends_bound,
            prefill_bound_s=prefill_bound,
            decode_bound_s=decode_bound,
            output_tokens_bound=output_bound,
        )

    @staticmethod
    def _slots_output(task: _Task, end: float | None) -> tuple[int | None, int | None]:
        """Output tokens from /slots: exact from the released context, else the last count and the rate after it."""
        if task.output_exact is not None:
            return task.output_exact, 0
        if not task.decoded:
            return None, None
        (t0, n0), (t1, n1) = task.decoded[0], task.decoded[-1]
        if end is None or t1 <= t0:
            return n1, None  # the rate is not known: at least n1
        rate = (n1 - n0) / (t1 - t0)
        extra = rate * max(0.0, end - t1)
        bound = rate * (_half(task.end) if task.end else 0.0) + 1
        return n1 + round(extra), round(bound + 0.5)

    def _to_mono(self, wall_s: float, now_wall_s: float) -> int:
        return self._mono_ns() - round((now_wall_s - wall_s) * 1e9)
