"""Live prefill and decode progress, read from Ollama's runners (llama-server ``/slots``) and its log.

``RunnerReader`` finds the runners of the watched Ollama (``runner_discovery``), polls each one's
``/slots`` (loopback only) 4 times a second while a request to its model is in flight (8 while a slot reads a
proxied request's prompt: ``PREFILL_INTERVAL_S``) and every
``idle_interval_s`` otherwise (once a second while every such request streams and its decoding has been
read: the proxy sees each of their tokens itself, and 4 Hz cost a CPU runner 0.6–1.1% of its decode
speed, ``bench/slots_polling.py``), joins a busy slot to the in-flight request of that model (oldest request
↔ oldest task), and queues ``ProgressSample`` rows (source slots, or log from ``--ollama-log``). The
service drains the queue on each tick, after it has written the in-flight requests the rows belong to.

The prompt's size: /slots does not give it while the prompt is read (``collectors.ollama.slots``), so prefill
readings carry ``prompt_tokens=None`` until it is known — from the first reading after decoding began,
or from a log progress line (n_tokens / progress) — and are then queued again with it (rows are keyed
by request, source and time, so the second write replaces the first).

Where no runner can be read (remote or older Ollama, ``--no-slots``, a 404/501/garbage answer, a closed
port, a runner gone mid-request) nothing is written from slots and the request keeps its estimate
(written elsewhere); ``problems`` says why. Nothing here raises into the collector.

``python -m collectors.ollama --ollama URL --json`` prints the runners found and their slots now.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from analysis.model_names import is_cloud, same_model
from analysis.records import LoadedModel, ProgressSample, ProgressSource, RequestRecord, RunnerFlags, SeenFrom
from analysis.runner_load import PlacementReader, RunnerDeviceRow, RunnerPlacement, placement_rows
from analysis.runner_waits import RequestWaitsRow, WaitJoiner, waits_row
from collectors.ollama.direct import GENERATION_PATHS, DirectTasks, RunnerRef
from collectors.ollama.discovery import (
    MLX_RUNNER,
    DigestCache,
    Discoverer,
    Discovery,
    ProcessWatch,
    Runner,
    RunnerSet,
    discover,
    off_loop_daemon,
)
from collectors.ollama.log import EventKind, LogEvent, LogSource, LogTail
from collectors.ollama.mlx_direct import MlxDirect
from collectors.ollama.slots import MAX_SLOTS, SlotReading, SlotsFormatError, parse_slots, slots_cap

log = logging.getLogger(__name__)

BUSY_INTERVAL_S = 0.25  # 4 Hz while a request to the runner's model runs
# 8 Hz while a proxied request reads its prompt and no reading has shown it decoding. The count moves a batch
# (512 tokens) at a time, ~1.1 s a batch on a 2-core CPU, and each reading comes up to one interval after the
# batch it shows: at a quarter of a 4,000-token prompt the rate rests on one batch, so 0.25 s of lateness is up to
# a 25% rate error, which the ETA extrapolates over the rest of the prompt (a CI run: 36% off, against 30%).
PREFILL_INTERVAL_S = 0.125
MIN_STEP_S = 0.01  # the reader's steps never come closer than this
# No proxied request to its model: still once a second, so a generation a client sends Ollama directly is seen
# starting (collectors.ollama.direct); 4 Hz again while the runner has a slot busy.
IDLE_INTERVAL_S = 1.0
RETRY_INTERVAL_S = 2.0  # a runner that could not be read while its model is busy: try again this often
DISCOVER_EVERY_S = 10.0
STREAMED_DECODE_INTERVAL_S = 1.0  # see the module doc
# A proxied request the runner of its model can be read for: the collector's estimate waits this long after the
# request was forwarded for the runner's first reading of it (a poll at the busy pace, then the service's next
# tick), so the Live card does not show an estimate for the moment before the runner's own reading replaces it.
FIRST_READING_GRACE_S = 2.0
REDISCOVER_BUSY_S = 1.0  # a request with no runner for its model: look again this often
REDISCOVER_LOADED_S = 3.0  # a model in /api/ps with no runner found (just loaded, or a remote Ollama): this often
SLOTS_TIMEOUT_S = 2.0
# Readings kept per in-flight request, to give them the prompt's size once it is known (or raised: a
# reading racing the last batch can read it low, and the next one corrects it). A prefill reading is new only
# when a batch ends, so a 128k prompt in 512-token batches needs 256; decode readings come every poll, so
# only the latest few are kept. Past these, the oldest are let go: they stay in the store with the size they
# had, and the finished request's own count fills it in.
MAX_PREFILL_ROWS_KEPT = 1024
MAX_DECODE_ROWS_KEPT = 8
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
MLX_NO_SLOTS = "an MLX runner (Apple Silicon's engine): it has no /slots; its requests are told by Ollama's log"
MAX_BODY_BYTES = 4 << 20  # /slots carries prompt text; a larger body is not read
MAX_WAIT_RUNNERS = 8  # runners (by port) whose wait lines and placements are kept: runners come and go, the newest kept
# A start line is read at most this long after Ollama wrote it (a log read every step, a worker thread, a busy
# machine): the runner it started began after that.
START_LINE_READ_LAG_S = 10.0
MAX_START_SEQUENCES = 4  # starts told of and not yet confirmed by discovery (models loaded one after another)


def classify_slots_answer(status: int, body: bytes, max_slots: int = MAX_SLOTS) -> tuple[list[SlotReading] | None, str | None]:
    """(readings, None) for a usable /slots answer of at most ``max_slots`` slots, else (None, why not).
    A redirect is an answer like any other status: never followed (whatever answers on a runner's port
    could send the collector anywhere)."""
    if status != 200:
        hint = {404: " (no /slots: an older runner?)", 501: " (started with --no-slots)"}.get(status, "")
        return None, f"/slots answered HTTP {status}{hint}"
    # Each slot has one "is_processing" key, and a quote inside a JSON string is escaped: counting them bounds
    # the slots before a parse (parse_slots counts again, exactly), so a list of thousands costs no parse.
    if body.count(b'"is_processing"') > max_slots:
        return None, f"/slots answered something that is not a list of slots: more than the runner's {max_slots} slots"
    try:
        return parse_slots(json.loads(body), max_slots), None
    except (ValueError, SlotsFormatError) as exc:
        return None, f"/slots answered something that is not a list of slots: {str(exc)[:120]}"
    except RecursionError:  # nested deeper than the parser goes: not llama-server's answer
        return None, "/slots answered something that is not a list of slots: JSON nested too deeply"


@dataclass
class RunnerState:
    runner: Runner
    digest: str | None = None
    model: str | None = None  # /api/ps name of the model it serves, once matched
    slots: list[SlotReading] = field(default_factory=list)
    problem: str | None = None
    next_poll_s: float = 0.0  # monotonic
    polling: bool = False
    started_unix_s: float | None = None  # when its process started (psutil), to confirm a start sequence as its own

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self.runner)
        out.update(
            digest=self.digest,
            model=self.model,
            problem=self.problem,
            slots=[asdict(s) for s in self.slots],
        )
        return out


@dataclass
class _Track:
    """What the reader knows of one in-flight request."""

    request_id: str
    prompt_tokens: int | None = None
    exact: bool = False  # prompt_tokens read from /slots after decoding began (not from a log fraction)
    last_key: tuple[Any, ...] | None = None
    # rows written, as last written: prefill ones and the latest decode ones (bounded, see above)
    prefill_rows: deque[ProgressSample] = field(default_factory=lambda: deque(maxlen=MAX_PREFILL_ROWS_KEPT))
    decode_rows: deque[ProgressSample] = field(default_factory=lambda: deque(maxlen=MAX_DECODE_ROWS_KEPT))


def process_started_unix_s(pid: int) -> float | None:
    """When process ``pid`` started (its creation time, as the OS keeps it); None when it cannot be read."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def _model_of(digest: str | None, models: Sequence[LoadedModel]) -> str | None:
    if not digest:
        return None
    for m in models:
        if m.digest == digest or m.digest.removeprefix("sha256:") == digest:
            return m.name
    return None


