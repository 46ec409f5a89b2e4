"""LlamaEngine: a real llama.cpp model behind the simulator's Ollama API (``python -m sim --engine llama-cpp``).

It implements ``sim.backend.Backend``, so ``sim.server`` serves it with the same routes, shapes and
streaming as the simulated engine. Prefill and decode really run (llama-cpp-python, on the CPU) in one
worker thread, so the event loop keeps serving while a request computes. There is one slot
(``OLLAMA_NUM_PARALLEL=1``): later requests wait for it, and that wait lands in ``total_duration``
only, as in Ollama.

Durations follow Ollama >= 0.30, which reports llama-server's slot timings (docs/ollama-api.md §4):

* ``prompt_eval_duration`` = ``prompt_ms``: prompt processing starts -> first token sampled; only the
  tokens not found in the prompt cache are evaluated.
* ``eval_duration`` = ``predicted_ms``: first token sampled -> last token sampled (sampling included).
* ``eval_count`` = ``predicted_n``: every sampled token, the first and an end-of-generation token included.
* ``prompt_eval_count`` = ``cache_n + prompt_n``: the whole prompt; ``prompt_eval_cached_count`` = ``cache_n``.

Beside them, every request keeps llama.cpp's own counters (``llama_perf_context``: compute time of
prompt batches and of single-token decodes, without sampling) and the time spent in llama.cpp's
sampler (timed around its calls), split at the first token, served on ``GET /sim/engine`` so tests
can hold the reported phases against them. llama.cpp files a decode by its
batch size, not by phase: a one-token prompt suffix counts as an "eval", so we split by time instead.

The prompt cache is llama-cpp-python's: ``Llama.generate`` keeps the previous request's tokens in
the KV cache and evaluates only what follows the longest common prefix (always at least one token,
as llama-server). Load and unload really create and free the ``Llama`` object; keep-alive and
``keep_alive: 0`` behave as in Ollama. ``/api/show``, ``/api/tags`` and ``/api/ps`` come from the
GGUF's own metadata; the digest is the file's sha256.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sim.backend import Done, EngineError, Event, Failed, GenRequest, Loaded, LoadedInfo, SlotAcquired, Token
from sim.catalog import ModelFacts
from sim.gguf_model import (
    DEFAULT_MODEL_NAME,
    DEFAULT_NUM_BATCH,
    DEFAULT_NUM_CTX,
    QUEUE_FULL_MESSAGE,
    EngineUnavailable,
    ollama_sampling,
    read_model_facts,
    render_prompt,
    stop_strings,
)

if TYPE_CHECKING:
    from llama_cpp import Llama

ENGINE_LOG_MAX = 10_000


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or EngineUnavailable with the install line."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineUnavailable(
            'llama-cpp-python is not installed: CMAKE_ARGS="-DGGML_NATIVE=OFF" '
            ".venv/bin/pip install --no-cache-dir -r requirements-engine.txt"
        ) from exc
    return llama_cpp


# --- sampling, stop strings -------------------------------------------------------------------


def sampling_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """``Llama.generate`` keyword arguments from Ollama's options (Ollama's defaults where absent)."""
    o = ollama_sampling(options)
    return {
        "temp": o["temperature"], "top_k": int(o["top_k"]), "top_p": o["top_p"], "min_p": o["min_p"],
        "typical_p": o["typical_p"], "repeat_penalty": o["repeat_penalty"],
        "presence_penalty": o["presence_penalty"], "frequency_penalty": o["frequency_penalty"],
    }


class StopFilter:
    """Holds back text that may be the start of a stop string, so a stop string is never sent."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text that is safe to send now; sets ``stopped`` when a stop string completed."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
            return out
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


# --- llama.cpp's own counters ---------------------------------------------------------------


