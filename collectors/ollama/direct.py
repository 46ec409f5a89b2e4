"""Generations clients send Ollama directly, recorded from its runner: a runner task no proxied request claims.

``RunnerReader`` reads each runner's ``/slots`` and Ollama's log; it hands both to ``DirectTasks``, which keeps
one ``Task`` (``direct_task``) per (runner pid, task id) and turns each unclaimed one into a ``RequestRecord`` with
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

Its parts, one module each: ``direct_task`` (a task and what /slots showed of it), ``direct_confirm`` (whether
its log lines are believed), ``direct_owner`` (whether it was a proxied request), ``direct_access`` (which access
line is its) and ``direct_record`` (its figures and record). This module tracks the tasks and decides them.

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

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from analysis.model_names import same_model
from analysis.records import AGENT_ENDPOINTS, EMBED_ENDPOINTS, RequestRecord
from collectors.ollama.access_failures import FAILED_WAIT_S, FailureBudget, failed_record, is_failure
from collectors.ollama.access_fit import ACCESS_SLACK_S, Claimant, fits_line
from collectors.ollama.direct_access import assign, claimant, proxied, span
from collectors.ollama.direct_confirm import confirmed_log
from collectors.ollama.direct_owner import owner_by_figures, owner_by_time
from collectors.ollama.direct_record import Figures, log_figures, slots_figures, task_record
from collectors.ollama.direct_task import RunnerRef, Task, read_slot
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
MAX_PENDING_LOADS = 8  # loads (a "started in" line after its "starting llama-server") waiting for a task on their port
LOAD_KEPT_S = 60.0  # ...this long at most
LOAD_SLACK_S = 1.0  # a load's stated seconds may pass the time between its two lines by this (each read within a tick)
# A task starting within this of a load's end on its runner (a log read or a poll later) is the one that waited for
# it; a load for an empty prompt (a client's preload) runs no task, and the next task is not its.
LOAD_FOLLOWS_S = 1.0
GENERATION_PATHS = frozenset({"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"} | AGENT_ENDPOINTS)
TASK_LINE_KINDS = frozenset({"launch", "new_prompt", "prompt_eval", "eval", "release"})
# Task ids a slot stepped over between two polls (an embed call's inputs run tens of milliseconds each): kept per
# runner and slot, so a task's lines that name that slot and an id in between are its runner's (``_between``).
MAX_STEPS = 64


@dataclass
class _Pending:
    """A task id's log lines while no runner's /slots has shown that task."""

    first_read_unix_s: float
    lines: list[LogEvent] = field(default_factory=list)


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
        self._tasks: dict[tuple[int, int], Task] = {}
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
            read_slot(task, slot, ts, prev)
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
                self._decided.append(claimant(task, figures))
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

    def _embedding_input(self, task: Task) -> bool:
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
    ) -> Task | None:
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

    def _new(self, runner: RunnerRef, task_id: int, slot_id: int | None, ts: float) -> Task:
        task = self._tasks[(runner.pid, task_id)] = Task(RunnerRef(runner.pid, runner.port, runner.model), task_id, slot_id, ts)
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

    def _forget(self, task: Task) -> None:
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

    # -- deciding ------------------------------------------------------------------------------------

    def _due(self, task: Task, now: float) -> bool:
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

    def _prompt_size(self, task: Task) -> int | None:
        """The task's prompt size in the runner's own count: /slots once decoding began, else its confirmed log."""
        if task.prompt_tokens is not None:
            return task.prompt_tokens
        log = confirmed_log(task)
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
    def _rough_start(task: Task) -> float:
        return task.start[0] if task.start is not None else task.first_seen_unix_s

    def _proxied_owner(self, task: Task, now: float) -> str | None:
        """The proxied request this ended task was, or None: it was a direct one."""
        model = task.runner.model or ""  # none known: no request is of it
        finished = [rec for _, rec in self._finished if rec.id not in self._owned and same_model(rec.model, model)]
        log = confirmed_log(task)
        if log is not None:
            return owner_by_figures(task, log, finished)
        if task.claimed_by is not None:
            return task.claimed_by
        return owner_by_time(task, finished, self._claims, now)

    # -- the access line -------------------------------------------------------------------------------

    def _fit_access(self, task: Task, figures: Figures) -> None:
        """This task's access line: the one that fits it once every generation that fits one line alone has
        taken it (tasks still tracked, proxied requests, tasks decided without one); none while two still fit."""
        me = claimant(task, figures)
        if not any(fits_line(a, me) for a in self._access):
            return
        # every line of about that second: a rival's other choices free this task's
        lines = [a for a in self._access if abs(a.ended_unix_s - me.end) <= 1 + 2 * ACCESS_SLACK_S]
        lo = min(a.ended_unix_s for a in lines) - ACCESS_SLACK_S
        hi = max(a.ended_unix_s for a in lines) + 1 + ACCESS_SLACK_S
        claimants = [me, *self._rivals(lo, hi)]
        candidates = [{i for i, a in enumerate(lines) if fits_line(a, c)} for c in claimants]
        mine = assign(candidates).get(0)
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
            if fits_line(line, proxied(rec, end)):
                return rec.id
        return None

    def _undecided(self) -> list[Claimant]:
        """The unclaimed tasks that ended and wait to be decided, as possible owners of an access line."""
        return [span(t) for t in self._tasks.values() if t.ended_unix_s is not None and t.claimed_by is None]

    def _rivals(self, lo: float, hi: float) -> list[Claimant]:
        """Every other generation that ended between ``lo`` and ``hi``: an access line may be its. A finished
        proxied request's line has its status."""
        rivals = [
            span(t)
            for t in self._tasks.values()
            if (e := t.ended_unix_s) is not None and lo <= e <= hi and t.claimed_by is None  # a claimed one: its request's
        ]
        rivals += [proxied(rec, e) for e, rec in self._finished if lo <= e <= hi]
        rivals += [c for c in self._decided if lo <= c.end <= hi]
        return rivals

    # -- the record ------------------------------------------------------------------------------------

    def _figures(self, task: Task, *, count_dropped: bool = False) -> Figures:
        """The record's times and counts: the log's, when /slots agrees with them, else the /slots readings'."""
        log = confirmed_log(task)
        if log is not None:
            return log_figures(task, log, self.log_read_bound_s)
        if count_dropped and task.lines:
            self._drop("disagrees" if task.log_done else "unconfirmed", len(task.lines))
        return slots_figures(task, self.log_read_bound_s)

    def _record(self, task: Task, *, final: bool = False, figures: Figures | None = None) -> RequestRecord:
        """The task as a request record (in flight until ``final``)."""
        now = self._clock()
        f = figures if figures is not None else self._figures(task)
        return task_record(task, f, final=final, to_mono=lambda wall_s: self._to_mono(wall_s, now))

    def _to_mono(self, wall_s: float, now_wall_s: float) -> int:
        return self._mono_ns() - round((now_wall_s - wall_s) * 1e9)
