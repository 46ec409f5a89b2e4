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

Its parts, one module each, are base classes of ``RunnerReader`` over the state ``runner_state.ReaderState``
declares: ``runner_join`` (readings joined to requests, their rows queued), ``runner_loads`` (placements and waits
from the log's load and wait lines) and ``runner_log`` (the log read and its lines joined); ``runner_slots`` asks a
runner for its /slots and reads the answer. This module is the loop: discovery, the polling pace, the polls.

``python -m collectors.ollama --ollama URL --json`` (``runner_slots.read_once``) prints the runners found and their slots now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from analysis.model_names import is_cloud, same_model
from analysis.records import LoadedModel, ProgressSample, RequestRecord, RunnerFlags
from analysis.runner_placement import PlacementReader
from analysis.runner_wait_fold import WaitJoiner
from analysis.runner_wait_tasks import RequestWaitsRow
from collectors.beat import until_next_beat_s
from collectors.ollama.direct import DirectTasks
from collectors.ollama.discovery import (
    MLX_RUNNER,
    DigestCache,
    Discoverer,
    Discovery,
    ProcessWatch,
    Runner,
    RunnerSet,
    off_loop_daemon,
)
from collectors.ollama.log import LogSource, LogTail
from collectors.ollama.log_watch import LogNotices
from collectors.ollama.mlx_direct import MlxDirect
from collectors.ollama.runner_loads import MAX_START_SEQUENCES
from collectors.ollama.runner_log import RunnerLog
from collectors.ollama.runner_slots import SLOTS_TIMEOUT_S, fetch_slots
from collectors.ollama.runner_state import RunnerState, StartSequence, Track, model_of, process_started_unix_s
from collectors.ollama.slots import SlotReading

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
# Nothing running, nothing read from the log, no runner busy for this long, and the kernel tells of the log's
# changes (collectors.ollama.log_watch): the reader steps at the idle interval, woken early by a log line or a
# proxied request. Longer than the direct tracker's waits after a task ends (GRACE_S, LOG_WAIT_S), so what ended is
# decided at the busy pace. Looking four times a second was the largest part of an idle collector (issue 44).
QUIET_AFTER_S = 5.0
RETRY_INTERVAL_S = 2.0  # a runner that could not be read while its model is busy: try again this often
DISCOVER_EVERY_S = 10.0
STREAMED_DECODE_INTERVAL_S = 1.0  # see the module doc
# A proxied request the runner of its model can be read for: the collector's estimate waits this long after the
# request was forwarded for the runner's first reading of it (a poll at the busy pace, then the service's next
# tick), so the Live card does not show an estimate for the moment before the runner's own reading replaces it.
FIRST_READING_GRACE_S = 2.0
REDISCOVER_BUSY_S = 1.0  # a request with no runner for its model: look again this often
REDISCOVER_LOADED_S = 3.0  # a model in /api/ps with no runner found (just loaded, or a remote Ollama): this often
MLX_NO_SLOTS = "an MLX runner (Apple Silicon's engine): it has no /slots; its requests are told by Ollama's log"


class RunnerReader(RunnerLog):
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
        quiet_after_s: float = QUIET_AFTER_S,
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
        self.quiet_after_s = quiet_after_s
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
        self._tracks: dict[str, Track] = {}
        self._queue: list[ProgressSample] = []
        self._log: LogSource | None = log_source if log_source is not None else LogTail(log_path) if log_path else None
        self._log_problem: str | None = None  # as last said in the collector's log
        # Generations Ollama's log ended (access lines) since the runner last wrote a line of a task: the runner's
        # per-request lines may no longer reach the log (written only with OLLAMA_DEBUG: docs/ollama-api.md §13).
        # ``runner_lines_missing`` says so, with the fix, once it is clear.
        self._generations_without_runner_lines = 0
        self.runner_lines_missing: str | None = None
        self._log_read: asyncio.Future[None] | None = None  # the log read in a worker thread now, if any
        self.log_notices = LogNotices(self._log.watched_path if self._log is not None else None)
        # When the last read that reached the log's end began (None: the last read stopped short, or no watch):
        # lines read after it must have come with a change notice (LogNotices.check_read).
        self._log_read_to_end_s: float | None = None
        self._active_s = float("-inf")  # monotonic: the last step with anything running, or lines read
        self._woken: asyncio.Future[None] | None = None  # set by wake(): the next step now
        self.steps = 0
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
        # count only inside a start sequence (``StartSequence``) a runner found on that port confirms as its own.
        self.placements: dict[int, PlacementReader] = {}
        self._placement_pid: dict[int, int] = {}  # port → the runner process whose start sequence it is
        # The starts Ollama's log told of, not yet taken by their runner (the newest last; its lines are read into it).
        self._sequences: deque[StartSequence] = deque(maxlen=MAX_START_SEQUENCES)
        self._loading_port: int | None = None
        self.load_lines_dropped = 0  # load lines outside a start sequence, or beyond a load's bounds
        # The runner's own waits before each task's prompt (analysis.runner_wait_fold), per runner port (None: not known),
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
        loop = asyncio.get_running_loop()
        stopped = asyncio.ensure_future(stop.wait())  # one waiter for every step (a task each step cost more)
        self.log_notices.start(loop, self.wake)
        try:
            while not stop.is_set():
                try:
                    self._step(pending)
                except Exception:  # a bug here must never stop the collector
                    self.errors += 1
                    log.exception("runner reader step failed")
                stepped_s = time.monotonic()
                self._woken = loop.create_future()
                waiters: set[asyncio.Future[Any]] = {stopped, self._woken}
                await asyncio.wait(waiters, timeout=self._until_next_step_s(), return_when=asyncio.FIRST_COMPLETED)
                # Woken (a log line, a proxied request): no sooner than the busy pace after the last step, so a
                # chatty log is read no more often than it was looked at, and a line still waits at most one step.
                rest_s = stepped_s + self.busy_interval_s - time.monotonic()
                if self._woken.done() and rest_s > 0:
                    await asyncio.wait({stopped}, timeout=rest_s)
        finally:
            stopped.cancel()
            self.log_notices.close()
        if self._log_read is not None:  # a worker thread cannot be cancelled: let its read end (it is bounded)
            await asyncio.gather(self._log_read, return_exceptions=True)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def wake(self) -> None:
        """Step now, not at the quiet pace: something began (the service calls it when a proxied request does)."""
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    def quiet(self) -> bool:
        """Stepping at the idle interval: nothing for ``quiet_after_s``, and the log's changes are told, not looked
        for (or no log is read)."""
        told = self._log is None or self.log_notices.working  # no log: no line's stamp rests on looking
        return told and time.monotonic() - self._active_s >= self.quiet_after_s

    def _until_next_step_s(self) -> float:
        """The busy interval (the idle one while quiet), or less when a runner's next poll is due sooner (the
        prefill pace). A poll still running past its next due time (a slow answer) sets the next one when it ends:
        it does not hurry the steps."""
        now = time.monotonic()
        # On the collector's beat (collectors.beat): a quiet step wakes the loop with the sampler's tick.
        period_s = self.idle_interval_s if self.quiet() else self.busy_interval_s
        pace_s = until_next_beat_s(asyncio.get_running_loop().time(), period_s)
        due = [s.next_poll_s for s in self.runners.values() if not (s.polling and s.next_poll_s <= now)]
        if not due:
            return pace_s
        return min(pace_s, max(MIN_STEP_S, min(due) - now))

    def _spawn(self, pending: set[asyncio.Task[None]], coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    def _step(self, pending: set[asyncio.Task[None]]) -> None:
        now = time.monotonic()
        self.steps += 1
        requests = list(self._in_flight())
        live_ids = {r.id for r in requests} | self.direct.active_ids()
        if live_ids or self._log_read is not None:
            self._active_s = now
        for rid in [rid for rid in self._tracks if rid not in live_ids]:
            del self._tracks[rid]
        self._tasks = {k: v for k, v in self._tasks.items() if v in live_ids}
        models = self._loaded_models()
        if self._discovery_due(now, requests, models) and not self._discovering:
            self._next_discover_s = now + self.discover_every_s
            self._maybe_rediscover(pending)
        for state in self.runners.values():
            if state.model is None:
                state.model = model_of(state.digest, models)
            interval_s = self._interval_s(state, requests)
            if interval_s < self.idle_interval_s:
                self._active_s = now
            if state.next_poll_s > now + interval_s and state.problem is None:
                state.next_poll_s = now  # a request began, or one needs more: poll now, not at the slower pace
            if not state.polling and now >= state.next_poll_s:
                state.polling = True
                state.next_poll_s = now + interval_s  # known while it runs: the reader's next step is timed by it
                self._spawn(pending, self._poll(state, requests, interval_s))
        self.log_notices.keep_open()
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
        return await fetch_slots(self._session, runner)

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

    # -- joining readings to requests -----------------------------------------------------------

    # -- the log ----------------------------------------------------------------------------------