@dataclass(frozen=True)
class PerfCounters:
    """``llama_perf_context`` since its last reset: compute time of decodes (ms), by batch size."""

    batch_ms: float  # decodes of more than one token (llama.cpp's t_p_eval_ms)
    batch_tokens: int
    single_ms: float  # one-token decodes (t_eval_ms)
    single_decodes: int

    @staticmethod
    def read(llama_cpp: Any, ctx: Any) -> PerfCounters:
        llama_cpp.llama_synchronize(ctx)  # pending work is booked when the context synchronizes
        p = llama_cpp.llama_perf_context(ctx)
        # llama.cpp reports max(1, n) so that rates never divide by zero: no time means none happened.
        return PerfCounters(
            batch_ms=p.t_p_eval_ms, batch_tokens=p.n_p_eval if p.t_p_eval_ms > 0 else 0,
            single_ms=p.t_eval_ms, single_decodes=p.n_eval if p.t_eval_ms > 0 else 0,
        )

    def minus(self, other: PerfCounters) -> PerfCounters:
        return PerfCounters(self.batch_ms - other.batch_ms, self.batch_tokens - other.batch_tokens,
                            self.single_ms - other.single_ms, self.single_decodes - other.single_decodes)

    @property
    def compute_ms(self) -> float:
        return self.batch_ms + self.single_ms

    @property
    def tokens(self) -> int:
        return self.batch_tokens + self.single_decodes

    def to_json(self) -> dict[str, float | int]:
        return {"compute_ms": self.compute_ms, "tokens": self.tokens, "batch_ms": self.batch_ms,
                "batch_tokens": self.batch_tokens, "single_ms": self.single_ms, "single_decodes": self.single_decodes}


@dataclass
class EngineRecord:
    """What llama.cpp itself measured for one request (``GET /sim/engine``)."""

    id: str  # the same id as /sim/truth and the X-Sim-Request-Id header
    model: str
    n_threads: int
    num_ctx: int
    num_batch: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    sampled_tokens: int = 0  # first token and end-of-generation token included (Ollama's eval_count)
    prompt_eval_ns: int = 0  # reported: prompt start -> first token sampled
    eval_ns: int = 0  # reported: first -> last token sampled
    prefill: dict[str, float | int] = field(default_factory=dict)  # PerfCounters up to the first token
    decode: dict[str, float | int] = field(default_factory=dict)  # PerfCounters after it
    cancelled: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --- the loaded model -----------------------------------------------------------------------


@dataclass
class _Job:
    req: GenRequest
    prompt: str
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    slot_ns: int = 0  # when the slot was acquired
    cancel: threading.Event = field(default_factory=threading.Event)
    record: EngineRecord | None = None

    def emit(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, ev)


