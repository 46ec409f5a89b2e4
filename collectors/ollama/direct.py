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

Never twice: a task claimed by a proxied request (``RunnerReader._join``) is the proxy's. The live claim pairs
the oldest request with the oldest new task (start order: a tie-break only); when the request finishes, its
prompt size, the runner's own count in its reply, must agree with the task's (/slots or the log): a claim whose
size disagrees is taken back and the task of that size, if exactly one fits, claimed instead. Every ended task
waits ``GRACE_S`` for the proxy to finish its requests; then one that the log timed is matched to a finished
proxied request by its exact figures (the same numbers Ollama put in that reply); one without log figures, by
model, time and prompt size. Only what no proxied request accounts for is written as direct.

Believed only in the runner's own words (anyone who can send the runner a request can make it print text
into Ollama's log): a task's log lines wait, by task id, until /slots shows that task on exactly one runner
(``PENDING_TTL_S``; never shown: dropped); its figures count only when they agree with /slots (the prompt's
size, the output count, the slot's context at release, the time between the polls around it), else the
record keeps its /slots figures; a load line counts only for a runner found on its port, and no longer than
the time between its two lines. What is not confirmed is dropped and counted (``dropped``), never recorded.
Route, status and client come from Ollama's access line only when its end second, latency and status fit this
task (``access_fit``: a task the runner ran to its end is not a 5xx line's) and, after every other generation
took the one line that fits it alone, no other: the client is then marked unverified (``client_unverified``: the
line is Ollama's text, not a socket this collector saw). An error line no generation owns is a direct request
that failed before a runner took it: recorded from the line alone (``access_failures``).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from analysis.model_names import same_model
from analysis.records import AGENT_ENDPOINTS, EMBED_ENDPOINTS, FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.access_failures import FAILED_WAIT_S, FailureBudget, failed_record, is_failure
from collectors.ollama.access_fit import ACCESS_SLACK_S, ANSWER_LAG_S, Claimant, fits_line
from collectors.ollama.embed_calls import EmbedCalls, EmbedInput, input_tokens
from collectors.ollama.log import AccessLine, LogEvent
from collectors.ollama.slots import SlotReading

GRACE_S = 2.0  # after a task ends: time for the proxy to finish the request it may belong to
LOG_WAIT_S = 3.0  # after /slots saw a task end, while the log is readable: time for its timing lines to be read
CLAIM_WAIT_MAX_S = 120.0  # a task claimed by a proxied request still running this long after it ended: the proxy's
FINISHED_KEPT_S = 120.0  # finished proxied requests kept to match ended tasks against...
MAX_FINISHED = 4096  # ...at most this many (a flood of proxied requests keeps the latest)
MAX_TASKS = 4096  # tasks tracked at once (per collector); past it the oldest ended ones are decided first
# A task's log lines wait, by task id, this long for /slots to show that task (it polls each runner once a second
# at least): the runner's own lines come within a poll of what they tell, so a minute is generous, and lines no
# runner ever shows are dropped then, counted.
PENDING_TTL_S = 60.0
MAX_PENDING_TASKS = 256  # task ids whose lines wait at once; past it the oldest id's lines are dropped, counted
# Lines kept per task id: the runner prints one launch, new prompt, prompt eval, eval and release line per task;
# more are someone else's text (a forged line can only make the task's log figures ambiguous, never pick them), and
# past this many the rest are dropped, counted.
MAX_LINES_PER_TASK = 16
# Contexts kept per task from the polls that saw it read its prompt: one per batch it was seen in (a 2,048-token
# batch: 64 of them is a 131,072-token prompt); past it the rest are not kept, so only those kept can confirm.
MAX_PREFILL_CTX_KEPT = 64
MAX_PENDING_LOADS = 8  # loads (a "started in" line after its "starting llama-server") waiting for a task on their port
LOAD_KEPT_S = 60.0  # ...this long at most
LOAD_SLACK_S = 1.0  # a load's stated seconds may pass the time between its two lines by this (each read within a tick)
LOG_TIMING_BOUND_S = 5e-6  # the runner prints its timings to 0.01 ms
# A task starting within this of a load's end on its runner (a log read or a poll later) is the one that waited for
# it; a load for an empty prompt (a client's preload) runs no task, and the next task is not its.
LOAD_FOLLOWS_S = 1.0
GENERATION_PATHS = frozenset({"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"} | AGENT_ENDPOINTS)
DURATION_MATCH_NS = 20_000  # the log's 0.01 ms rounding, twice
WINDOW_SLACK_S = 0.5  # the log's durations against the polls around the task: a log read's tick and the rounding
TASK_LINE_KINDS = frozenset({"launch", "new_prompt", "prompt_eval", "eval", "release"})
# Task ids a slot stepped over between two polls (an embed call's inputs run tens of milliseconds each): kept per
# runner and slot, so a task's lines that name that slot and an id in between are its runner's (``_between``).
MAX_STEPS = 64


@dataclass
class RunnerRef:
    """The runner a task ran on."""

    pid: int
    port: int
    model: str | None


@dataclass(frozen=True)
class _LogFigures:
    """One task's figures from its log lines, once /slots agrees with them."""

    prompt_total: int  # task.n_tokens (the computed count when no "new prompt" line was read)
    computed: int  # prompt tokens evaluated (the cached part not)
    has_total: bool
    prefill_ms: float
    output: int
    decode_ms: float
    release_unix_s: float  # when its release line was read
    release_ctx: int  # the slot's context at release: prompt + output - 1


@dataclass
class _Task:
    runner: RunnerRef
    task_id: int
    slot_id: int | None
    first_seen_unix_s: float  # when this collector first knew of it (a poll)
    # /slots: each moment lies between the last poll that did not see it and the first that did
    start: tuple[float, float] | None = None
    start_lo: float | None = None  # the poll before it was first seen, when there was one (its start's lower bound)
    decode_start: tuple[float, float] | None = None
    end: tuple[float, float] | None = None
    first_processing_s: float | None = None  # the first and last polls that saw it running
    last_processing_s: float | None = None
    last_prefill_s: float | None = None  # the last poll that saw it reading its prompt
    prompt_tokens: int | None = None  # exact (processed + cached, once decoding began)
    # The context polls saw while it read its prompt (at most its whole prompt): what confirms its log lines when no
    # poll saw it decode or released (a reply shorter than a poll's interval, the next task in its slot at once).
    prefill_ctx: set[int] = field(default_factory=set)
    cached_tokens: int | None = None
    decoded: list[tuple[float, int]] = field(default_factory=list)  # (poll time, tokens decoded): first and last
    output_exact: int | None = None  # from the slot's context after its release
    final_ctx: int | None = None  # the slot's context after its release (prompt + output - 1)
    seen_processing: bool = False
    gone: bool = False  # its runner went away: no line is its any more
    lines: list[LogEvent] = field(default_factory=list)  # its log lines, as read (at most MAX_LINES_PER_TASK)
    load_s: float | None = None
    between: bool = False  # known only from its slot's step over its id between two polls: an embedding input or nothing
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
        """When /slots saw it end (a log line alone never ends a task: anyone can write one)."""
        return self.end[1] if self.end is not None else None

    @property
    def log_done(self) -> bool:
        """Its prompt eval, eval and release lines were read (whether /slots agrees is decided later)."""
        kinds = {e.kind for e in self.lines}
        return {"prompt_eval", "eval", "release"} <= kinds

    @property
    def id(self) -> str:
        return f"direct-{self.runner.port}-{self.runner.pid}-{self.task_id}-{int(self.first_seen_unix_s)}"


@dataclass
class _Figures:
    """What a record says of its task's times and counts, from the log (exact) or from /slots (bounded)."""

    source: str  # "log" | "slots"
    start: float
    decode_start: float | None
    end: float | None
    ends_bound: float
    prompt: int | None
    cached: int | None
    prefill_s: float | None
    prefill_bound: float | None
    decode_s: float | None
    decode_bound: float | None
    output: int | None
    output_bound: int | None


@dataclass
class _Pending:
    first_read_unix_s: float
    lines: list[LogEvent] = field(default_factory=list)


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
        self._pids_of: dict[int, set[int]] = {}  # task id → pids of the runners whose /slots showed a task of that id
        self._claims: dict[str, tuple[int, int]] = {}  # proxied request id → the task it claims
        self._disowned: deque[tuple[tuple[int, int], str]] = deque(maxlen=256)  # claims found wrong: never again
        self._last_task: dict[tuple[int, int], int | None] = {}  # (pid, slot) → the id_task it showed last
        self._last_poll: dict[int, float] = {}  # pid → time of its last /slots reading
        self._finished: deque[tuple[float, RequestRecord]] = deque()  # proxied, (end wall time, record)
        self._finished_ids: set[str] = set()  # their ids
        self._failure_owners: set[str] = set()  # finished proxied requests that took an error access line
        self._failure_budget = FailureBudget()
        self.recorded_failed = 0  # direct requests recorded from an error access line alone (access_failures)
        self._owned: set[str] = set()  # proxied request ids already matched to a task
        # task id → its lines, while no runner's /slots has shown it (oldest first: they expire in order)
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._access: deque[AccessLine] = deque(maxlen=1024)
        self._load_start: tuple[int, float] | None = None  # (port, read time) of the last "starting llama-server"
        self._loads: OrderedDict[int, tuple[float, float]] = OrderedDict()  # port → (load end read time, seconds)
        # spans of tasks decided without an access line (they may own one still waiting): rivals for the lines
        self._decided: deque[Claimant] = deque(maxlen=1024)
        self._out: list[RequestRecord] = []
        self._retracted: list[str] = []
        self.embeds = EmbedCalls()  # embed calls' inputs, gathered into one record each (collectors.ollama.embed_calls)
        # (runner, slot, id before, id after, poll before, poll after): a slot's steps over task ids between two polls
        self._steps: deque[tuple[RunnerRef, int, int, int, float, float]] = deque(maxlen=MAX_STEPS)
        self.recorded = 0  # direct records written (finished)
        self.matched_proxied = 0  # ended tasks found to be a proxied request's
        self.claims_corrected = 0  # live claims whose prompt size the finished request's own count disproved
        # Log lines not believed, by why (module doc): "unconfirmed" (no runner's /slots showed their task),
        # "ambiguous" (two runners showed that task id), "disagrees" (/slots contradicts them), "capped" (past
        # MAX_LINES_PER_TASK), "load" (a load line no runner's task confirmed, or longer than its own lines allow),
        # "access_ambiguous" (an error access line a generation recorded without one may own), "access_flood" (error
        # access lines past access_failures.MAX_FAILED_PER_MIN).
        self.dropped: dict[str, int] = {}

    # -- what the reader feeds -------------------------------------------------------------------

    def claimed(self, runner: RunnerRef, task_id: int, request_id: str) -> None:
        """The live join paired this task with a proxied request."""
        task = self._tasks.get((runner.pid, task_id))
        if task is None or task.claimed_by == request_id or (task.key, request_id) in self._disowned:
            return
        if task.claimed_by is not None:
            self._claims.pop(task.claimed_by, None)
        task.claimed_by = request_id
        self._claims[request_id] = task.key
        if task.emitted:  # written as direct before the proxy's request showed up: take it back
            task.emitted = False
            self._retracted.append(task.id)

    def proxied_finished(self, rec: RequestRecord) -> None:
        """A proxied request finished: it may account for a task that ended unclaimed, and its own prompt count
        checks the task the live join gave it."""
        end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
        end = rec.wall_s(end_ns) if end_ns is not None else self._clock()
        if len(self._finished) >= MAX_FINISHED:
            self._let_go(self._finished.popleft()[1])
        self._finished_ids.add(rec.id)
        # Kept slim: its stamps, model and figures are what a match needs, not its tokens or text.
        self._finished.append((end, replace(rec, token_chunk_ns=[], prompt_text=None, response_text=None, error=None)))
        self._check_claim(rec, end)

    def slots_read(
        self,
        runner: RunnerRef,
        readings: Iterable[SlotReading],
        ts: float,
        claims: Mapping[int, str],
        *,
        asked: float | None = None,
    ) -> list[tuple[str, SlotReading]]:
        """One /slots reading of a runner, answered by ``ts`` (and asked for at ``asked``: the runner read its state
        between the two); returns the (direct request id, reading) pairs to keep as progress rows. What the next
        reading finds changed happened after this one's ``asked``: each interval's lower bound."""
        prev = self._last_poll.get(runner.pid)
        self._last_poll[runner.pid] = min(ts, asked) if asked is not None else ts
        progress: list[tuple[str, SlotReading]] = []
        seen_slots: set[int] = set()
        for slot in readings:
            seen_slots.add(slot.slot_id)
            task = self._slot_task(runner, slot, ts, prev, claims)
            if task is None:
                continue
            self._read_slot(task, slot, ts, prev)
            if slot.is_processing and task.claimed_by is None:
                task.unclaimed_polls += 1
                if task.unclaimed_polls >= 2 or task.emitted:  # a proxied request arriving meanwhile had a poll to claim it
                    task.emitted = True
                    self._out.append(self._record(task))
                    progress.append((task.id, slot))
        self._slots_vanished(runner, seen_slots, ts, prev)
        return progress

    def runner_gone(self, pid: int) -> None:
        """A runner is no more (unloaded, killed): its running tasks ended between its last reading and now."""
        last = self._last_poll.pop(pid, None)
        now = self._clock()
        for task in self._tasks.values():
            if task.runner.pid == pid:
                task.gone = True
                if task.end is None:
                    task.end = (last if last is not None else task.first_seen_unix_s, now)
        self._last_task = {k: v for k, v in self._last_task.items() if k[0] != pid}

    def log_events(self, events: Iterable[LogEvent]) -> None:
        """Ollama's log lines, in order: each task line waits for /slots to show its task (module doc)."""
        for event in events:
            if event.kind == "access" and event.access is not None:
                if event.access.method == "POST" and event.access.path in GENERATION_PATHS:
                    self._access.append(event.access)
                elif event.access.method == "POST" and event.access.path in EMBED_ENDPOINTS:
                    self.embeds.line(event.access)
            elif event.kind == "runner_start" and event.port is not None:
                self._load_start = (event.port, event.read_unix_s)
            elif event.kind == "runner_started":
                self._load_read(event)
            elif event.task_id is not None and event.kind in TASK_LINE_KINDS:
                self._task_line(event)

    def active_ids(self) -> set[str]:
        """Ids of the direct records written as in flight and not decided yet."""
        return {t.id for t in self._tasks.values() if t.emitted}

    def unclaimed(self, task_id: int) -> bool:
        """A task of that id is tracked and no proxied request claimed it (its log lines are not a proxied one's)."""
        return any(self._tasks[(pid, task_id)].claimed_by is None for pid in self._pids_of.get(task_id, ()))

    def record_id(self, task_id: int) -> str | None:
        """The direct record id of the one unclaimed task with this id (None: none, or several runners have one)."""
        ids = {t.id for pid in self._pids_of.get(task_id, ()) if (t := self._tasks[(pid, task_id)]).claimed_by is None}
        return ids.pop() if len(ids) == 1 else None

    def known_runner_of(self, task_id: int) -> RunnerRef | None:
        """The runner whose slots showed this task id, when exactly one did."""
        pids = self._pids_of.get(task_id, set())
        return self._tasks[(next(iter(pids)), task_id)].runner if len(pids) == 1 else None

    @property
    def dropped_lines(self) -> int:
        """Log lines not believed (``dropped``), all reasons together."""
        return sum(self.dropped.values())

    # -- deciding and writing ------------------------------------------------------------------

    def step(self) -> None:
        """Decide the ended tasks whose wait is over: proxied (dropped) or direct (written as finished)."""
        now = self._clock()
        while self._finished and self._finished[0][0] < now - FINISHED_KEPT_S:
            self._let_go(self._finished.popleft()[1])
        self._expire(now)
        due = sorted((t for t in self._tasks.values() if self._due(t, now)), key=lambda t: t.ended_unix_s or 0.0)
        if len(self._tasks) > MAX_TASKS:
            ended = sorted((t for t in self._tasks.values() if t.ended_unix_s is not None), key=lambda t: t.ended_unix_s or 0.0)
            due += [t for t in ended[: len(self._tasks) - MAX_TASKS] if t not in due]
        for task in due:
            self._forget(task)
            if self._embedding_input(task):
                continue
            if task.between:
                self._drop("unconfirmed", len(task.lines))  # a stepped-over id that is no embedding: as never shown
                continue
            owner = self._proxied_owner(task, now)
            if owner is not None:
                self.matched_proxied += 1
                self._owned.add(owner)
                if task.emitted:
                    self._retracted.append(task.id)
                continue
            figures = self._figures(task, count_dropped=True)
            self._fit_access(task, figures)
            if task.access is None:
                self._decided.append(self._claimant(task, figures))
            self._out.append(self._record(task, final=True, figures=figures))
            self.recorded += 1
        self._out += self.embeds.step(
            now,
            proxied=self._finished,
            line_expected=self.log_readable,
            settle_s=max(self.grace_s, self.log_wait_s) + self.grace_s,
            to_mono=lambda wall_s: self._to_mono(wall_s, now),
        )
        self._record_failures(now)

    def _embedding_input(self, task: _Task) -> bool:
        """An unclaimed task its own lines and /slots show to be one input of an embed call: handed to ``embeds``
        (its in-flight row, if one was written, taken back)."""
        if task.claimed_by is not None or task.gone or task.end is None:
            return False
        decoded = task.decode_start is not None or bool(task.decoded)
        tokens = input_tokens(task.lines, decoded=decoded, final_ctx=task.final_ctx)
        if tokens is None:
            return False
        start = task.start if task.start is not None else (task.first_seen_unix_s, task.first_seen_unix_s)
        self.embeds.add(
            EmbedInput(
                task.id,
                task.runner.port,
                task.runner.pid,
                task.task_id,
                task.runner.model or "",
                start[0],
                start[1],
                task.end[0],
                task.end[1],
                tokens,
                task.load_s,
            )
        )
        if task.emitted:
            self._retracted.append(task.id)
        return True

    def drain(self) -> tuple[list[RequestRecord], list[str]]:
        """(records to write, in order: in-flight updates and finished ones; ids of direct rows to delete)."""
        out, self._out = self._out, []
        gone, self._retracted = self._retracted, []
        return out, gone

    # -- /slots --------------------------------------------------------------------------------------

    def _slot_task(
        self, runner: RunnerRef, slot: SlotReading, ts: float, prev: float | None, claims: Mapping[int, str]
    ) -> _Task | None:
        """The task this slot reading is about (tracked from now on), or None (idle, or a task from before)."""
        key = (runner.pid, slot.slot_id)
        before = self._last_task.get(key, -1)
        self._last_task[key] = slot.task_id
        if slot.task_id is None:
            return None
        if before != slot.task_id and before not in (-1, None):
            self._moved_on(runner, slot, before, ts, prev)
        task = self._tasks.get((runner.pid, slot.task_id))
        if not slot.is_processing and (task is None or not task.seen_processing):
            if before not in (-1, slot.task_id) and prev is not None:
                # a task that ran wholly between two polls: the slot shows its id and final context only
                task = task or self._new(runner, slot.task_id, slot.slot_id, ts)
                task.runner.model = task.runner.model or runner.model
                task.start = task.start or (prev, ts)
                task.start_lo = prev
                task.end = task.end or (prev, ts)
                task.final_ctx = slot.ctx_tokens
                if slot.task_id in claims:
                    self.claimed(runner, slot.task_id, claims[slot.task_id])
            return None
        if task is None:
            task = self._new(runner, slot.task_id, slot.slot_id, ts)
        if slot.task_id in claims and task.claimed_by is None:
            self.claimed(runner, slot.task_id, claims[slot.task_id])
        task.runner.model = task.runner.model or runner.model
        return task

    def _moved_on(self, runner: RunnerRef, slot: SlotReading, before: int | None, ts: float, prev: float | None) -> None:
        """The slot shows another task than at the last poll: the one before ended, and ids in between ran meanwhile."""
        self._ended_unseen_after(runner, before, ts, prev)
        if before is not None and slot.task_id is not None and slot.task_id > before + 1 and prev is not None:
            self._stepped(runner, slot.slot_id, before, slot.task_id, prev, ts)

    def _stepped(self, runner: RunnerRef, slot_id: int, before: int, after: int, prev: float, ts: float) -> None:
        """The slot went from task ``before`` to ``after`` between two polls: the ids in between ran there meanwhile
        or are the runner's own (a /slots poll, a /tokenize); lines waiting for such an id whose launch line names
        this slot are its tasks'."""
        self._steps.append((runner, slot_id, before, after, prev, ts))
        for task_id in [t for t in self._pending if before < t < after]:
            if any(e.kind == "launch" and e.slot_id == slot_id for e in self._pending[task_id].lines):
                self._between(runner, slot_id, task_id, prev, ts)

    def _between(self, runner: RunnerRef, slot_id: int, task_id: int, prev: float, ts: float) -> None:
        """A task known from its slot's step over its id: it began and ended between the two polls."""
        if task_id in self._pids_of:
            return  # a task of that id is tracked already: its lines are its
        task = self._new(runner, task_id, slot_id, ts)
        task.between = True
        task.start = task.end = (prev, ts)
        task.start_lo = prev

    def _slots_vanished(self, runner: RunnerRef, seen_slots: set[int], ts: float, prev: float | None) -> None:
        """Slots this reading no longer lists: their tasks ended since the last one (and the slot is forgotten)."""
        for key in [k for k in self._last_task if k[0] == runner.pid and k[1] not in seen_slots]:
            self._ended_unseen_after(runner, self._last_task.pop(key), ts, prev)

    def _new(self, runner: RunnerRef, task_id: int, slot_id: int | None, ts: float) -> _Task:
        task = self._tasks[(runner.pid, task_id)] = _Task(RunnerRef(runner.pid, runner.port, runner.model), task_id, slot_id, ts)
        self._pids_of.setdefault(task_id, set()).add(runner.pid)
        load = self._loads.get(runner.port)
        if load is not None and 0 <= ts - load[0] <= LOAD_FOLLOWS_S:
            task.load_s = load[1]  # a runner on that port is found, and this task followed its load at once
            del self._loads[runner.port]
        pending = self._pending.pop(task_id, None)
        if pending is not None:
            for event in pending.lines:
                self._task_line(event)
        return task

    def _forget(self, task: _Task) -> None:
        del self._tasks[task.key]
        pids = self._pids_of.get(task.task_id)
        if pids is not None:
            pids.discard(task.runner.pid)
            if not pids:
                del self._pids_of[task.task_id]
        if task.claimed_by is not None and self._claims.get(task.claimed_by) == task.key:
            del self._claims[task.claimed_by]

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
                task.start_lo = prev
                task.first_processing_s = ts
            task.last_processing_s = ts
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
                if slot.ctx_tokens is not None and len(task.prefill_ctx) < MAX_PREFILL_CTX_KEPT:
                    task.prefill_ctx.add(slot.ctx_tokens)
            task.end = None
        elif task.seen_processing and task.end is None:
            task.end = (prev if prev is not None else ts, ts)
            task.final_ctx = slot.ctx_tokens
            if slot.ctx_tokens is not None and task.prompt_tokens is not None and slot.ctx_tokens >= task.prompt_tokens:
                task.output_exact = slot.ctx_tokens - task.prompt_tokens + 1  # the last token is not put in the context

    # -- the log ---------------------------------------------------------------------------------

    def _drop(self, why: str, n: int = 1) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + n

    def _task_line(self, event: LogEvent) -> None:
        """A task's line: its task's, when exactly one runner's /slots showed that task; else it waits for one."""
        assert event.task_id is not None
        pids = self._pids_of.get(event.task_id)
        if pids:
            if len(pids) > 1:
                self._drop("ambiguous")  # two runners have a task of that id: whose line it is is not known
                return
            task = self._tasks[(next(iter(pids)), event.task_id)]
            if task.gone:
                self._drop("unconfirmed")
            elif len(task.lines) >= MAX_LINES_PER_TASK:
                self._drop("capped")
            else:
                task.lines.append(event)
            return
        pending = self._pending.get(event.task_id)
        if pending is None:
            if len(self._pending) >= MAX_PENDING_TASKS:
                _, oldest = self._pending.popitem(last=False)
                self._drop("unconfirmed", len(oldest.lines))
            pending = self._pending[event.task_id] = _Pending(event.read_unix_s)
        if len(pending.lines) >= MAX_LINES_PER_TASK:
            self._drop("capped")
            return
        pending.lines.append(event)
        if event.kind == "launch" and event.slot_id is not None:
            steps = [s for s in self._steps if s[1] == event.slot_id and s[2] < event.task_id < s[3]]
            if len({s[0].pid for s in steps}) == 1:  # two runners stepped over that id: whose it is is not known
                runner, slot_id, _, _, prev, ts = steps[-1]
                self._between(runner, slot_id, event.task_id, prev, ts)

    def _expire(self, now: float) -> None:
        """Lines whose task no runner showed within ``PENDING_TTL_S``, and loads no task followed: dropped."""
        while self._pending:
            task_id, pending = next(iter(self._pending.items()))
            if pending.first_read_unix_s >= now - PENDING_TTL_S:
                break
            del self._pending[task_id]
            self._drop("unconfirmed", len(pending.lines))
        while self._loads and next(iter(self._loads.values()))[0] < now - LOAD_KEPT_S:
            self._loads.popitem(last=False)
            self._drop("load")

    def _load_read(self, event: LogEvent) -> None:
        """A "started in X seconds" line: the load of the runner whose "starting llama-server" line came last, when
        X fits the time between the two lines; it waits for a task on that port (``_new``)."""
        start, self._load_start = self._load_start, None
        if start is None or event.duration_ms is None:
            self._drop("load")
            return
        port, start_read_s = start
        seconds = event.duration_ms / 1000
        if not 0 <= seconds <= event.read_unix_s - start_read_s + LOAD_SLACK_S:
            self._drop("load")  # longer than the runner has been starting: not the runner's words
            return
        self._loads.pop(port, None)
        if len(self._loads) >= MAX_PENDING_LOADS:
            self._loads.popitem(last=False)
            self._drop("load")
        self._loads[port] = (event.read_unix_s, seconds)

    def _confirmed_log(self, task: _Task) -> _LogFigures | None:
        """The task's figures from its log lines, when exactly one reading of them agrees with /slots."""
        if not task.log_done:
            return None
        if task.prompt_tokens is None and task.final_ctx is None and task.output_exact is None and not task.prefill_ctx:
            return None  # /slots told nothing to check them against
        kinds: dict[str, list[LogEvent]] = {k: [] for k in ("new_prompt", "prompt_eval", "eval", "release")}
        for event in task.lines:
            if event.kind in kinds and (event.kind in ("new_prompt", "release") or event.duration_ms is not None):
                kinds[event.kind].append(event)
        totals: list[LogEvent | None] = [*kinds["new_prompt"]] or [None]
        fits: set[_LogFigures] = set()
        for total, pe, ev, rel in itertools.product(totals, kinds["prompt_eval"], kinds["eval"], kinds["release"]):
            assert pe.duration_ms is not None and ev.duration_ms is not None
            figures = _LogFigures(
                prompt_total=total.tokens if total is not None else pe.tokens,
                computed=pe.tokens,
                has_total=total is not None,
                prefill_ms=pe.duration_ms,
                output=ev.tokens,
                decode_ms=ev.duration_ms,
                release_unix_s=rel.read_unix_s,
                release_ctx=rel.tokens,
            )
            if self._agrees(task, figures):
                fits.add(figures)
        return fits.pop() if len(fits) == 1 else None

    @staticmethod
    def _agrees(task: _Task, f: _LogFigures) -> bool:
        """Whether the log's figures fit what /slots saw of the task: sizes, counts and the time between polls."""
        if f.computed > f.prompt_total or abs(f.release_ctx - (f.prompt_total + f.output - 1)) > 1:
            return False  # the runner's own lines always add up so
        if not DirectTasks._sizes_agree(task, f):
            return False
        took_s = (f.prefill_ms + f.decode_ms) / 1000
        if task.start_lo is not None and task.end is not None and took_s > task.end[1] - task.start_lo + WINDOW_SLACK_S:
            return False  # longer than the polls around it allow
        if task.first_processing_s is not None and task.last_processing_s is not None:
            if took_s < task.last_processing_s - task.first_processing_s - WINDOW_SLACK_S:
                return False  # shorter than the polls that saw it running
            if f.release_unix_s < task.last_processing_s - WINDOW_SLACK_S:
                return False  # released before a poll saw it running
        return True

    @staticmethod
    def _sizes_agree(task: _Task, f: _LogFigures) -> bool:
        """The log's prompt, output and context sizes against those /slots showed of the task."""
        if task.prompt_tokens is not None and f.prompt_total != task.prompt_tokens:
            return False
        seen_only_reading = task.prompt_tokens is None and task.final_ctx is None and task.output_exact is None
        if seen_only_reading and f.prompt_total not in task.prefill_ctx:
            return False  # the size its lines name must be a context a poll saw it reach while reading its prompt
        if task.final_ctx is not None and abs(f.release_ctx - task.final_ctx) > 1:
            return False
        if task.output_exact is not None and abs(f.output - task.output_exact) > 1:
            return False
        return not (task.decoded and f.output < task.decoded[-1][1] - 1)  # not fewer than a poll saw decoded

    # -- deciding ------------------------------------------------------------------------------------

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
        if task.claimed_by is not None and task.claimed_by not in self._finished_ids:
            wait = max(wait, CLAIM_WAIT_MAX_S)  # its request is still running: decide once it has finished
        return now >= ended + wait

    def _let_go(self, rec: RequestRecord) -> None:
        self._owned.discard(rec.id)
        self._failure_owners.discard(rec.id)
        self._finished_ids.discard(rec.id)

    def _prompt_size(self, task: _Task) -> int | None:
        """The task's prompt size in the runner's own count: /slots once decoding began, else its confirmed log."""
        if task.prompt_tokens is not None:
            return task.prompt_tokens
        log = self._confirmed_log(task)
        return log.prompt_total if log is not None and log.has_total else None

    def _check_claim(self, rec: RequestRecord, end: float) -> None:
        """A finished proxied request's prompt count against the task the live join gave it: a task whose size
        disagrees is not its (taken back); the one task of its model, time and size is claimed instead."""
        counted = rec.metrics.prompt_eval_count if rec.metrics is not None else None
        if counted is None:
            return
        key = self._claims.get(rec.id)
        task = self._tasks.get(key) if key is not None else None
        size = self._prompt_size(task) if task is not None else None
        if task is not None and size == counted:
            return  # the live claim agrees with the runner's own count
        fits = [
            t
            for t in self._tasks.values()
            if t.claimed_by is None
            and (t.key, rec.id) not in self._disowned
            and t.runner.model is not None
            and same_model(rec.model, t.runner.model)
            and self._prompt_size(t) == counted
            and self._rough_start(t) <= end + 0.5
        ]
        if task is not None and (size is not None or len(fits) == 1):
            # its size disagrees, or it is unknown and exactly one other task has the request's: not its
            task.claimed_by = None
            task.unclaimed_polls = 0
            del self._claims[rec.id]
            self._disowned.append((task.key, rec.id))
            self.claims_corrected += 1
        if len(fits) == 1:
            self.claimed(fits[0].runner, fits[0].task_id, rec.id)

    @staticmethod
    def _rough_start(task: _Task) -> float:
        return task.start[0] if task.start is not None else task.first_seen_unix_s

    def _proxied_owner(self, task: _Task, now: float) -> str | None:
        """The proxied request this ended task was, or None: it was a direct one."""
        model = task.runner.model or ""  # none known: no request is of it
        finished = [rec for _, rec in self._finished if rec.id not in self._owned and same_model(rec.model, model)]
        log = self._confirmed_log(task)
        if log is not None:
            return self._owner_by_figures(task, log, finished)
        if task.claimed_by is not None:
            return task.claimed_by
        return self._owner_by_time(task, finished, now)

    def _owner_by_figures(self, task: _Task, log: _LogFigures, finished: list[RequestRecord]) -> str | None:
        """A task the log timed: the finished request with its exact figures, else the live claim when nothing
        can disprove it (still running, or a /v1 reply without durations)."""
        for rec in finished:
            if self._same_figures(log, rec):
                return rec.id
        if task.claimed_by is not None:
            claimer = next((rec for rec in finished if rec.id == task.claimed_by), None)
            if claimer is None or not self._has_durations(claimer):
                return task.claimed_by
        return None

    def _owner_by_time(self, task: _Task, finished: list[RequestRecord], now: float) -> str | None:
        """A task without log figures: a finished request of its model that claims no task, ran at the same time,
        and whose prompt count does not disagree with the task's."""
        start = task.start[0] if task.start else task.first_seen_unix_s
        end = task.end[1] if task.end else (task.ended_unix_s or now)
        for rec in finished:
            if rec.id in self._claims:
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

    @staticmethod
    def _has_durations(rec: RequestRecord) -> bool:
        return rec.metrics is not None and rec.metrics.prompt_eval_duration_ns is not None

    @staticmethod
    def _same_figures(log: _LogFigures, rec: RequestRecord) -> bool:
        m = rec.metrics
        if m is None:
            return False
        if m.prompt_eval_count != log.prompt_total or m.eval_count is None or abs(m.eval_count - log.output) > 1:
            return False
        if m.prompt_eval_duration_ns is None or m.eval_duration_ns is None:
            return True  # a /v1 reply: its counts are all it has
        return (
            abs(m.prompt_eval_duration_ns - log.prefill_ms * 1e6) <= DURATION_MATCH_NS
            and abs(m.eval_duration_ns - log.decode_ms * 1e6) <= DURATION_MATCH_NS
        )

    # -- the access line -------------------------------------------------------------------------------

    def _fit_access(self, task: _Task, figures: _Figures) -> None:
        """This task's access line: the one that fits it once every generation that fits one line alone has
        taken it (tasks still tracked, proxied requests, tasks decided without one); none while two still fit."""
        me = self._claimant(task, figures)
        if not any(fits_line(a, me) for a in self._access):
            return
        # every line of about that second: a rival's other choices free this task's
        lines = [a for a in self._access if abs(a.ended_unix_s - me.end) <= 1 + 2 * ACCESS_SLACK_S]
        lo = min(a.ended_unix_s for a in lines) - ACCESS_SLACK_S
        hi = max(a.ended_unix_s for a in lines) + 1 + ACCESS_SLACK_S
        claimants = [me, *self._rivals(lo, hi)]
        candidates = [{i for i, a in enumerate(lines) if fits_line(a, c)} for c in claimants]
        mine = self._assign(candidates).get(0)
        if mine is not None:
            task.access = lines[mine]
            self._access.remove(task.access)

    def _record_failures(self, now: float) -> None:
        """Error access lines no generation can own once every one that might has been decided: a direct request
        Ollama failed before any runner task of it was seen (``access_failures``). A line a proxied request with
        that status fits is the proxy's; one an undecided task fits waits for it; one a task decided without a
        line fits may be that task's: dropped, counted, never a second record."""
        due = [a for a in self._access if is_failure(a) and a.ended_unix_s + 1 + FAILED_WAIT_S <= now]
        undecided = self._undecided() if due else []
        for line in due:
            if any(fits_line(line, c) for c in undecided):
                continue
            self._access.remove(line)
            owner = self._proxied_failure(line)
            if owner is not None:
                self._failure_owners.add(owner)
            elif any(fits_line(line, c) for c in self._decided):
                self._drop("access_ambiguous")
            elif not self._failure_budget.allow(now):
                self._drop("access_flood")
            else:
                self._out.append(failed_record(line, now, self._to_mono))
                self.recorded_failed += 1

    def _proxied_failure(self, line: AccessLine) -> str | None:
        """The finished proxied request answered with this error line's status that the line fits, if any."""
        for end, rec in self._finished:
            if rec.id in self._failure_owners or rec.status_code != line.status:
                continue
            if fits_line(line, _proxied(rec, end)):
                return rec.id
        return None

    def _undecided(self) -> list[Claimant]:
        """The unclaimed tasks that ended and wait to be decided, as possible owners of an access line."""
        return [self._span(t) for t in self._tasks.values() if t.ended_unix_s is not None and t.claimed_by is None]

    @staticmethod
    def _claimant(task: _Task, figures: _Figures) -> Claimant:
        """The task as an access line's possible owner: its span (its load included), and whether the runner ran it
        to its end (it decoded and its runner did not go away: Ollama answered it, so a 5xx line is not its)."""
        start = figures.start - (task.load_s or 0.0)
        end = figures.end if figures.end is not None else figures.start
        lo, hi = task.end if task.end is not None else (end, end)
        return Claimant(start, max(end, hi), answered=figures.decode_start is not None and not task.gone, earliest_end=lo)

    def _rivals(self, lo: float, hi: float) -> list[Claimant]:
        """Every other generation that ended between ``lo`` and ``hi``: an access line may be its. A finished
        proxied request's line has its status."""
        rivals = [
            self._span(t)
            for t in self._tasks.values()
            if (e := t.ended_unix_s) is not None and lo <= e <= hi and t.claimed_by is None  # a claimed one: its request's
        ]
        rivals += [_proxied(rec, e) for e, rec in self._finished if lo <= e <= hi]
        rivals += [c for c in self._decided if lo <= c.end <= hi]
        return rivals

    @staticmethod
    def _assign(candidates: list[set[int]]) -> dict[int, int]:
        """Generation → line, where it follows: a generation left with one line takes it, unless another is left
        with that same line alone (then neither does); repeated until nothing more follows."""
        assigned: dict[int, int] = {}
        while True:
            taken = set(assigned.values())
            wanted: dict[int, list[int]] = {}  # line → the generations it is the only line left for
            for k, cands in enumerate(candidates):
                left = cands - taken
                if k not in assigned and len(left) == 1:
                    wanted.setdefault(next(iter(left)), []).append(k)
            alone = {line: ks[0] for line, ks in wanted.items() if len(ks) == 1}
            if not alone:
                return assigned
            for line, k in alone.items():
                assigned[k] = line

    @classmethod
    def _span(cls, task: _Task) -> Claimant:
        """A rival task as an access line's possible owner: as late a start and as wide an end as its polls allow."""
        lo, hi = task.end if task.end is not None else (task.first_seen_unix_s, task.first_seen_unix_s)
        return Claimant(cls._late_start(task), hi, earliest_end=lo)

    @staticmethod
    def _late_start(task: _Task) -> float:
        """A rival's start, as late as its polls allow: it fits every line it may own."""
        return task.start[1] if task.start is not None else task.first_seen_unix_s

    # -- the record ------------------------------------------------------------------------------------

    def _figures(self, task: _Task, *, count_dropped: bool = False) -> _Figures:
        """The record's times and counts: the log's, when /slots agrees with them, else the /slots readings'."""
        log = self._confirmed_log(task)
        if log is not None:
            return self._log_figures(task, log)
        if count_dropped and task.lines:
            self._drop("disagrees" if task.log_done else "unconfirmed", len(task.lines))
        return self._slots_figures(task)

    def _log_figures(self, task: _Task, log: _LogFigures) -> _Figures:
        """Exact: the runner's own timings; the end is when its release line was read (or the poll that saw it)."""
        prefill_s, decode_s = log.prefill_ms / 1000, log.decode_ms / 1000
        end = log.release_unix_s if task.end is None else min(_mid(task.end), log.release_unix_s)
        cached = log.prompt_total - log.computed if log.has_total else None
        return _Figures(
            source="log",
            start=end - prefill_s - decode_s,
            decode_start=end - decode_s,
            end=end,
            ends_bound=_half(task.end) if task.end is not None else self.log_read_bound_s,
            prompt=log.prompt_total,
            cached=cached,
            prefill_s=prefill_s,
            prefill_bound=LOG_TIMING_BOUND_S,
            decode_s=decode_s,
            decode_bound=LOG_TIMING_BOUND_S,
            output=log.output,
            output_bound=0,
        )

    def _slots_figures(self, task: _Task) -> _Figures:
        """Bounded: each moment between two polls, kept with the half-widths of those intervals."""
        start = _mid(task.start) if task.start else task.first_seen_unix_s
        start_bound = _half(task.start) if task.start else 0.0
        decode_start = _mid(task.decode_start) if task.decode_start else None
        ds_bound = _half(task.decode_start) if task.decode_start else 0.0
        end = _mid(task.end) if task.end else None
        prefill_s = decode_start - start if decode_start is not None else None
        decode_s = (end - decode_start) if end is not None and decode_start is not None else None
        output, output_bound = self._slots_output(task, end)
        return _Figures(
            source="slots",
            start=start,
            decode_start=decode_start,
            end=end,
            ends_bound=max(start_bound, _half(task.end) if task.end else self.log_read_bound_s),
            prompt=task.prompt_tokens,
            cached=task.cached_tokens,
            prefill_s=prefill_s,
            prefill_bound=start_bound + ds_bound if prefill_s is not None else None,
            decode_s=decode_s,
            decode_bound=ds_bound + (_half(task.end) if task.end else 0.0) if decode_s is not None else None,
            output=output,
            output_bound=output_bound,
        )

    def _record(self, task: _Task, *, final: bool = False, figures: _Figures | None = None) -> RequestRecord:
        """The task as a request record (in flight until ``final``)."""
        now = self._clock()
        f = figures if figures is not None else self._figures(task)
        metrics = None
        if final and (f.prompt is not None or f.output is not None):
            metrics = FinalMetrics(
                load_duration_ns=round(task.load_s * 1e9) if task.load_s is not None else None,
                prompt_eval_count=f.prompt,
                prompt_eval_cached_count=f.cached,
                prompt_eval_duration_ns=round(f.prefill_s * 1e9) if f.prefill_s is not None else None,
                eval_count=f.output,
                eval_duration_ns=round(f.decode_s * 1e9) if f.decode_s is not None and f.decode_s >= 0 else None,
                total_duration_ns=round(task.access.latency_s * 1e9) if task.access is not None else None,
            )
        started = f.start - (task.load_s or 0.0)
        received_ns = self._to_mono(started, now)
        access = task.access
        return RequestRecord(
            id=task.id,
            started_at_unix_s=started,
            client_addr=access.client if access is not None else None,
            client_unverified=access is not None,
            endpoint=access.path if access is not None else None,
            model=task.runner.model or "",
            stream=None,
            kind=RequestKind.GENERATE,
            received_ns=received_ns,
            forwarded_ns=received_ns,
            first_token_ns=self._to_mono(f.decode_start, now) if f.decode_start is not None else None,
            final_chunk_ns=self._to_mono(f.end, now) if final and f.end is not None else None,
            status_code=access.status if access is not None else None,
            outcome=self._outcome(access) if final else Outcome.IN_FLIGHT,
            metrics=metrics,
            thinking_chunks=None,
            seen_from=SeenFrom.RUNNER,
            runner_port=task.runner.port,
            runner_task_id=task.task_id,
            runner_source=f.source,
            ends_bound_s=f.ends_bound,
            prefill_bound_s=f.prefill_bound,
            decode_bound_s=f.decode_bound,
            output_tokens_bound=f.output_bound,
        )

    @staticmethod
    def _outcome(access: AccessLine | None) -> Outcome:
        if access is None or access.status < 400:
            return Outcome.OK
        return Outcome.CANCELLED if access.status == 499 else Outcome.HTTP_ERROR

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


def _proxied(rec: RequestRecord, end: float) -> Claimant:
    """A finished proxied request as an access line's possible owner: its last chunk reached the proxy at ``end``,
    a moment after Ollama wrote it and about when its handler returned (the line's end)."""
    return Claimant(rec.started_at_unix_s, end, status=rec.status_code, earliest_end=end - ANSWER_LAG_S)
