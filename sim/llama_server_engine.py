"""LlamaServerEngine: llama.cpp's ``llama-server`` as a child process behind sim's Ollama API.

``python -m sim --engine llama-server --gguf PATH`` runs what Ollama >= 0.30 runs for a GGUF model:
the upstream ``llama-server`` binary (``scripts/build_llama_server.sh`` builds it), started the way
Ollama starts it (``--model PATH --port N --host 127.0.0.1 --no-webui --offline -c CTX -np N -b B
-ub B --log-verbosity 4 --no-log-prefix --no-log-timestamps``, a free loopback port), its stdout and
stderr copied line by line to ours as Ollama copies them into its log. Generate and chat are relayed
to the child's ``POST /completion`` (streamed), and the final chunk carries Ollama's durations from the
child's ``timings`` block, as Ollama does (docs/ollama-api.md §4):

* ``prompt_eval_duration`` = ``prompt_ms``, ``eval_duration`` = ``predicted_ms`` (ms -> ns);
* ``prompt_eval_count`` = ``cache_n + prompt_n``, ``prompt_eval_cached_count`` = ``cache_n``,
  ``eval_count`` = ``predicted_n`` (an end-of-generation token included: it has no chunk);
* ``load_duration``: request received -> the child answers ``/health`` (a start when none runs);
  ``total_duration`` also holds the wait for one of the ``-np`` slots, which Ollama keeps in front of
  the child (a per-model semaphore), and the tokenization.

The child's raw ``timings`` and counts per request, and the child itself (pid, port, argv), are on
``GET /sim/engine`` for tests. Load happens on the first request (or an empty-prompt load), unload on
``keep_alive: 0`` or when the keep-alive runs out: the child process is started and stopped.
``/api/tags`` and ``/api/show`` come from the GGUF header (``sim.gguf_model``). A build with a GPU backend
(``--list-devices`` names one) gets ``-ngl`` as Ollama passes it (every layer when the model fits the GPUs' free
memory), and ``/api/ps`` answers size and size_vram from the child's own load lines (``analysis.runner_load_lines``), as
Ollama >= 0.30 does; a CPU build's answer is the GGUF's size plus its cache, size_vram 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from analysis.log_grammar import runner_line
from analysis.memory import KV_TYPE_BYTES
from analysis.runner_load_lines import LoadLine, listening_port, load_of
from analysis.runner_placement import PlacementReader
from sim import ollama_log
from sim.backend import (
    QUEUE_FULL_MESSAGE,
    Done,
    EmbedDone,
    EmbedRequest,
    EngineError,
    Event,
    Failed,
    GenRequest,
    Loaded,
    LoadedInfo,
    SlotAcquired,
    Token,
)
from sim.catalog import ModelFacts
from sim.context_fit import fit_prompt
from sim.gguf_model import (
    DEFAULT_MODEL_NAME,
    DEFAULT_NUM_BATCH,
    DEFAULT_NUM_CTX,
    EngineUnavailable,
    GgufModelFacts,
    ollama_sampling,
    read_model_facts,
    render_prompt,
    stop_strings,
)
from sim.ollama_placement import gpu_layers_to_ask, parse_device_list, ps_sizes

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILT_BINARY = REPO_ROOT / ".cache" / "llama-server" / "bin" / "llama-server"
ENGINE_LOG_MAX = 10_000
START_TIMEOUT_S = 120.0  # Ollama waits minutes for a big model; ours maps 253 MB
HEALTH_POLL_S = 0.01
STOP_TIMEOUT_S = 5.0
RUNNER_LOG_LINES = 2000  # the child's last lines, kept for errors and for /sim/engine
LIST_DEVICES_TIMEOUT_S = 30.0  # `llama-server --list-devices` loads the backends and exits
# A connection error to the child is its death only when the child has exited: a crash closes its sockets a moment
# before its exit is reaped, so the exit is waited for this long before the child is taken to be alive.
EXIT_REAP_S = 0.5
# ...and a live child's connection error is a pooled keep-alive connection it closed (llama-server drops one idle
# for 5 s) or a reset: the request is sent again on a fresh connection this many times, as Go's HTTP client that
# Ollama uses retries a request that a reused connection failed before any answer.
CONNECTION_RETRIES = 2
# llama-server's stop_type -> Ollama's done_reason.
DONE_REASONS = {"eos": "stop", "word": "stop", "limit": "length"}


def find_llama_server(explicit: str | None = None) -> Path:
    """The llama-server binary: ``explicit``, ``$PHASEWATCH_LLAMA_SERVER``, our build, or one on PATH."""
    for candidate in (explicit, os.environ.get("PHASEWATCH_LLAMA_SERVER")):
        if candidate:
            path = Path(candidate)
            if path.is_file() and os.access(path, os.X_OK):
                return path
            raise EngineUnavailable(f"no executable llama-server at {path}")
    if BUILT_BINARY.is_file() and os.access(BUILT_BINARY, os.X_OK):
        return BUILT_BINARY
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    raise EngineUnavailable(f"llama-server is not built: bash scripts/build_llama_server.sh (writes {BUILT_BINARY})")


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now, as Ollama picks one for each runner."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with(parent_pid: int) -> Callable[[], None]:
    """In the child before exec: a sim that dies, however, takes its runner with it (Linux only). SIGKILL, not
    SIGTERM: llama-server busy with a generation finishes its step before it heeds a SIGTERM, and a runner left
    decoding with no parent is what a stopped Ollama never leaves. A parent gone before the call (a race the
    kernel does not cover) is checked after it."""

    def in_child() -> None:
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


@dataclass
class EngineRecord:
    """What llama-server itself said about one request (``GET /sim/engine``)."""

    id: str  # the same id as /sim/truth and the X-Sim-Request-Id header
    model: str
    runner_pid: int
    num_ctx: int
    num_batch: int
    prompt_tokens: int = 0  # as tokenized by the child
    cached_tokens: int | None = None  # timings.cache_n
    timings: dict[str, Any] = field(default_factory=dict)  # the child's raw timings block
    stop_type: str | None = None
    tokens_evaluated: int | None = None
    tokens_cached: int | None = None
    chunks: int = 0  # streamed chunks with text
    sent_ns: int = 0  # /completion sent (time.monotonic_ns)
    first_chunk_ns: int | None = None  # first chunk with a token received
    last_chunk_ns: int | None = None  # last chunk with a token received
    final_ns: int | None = None  # the final chunk (with timings) received
    cancelled: bool = False
    embedding: bool = False  # one input of an embed call (POST /embedding: its prompt read, nothing decoded)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def speculative_flags(draft_gguf: str | None, draft_max_tokens: int | None) -> list[str]:
    """A child's speculative-decoding flags, in llama-server's own names (``--spec-draft-model``, ``--spec-type
    draft-simple``, ``--spec-draft-n-max``); none without a draft model."""
    if draft_gguf is None:
        return []
    flags = ["--spec-draft-model", draft_gguf, "--spec-type", "draft-simple"]
    if draft_max_tokens is not None:
        flags += ["--spec-draft-n-max", str(draft_max_tokens)]
    return flags


class ServerChild:
    """One ``llama-server`` child: its process, port, settings and keep-alive."""

    def __init__(self, engine: LlamaServerEngine, num_ctx: int, num_batch: int, gpu_layers: int = 0) -> None:
        self.engine = engine
        self.gpu_layers = gpu_layers
        # Where the child put the model, from its own load lines, as Ollama >= 0.30 reads them for /api/ps.
        self.placement = PlacementReader()
        self.starting = True  # until the child's own listening line: only then are its load lines its placement
        self.num_ctx = num_ctx  # per slot, what /api/ps shows
        self.num_batch = num_batch
        self.port = free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            str(engine.binary),
            "--model",
            engine.model.path,
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            "--no-webui",
            "--offline",
            "-c",
            str(num_ctx * engine.num_parallel),
            "-np",
            str(engine.num_parallel),
            "-b",
            str(num_batch),
            "-ub",
            str(num_batch),
            "--threads",
            str(engine.n_threads),
            # As Ollama passes OLLAMA_FLASH_ATTENTION and OLLAMA_KV_CACHE_TYPE, and -ngl: every layer when the model
            # fits the GPUs' free memory (0 for a build with no GPU backend).
            "--flash-attn",
            engine.flash_attn,
            "--cache-type-k",
            engine.kv_cache_type,
            "--cache-type-v",
            engine.kv_cache_type,
            "--n-gpu-layers",
            str(gpu_layers),
            *speculative_flags(engine.draft_gguf, engine.draft_max_tokens),
            # As Ollama: every line the child logs (per-batch progress included), none stamped (Ollama stamps its own).
            "--log-verbosity",
            "4",
            "--no-log-prefix",
            "--no-log-timestamps",
        ]
        if engine.model.pooling_type is not None:
            # As Ollama starts the runner of a GGUF that declares pooling: its /embedding pools by the file's type.
            self.argv.append("--embedding")
        self.proc: asyncio.subprocess.Process | None = None
        self.keep_alive_ns = engine.default_keep_alive_ns
        self.expires_at_unix_s: float | None = time.time() + self.keep_alive_ns / 1e9 if self.keep_alive_ns >= 0 else None
        self.refs = 0
        self.closed = False
        self.log: deque[str] = deque(maxlen=RUNNER_LOG_LINES)
        self._pumps: list[asyncio.Task[None]] = []
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    async def has_exited(self, within_s: float) -> bool:
        """Whether the child has exited, waiting up to ``within_s`` for an exit under way to be reaped."""
        if self.proc is None:
            return True
        if self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), within_s)
        return self.proc.returncode is not None

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start the child and wait until it answers ``/health`` with 200 (model loaded, warmed up); say both in
        Ollama's log as Ollama does (``starting llama-server cmd=…``, ``llama-server started in X seconds``)."""
        started_s = time.monotonic()
        ollama_log.slog("starting llama-server", source="llama_server.go:431", cmd=" ".join(self.argv))
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # A function run in the child before exec needs fork (POSIX); Windows' process creation takes none.
            preexec_fn=die_with(os.getpid()) if hasattr(os, "fork") else None,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._pumps = [asyncio.create_task(self._pump(s)) for s in (self.proc.stdout, self.proc.stderr)]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.returncode is not None:
                await asyncio.gather(*self._pumps, return_exceptions=True)
                raise EngineError(500, f"llama-server process has terminated: {self.last_error()}")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        self.starting = False  # it serves: no line from here on is a load line of its
                        took_s = time.monotonic() - started_s
                        ollama_log.slog(f"llama-server started in {took_s:.2f} seconds", source="llama_server.go:1362")
                        return
            if time.monotonic() > deadline:
                await self.stop()
                raise EngineError(500, f"timed out waiting for llama-server to start: {self.last_error()}")
            await asyncio.sleep(HEALTH_POLL_S)

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        """Copy the child's lines to our stderr as they come (Ollama writes them into its log)."""
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line over the reader's limit: pass what there is
                line = await stream.read(1 << 16)
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip("\n")
            self.log.append(text)
            if self.starting:  # its load lines come before it listens: after that, a client can have any line echoed
                split = runner_line(text)
                if split is not None and listening_port(split) == self.port:
                    self.starting = False
                elif split is not None and (fact := load_of(split)) is not None:
                    self.placement.feed(fact)
            ollama_log.line(text)

    def last_error(self) -> str:
        lines = [ln for ln in self.log if ln.strip()]
        code = self.proc.returncode if self.proc is not None else None
        return f"exit status {code}; " + (" | ".join(lines[-3:]) or "no output")

    async def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL) and wait for its output to end."""
        self.closed = True
        self.mark_busy()
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    # --- keep-alive ---------------------------------------------------------------------
    def mark_busy(self) -> None:
        if self._expiry:
            self._expiry.cancel()
            self._expiry = None

    def mark_idle(self) -> None:
        self.mark_busy()
        ka = self.keep_alive_ns
        if ka < 0:
            self.expires_at_unix_s = None
            return
        self.expires_at_unix_s = time.time() + ka / 1e9
        if ka == 0:
            self.engine._spawn(self.engine._unload_runner(self))
            return
        self._expiry = asyncio.get_running_loop().call_later(
            ka / 1e9, lambda: self.engine._spawn(self.engine._unload_if_idle(self))
        )


def loaded_sizes(placement: PlacementReader, estimate_bytes: int) -> tuple[int, int]:
    """/api/ps's size and size_vram: from the runner's own load lines when it put anything on a GPU, as Ollama >= 0.30
    answers; else the model and its cache all in system memory (size_vram 0, what Ollama shows for a CPU build)."""
    placed = placement.placement()
    sizes = ps_sizes(placed) if placed is not None and placed.devices else None
    return sizes if sizes is not None else (estimate_bytes, 0)


@dataclass
class _Stream:
    """One generation's relay so far: its prompt, the tokens sampled, whether any chunk came back."""

    prompt_ids: list[int]
    sampled: list[int] = field(default_factory=list)
    started: bool = False