class _Runner:
    """One loaded ``Llama``; every call into it runs on the engine's single worker thread."""

    def __init__(self, engine: LlamaEngine, llm: Llama, num_ctx: int, num_batch: int) -> None:
        self.engine = engine
        self.llm = llm
        self.num_ctx = num_ctx
        self.num_batch = num_batch
        self.keep_alive_ns = engine.default_keep_alive_ns
        self.expires_at_unix_s: float | None = time.time() + self.keep_alive_ns / 1e9 if self.keep_alive_ns >= 0 else None
        self.refs = 0
        self.slot = asyncio.Lock()  # one slot: FIFO waiters
        # llama.cpp's sampler keeps no timings of its own in this binding, so we time its calls: Ollama's
        # durations include sampling, and over a 262k-token vocabulary it is a few % of a decode step.
        self.sample_ns = 0
        original_sample = llm.sample

        def timed_sample(*args: Any, **kwargs: Any) -> int:
            t0 = time.perf_counter_ns()
            try:
                return int(original_sample(*args, **kwargs))
            finally:
                self.sample_ns += time.perf_counter_ns() - t0

        setattr(llm, "sample", timed_sample)  # Llama.generate looks it up on the instance  # noqa: B010
        self._expiry: asyncio.TimerHandle | None = None
        self.closed = False

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

    # --- worker thread ------------------------------------------------------------------
    def run_job(self, job: _Job) -> None:
        """Prefill and decode one request, sending events to the event loop as they happen."""
        try:
            self._run_job(job)
        except Exception as exc:  # a crash in llama.cpp must end the stream, not hang it
            job.emit(Failed(f"llama.cpp: {exc}"))

    def _run_job(self, job: _Job) -> None:
        llama_cpp = self.engine.llama_cpp
        llm, req, truth = self.llm, job.req, job.req.truth
        ctx = llm._ctx.ctx
        tokens: list[int] = llm.tokenize(job.prompt.encode("utf-8"), add_bos=True, special=False)
        if len(tokens) >= self.num_ctx:  # Ollama truncates from the front to fit num_ctx
            tokens = tokens[-(self.num_ctx - 1):]
        # The cache llama-cpp-python will reuse: the longest common prefix, leaving at least one token to evaluate.
        held = llm.input_ids[: llm.n_tokens].tolist()
        common = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            common += 1
        cached = min(common, len(tokens) - 1)
        if common >= len(tokens):
            # The whole prompt is held: llama-cpp-python would sample from stale logits without evaluating
            # anything; llama-server re-evaluates the last prompt token, and so do we.
            llm.n_tokens = len(tokens) - 1
        truth.prompt_tokens, truth.cached_tokens = len(tokens), cached
        room = self.num_ctx - len(tokens)
        max_tokens = min(req.num_predict, room) if req.num_predict > 0 else room
        length_reason = "length"
        seed = req.options.get("seed")
        llm.set_seed(int(seed) if isinstance(seed, int) and seed >= 0 else int.from_bytes(os.urandom(4), "little"))
        stops = StopFilter(stop_strings(req))
        vocab = llm._model.vocab
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        record = job.record
        assert record is not None
        record.prompt_tokens, record.cached_tokens = len(tokens), cached
        job.emit(SlotAcquired(job.slot_ns, cached))

        llama_cpp.llama_perf_context_reset(ctx)
        zero = PerfCounters.read(llama_cpp, ctx)
        sample0_ns = sample1_ns = self.sample_ns
        start_ns = time.monotonic_ns()
        truth.prefill_start_ns = start_ns
        first_ns = last_ns = start_ns
        at_first = zero
        sampled: list[int] = []
        reason = length_reason
        gen = llm.generate(tokens, **sampling_kwargs(req.options))
        try:
            for tok in gen:
                now = time.monotonic_ns()
                sampled.append(tok)
                last_ns = now
                truth.token_sampled_ns.append(now)
                if len(sampled) == 1:
                    first_ns = now
                    truth.prefill_end_ns = now
                    at_first = PerfCounters.read(llama_cpp, ctx)
                    sample1_ns = self.sample_ns
                if llama_cpp.llama_vocab_is_eog(vocab, tok):
                    job.emit(Token("", tok, now, eos=True))  # counted in eval_count, never written
                    reason = "stop"
                    break
                piece = utf8.decode(llm.detokenize([tok]))
                text = stops.feed(piece)
                if stops.stopped:
                    if text:
                        job.emit(Token(text, tok, now))
                    reason = "stop"
                    break
                job.emit(Token(text, tok, now))
                if job.cancel.is_set():
                    record.cancelled = True
                    return
                if len(sampled) >= max_tokens:
                    break
        finally:
            gen.close()
        tail = stops.flush() + utf8.decode(b"", final=True)
        if tail:
            job.emit(Token(tail, 0, time.monotonic_ns()))
        end = PerfCounters.read(llama_cpp, ctx)
        record.sampled_tokens = len(sampled)
        record.prompt_eval_ns, record.eval_ns = first_ns - start_ns, last_ns - first_ns
        record.prefill = at_first.minus(zero).to_json() | {"sample_ms": (sample1_ns - sample0_ns) / 1e6}
        record.decode = end.minus(at_first).to_json() | {"sample_ms": (self.sample_ns - sample1_ns) / 1e6}
        job.emit(Done(
            done_reason=reason,
            prompt_eval_count=len(tokens),
            prompt_eval_cached_count=cached,
            prompt_eval_ns=first_ns - start_ns,
            eval_count=len(sampled),
            eval_ns=last_ns - first_ns,
            context_ids=tokens + sampled,
        ))