@dataclass
class _StartSequence:
    """A runner's start as Ollama's log tells it: from Ollama's ``starting llama-server`` line (its port) to the
    runner's own listening line (or Ollama's "started in"); its load lines fold into ``reader``."""

    port: int
    read_unix_s: float  # when its start line was read
    reader: PlacementReader = field(default_factory=PlacementReader)
    up: bool = False  # the runner said it listens: no load line after this is its


class RunnerReader:
    """Reads the runners of one Ollama; ``await run(stop)`` until ``stop`` is set, ``drain()`` the rows."""

    def __init__(
        self,
        ollama_url: str,
        session: aiohttp.ClientSession,
        *,
        in_flight: Callable[[], Sequence[RequestRecord]],
        loaded_models: Callable[[], Sequence[LoadedModel]],
        log_path: Path | None = None,
        log_source: LogSource | None = None,  # instead of log_path: e.g. the journal (collectors.ollama.journal)
        clock: Callable[[], float] = time.time,
        busy_interval_s: float = BUSY_INTERVAL_S,
        idle_interval_s: float = IDLE_INTERVAL_S,
        discover_every_s: float = DISCOVER_EVERY_S,
        discover: Callable[[str], Discovery] | None = None,  # default: a Discoverer of this reader's own
        watch: ProcessWatch | None = None,
    ) -> None:
        self.ollama_url = ollama_url
        self._session = session
        self._in_flight = in_flight
        self._loaded_models = loaded_models
        self._clock = clock
        self.busy_interval_s = busy_interval_s
        self.idle_interval_s = idle_interval_s
        self.discover_every_s = discover_every_s
        self._discover = discover if discover is not None else Discoverer()
        # With a process watch, the timer's round is skipped while the runner processes are those of the last
        # round and that round's answer cannot change without one coming or going (``Discovery.recheck``).
        self._watch = watch
        self._runner_set_at_round: RunnerSet | None = None
        self._digests = DigestCache()
        self.runners: dict[int, RunnerState] = {}  # by pid
        self.discovery: Discovery | None = None  # the last one: how the runners were found, or why none were
        self._next_discover_s = 0.0
        self._look_now = True  # a round now, whatever the process watch says (first, or a runner said to have come or gone)
        self._discovering = False
        self._tasks: dict[tuple[int, int], str] = {}  # (runner pid, task id) → request id
        self._tracks: dict[str, _Track] = {}
        self._queue: list[ProgressSample] = []
        self._log: LogSource | None = log_source if log_source is not None else LogTail(log_path) if log_path else None
        self._log_problem: str | None = None  # as last said in the collector's log
        # Generations Ollama's log ended (access lines) since the runner last wrote a line of a task: the runner's
        # per-request lines may no longer reach the log (written only with OLLAMA_DEBUG: docs/ollama-api.md §13).
        # ``runner_lines_missing`` says so, with the fix, once it is clear.
        self._generations_without_runner_lines = 0
        self.runner_lines_missing: str | None = None
        self._log_read: asyncio.Future[None] | None = None  # the log read in a worker thread now, if any
        self.errors = 0  # unexpected failures caught (each logged once per kind)
        self.log_lines_dropped = 0  # progress lines of no task /slots showed joined (see _read_log)
        self.claims_by_order = 0  # live joins where more tasks than requests began: paired by start order (see _join)
        self.polls = 0
        self.direct = DirectTasks(clock=clock, log_read_bound_s=busy_interval_s)
        # Apple Silicon's MLX runner: no /slots, its requests told by its lines in Ollama's log, believed while
        # exactly one is running and answers /v1/status (pids of those that did at their last poll).
        self.mlx = MlxDirect(read_tick_s=busy_interval_s, clock=clock)
        self._mlx_answered: set[int] = set()
        self._mlx_out: list[RequestRecord] = []  # its generations to write (in flight, then finished)
        # Where each runner (by port) put its model, from its load lines in Ollama's log: they carry no port, and
        # count only inside a start sequence (``_StartSequence``) a runner found on that port confirms as its own.
        self.placements: dict[int, PlacementReader] = {}
        self._placement_pid: dict[int, int] = {}  # port → the runner process whose start sequence it is
        # The starts Ollama's log told of, not yet taken by their runner (the newest last; its lines are read into it).
        self._sequences: deque[_StartSequence] = deque(maxlen=MAX_START_SEQUENCES)
        self._loading_port: int | None = None
        self.load_lines_dropped = 0  # load lines outside a start sequence, or beyond a load's bounds
        # The runner's own waits before each task's prompt (analysis.runner_waits), per runner port (None: not known),
        # and the tasks whose waits changed and are not yet joined to a request (joined when /slots shows the task).
        self._waits: dict[int | None, WaitJoiner] = {}
        self._waits_unjoined: dict[tuple[int | None, int], float] = {}  # (port, task) → when read
        self._waits_queue: dict[str, RequestWaitsRow] = {}
        self.wait_lines_dropped = 0  # wait and task lines naming a slot or slot count the runner does not have

    # -- what others read ------------------------------------------------------------------

    def look_again(self) -> None:
        """Discover at the next tick (a runner process appeared or went)."""
        self._look_now = True

    def drain(self) -> list[ProgressSample]:
        """The rows queued since the last call (the service writes them after the in-flight requests)."""
        out, self._queue = self._queue, []
        return out

    def drain_direct(self) -> tuple[list[RequestRecord], list[str]]:
        """Direct generations to write (in flight, then finished) and ids of direct rows to delete (a proxied
        request's after all); the service writes them before ``drain()``'s rows, which may belong to them."""
        records, gone = self.direct.drain()
        mlx, self._mlx_out = self._mlx_out, []
        return records + mlx, gone

    def proxied_finished(self, rec: RequestRecord) -> None:
        """The service tells each finished proxied request: it may account for a runner task (never recorded twice)."""
        self.direct.proxied_finished(rec)
        self.mlx.proxied_finished(rec)

    def flags(self, ts_unix_s: float) -> list[RunnerFlags]:
        """Each runner found and the settings its command line gives (the settings in force), for the store."""
        return [
            RunnerFlags(
                ts_unix_s=ts_unix_s,
                pid=r.pid,
                port=r.port,
                kind=r.kind,
                digest=state.digest,
                model=state.model,
                ctx_size_tokens=r.n_ctx,
                parallel=r.n_parallel,
                batch_tokens=r.n_batch,
                ubatch_tokens=r.n_ubatch,
                cache_type_k=r.cache_type_k,
                cache_type_v=r.cache_type_v,
                flash_attn=r.flash_attn,
                gpu_layers=r.gpu_layers,
                threads=r.threads,
            )
            for state in self.runners.values()
            for r in (state.runner,)
        ]

    def _placement(self, state: RunnerState) -> RunnerPlacement | None:
        """The runner's placement from its own start sequence (None: not read, or not confirmed as this process's)."""
        port = state.runner.port
        reader = self.placements.get(port)
        if reader is None or self._placement_pid.get(port) != state.runner.pid:
            return None
        return reader.placement()

    def placement_rows(self, ts_unix_s: float) -> dict[int, list[RunnerDeviceRow]]:
        """Each found runner's placement from its own load lines, by port, for the store (runners whose load was
        not read, e.g. loaded before the collector started, have none)."""
        out: dict[int, list[RunnerDeviceRow]] = {}
        for state in self.runners.values():
            placement = self._placement(state)
            if placement is not None:
                port = state.runner.port
                out[port] = placement_rows(placement, ts_unix_s=ts_unix_s, port=port, model=state.model, digest=state.digest)
        return out

    def placement_of(self, model: str) -> RunnerPlacement | None:
        """Where the runner serving ``model`` put it, in its own load lines; None when no found runner serves it or
        its load was not read."""
        for state in self.runners.values():
            matches = state.model is not None and same_model(model, state.model)
            if matches and (placement := self._placement(state)) is not None:
                return placement
        return None

    def _fold_load_lines(self, events: list[LogEvent]) -> None:
        """A load line counts only inside the start sequence Ollama's log told of last (its ``starting llama-server``
        line, to the runner's listening line): one after the runner is up, or with no start, is dropped and counted."""
        for event in events:
            seq = self._sequences[-1] if self._sequences else None
            if event.kind == EventKind.RUNNER_START and event.port is not None:
                self._loading_port = event.port
                self._sequences.append(_StartSequence(event.port, event.read_unix_s))
            elif event.kind == EventKind.RUNNER_LOAD and event.load is not None:
                if seq is None or seq.up or not seq.reader.feed(event.load):
                    self.load_lines_dropped += 1
            elif event.kind in (EventKind.RUNNER_LISTENING, EventKind.RUNNER_STARTED) and seq is not None:
                seq.up = seq.up or event.port in (None, seq.port)
        self._adopt_sequences()

    def _started_after(self, seq: _StartSequence) -> RunnerState | None:
        """The runner found on the sequence's port if its process started after the start line was written."""
        for state in self.runners.values():
            started = state.started_unix_s
            if state.runner.port == seq.port and started is not None and started >= seq.read_unix_s - START_LINE_READ_LAG_S:
                return state
        return None

    def _adopt_sequences(self) -> None:
        """A start sequence becomes the placement of the runner on its port whose process started after its start line
        was written (a forged start line naming a running runner's port is not that runner's), once per runner process
        (a later sequence naming the same process changes nothing). The newest such sequence for a port is the one
        Ollama wrote for it; older ones for that port are let go."""
        for seq in reversed(list(self._sequences)):
            if seq not in self._sequences:
                continue  # let go as older than one taken
            state = self._started_after(seq)
            if state is None:
                continue
            pid = state.runner.pid
            if self._placement_pid.get(seq.port) == pid and self.placements.get(seq.port) is not seq.reader:
                continue  # this process's own sequence was taken already
            self.placements[seq.port] = seq.reader
            self._placement_pid[seq.port] = pid
            for other in [o for o in self._sequences if o.port == seq.port and o is not seq and o.read_unix_s <= seq.read_unix_s]:
                self._sequences.remove(other)
            if seq.up:
                self._sequences.remove(seq)  # complete and taken: nothing more to read into it
        live = {s.runner.port for s in self.runners.values()}
        for port in [p for p in self.placements if p not in live][: max(0, len(self.placements) - MAX_WAIT_RUNNERS)]:
            del self.placements[port]  # runners come and go: a gone runner's is let go
            self._placement_pid.pop(port, None)

    def drain_waits(self) -> list[RequestWaitsRow]:
        """The runner waits joined to requests since the last call (one row per request, the latest)."""
        out, self._waits_queue = list(self._waits_queue.values()), {}
        return out

    def _waits_target(self) -> tuple[int | None, dict[int, int | None]]:
        """Whose the next wait lines are (they carry no port): the runner Ollama started last, or the only one; and each
        found runner's slot count by port, from its command line (-np), to hold the lines' slot ids to."""
        port = self._loading_port
        if port is None and len(self.runners) == 1:
            port = next(iter(self.runners.values())).runner.port
        return port, {state.runner.port: state.runner.n_parallel for state in self.runners.values()}

    def _fold_waits(
        self, events: list[LogEvent], port: int | None, slots_by_port: dict[int, int | None]
    ) -> list[tuple[int | None, int, float]]:
        """The runner's waits and task lines, in the order it printed them: the (port, task, when read) whose waits
        changed, to join to requests on the loop. Runs in the log's worker thread; each line costs the same however
        many came before (the joiner's tables are bounded: analysis.runner_waits)."""
        started = [e.port for e in events if e.kind == EventKind.RUNNER_START and e.port is not None]
        if started:
            port = started[-1]  # like _fold_load_lines: the lines after a start are that runner's
        joiner = self._waits.get(port)
        if joiner is None:
            for old in list(self._waits)[: max(0, len(self._waits) - (MAX_WAIT_RUNNERS - 1))]:  # runners come and go
                del self._waits[old]
            joiner = self._waits[port] = WaitJoiner(slots_by_port.get(port) if port is not None else None)
        dropped_before = joiner.dropped
        changed: dict[tuple[int | None, int], float] = {}
        for event in events:
            tasks = []
            if event.kind == EventKind.RUNNER_WAIT and event.wait is not None:
                tasks = joiner.wait(event.wait)
            elif event.task_id is not None and event.kind == EventKind.LAUNCH:
                tasks = joiner.launch(event.slot_id, event.task_id)
            elif event.task_id is not None and event.kind == EventKind.NEW_PROMPT:
                tasks = joiner.new_prompt(event.task_id)
            elif event.task_id is not None and event.kind == EventKind.RELEASE:
                tasks = joiner.release(event.slot_id, event.task_id)
            for task in tasks:
                changed[(port, task.task_id)] = event.read_unix_s
        self.wait_lines_dropped += joiner.dropped - dropped_before
        # Only tasks the joiner still holds can be joined: a flood of launches leaves its newest MAX_TASKS_KEPT.
        return [(p, t, at) for (p, t), at in changed.items() if t in joiner.tasks]

    def _join_waits(self) -> None:
        by_task = {task: rid for (_pid, task), rid in self._tasks.items()} if len(self.runners) <= 1 else {}
        for (port, task_id), read_s in list(self._waits_unjoined.items()):
            task = self._waits.get(port, WaitJoiner()).tasks.get(task_id)
            if task is None:
                del self._waits_unjoined[(port, task_id)]
                continue
            rid = by_task.get(task_id)
            if rid is None and self.direct.unclaimed(task_id):
                rid = self.direct.record_id(task_id)
            if rid is not None:
                self._waits_queue[rid] = waits_row(rid, task, ts_unix_s=read_s, port=port)
                del self._waits_unjoined[(port, task_id)]
            elif self._clock() - read_s > 60.0:
                del self._waits_unjoined[(port, task_id)]  # no request was ever joined to it: let it go

    def awaits_first_reading(self, rec: RequestRecord, now_unix_s: float) -> bool:
        """True while a readable runner serves ``rec``'s model, nothing of ``rec`` has been read from it yet, and it
        was forwarded less than ``FIRST_READING_GRACE_S`` ago: its reading is due, an estimate would come first."""
        if rec.id in self._tracks or rec.first_token_ns is not None:
            return False
        if now_unix_s - rec.wall_s(rec.forwarded_ns or rec.received_ns) >= FIRST_READING_GRACE_S:
            return False  # not read in time (a runner that cannot be joined): the estimate, as before
        return any(
            state.model is not None and state.problem is None and same_model(rec.model, state.model)
            for state in self.runners.values()
        )

    def snapshot(self) -> list[dict[str, Any]]:
        """The runners and their slots now (counts only), for debugging."""
        return [r.as_json() for r in self.runners.values()]

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            try:
                self._step(pending)
            except Exception:  # a bug here must never stop the collector
                self.errors += 1
                log.exception("runner reader step failed")
            with_timeout = asyncio.ensure_future(stop.wait())
            await asyncio.wait({with_timeout}, timeout=self._until_next_step_s())
            with_timeout.cancel()
        if self._log_read is not None:  # a worker thread cannot be cancelled: let its read end (it is bounded)
            await asyncio.gather(self._log_read, return_exceptions=True)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _until_next_step_s(self) -> float:
        """The busy interval, or less when a runner's next poll is due sooner (the prefill pace). A poll still
        running past its next due time (a slow answer) sets the next one when it ends: it does not hurry the steps."""
        now = time.monotonic()
        due = [s.next_poll_s for s in self.runners.values() if not (s.polling and s.next_poll_s <= now)]
        if not due:
            return self.busy_interval_s
        return min(self.busy_interval_s, max(MIN_STEP_S, min(due) - now))

    def _spawn(self, pending: set[asyncio.Task[None]], coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    def _step(self, pending: set[asyncio.Task[None]]) -> None:
        now = time.monotonic()
        requests = list(self._in_flight())
        live_ids = {r.id for r in requests} | self.direct.active_ids()
        for rid in [rid for rid in self._tracks if rid not in live_ids]:
            del self._tracks[rid]
        self._tasks = {k: v for k, v in self._tasks.items() if v in live_ids}
        models = self._loaded_models()
        if self._discovery_due(now, requests, models) and not self._discovering:
            self._next_discover_s = now + self.discover_every_s
            self._maybe_rediscover(pending)
        for state in self.runners.values():
            if state.model is None:
                state.model = _model_of(state.digest, models)
            interval_s = self._interval_s(state, requests)
            if state.next_poll_s > now + interval_s and state.problem is None:
                state.next_poll_s = now  # a request began, or one needs more: poll now, not at the slower pace
            if not state.polling and now >= state.next_poll_s:
                state.polling = True
                state.next_poll_s = now + interval_s  # known while it runs: the reader's next step is timed by it
                self._spawn(pending, self._poll(state, requests, interval_s))
        self._read_log_if_written()
        self.direct.log_readable = self._log is not None and self._log.problem is None
        self.direct.step()

    def _discovery_due(self, now: float, requests: list[RequestRecord], models: Sequence[LoadedModel]) -> bool:
        """A round is due: asked for, the timer, or a model (requested or loaded) with no runner found for it."""

        def uncovered(names: Iterable[str]) -> bool:
            return any(not any(s.model and same_model(m, s.model) for s in self.runners.values()) for m in names)

        since_s = now - (self._next_discover_s - self.discover_every_s)  # since the last round began (or was skipped)
        return (
            self._look_now
            or now >= self._next_discover_s
            # (a cloud model's request runs on ollama.com: no runner will ever serve it here, none is looked for)
            or (since_s >= REDISCOVER_BUSY_S and uncovered({r.model for r in requests if not is_cloud(r.model)}))
            # a model loaded without a runner found: a direct client's generation may be running on it
            or (since_s >= REDISCOVER_LOADED_S and uncovered({m.name for m in models}))
        )

    def _maybe_rediscover(self, pending: set[asyncio.Task[None]]) -> None:
        """Start a round unless nothing could have changed: no runner or Ollama process came or went since the last
        one, and its answer needs no recheck (a port not bound yet)."""
        runner_set = self._watch.runner_set() if self._watch is not None else None
        quiet = (
            not self._look_now
            and runner_set is not None
            and runner_set == self._runner_set_at_round
            and self.discovery is not None
            and not self.discovery.recheck
        )
        if not quiet:
            self._look_now = False
            self._discovering = True
            self._runner_set_at_round = runner_set
            self._spawn(pending, self._rediscover())

    async def _rediscover(self) -> None:
        try:
            # In a daemon thread: discovery reads other processes' files and hashes model files (see off_loop_daemon).
            found = await off_loop_daemon(lambda: self._discover(self.ollama_url), "runner-discovery")
            digests = await off_loop_daemon(
                lambda: [self._digests.digest(r.model_path) if r.model_path else None for r in found.runners],
                "runner-digests",
            )
            started = await off_loop_daemon(lambda: [process_started_unix_s(r.pid) for r in found.runners], "runner-starts")
        except Exception:
            self.errors += 1
            log.exception("runner discovery failed")
            return
        finally:
            self._discovering = False
        if self.discovery is None or (found.problem, found.found_by) != (self.discovery.problem, self.discovery.found_by):
            log.info("runners: %s", f"found {found.found_by}" if found.found_by else found.problem)
        self.discovery = found
        kept: dict[int, RunnerState] = {}
        for runner, digest, started_s in zip(found.runners, digests, started, strict=True):
            old = self.runners.get(runner.pid)
            new = RunnerState(runner, digest=digest, started_unix_s=started_s)
            kept[runner.pid] = old if old is not None and old.runner == runner and old.started_unix_s == started_s else new
        gone = set(self.runners) - set(kept)
        if gone or set(kept) - set(self.runners):
            log.info("runners: %s", ", ".join(f"pid {r.runner.pid} port {r.runner.port}" for r in kept.values()) or "none")
        for pid in gone:
            self.direct.runner_gone(pid)
        self.runners = kept
        self._tasks = {k: v for k, v in self._tasks.items() if k[0] in kept}
        self._adopt_sequences()  # a runner Ollama just started: its start sequence is now confirmed

    def _interval_s(self, state: RunnerState, requests: list[RequestRecord]) -> float:
        """How often to read this runner now: fastest while a slot reads a proxied request's prompt (read taking
        its task, no token yet, no reading of it decoding); fast while any is not streamed or not yet seen
        decoding by a reading (its prompt's exact size comes from one); slower while all of them stream their
        tokens through the proxy; idle when none runs."""
        mine = [r for r in requests if state.model is not None and same_model(r.model, state.model)]
        if not mine:
            busy = any(s.is_processing for s in state.slots)  # a direct client's generation: read it as closely
            return self.busy_interval_s if busy else self.idle_interval_s
        tracks = [(r, self._tracks.get(r.id)) for r in mine]
        if any(t is not None and t.prefill_rows and not t.decode_rows and r.first_token_ns is None for r, t in tracks):
            return min(PREFILL_INTERVAL_S, self.busy_interval_s)  # its slot reads the prompt: not while it queues
        for r, track in tracks:
            if not r.stream or r.first_token_ns is None or track is None or not track.exact:
                return self.busy_interval_s
        return max(self.busy_interval_s, STREAMED_DECODE_INTERVAL_S)

    async def _poll(self, state: RunnerState, requests: list[RequestRecord], interval_s: float) -> None:
        # The next poll is due an interval after this one began. Counted from its end instead, it fell just after
        # the reader's next step (steps come every busy interval too): 4 Hz read as 2 Hz, 1 s as 1.25 s, and
        # each prefill reading was up to 0.5 s late, which the ETA extrapolates over the rest of the prompt.
        began_s = time.monotonic()
        try:
            asked = self._clock()
            readings, problem = await self._fetch(state.runner)
            self.polls += 1
            ts = self._clock()
            if problem is not None and problem != state.problem:
                log.info(
                    "runner pid %d port %d: %s; its requests keep their estimates", state.runner.pid, state.runner.port, problem
                )
            state.problem = problem
            if readings is not None:
                state.slots = readings
                self._join(state, readings, requests, ts, asked)
            elif "connect" in (problem or ""):
                self._look_now = True  # gone or restarted: look again
        except Exception:
            self.errors += 1
            log.exception("reading runner pid %d failed", state.runner.pid)
        finally:
            state.polling = False
            if state.problem is not None and interval_s < self.idle_interval_s:
                interval_s = RETRY_INTERVAL_S  # busy but unreadable: try again, not at the busy pace
            state.next_poll_s = began_s + interval_s

    async def _fetch(self, runner: Runner) -> tuple[list[SlotReading] | None, str | None]:
        if runner.kind == MLX_RUNNER:  # Apple Silicon's MLX runner has no /slots: never asked (its 404 says nothing)
            return None, await self._mlx_status(runner)
        timeout = aiohttp.ClientTimeout(total=SLOTS_TIMEOUT_S)
        try:
            async with self._session.get(runner.base_url + "/slots", timeout=timeout, allow_redirects=False) as resp:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:  # the prompt text makes it long; beyond this, not worth reading
                        return None, f"/slots answered more than {MAX_BODY_BYTES} bytes"
                return classify_slots_answer(resp.status, bytes(body), slots_cap(runner.n_parallel))
        except TimeoutError:
            return None, f"/slots did not answer within {SLOTS_TIMEOUT_S:g} s"
        except aiohttp.ClientConnectorError as exc:
            return None, f"cannot connect to the runner on port {runner.port}: {exc.os_error.strerror or exc}"
        except (aiohttp.ClientError, OSError) as exc:
            return None, f"/slots failed: {type(exc).__name__}: {exc}"

    async def _mlx_status(self, runner: Runner) -> str:
        """Ask an MLX runner its /v1/status: one that answers 200 is running, so its lines in the log are believed."""
        timeout = aiohttp.ClientTimeout(total=SLOTS_TIMEOUT_S)
        problem = MLX_NO_SLOTS
        try:
            async with self._session.get(runner.base_url + "/v1/status", timeout=timeout, allow_redirects=False) as resp:
                ok = resp.status == 200
                if not ok:
                    problem = f"{MLX_NO_SLOTS}; its /v1/status answered HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            ok, problem = False, f"cannot read the MLX runner on port {runner.port}: {type(exc).__name__}"
        if ok:
            self._mlx_answered.add(runner.pid)
        else:
            self._mlx_answered.discard(runner.pid)
        self._mlx_runners_seen()
        return problem

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

    # -- joining readings to requests -----------------------------------------------------------

    def _join(
        self,
        state: RunnerState,
        readings: list[SlotReading],
        requests: list[RequestRecord],
        ts: float,
        asked: float | None = None,
    ) -> None:
        pid = state.runner.pid
        if state.model is None:
            return  # which model it serves is not known yet (/api/ps not read): no join is safe
        self._claim_new_tasks(pid, state.model, readings, requests)
        for slot in readings:
            rid = self._tasks.get((pid, slot.task_id or 0)) if slot.task_id is not None else None
            if rid is not None and slot.processed_tokens is not None:
                self._add(rid, slot, ts)
        claims = {task: rid for (p, task), rid in self._tasks.items() if p == pid}
        ref = RunnerRef(pid, state.runner.port, state.model)
        for rid, slot in self.direct.slots_read(ref, readings, ts, claims, asked=asked):
            if slot.processed_tokens is not None:
                self._add(rid, slot, ts)

    def _claim_new_tasks(self, pid: int, model: str, readings: list[SlotReading], requests: list[RequestRecord]) -> None:
        """Proxied requests of this runner's model with no task yet take the tasks its slots began since the last poll."""
        mine = sorted((r for r in requests if same_model(r.model, model)), key=lambda r: (r.started_at_unix_s, r.id))
        taken = set(self._tasks.values())
        free = [r for r in mine if r.id not in taken and r.first_token_ns is None]
        new = sorted(
            (s for s in readings if s.is_processing and s.task_id is not None and (pid, s.task_id) not in self._tasks),
            key=lambda s: s.task_id or 0,
        )
        # Nothing in flight tells which new task is which request (the runner's count of a request's prompt comes
        # with its reply): the oldest request takes the oldest task, a tie-break only. When more tasks began than
        # requests, one may be a direct client's: the claim is checked against the request's own prompt count when
        # it finishes, and moved to the task of that size (DirectTasks.proxied_finished).
        if len(new) > len(free) > 0:
            self.claims_by_order += 1
        for slot, req in zip(new, free, strict=False):
            self._tasks[(pid, slot.task_id or 0)] = req.id

    def _track(self, rid: str) -> _Track:
        track = self._tracks.get(rid)
        if track is None:
            track = self._tracks[rid] = _Track(rid)
        return track

    def _add(self, rid: str, slot: SlotReading, ts: float) -> None:
        track = self._track(rid)
        key = (slot.processed_tokens, slot.cached_tokens, slot.decoded_tokens, slot.ctx_tokens)
        if key == track.last_key:
            return  # nothing moved since the last row
        track.last_key = key
        if slot.prompt_size_tokens is not None:
            self._sized(track, slot.prompt_size_tokens, exact=True)
        sample = ProgressSample(
            request_id=rid,
            ts_unix_s=ts,
            source=ProgressSource.SLOTS,
            processed_tokens=slot.processed_tokens or 0,
            prompt_tokens=track.prompt_tokens,
            cached_tokens=slot.cached_tokens,
            decoded_tokens=slot.decoded_tokens,
            ctx_used_tokens=slot.ctx_tokens,
            n_ctx=slot.n_ctx,
        )
        (track.decode_rows if slot.decoding else track.prefill_rows).append(sample)
        self._queue.append(sample)

    def _sized(self, track: _Track, prompt_tokens: int, *, exact: bool) -> None:
        """The prompt's size is now known (exactly, or from a log line's rounded fraction): queue the earlier
        rows again with it. Rows keyed alike in the store, the later write wins."""
        if track.prompt_tokens == prompt_tokens:
            track.exact = track.exact or exact
            return
        if track.exact and (not exact or prompt_tokens < (track.prompt_tokens or 0)):
            return  # an exact size is only ever raised (a reading racing the prompt's last batch may read low)
        track.prompt_tokens, track.exact = prompt_tokens, exact
        for rows in (track.prefill_rows, track.decode_rows):
            for i, row in enumerate(rows):
                if row.prompt_tokens != prompt_tokens:
                    rows[i] = replace(row, prompt_tokens=prompt_tokens)
                    self._queue.append(rows[i])

    # -- the log ----------------------------------------------------------------------------------

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

            events, changed = await asyncio.to_thread(read_and_fold)
            self._take_log(source, events, list(self._in_flight()), changed)
        except Exception:
            self.errors += 1
            log.exception("reading Ollama's log failed")
        finally:
            self._log_read = None

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


# -- python -m collectors.ollama ------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect comes back as its own status (see ``classify_slots_answer``), never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())  # loopback: never via a proxy
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY_BYTES + 1)