class LlamaServerEngine:
    """A ``sim.backend.Backend`` that serves one GGUF through a ``llama-server`` child process."""

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        binary: str | None = None,
        n_threads: int = 2,
        num_parallel: int = 1,
        kv_cache_type: str = "f16",
        flash_attn: str = "auto",
        default_num_ctx: int = DEFAULT_NUM_CTX,
        max_queue: int = 512,
        default_keep_alive_ns: int = 5 * 60 * 10**9,
        context_shift: bool = True,
        draft_gguf: str | None = None,
        draft_max_tokens: int | None = None,
    ) -> None:
        self.binary = find_llama_server(binary)
        self.draft_gguf = draft_gguf  # speculative decoding: the draft model the child checks proposals of
        self.draft_max_tokens = draft_max_tokens
        self.context_shift = context_shift  # False: a long prompt is a 400, as from a runner that cannot shift
        self.model: GgufModelFacts = read_model_facts(gguf_path, model_name)
        self.n_threads = n_threads
        self.num_parallel = num_parallel
        self.kv_cache_type = kv_cache_type
        self.flash_attn = flash_attn
        self.default_num_ctx = default_num_ctx
        self.max_queue = max_queue
        self.default_keep_alive_ns = default_keep_alive_ns
        self.runner: ServerChild | None = None
        self.records: deque[EngineRecord] = deque(maxlen=ENGINE_LOG_MAX)
        # Requests sent again after a live child's connection failed (path, error, attempt), for tests: GET /sim/engine.
        self.connection_retries: deque[dict[str, Any]] = deque(maxlen=ENGINE_LOG_MAX)
        self._session: aiohttp.ClientSession | None = None
        self._sched_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(num_parallel)  # Ollama's per-model semaphore in front of the child
        self._waiting = 0  # requests waiting for it
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()  # unloads in flight (the loop keeps only weak references)
        self.gpu_devices: list[LoadLine] | None = None  # the build's GPUs (--list-devices), once asked

    async def devices(self) -> list[LoadLine]:
        """The GPUs this llama-server build can use, asked once (``--list-devices``); [] for a CPU build or no answer."""
        if self.gpu_devices is None:
            text = ""
            try:
                proc = await asyncio.create_subprocess_exec(
                    str(self.binary), "--list-devices", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
                )
                out, _ = await asyncio.wait_for(proc.communicate(), LIST_DEVICES_TIMEOUT_S)
                text = out.decode("utf-8", errors="replace")
            except (OSError, TimeoutError):
                text = ""
            self.gpu_devices = parse_device_list(text)
        return self.gpu_devices

    def _gpu_layers(self, num_ctx: int, devices: list[LoadLine]) -> int:
        kv_scale = KV_TYPE_BYTES[self.kv_cache_type] / KV_TYPE_BYTES["f16"]
        need = self.model.size_bytes + int(self.model.kv_bytes_per_token * kv_scale * num_ctx * self.num_parallel)
        return gpu_layers_to_ask(devices, need, self.model.block_count + 1)  # llama.cpp counts the output layer

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No timeout on the whole stream (a long generation is fine); a stalled child is its own error.
            # The final chunk echoes the prompt's text: lines can be long.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), read_bufsize=1 << 24
            )
        return self._session

    def catalog(self) -> list[ModelFacts]:
        return [self.model]

    # --- loading ------------------------------------------------------------------------
    def _num_ctx(self, num_ctx: int | None) -> int:
        ctx = num_ctx if num_ctx and num_ctx > 0 else self.default_num_ctx
        return max(min(ctx, self.model.context_length or ctx), 16)

    async def _get_runner(self, num_ctx: int | None, num_batch: int | None, keep_alive_ns: int | None, truth: Any) -> ServerChild:
        """The running child with one reference taken; starts or restarts it (load-time options changed) first."""
        ctx = self._num_ctx(num_ctx)
        batch = num_batch if num_batch and num_batch > 0 else DEFAULT_NUM_BATCH
        runner = self.runner
        if runner is not None and runner.exited and runner.refs == 0:
            # The child died (killed, crashed): forget it; this request starts a new one, as Ollama does.
            await self._unload_runner(runner)
            runner = None
        if runner is None or runner.num_ctx != ctx or runner.num_batch != batch:
            if self._pending >= self.max_queue:
                raise EngineError(503, QUEUE_FULL_MESSAGE)
            self._pending += 1
            try:
                async with self._sched_lock:
                    runner = self.runner
                    if runner is not None and (runner.num_ctx != ctx or runner.num_batch != batch):
                        while runner.refs > 0:  # Ollama waits for the runner to go idle before a reload
                            await asyncio.sleep(0.005)
                        await self._unload_runner(runner)
                        runner = None
                    if runner is None:
                        devices = await self.devices()  # asked once, as Ollama finds its GPUs before any load
                        if truth is not None:
                            truth.load_start_ns = time.monotonic_ns()
                        runner = ServerChild(self, ctx, batch, self._gpu_layers(ctx, devices))
                        await runner.start(self.session())
                        self.runner = runner
                        if truth is not None:
                            truth.load_end_ns = time.monotonic_ns()
            finally:
                self._pending -= 1
        runner.refs += 1
        runner.mark_busy()
        if keep_alive_ns is not None:
            runner.keep_alive_ns = keep_alive_ns  # a request's keep_alive sticks to the runner
        return runner

    def _release(self, runner: ServerChild) -> None:
        runner.refs -= 1
        if runner.refs == 0 and self.runner is runner:
            runner.mark_idle()

    async def _unload_runner(self, runner: ServerChild) -> None:
        if self.runner is runner:
            self.runner = None
        if not runner.closed:
            await runner.stop()

    async def _unload_if_idle(self, runner: ServerChild) -> None:
        if runner.refs == 0:
            await self._unload_runner(runner)

    # --- one request --------------------------------------------------------------------
    async def _tokenize(self, runner: ServerChild, text: str) -> list[int]:
        """The prompt as the child tokenizes it (BOS added), as Ollama tokenizes before it sends."""
        body = {"content": text, "add_special": True, "parse_special": False}
        for attempt in itertools.count():
            try:
                async with self.session().post(runner.base_url + "/tokenize", json=body) as r:
                    if r.status != 200:
                        raise EngineError(500, f"llama-server /tokenize answered {r.status}: {(await r.text())[:200]}")
                    return [int(t) for t in (await r.json())["tokens"]]
            except aiohttp.ClientError as exc:
                await self._connection_failed(runner, "/tokenize", exc, attempt)
        raise AssertionError("unreachable")

    async def _connection_failed(self, runner: ServerChild, path: str, exc: BaseException, attempt: int) -> None:
        """A request to the child failed on its connection before any answer: the child's death when it has exited
        (its exit status and last lines, as Ollama says it); else returns, for the caller to send it again, until
        ``CONNECTION_RETRIES``, after which the error itself is the answer (the child still runs: not terminated)."""
        # The first failure is sent again at once while the child runs (a pooled connection it closed: Go's client
        # does not wait either); a second waits for a crash's exit to be reaped before it calls the child alive.
        if await runner.has_exited(EXIT_REAP_S if attempt else 0.0):
            raise EngineError(500, f"llama-server process has terminated: {runner.last_error()}") from exc
        if attempt >= CONNECTION_RETRIES:
            raise EngineError(500, f"llama-server {path}: {exc} (its process still running)") from exc
        self.connection_retries.append({"path": path, "error": str(exc), "attempt": attempt + 1})

    def _completion_body(self, req: GenRequest, prompt_ids: list[int], runner: ServerChild) -> dict[str, Any]:
        room = runner.num_ctx - len(prompt_ids)
        n_predict = min(req.num_predict, room) if req.num_predict > 0 else room
        s = ollama_sampling(req.options)
        seed = req.options.get("seed")
        return {
            "prompt": prompt_ids,
            "stream": True,
            "cache_prompt": True,
            "n_predict": n_predict,
            "temperature": s["temperature"],
            "top_k": int(s["top_k"]),
            "top_p": s["top_p"],
            "min_p": s["min_p"],
            "typical_p": s["typical_p"],
            "repeat_penalty": s["repeat_penalty"],
            "presence_penalty": s["presence_penalty"],
            "frequency_penalty": s["frequency_penalty"],
            "seed": int(seed) if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else -1,
            "stop": stop_strings(req),
            "return_tokens": True,
        }

    async def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]:
        truth = req.truth
        runner = await self._get_runner(req.num_ctx, req.num_batch, req.keep_alive_ns, truth)
        record: EngineRecord | None = None
        try:
            yield Loaded(time.monotonic_ns())
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
            try:
                now = time.monotonic_ns()
                truth.slot_acquired_ns = now
                record = EngineRecord(truth.id, self.model.name, runner.pid, runner.num_ctx, runner.num_batch)
                self.records.append(record)
                yield SlotAcquired(now, 0)  # the child's cache match is known only at the end (timings.cache_n)
                async for ev in self._relay(req, runner, record):
                    yield ev
            finally:
                self._slots.release()
        finally:
            if record is not None and record.final_ns is None:
                record.cancelled = True  # closing the stream to the child cancels its task and frees the slot
            self._release(runner)

    async def _relay(self, req: GenRequest, runner: ServerChild, record: EngineRecord) -> AsyncGenerator[Event, None]:
        truth = req.truth
        prompt_ids = await self._tokenize(runner, render_prompt(req))
        prompt_ids = fit_prompt(prompt_ids, runner.num_ctx, can_shift=self.context_shift and req.shift)
        truth.prompt_tokens = record.prompt_tokens = len(prompt_ids)
        body = self._completion_body(req, prompt_ids, runner)
        stream = _Stream(prompt_ids)
        for attempt in itertools.count():
            record.sent_ns = truth.prefill_start_ns = time.monotonic_ns()
            try:
                async for ev in self._completion(req, runner, record, body, stream):
                    yield ev
                return
            except (aiohttp.ClientError, json.JSONDecodeError) as exc:
                if stream.started:  # a chunk came back: the stream ends with the error instead of a 500
                    yield Failed(f"llama-server: {exc}")
                    return
                # Before any answer: the child's death, or a connection of a live child to send it again on.
                retries = attempt if isinstance(exc, aiohttp.ClientConnectionError) else CONNECTION_RETRIES
                await self._connection_failed(runner, "/completion", exc, retries)

    async def _completion(
        self, req: GenRequest, runner: ServerChild, record: EngineRecord, body: dict[str, Any], stream: _Stream
    ) -> AsyncGenerator[Event, None]:
        """One ``POST /completion`` to the child, relayed as events; connection errors are the caller's."""
        truth = req.truth
        async with self.session().post(runner.base_url + "/completion", json=body) as r:
            if r.status != 200:
                raise EngineError(500, f"llama-server /completion answered {r.status}: {(await r.text())[:200]}")
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                now = time.monotonic_ns()
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    yield Failed(f"llama-server: {chunk['error']}")
                    return
                stream.started = True
                ids = [int(t) for t in chunk.get("tokens") or []]
                if chunk.get("stop"):
                    record.final_ns = now
                    done = self._done(chunk, record, stream.prompt_ids, stream.sampled)
                    if chunk.get("stop_type") == "eos":
                        # The end token: counted in predicted_n, never sent as text.
                        truth.token_sampled_ns.append(now)
                        yield Token("", 0, now, eos=True)
                    truth.cached_tokens = done.prompt_eval_cached_count
                    yield done
                    return
                text = str(chunk.get("content") or "")
                if not ids and not text:
                    continue
                stream.sampled.extend(ids)
                if record.first_chunk_ns is None:
                    record.first_chunk_ns = truth.prefill_end_ns = now
                record.last_chunk_ns = now
                record.chunks += 1
                truth.token_sampled_ns.append(now)
                yield Token(text, ids[-1] if ids else 0, now)
        if stream.started:
            yield Failed("llama-server ended the stream without its final chunk")
        else:
            raise EngineError(500, f"llama-server ended the stream early; {runner.last_error()}")

    def _done(self, chunk: dict[str, Any], record: EngineRecord, prompt_ids: list[int], sampled: list[int]) -> Done:
        """Ollama's final metrics from the child's timings (as Ollama >= 0.30 converts them)."""
        t = chunk.get("timings") or {}
        record.timings = dict(t)
        record.stop_type = chunk.get("stop_type")
        record.tokens_evaluated = chunk.get("tokens_evaluated")
        record.tokens_cached = chunk.get("tokens_cached")
        cache_n, prompt_n = int(t.get("cache_n", 0)), int(t.get("prompt_n", 0))
        record.cached_tokens = cache_n
        return Done(
            done_reason=DONE_REASONS.get(str(chunk.get("stop_type")), "stop"),
            prompt_eval_count=cache_n + prompt_n,
            prompt_eval_cached_count=cache_n,
            prompt_eval_ns=round(float(t.get("prompt_ms", 0.0)) * 1e6),
            eval_count=int(t.get("predicted_n", len(sampled))),
            eval_ns=round(float(t.get("predicted_ms", 0.0)) * 1e6),
            context_ids=prompt_ids + sampled,
        )

    # --- embeddings ---------------------------------------------------------------------
    async def embed(self, req: EmbedRequest) -> EmbedDone:
        """Each input its own ``POST /embedding`` to the child, all at once behind the per-model semaphore, as
        Ollama's embed handler sends them (one runner task each: its prompt read, then released at once)."""
        if self.model.pooling_type is None:
            raise EngineError(400, f'"{self.model.name}" does not support embeddings')
        truth = req.truth
        runner = await self._get_runner(req.num_ctx, None, req.keep_alive_ns, truth)
        try:
            loaded_ns = time.monotonic_ns()
            texts = req.texts if req.texts is not None else []
            counts = await asyncio.gather(*(self._embed_one(runner, truth, text) for text in texts))
            truth.prompt_tokens = sum(counts)
            if truth.prefill_start_ns is not None:
                truth.prefill_end_ns = time.monotonic_ns()
            return EmbedDone(loaded_ns, sum(counts), (truth.prefill_end_ns or loaded_ns) - (truth.prefill_start_ns or loaded_ns))
        finally:
            self._release(runner)

    async def _embed_one(self, runner: ServerChild, truth: Any, text: str) -> int:
        """One input: tokenized by the child (BOS/EOS as the model adds them), cut to the slot's context, sent as
        its token ids; returns its token count."""
        async with self._slots:
            ids = (await self._tokenize(runner, text))[: runner.num_ctx]
            record = EngineRecord(truth.id, self.model.name, runner.pid, runner.num_ctx, runner.num_batch, embedding=True)
            record.prompt_tokens = len(ids)
            self.records.append(record)
            record.sent_ns = time.monotonic_ns()
            if truth.prefill_start_ns is None:
                truth.prefill_start_ns = record.sent_ns  # the call's first input sent
            for attempt in itertools.count():
                try:
                    async with self.session().post(runner.base_url + "/embedding", json={"content": ids}) as r:
                        if r.status != 200:
                            raise EngineError(500, f"llama-server /embedding answered {r.status}: {(await r.text())[:200]}")
                        await r.read()
                        record.final_ns = time.monotonic_ns()
                        return len(ids)
                except aiohttp.ClientError as exc:
                    await self._connection_failed(runner, "/embedding", exc, attempt)
        raise AssertionError("unreachable")

    # --- Backend API --------------------------------------------------------------------
    async def load(self, model: ModelFacts, num_ctx: int | None, keep_alive_ns: int | None) -> None:
        runner = await self._get_runner(num_ctx, None, keep_alive_ns, None)
        self._release(runner)

    async def unload(self, model: ModelFacts) -> None:
        runner = self.runner
        if runner is None:
            return
        runner.keep_alive_ns = 0
        runner.expires_at_unix_s = time.time()
        if runner.refs == 0:
            await self._unload_runner(runner)

    def queued(self) -> dict[str, int]:
        return {self.model.name: self._waiting} if self.runner is not None else {}

    def loaded(self) -> list[LoadedInfo]:
        r = self.runner
        if r is None:
            return []
        # The facts' bytes per token are f16's; a quantized cache holds fewer (ggml's block sizes).
        kv_scale = KV_TYPE_BYTES[self.kv_cache_type] / KV_TYPE_BYTES["f16"]
        kv_bytes = int(self.model.kv_bytes_per_token * kv_scale * r.num_ctx * self.num_parallel)
        size, size_vram = loaded_sizes(r.placement, self.model.size_bytes + kv_bytes)
        return [LoadedInfo(self.model, size, size_vram, r.num_ctx, r.expires_at_unix_s)]

    def gpu_state(self) -> dict[str, Any] | None:
        return None

    def runner_state(self) -> dict[str, Any] | None:
        r = self.runner
        if r is None:
            return None
        return {
            "pid": r.pid,
            "port": r.port,
            "base_url": r.base_url,
            "argv": r.argv,
            "num_ctx": r.num_ctx,
            "num_batch": r.num_batch,
            "num_parallel": self.num_parallel,
            "gpu_layers": r.gpu_layers,
        }

    async def close(self) -> None:
        if self.runner is not None:
            await self._unload_runner(self.runner)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if self._session is not None:
            await self._session.close()


# --- extra route --------------------------------------------------------------------------


ENGINE_KEY = web.AppKey("llama_server_engine", LlamaServerEngine)


async def _get_engine_log(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "engine": "llama-server",
            "binary": str(engine.binary),
            "model": engine.model.name,
            "gguf": engine.model.path,
            "n_threads": engine.n_threads,
            "runner": engine.runner_state(),
            "connection_retries": list(engine.connection_retries),
            "requests": [r.to_json() for r in engine.records],
        }
    )


async def _delete_engine_log(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].records.clear()
    return web.json_response({"cleared": True})


def add_engine_routes(app: web.Application, engine: LlamaServerEngine) -> None:
    """``GET|DELETE /sim/engine``: llama-server's raw timings per request, and the child now running. On shutdown
    the child is stopped first, as Ollama stops its runners: a request still running on it ends then, and sim's
    exit does not wait on it."""
    app[ENGINE_KEY] = engine

    async def _stop_runner(_: web.Application) -> None:
        if engine.runner is not None:
            await engine._unload_runner(engine.runner)

    app.on_shutdown.append(_stop_runner)
    app.router.add_get("/sim/engine", _get_engine_log)
    app.router.add_delete("/sim/engine", _delete_engine_log)
