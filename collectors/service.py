"""The collector process's orchestration, on one asyncio loop (testable in-process).

Start order: lock the data folder, open the store (marking requests a killed collector
left in flight), start the proxy, then the loops — Ollama poller, samplers + heartbeat
+ in-flight snapshots every interval, retention every hour. Stop order is the reverse:
stop accepting, let running streams finish for a moment, stop the loops, write what is
queued, release the lock.

Blocking work (NVML, psutil, the SQLite writer) runs off the loop, so the proxy's
per-chunk path never waits for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.exposition import generate_latest

from analysis.ceilings import ceilings_for_request
from analysis.energy import energy_between
from analysis.hardware import match_gpu
from analysis.loopback import is_loopback
from analysis.model_facts import model_facts_from_show
from analysis.model_names import is_cloud, same_model
from analysis.records import (
    GPU_SOURCE_NAMES,
    CollectorInfo,
    GpuKind,
    GpuSample,
    HostBandwidth,
    HostSample,
    Outcome,
    RequestRecord,
    RunnerFlags,
)
from analysis.runner_load_rows import RunnerDeviceRow
from analysis.runner_load_words import placement_in_use
from analysis.wait_split import WaitSplit
from collectors.beat import until_next_beat_s
from collectors.config import Settings, SettingsError, prepare_data_dir
from collectors.gpu.apple import detect_apple_gpu
from collectors.gpu.choose import LOAD_PYNVML, GpuChoice, choose_gpu_sampler
from collectors.gpu.sim import SimGpuSource
from collectors.gpu.state import GpuSampler, GpuState
from collectors.host.bandwidth import measure_host_bandwidth, same_machine
from collectors.host.sampler import HostSampler, OllamaProcesses
from collectors.lab.ingest import LabIngester
from collectors.lock import CollectorLock, UnsafeFileError
from collectors.metrics import (
    CONTENT_TYPE,
    LabelSet,
    MetricsSnapshot,
    RequestStats,
    SlotUse,
    phase_windows,
    registry_for,
)
from collectors.ollama.discovery import ProcessWatch, ollama_local_port, with_loaded_models
from collectors.ollama.journal import JournalTail
from collectors.ollama.log import LogSource, LogTail
from collectors.ollama.log_access import LogAccessFacts, log_problem
from collectors.ollama.poller import PS_AFTER_FINISH_S, OllamaPoller, ps_at_interval
from collectors.ollama.progress_estimate import ProgressEstimator
from collectors.ollama.prompt_fit import FitBook, FitTap, count_tokens, read_ollama_start_lines, wants_count, with_count
from collectors.ollama.runners import RunnerReader
from collectors.proxy import refusals
from collectors.proxy.recording import RecordingProxy
from store import queries
from store.ops import (
    REDERIVE_BATCH,
    ApplyRetention,
    DeleteDirect,
    MarkInterrupted,
    PutExperiment,
    PutGpuSamples,
    PutHeartbeat,
    PutHostBandwidth,
    PutHostSample,
    PutOllamaSettings,
    PutProgress,
    PutRequest,
    PutRequestWaits,
    PutRunnerPlacement,
    PutRunners,
    RederivePhases,
)
from store.tables import RequestRow
from store.writer import DAY_S, BackgroundWriter, RetentionPolicy

log = logging.getLogger(__name__)

METRICS_PATH = "/phasewatch/metrics"
RETENTION_EVERY_S = 300.0  # ages; the size bound is also checked after each commit
INTERRUPTED_REASON = "the collector stopped before this request ended"
WRITER_CLOSE_TIMEOUT_S = 10.0
GPU_HISTORY_TICKS = 600  # GPU samples kept for energy by phase (10 min at the default interval)
ENERGY_PENDING_MAX = 10_000  # finished requests' phase windows waiting for the GPU sample after their end
# Finished requests whose decode ceiling is not known yet (the model's /api/show is read after it loads, often
# after the first request on a cold model ended): retried each tick for this long, at most this many.
CEILING_PENDING_MAX = 1_000
CEILING_PENDING_S = 60.0


PhaseWindow = tuple[str, float, float]  # (phase, start, end) in wall-clock seconds, as metrics.phase_windows gives


def _without_text(row: RequestRow) -> RequestRow:
    """The row without its prompt and reply (what the decode ceiling needs is the numbers)."""
    if row.prompt_text is None and row.response_text is None:
        return row
    return dataclasses.replace(row, prompt_text=None, response_text=None)


class StoreOpenError(RuntimeError):
    """The store in the data folder cannot be opened (the text says why)."""


def _log_named(s: Settings) -> str:
    """Which Ollama log the collector reads, for the sidebar (through the lock file: ``LockInfo.ollama_log``)."""
    if s.ollama_journal is not None:
        return f"the journal of {s.ollama_journal}"
    return str(s.ollama_log) if s.ollama_log is not None else ""


class CollectorService:
    """Everything ``python -m collectors`` runs. ``await start()``, then ``await stop()``.

    ``nvml`` is the ``pynvml`` module (tests pass a fake one); None imports the real one. The GPU
    source is chosen at start (``collectors.gpu.choose``): NVML, amdsmi, AMD sysfs, macmon, IORegistry.
    ``host_bandwidth`` measures this host's memory bandwidth, once, in a background thread at start,
    unless the store already holds a measurement of this machine; None measures nothing.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        nvml: ModuleType | Any | None = None,
        gpu_choose: Callable[..., GpuChoice] = choose_gpu_sampler,
        max_backoff_s: float | None = None,
        clock: Callable[[], float] = time.time,
        host_bandwidth: Callable[[], HostBandwidth] | None = measure_host_bandwidth,
        apple_chip: Callable[[], tuple[str, int | None] | None] = detect_apple_gpu,
    ) -> None:
        self.settings = settings
        self._measure_host_bandwidth = host_bandwidth
        self._detect_apple_chip = apple_chip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nvml = nvml
        self._gpu_choose = gpu_choose  # tests hand in one with fake drivers (amdsmi, macmon-lib)
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self.lock = CollectorLock(settings.data_dir)
        self.writer: BackgroundWriter | None = None
        self.proxy: RecordingProxy | None = None
        self.poller: OllamaPoller | None = None
        self.stats = RequestStats.for_upstream(settings.ollama_url)
        self.stats.ceiling_ratio_of = self._decode_ceiling_ratio
        self.stats.waits.slots_of = self._slots_of
        self.registry = registry_for(self.metrics_snapshot)
        self._loaded_names: set[str] | None = None  # /api/ps names at the last tick; None: not seen yet
        self._load_labels = LabelSet()
        self.loads: dict[str, int] = {}
        self.unloads: dict[str, int] = {}
        self.in_flight_by_phase: dict[str, int] = {}
        self.energy_j_by_phase: dict[str, float] = {}
        self._gpu_history: collections.deque[list[GpuSample]] = collections.deque(maxlen=GPU_HISTORY_TICKS)
        # Finished requests whose phases' energy is not counted yet: their windows only (never the row, whose
        # text may be large), and only while a GPU source exists (nothing else ever drains them).
        self._energy_pending: collections.deque[list[PhaseWindow]] = collections.deque(maxlen=ENERGY_PENDING_MAX)
        self._ceiling_pending: collections.deque[tuple[float, RequestRow]] = collections.deque(maxlen=CEILING_PENDING_MAX)
        self.runners: RunnerReader | None = None  # live prefill/decode progress from Ollama's runners
        self._runners_written: list[RunnerFlags] | None = None  # as last stored, times zeroed
        self._placements_written: dict[int, list[RunnerDeviceRow]] = {}  # by runner port, as last stored, times zeroed
        self._log_source: LogSource | None = None  # Ollama's log: --ollama-log's file or --ollama-journal's unit
        self.fit = FitBook()  # cut prompts and the settings in force, from that log (collectors.ollama.prompt_fit)
        self._counting: set[asyncio.Task[None]] = set()  # prompts being counted by a runner's /tokenize
        self._finished_since_asked = False  # a proxied request finished since the poller last asked (_ollama_busy)
        self._finish_asked_at_s = -PS_AFTER_FINISH_S  # monotonic: when a finish last made the poller ask /api/ps
        self.gpu_state = GpuState(GpuKind.NONE, "not started")
        self.latest_gpus: list[GpuSample] = []
        self.latest_host: HostSample | None = None
        self._session: aiohttp.ClientSession | None = None
        self._gpu: GpuSampler | None = None
        self._sim_source: SimGpuSource | None = None
        self._host: HostSampler | None = None
        self._lab: LabIngester | None = None
        self._host_facts = LogAccessFacts()  # what the sidebar's log advice rests on (looked up every 30 s)
        self._ollama_is_local = ollama_local_port(settings.ollama_url) is not None
        self._estimator = ProgressEstimator(settings.db_path, clock)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listen = ""
        self.unwritten_records = 0  # set by stop() when the store would not take everything
        self.unwritten_error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def listen(self) -> str:
        """The proxy's real address (with the chosen port when --listen asked for port 0)."""
        return self._listen

    async def start(self) -> None:
        """Raises SettingsError (bad folder, cannot listen), LockHeldError or StoreOpenError."""
        s = self.settings
        prepare_data_dir(s.data_dir)
        # listen="" until the proxy is up: readers take a non-empty address to mean "ready".
        try:
            self.lock.acquire(listen="", ollama_url=s.ollama_url, demo=s.demo)
        except UnsafeFileError as exc:
            raise SettingsError(str(exc)) from None
        try:
            await self._start_locked()
        except BaseException:
            await self.stop()
            raise

    async def _start_locked(self) -> None:
        s = self.settings
        retention = RetentionPolicy(
            samples_max_age_s=s.samples_retention_days * DAY_S,
            requests_max_age_s=s.requests_retention_days * DAY_S,
            max_bytes=s.max_db_bytes,
        )
        try:
            self.writer = BackgroundWriter(s.db_path, retention=retention)
        except Exception as exc:
            raise StoreOpenError(f"cannot open the store {s.db_path}: {exc}") from exc
        self._loop = asyncio.get_running_loop()
        self.writer.submit(MarkInterrupted(INTERRUPTED_REASON))
        # Lab runs are separate processes writing result files; only this process writes the store.
        self._lab = LabIngester(s.data_dir, self._submit_experiment)
        self.writer.submit(ApplyRetention(self._clock()))
        self._rederive_phases()

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), trust_env=False)
        processes = OllamaProcesses(pids=s.ollama_pids, demo=s.demo)
        if s.demo:
            self._sim_source = SimGpuSource(s.ollama_url, clock=self._clock)
            self.gpu_state = self._sim_source.state
        else:
            nvml = self._nvml
            choice = await asyncio.to_thread(
                self._gpu_choose,
                nvml=LOAD_PYNVML if nvml is None else lambda: nvml,
                processes=processes,
                ollama_vram_bytes=self._ollama_vram_bytes,
            )
            self._gpu = choice.sampler
            self.gpu_state = choice.state
        log.info("GPU: %s%s", self.gpu_state.kind, f" ({self.gpu_state.message})" if self.gpu_state.message else "")
        self._host = await asyncio.to_thread(HostSampler, processes, clock=self._clock)

        self.proxy = RecordingProxy(
            s.ollama_url,
            self._on_record,
            record_text=s.record_text,
            limits=s.limits,
            allowed_hosts=s.allowed_hosts,
            allowed_origins=s.allowed_origins,
            token=s.token,
            on_begin=self._request_began,
        )
        self.proxy.add_local_route("GET", METRICS_PATH, self._metrics_handler)
        try:
            await self.proxy.start(s.listen.host, s.listen.port)
        except OSError as exc:
            self.proxy = None
            raise SettingsError(f"{exc.strerror or exc}; choose another --listen address or stop what uses it") from None
        host = s.listen.host
        self._listen = f"[{host}]:{self.proxy.port}" if ":" in host else f"{host}:{self.proxy.port}"
        self.lock.update(listen=self._listen, ollama_url=s.ollama_url, demo=s.demo, ollama_log=_log_named(s))
        if not is_loopback(host):
            log.warning(
                "listening on %s, which is not a loopback address: other machines with the token can use Ollama "
                "through it, and their requests are recorded",
                self._listen,
            )

        kwargs = {} if self._max_backoff_s is None else {"max_backoff_s": self._max_backoff_s}
        watch = ProcessWatch() if self._ollama_is_local else None  # a remote one's processes are not here
        self.poller = OllamaPoller(
            s.ollama_url,
            self._session,
            self.writer,
            interval_s=s.interval_s,
            clock=self._clock,
            busy=self._ollama_busy,
            processes_changed=(lambda: self._runner_processes_changed(watch)) if watch else lambda: False,
            **kwargs,
        )
        poller, proxy = self.poller, self.proxy
        if s.ollama_journal is not None:
            self._log_source = JournalTail(s.ollama_journal, journal_dir=s.journal_dir)
        elif s.ollama_log is not None:
            self._log_source = LogTail(s.ollama_log)
            started = await asyncio.to_thread(read_ollama_start_lines, s.ollama_log, self._clock())
            if started is not None:  # Ollama wrote them when it started, before this collector
                self.fit.start_with(started, self._clock())
        if self._log_source is not None:
            self._log_source = FitTap(self._log_source, self.fit)
        self.runners = RunnerReader(
            s.ollama_url,
            self._session,
            in_flight=proxy.in_flight_heads,
            loaded_models=lambda: poller.state.models,
            log_source=self._log_source,
            clock=self._clock,
            watch=watch,  # no timer round while no runner process came or went
        )
        self._tasks = [
            asyncio.create_task(self.poller.run(self._stop), name="ollama-poller"),
            asyncio.create_task(self.runners.run(self._stop), name="runner-reader"),
            asyncio.create_task(self._tick_loop(), name="samplers"),
            asyncio.create_task(self._retention_loop(), name="retention"),
        ]
        if self._measure_host_bandwidth is not None:
            self._tasks.append(asyncio.create_task(self._host_bandwidth_once(), name="host-bandwidth"))
        log.info(
            "recording on %s for %s; data in %s%s",
            self._listen,
            s.ollama_url,
            s.data_dir,
            " (demo)" if s.demo else "",
        )

    async def stop(self) -> None:
        """Stop accepting, finish, flush and release. Safe to call more than once."""
        self._stop.set()
        if self.proxy is not None:
            await self.proxy.stop()  # finished streams reach _on_record before this returns
            self.proxy = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._log_source is not None:  # after the reader's task ended: nothing reads it any more
            await asyncio.to_thread(self._log_source.close)  # journalctl is stopped and reaped
            self._log_source = None
        if self.writer is not None:
            writer, self.writer = self.writer, None
            if not await asyncio.to_thread(writer.close, WRITER_CLOSE_TIMEOUT_S):
                self.unwritten_records = writer.pending_count
                self.unwritten_error = writer.last_error
                log.error("the store did not take %d records before closing: %s", self.unwritten_records, writer.last_error)
        if self._gpu is not None:
            await asyncio.to_thread(self._gpu.close)
            self._gpu = None
        if self._sim_source is not None:
            self._sim_source.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.lock.release()

    async def run_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # -- recording -----------------------------------------------------------------------

    def _runner_processes_changed(self, watch: ProcessWatch) -> bool:
        """For the poller (/api/ps now) and the runner reader (look for runners now): a runner process appeared or
        went. Without Ollama's log nothing else says a runner started, and its first tasks would go unseen."""
        changed = watch.runners_changed()
        if changed and self.runners is not None:
            self.runners.look_again()
        return changed

    def _ollama_busy(self) -> bool:
        """For the poller's pace (/api/ps every interval while this holds, poller.ps_at_interval): a request finished
        (its model's load and expiry show in /api/ps after it; at most every PS_AFTER_FINISH_S), a runner not yet
        matched to its model, or a proxied request running that no runner's /slots shows."""
        now_s = time.monotonic()
        finished = self._finished_since_asked and now_s - self._finish_asked_at_s >= PS_AFTER_FINISH_S
        if finished:  # else kept: read once PS_AFTER_FINISH_S has passed
            self._finished_since_asked, self._finish_asked_at_s = False, now_s
        runners = list(self.runners.runners.values()) if self.runners is not None else []
        return ps_at_interval(
            finished=finished,
            # A runner whose model /api/ps has not listed yet (it appeared while its model was still loading): its
            # slots cannot be matched to a model until /api/ps names it, so ask at the busy pace until then.
            unmatched=any(state.model is None for state in runners),
            running_models=[r.model for r in self.proxy.in_flight_heads()] if self.proxy is not None else [],
            slots_models=[state.model for state in runners if state.model and state.slots and state.problem is None],
        )

    def _request_began(self) -> None:
        if self.runners is not None:  # a quiet runner reader steps now, to read the runner of its model at once
            self.runners.wake()

    def _on_record(self, record: RequestRecord) -> None:
        """Called by the proxy once per finished request (and by the tick for a finished direct one), on the loop:
        only enqueue."""
        self._finished_since_asked = True
        record = self.fit.annotate(record, self.poller.state.models if self.poller is not None else (), self._clock())
        self._count_prompt_later(record)
        if not record.direct and self.runners is not None:
            self.runners.proxied_finished(record)  # it may account for a runner task: never recorded twice
        if self.writer is not None:
            stamps = record.token_chunk_ns  # a finished record's: no one appends to it any more
            self.writer.submit(PutRequest(record), on_done=lambda row: self._written(row, stamps))

    def _count_prompt_later(self, record: RequestRecord) -> None:
        """A reply that looks cut with no line of Ollama's to say so: its prompt counted by the runner's /tokenize,
        then the request written again with that count (collectors.ollama.prompt_fit)."""
        port = self._tokenizer_port(record.model) if wants_count(record) else None
        if port is None or self._session is None or record.prompt_text is None:
            return
        session, text = self._session, record.prompt_text

        async def count() -> None:
            sent = await count_tokens(session, port, text)
            if sent is not None and self.writer is not None:
                with contextlib.suppress(RuntimeError):  # the writer closed meanwhile (the collector stopping)
                    self.writer.submit(PutRequest(with_count(record, sent)))

        task = asyncio.get_running_loop().create_task(count(), name="prompt-tokenize")
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    def _slots_of(self, model: str) -> int | None:
        """The slot count (-np) of the runner serving ``model`` now, for /metrics' wait split; None: not known. Called
        on the writer's thread: the reader replaces its ``runners`` dict whole, never changes one in place."""
        for state in list(self.runners.runners.values()) if self.runners is not None else ():
            if state.model is not None and same_model(state.model, model) and state.runner.n_parallel:
                return int(state.runner.n_parallel)
        return None

    def _tokenizer_port(self, model: str) -> int | None:
        """The port of the llama-server runner serving ``model`` (Ollama's own Go runner has no /tokenize)."""
        for state in self.runners.runners.values() if self.runners is not None else ():
            if state.runner.kind == "llama-server" and state.model is not None and same_model(state.model, model):
                return state.runner.port
        return None

    def _written(self, row: RequestRow | None, token_chunk_ns: list[int] | None = None) -> None:
        """On the writer's thread, once a finished request is stored: count it, on the loop, from the stored row.
        Its token gaps and its wait split are taken here, off the loop that relays the proxy's chunks: the split of
        one request against its neighbours took 2-4 ms, and 64 requests ending together held every stream that long
        each (issue 44's added p99). Only this thread splits (``stats.waits`` keeps the rows split so far)."""
        loop = self._loop
        if row is not None and loop is not None and not loop.is_closed():
            gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(token_chunk_ns or ())]
            try:
                split = self.stats.waits.split(row)
            except Exception:  # statistics must never cost a record
                log.exception("metrics could not split the wait of request %s", row.id)
                split = None
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._count, row, gaps_s, split)

    def _count(self, row: RequestRow, token_gaps_s: list[float], split: WaitSplit | None) -> None:
        try:
            self.stats.observe(row, token_gaps_s, split=split)
            if not self._has_gpu_source():
                return  # neither list can ever be drained: no energy, no ceiling without a GPU
            if is_cloud(row.model):
                return  # ran on ollama.com: no ceiling of this GPU judges it, none of its energy was for it
            if row.decode_tok_s and self.stats.ceiling_ratio_of(row) is None:
                # Without its text: up to CEILING_PENDING_MAX rows wait, and with --record-text each may hold MBs.
                self._ceiling_pending.append((time.monotonic(), _without_text(row)))
            if windows := phase_windows(row):
                self._energy_pending.append(windows)
        except Exception:  # statistics must never cost a record
            log.exception("metrics could not count request %s", row.id)

    def _has_gpu_source(self) -> bool:
        return self._gpu is not None or self._sim_source is not None

    def _submit_experiment(self, *args: Any, **kwargs: Any) -> None:
        """The Lab ingester's sink: one run document as a ``PutExperiment`` (same arguments)."""
        if self.writer is not None:
            self.writer.submit(PutExperiment(*args, **kwargs))

    def _rederive_phases(self, done: int | None = None) -> None:
        """Re-derive rows split by an older analysis.phases, a bounded batch per transaction, until none is left.

        Each batch is queued when the one before it is committed (``done`` rows), so the collector's own
        writes go between them.
        """
        writer = self.writer
        if writer is None or self._stop.is_set() or (done is not None and done < REDERIVE_BATCH):
            if done:
                log.info("re-derived the phases of the last %d stored requests", done)
            return
        with contextlib.suppress(RuntimeError):  # closing
            writer.submit(RederivePhases(REDERIVE_BATCH), on_done=self._rederive_phases)

    async def _host_bandwidth_once(self) -> None:
        """Measure the host's memory bandwidth unless the store holds a measurement of this machine; read which
        Apple chip this is (None at once elsewhere) and store it beside it, for the Why page."""
        measure = self._measure_host_bandwidth
        if measure is None:
            return
        try:
            stored = await asyncio.to_thread(self._stored_host_bandwidth)
            chip = await asyncio.to_thread(self._detect_apple_chip)
            if stored is not None and same_machine(stored):
                if chip is None or stored.apple_chip is not None:
                    return
                hb = stored  # measured before the chip was stored: only the chip is new
            else:
                hb = await asyncio.to_thread(measure)
        except Exception:  # the Why page then says the bandwidth is unknown
            log.exception("could not measure the host's memory bandwidth")
            return
        if chip is not None:
            hb = dataclasses.replace(hb, apple_chip=chip[0], apple_gpu_cores=chip[1])
        if self.writer is not None:
            self.writer.submit(PutHostBandwidth(hb))
            log.info("host memory bandwidth: %.1f GB/s", hb.bandwidth_bytes_s / 1e9)

    def _stored_host_bandwidth(self) -> HostBandwidth | None:
        with queries.open_reader(self.settings.db_path) as conn:
            return None if conn is None else queries.latest_host_bandwidth(conn)

    def _tick_blocking(self) -> tuple[list[GpuSample], HostSample | None]:
        """A tick's blocking work, in one worker thread's trip (each trip wakes two threads): the GPU and host
        samples, and the Lab's folder looked at for new results."""
        if self._sim_source is not None:
            gpus = self._sim_source.sample()
        else:
            gpus = self._gpu.sample(self._clock()) if self._gpu is not None else []
        host = self._host.sample() if self._host is not None else None
        if self._lab is not None:
            try:
                self._lab.poll()
            except Exception:  # the tick's samples are kept; the next tick looks again
                log.exception("could not read the Lab's results")
        return gpus, host

    async def _tick(self) -> None:
        writer = self.writer
        if writer is None:
            return
        gpus, host = await asyncio.to_thread(self._tick_blocking)
        if self._sim_source is not None:
            self.gpu_state = self._sim_source.state
        elif self._gpu is not None:
            self.gpu_state = self._gpu.state
        if gpus:
            writer.submit(PutGpuSamples(gpus))
        if host is not None:
            writer.submit(PutHostSample(host))
        self.latest_gpus, self.latest_host = gpus, host
        direct, retracted = self.runners.drain_direct() if self.runners is not None else ([], [])
        progress = self.runners.drain() if self.runners is not None else []  # before the snapshot: their requests are in it
        if retracted:
            writer.submit(DeleteDirect(tuple(retracted)))
        for rec in direct:  # generations sent to Ollama directly, seen from its runner; before their progress rows
            if rec.outcome == Outcome.IN_FLIGHT:
                writer.submit(PutRequest(rec))
            else:
                self._on_record(rec)
        running = await self.proxy.in_flight_sliced() if self.proxy is not None else []
        for rec in running:  # the Live page shows generations while they run
            writer.submit(PutRequest(rec))
        if progress:
            writer.submit(PutProgress(progress))
        self._write_log_findings(writer)
        if running:
            await self._estimate_progress(running)
        self._count_state(gpus, running)
        self._write_runners(writer)
        writer.submit(PutHeartbeat(self.heartbeat()))

    def _write_log_findings(self, writer: BackgroundWriter) -> None:
        """What Ollama's log told since the last tick: cut prompts read late, its start-line settings, the runner's waits."""
        for rec in self.fit.late():  # a cut told by a line of Ollama's read after its request was written
            writer.submit(PutRequest(rec))
        if self.fit.settings_changed:
            writer.submit(PutOllamaSettings(self.fit.rows(self._clock())))
        waits = self.runners.drain_waits() if self.runners is not None else []
        if waits:  # the runner's own waits before these requests' prompts (analysis.runner_wait_fold)
            writer.submit(PutRequestWaits(waits))

    def _write_runners(self, writer: BackgroundWriter) -> None:
        """The runners and their command lines' settings, when they changed (a runner came, went or was matched)."""
        if self.runners is None:
            return
        found = self.runners.flags(self._clock())
        key = [dataclasses.replace(f, ts_unix_s=0.0) for f in found]
        if key != self._runners_written:
            writer.submit(PutRunners(found))
            self._runners_written = key
        for port, rows in self.runners.placement_rows(self._clock()).items():
            placed = [dataclasses.replace(r, ts_unix_s=0.0) for r in rows]
            if placed != self._placements_written.get(port):
                writer.submit(PutRunnerPlacement(port, rows))
                self._placements_written[port] = placed

    def _count_state(self, gpus: list[GpuSample], running: list[RequestRecord]) -> None:
        """For /metrics: running generations by phase, loads and unloads seen in /api/ps, GPU energy by phase."""
        state = self.poller.state if self.poller is not None else None
        up = state is not None and state.status is not None and state.status.up
        names = {m.name for m in state.models} if state is not None and up else None
        by_phase = {"load": 0, "prefill": 0, "decode": 0}
        for rec in running:
            if rec.first_token_ns is not None:
                by_phase["decode"] += 1
            elif names is not None and rec.model not in names:
                by_phase["load"] += 1  # its model is not in /api/ps yet
            else:
                by_phase["prefill"] += 1  # waiting for the first token: a slot, the template, the prompt
        self.in_flight_by_phase = by_phase
        if names is not None:
            if self._loaded_names is not None:  # models loaded before we started are no load we saw
                for name in names - self._loaded_names:
                    label = self._load_labels.admit(name)
                    self.loads[label] = self.loads.get(label, 0) + 1
                for name in self._loaded_names - names:
                    label = self._load_labels.admit(name)
                    self.unloads[label] = self.unloads.get(label, 0) + 1
            self._loaded_names = names
        if gpus:
            self._gpu_history.append(gpus)
            self._count_energy()
        self._retry_ceiling_ratios()

    def _count_energy(self) -> None:
        """GPU energy over the phases of finished requests, once samples on both sides of each phase are in."""
        if not self._gpu_history:
            return
        samples = [s for tick in self._gpu_history for s in tick]
        latest_s = max(s.ts_unix_s for s in self._gpu_history[-1])
        oldest_s = min(s.ts_unix_s for s in self._gpu_history[0])
        waiting: collections.deque[list[PhaseWindow]] = collections.deque(maxlen=ENERGY_PENDING_MAX)
        for windows in self._energy_pending:
            if any(t1 > latest_s for _, _, t1 in windows):
                waiting.append(windows)  # the sample after its end is not in yet
                continue
            for phase, t0, t1 in windows:
                if t0 >= oldest_s and (e := energy_between(samples, t0, t1)) is not None:
                    self.energy_j_by_phase[phase] = self.energy_j_by_phase.get(phase, 0.0) + e.joules
        self._energy_pending = waiting

    def _retry_ceiling_ratios(self) -> None:
        """Observe the ceiling ratios that became known (the model's /api/show arrived); drop those too old."""
        if not self._ceiling_pending:
            return
        now_s, waiting = time.monotonic(), collections.deque[tuple[float, RequestRow]](maxlen=CEILING_PENDING_MAX)
        for since_s, row in self._ceiling_pending:
            if not self.stats.observe_ceiling_ratio(row) and now_s - since_s < CEILING_PENDING_S:
                waiting.append((since_s, row))
        self._ceiling_pending = waiting

    def _decode_ceiling_ratio(self, row: RequestRow) -> float | None:
        """A finished request's decode rate over its memory-bandwidth ceiling on this GPU; None when either is unknown,
        and for a cloud model's request, which ran on ollama.com (docs/ollama-api.md §15)."""
        if is_cloud(row.model):
            return None
        poller, gpu = self.poller, self.latest_gpus[0] if self.latest_gpus else None
        if not row.decode_tok_s or poller is None or gpu is None or (show := poller.shows.get(row.model)) is None:
            return None
        spec = match_gpu(gpu.name, gpu.mem_total_bytes)
        if spec is None:
            return None
        try:
            facts = model_facts_from_show(show, None)
        except (ValueError, KeyError, TypeError):  # a show without the architecture's numbers
            return None
        loaded = next((m for m in poller.state.models if m.name == row.model), None)
        # Where the model sits as the pages take it: the runner's own load lines, else /api/ps (analysis.runner_load_words).
        placement = placement_in_use(
            self.runners.placement_of(row.model) if self.runners is not None else None,
            loaded.size_bytes if loaded else None,
            loaded.size_vram_bytes if loaded else None,
        )
        c = ceilings_for_request(
            spec, facts, prompt_tokens=row.prompt_tokens, output_tokens=row.output_tokens, vram_fraction=placement.gpu_fraction
        )
        return row.decode_tok_s / c.decode_ceiling_tok_s if c.decode_ceiling_tok_s > 0 else None

    async def _estimate_progress(self, running: list[RequestRecord]) -> None:
        """Estimated prefill progress of the running requests without a first token (after their rows)."""
        models = self.poller.state.models if self.poller is not None else []
        loaded = {name: m.context_length for m in models for name in (m.name, m.model)}
        if self.runners is not None:  # the runner's own first reading is due: no estimate before it (see RunnerReader)
            now = self._clock()
            running = [r for r in running if not self.runners.awaits_first_reading(r, now)]
        samples = await asyncio.to_thread(self._estimator.samples, running, loaded, self.latest_gpus)
        if samples and self.writer is not None:
            self.writer.submit(PutProgress(samples))

    def _ollama_vram_bytes(self) -> int | None:
        """What Ollama's loaded models hold of GPU memory (/api/ps size_vram): the "VRAM" line on unified memory."""
        state = self.poller.state if self.poller is not None else None
        if state is None or state.status is None or not state.status.up:
            return None
        return sum(m.size_vram_bytes for m in state.models)

    def heartbeat(self) -> CollectorInfo:
        s = self.settings
        return CollectorInfo(
            ts_unix_s=self._clock(),
            pid=os.getpid(),
            listen=self._listen,
            ollama_url=s.ollama_url,
            data_dir=str(s.data_dir),
            gpu_state=self.gpu_state.kind,
            gpu_message=self.gpu_state.message,
            demo=s.demo,
            record_text=s.record_text,
            proxy_refused=None if self.proxy is None else refusals.summary(self.proxy.refusals.last_hour()),
            runner_lines_missing=self.runners.runner_lines_missing if self.runners is not None else None,
            ollama_queued=self._ollama_queued(),
            **self._ollama_sources(),
        )

    def _ollama_queued(self) -> str | None:
        """Ollama's own queue gauge (its /metrics), as JSON for the heartbeat; None where it is not served."""
        queued = self.poller.state.queued if self.poller is not None else None
        return None if queued is None else json.dumps(queued, sort_keys=True)

    def _ollama_sources(self) -> dict[str, str | None]:
        """For the sidebar: how the runners were found or why not, and why Ollama's log is not read (what to do)."""
        found = self.runners.discovery if self.runners is not None else None
        n = len(self.runners.runners) if self.runners is not None else 0
        source, s = self._log_source, self.settings
        local = self._ollama_is_local
        return {
            "runners_found": f"{n} runner{'s' if n != 1 else ''} found {found.found_by}" if found and found.found_by else None,
            "runners_problem": (
                with_loaded_models(found.problem, self._loaded_model_names(), simulated=s.demo)
                if found is not None and found.problem is not None
                else None
            ),
            "log_problem": log_problem(
                configured=source is not None,
                source_problem=source.problem if source is not None else None,
                log_file=s.ollama_log,
                container=found is not None and found.container,
                unit_installed=local and self._host_facts.unit_installed(),
                journal_readable=self._host_facts.journal_readable(),
            ),
        }

    def _loaded_model_names(self) -> list[str] | None:
        """The models Ollama's last /api/ps listed (None: not known: no poll yet, or Ollama down)."""
        state = self.poller.state if self.poller is not None else None
        if state is None or state.status is None or not state.status.up:
            return None
        return [m.name for m in state.models]

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.interval_s
        while not self._stop.is_set():
            try:
                await self._tick()
            except Exception:  # one bad tick must not end sampling
                log.exception("sampling failed")
            # On the collector's beat (collectors.beat): one wake-up with the poller and the runner reader. A tick
            # that ran long (a slow NVML call) skips the beats it missed: it does not burst.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), until_next_beat_s(loop.time(), interval))

    async def _retention_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), RETENTION_EVERY_S)
            if not self._stop.is_set() and self.writer is not None:
                self.writer.submit(ApplyRetention(self._clock()))

    # -- /phasewatch/metrics ---------------------------------------------------------------

    def metrics_snapshot(self) -> MetricsSnapshot:
        poller = self.poller
        return MetricsSnapshot(
            gpus=self.latest_gpus,
            gpu_source=GPU_SOURCE_NAMES.get(self.gpu_state.kind, str(self.gpu_state.kind)),
            host=self.latest_host,
            ollama=poller.state.status if poller else None,
            loaded_models=poller.state.models if poller else [],
            stats=self.stats,
            in_flight_by_phase=self.in_flight_by_phase,
            store_pending=self.writer.pending_count if self.writer else 0,
            store_failing=None if self.writer is None else self.writer.last_error is not None,
            store_dropped=None if self.writer is None else self.writer.dropped_count,
            store_shed=None if self.writer is None else self.writer.shed_count,
            store_queued_bytes=None if self.writer is None else self.writer.queued_bytes,
            store_reopened=None if self.writer is None else self.writer.reopened_count,
            log_dropped=None if self.runners is None else {**self.runners.log_dropped(), "settings": self.fit.settings_dropped},
            loads=self.loads,
            unloads=self.unloads,
            energy_j_by_phase=self.energy_j_by_phase,
            slots=self._slot_uses(),
            proxy_refused=None
            if self.proxy is None
            else {(status, why.value): n for (status, why), n in self.proxy.refusals.counts.items()},
        )

    def _slot_uses(self) -> list[SlotUse]:
        """Context use of each runner slot read last (only runners whose model and slot sizes are known)."""
        if self.runners is None:
            return []
        return [
            SlotUse(state.model, slot.slot_id, slot.ctx_tokens, slot.n_ctx)
            for state in self.runners.runners.values()
            if state.model is not None
            for slot in state.slots
            if slot.ctx_tokens is not None and slot.n_ctx is not None
        ]

    async def _metrics_handler(self, request: web.BaseRequest) -> web.StreamResponse:
        body = generate_latest(self.registry)  # on the loop: the state it reads changes only there
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