def read_once(ollama_url: str) -> dict[str, Any]:
    """Discover the runners, match their models through /api/ps and read each one's /slots once."""
    from collectors.ollama.poller import PollError, parse_ps

    found = discover(ollama_url)
    models: list[LoadedModel] = []
    ps_problem = None
    try:
        status, body = _get(ollama_url.rstrip("/") + "/api/ps", 5.0)
        models = parse_ps(json.loads(body), time.time()) if status == 200 else []
        if status != 200:
            ps_problem = f"/api/ps answered HTTP {status}"
    except (OSError, ValueError, RecursionError, PollError) as exc:
        ps_problem = f"/api/ps: {type(exc).__name__}: {str(exc)[:120]}"
    digests = DigestCache()
    out = []
    for runner in found.runners:
        digest = digests.digest(runner.model_path) if runner.model_path else None
        state = RunnerState(runner, digest=digest, model=_model_of(digest, models))
        try:
            status, body = _get(runner.base_url + "/slots", SLOTS_TIMEOUT_S)
            readings, state.problem = classify_slots_answer(status, body, slots_cap(runner.n_parallel))
            if len(body) > MAX_BODY_BYTES:
                readings, state.problem = None, f"/slots answered more than {MAX_BODY_BYTES} bytes"
            state.slots = readings or []
        except OSError as exc:
            state.problem = f"cannot read /slots: {exc}"
        out.append(state.as_json())
    return {"ollama": ollama_url, "found_by": found.found_by, "problem": found.problem, "ps_problem": ps_problem, "runners": out}