class LlamaEngine:
    """A ``sim.backend.Backend`` that serves one GGUF through llama.cpp on the CPU."""

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        n_threads: int = 2,
        default_num_ctx: int = DEFAULT_NUM_CTX,
        max_queue: int = 512,
        default_keep_alive_ns: int = 5 * 60 * 10**9,
        warmup: bool = True,
    ) -> None:
        self.llama_cpp = import_llama_cpp()
        self.model = read_model_facts(gguf_path, model_name)
        self.n_threads = n_threads
        self.default_num_ctx = default_num_ctx
        self.max_queue = max_queue
        self.default_keep_alive_ns = default_keep_alive_ns
        self.warmup = warmup
        self.runner: _Runner | None = None
        self.records: deque[EngineRecord] = deque(maxlen=ENGINE_LOG_MAX)
        # llama.cpp objects are not thread-safe: one thread makes every call into them.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._sched_lock = asyncio.Lock()
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()  # unloads in flight (the loop keeps only weak references)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _in_worker(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    def catalog(self) -> list[ModelFacts]:
        return [self.model]

    # --- loading ------------------------------------------------------------------------
    def _num_ctx(self, num_ctx: int | None) -> int:
        ctx = num_ctx if num_ctx and num_ctx > 0 else self.default_num_ctx
        return max(min(ctx, self.model.context_length or ctx), 16)

    def _load_blocking(self, num_ctx: int, num_batch: int) -> Llama:
        llm = self.llama_cpp.Llama(
            model_path=self.model.path, n_ctx=num_ctx, n_batch=num_batch, n_ubatch=num_batch,
            n_threads=self.n_threads, n_threads_batch=self.n_threads, verbose=False,
        )
        if self.warmup:
            # As llama-server does at start: one small decode so the first request does not pay for first touches.
            llm.eval([llm.token_bos(), llm.token_eos()])
            self.llama_cpp.llama_synchronize(llm._ctx.ctx)
            llm.reset()  # n_tokens = 0: the next eval starts by clearing the KV cache
        return llm

    async def _get_runner(self, num_ctx: int | None, num_batch: int | None, keep_alive_ns: int | None, truth: Any) -> _Runner:
        """The loaded runner with one reference taken; loads or reloads (load-time options changed) first."""
        ctx = self._num_ctx(num_ctx)
        batch = num_batch if num_batch and num_batch > 0 else DEFAULT_NUM_BATCH
        runner = self.runner
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
                        if truth is not None:
                            truth.load_start_ns = time.monotonic_ns()
                        try:
                            llm = await self._in_worker(lambda: self._load_blocking(ctx, batch))
                        except (ValueError, RuntimeError) as exc:
                            raise EngineError(500, f"llama runner process has terminated: {exc}") from exc
                        runner = _Runner(self, llm, ctx, batch)
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

    def _release(self, runner: _Runner) -> None:
        runner.refs -= 1
        if runner.refs == 0 and self.runner is runner:
            runner.mark_idle()

    async def _unload_runner(self, runner: _Runner) -> None:
        if self.runner is runner:
            self.runner = None
        runner.mark_busy()
        if not runner.closed:
            runner.closed = True
            await self._in_worker(runner.llm.close)

    async def _unload_if_idle(self, runner: _Runner) -> None:
        if runner.refs == 0:
            await self._unload_runner(runner)

    # --- Backend API --------------------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]:
        truth = req.truth
        runner = await self._get_runner(req.num_ctx, req.num_batch, req.keep_alive_ns, truth)
        job: _Job | None = None
        work: asyncio.Future[None] | None = None
        try:
            yield Loaded(time.monotonic_ns())
            async with runner.slot:
                now = time.monotonic_ns()
                truth.slot_acquired_ns = now
                loop = asyncio.get_running_loop()
                job = _Job(req, render_prompt(req), loop, asyncio.Queue(), slot_ns=now)
                job.record = EngineRecord(truth.id, self.model.name, self.n_threads, runner.num_ctx, runner.num_batch)
                self.records.append(job.record)
                work = loop.run_in_executor(self._worker, runner.run_job, job)
                while True:
                    ev = await job.events.get()
                    yield ev
                    if isinstance(ev, Done | Failed):
                        break
        finally:
            if job is not None:
                job.cancel.set()
            if work is not None:
                # The slot is free once the worker has stopped at the next token boundary.
                with contextlib.suppress(Exception):
                    await asyncio.shield(work)
            self._release(runner)

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

    def loaded(self) -> list[LoadedInfo]:
        r = self.runner
        if r is None:
            return []
        kv_bytes = int(self.model.kv_bytes_per_token * r.num_ctx)
        # Everything is in system memory: size_vram 0 is what Ollama shows for a CPU-only model.
        return [LoadedInfo(self.model, self.model.size_bytes + kv_bytes, 0, r.num_ctx, r.expires_at_unix_s)]

    def gpu_state(self) -> dict[str, Any] | None:
        return None

    async def close(self) -> None:
        if self.runner is not None:
            await self._unload_runner(self.runner)
        self._worker.shutdown(wait=True)


# --- extra route --------------------------------------------------------------------------


ENGINE_KEY = web.AppKey("llama_engine", LlamaEngine)


async def _get_engine_log(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({
        "engine": "llama.cpp", "model": engine.model.name, "gguf": engine.model.path, "n_threads": engine.n_threads,
        "requests": [r.to_json() for r in engine.records],
    })


async def _delete_engine_log(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].records.clear()
    return web.json_response({"cleared": True})


def add_engine_routes(app: web.Application, engine: LlamaEngine) -> None:
    """``GET|DELETE /sim/engine``: llama.cpp's own counters per request (see ``EngineRecord``)."""
    app[ENGINE_KEY] = engine
    app.router.add_get("/sim/engine", _get_engine_log)
    app.router.add_delete("/sim/engine", _delete_engine_log)
