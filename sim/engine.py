"""SimEngine: continuous batching with roofline step times (the ``Backend`` for ``python -m sim``).

One ``_Runner`` per loaded model owns ``num_parallel`` slots and one batch
loop. Each step carries one token per decoding slot plus up to ``num_batch``
prompt tokens of prefilling slots (as llama-server's ``update_slots``) and
lasts as long as ``sim.timing.step_seconds`` says. Tokens of every slot in a
step are handed out in the same event-loop tick, as a batching server writes
them. All reported durations are measured with ``time.monotonic_ns()``, never
computed from the model, so they always match elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
import traceback
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sim import timing
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
from sim.catalog import MODELS, ModelFacts
from sim.context_fit import fit_prompt
from sim.faults import Faults
from sim.gpu import VirtualGpu
from sim.profiles import SimProfile
from sim.tokens import TextStream, special_id, token_id

GRAPH_BYTES = 256 * 1024**2  # llama.cpp compute buffers
MODELS_PER_GPU = 3  # OLLAMA_MAX_LOADED_MODELS's default (0, "auto"): 3 per GPU, and the sim has one
EOS_TOKEN_ID = special_id(2)  # <|eot_id|>
# Steps are scheduled on a virtual timeline (each ends one step time after the previous one's planned end),
# so timer overshoot and a starved host CPU are caught up by the following steps and average rates follow
# the model. Lateness beyond this restarts the timeline from now.
MAX_CARRY_NS = 250_000_000
# How many thinking tokens precede the answer, by ``think`` level (drawn from the request's seed).
THINKING_TOKENS = {"low": (8, 32), "medium": (32, 96), "high": (96, 192), "max": (192, 384)}


def thinking_length(level: str, seed: str) -> int:
    lo, hi = THINKING_TOKENS.get(level, THINKING_TOKENS["medium"])
    return random.Random(seed + ":think").randint(lo, hi)


def _answer_text(think_n: int, words: TextStream, pieces: list[str] | None) -> Iterator[str]:
    """``think_n`` pseudo-words of thinking, then the answer: fixed pieces, or more pseudo-words."""
    for _ in range(think_n):
        yield next(words)
    yield from pieces if pieces is not None else words


class QueueFullError(EngineError):
    def __init__(self) -> None:
        super().__init__(503, QUEUE_FULL_MESSAGE)


@dataclass
class _Slot:
    index: int
    cache_ids: list[int] = field(default_factory=list)
    busy: bool = False
    last_used_ns: int = 0


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the shared prefix; bisects on slice equality (C speed) so long prompts do not stall the loop."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class _Job:
    req: GenRequest
    slot: _Slot
    prompt_ids: list[int]
    cached: int
    max_tokens: int
    length_reason: str  # why it ends at max_tokens: "length" or "stop"
    text: Iterator[str]
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    pos: int = 0  # prompt tokens in the KV cache
    generated: list[int] = field(default_factory=list)
    prefill_start_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    active: bool = True
    think_n: int = 0  # the first tokens are thinking
    embed: bool = False  # prefill only: ends when the prompt is in, nothing sampled
    done: asyncio.Future[int] | None = None  # embed: resolved with the end of its last step
    input_lengths: list[int] = field(default_factory=list)  # embed: tokens of each input (separate sequences)

    @property
    def decoding(self) -> bool:
        return self.pos >= len(self.prompt_ids)

    @property
    def context_len(self) -> int:
        return self.pos + len(self.generated)


def _segments(job: _Job, n: int) -> list[tuple[int, int]]:
    """(tokens before, tokens) of a prefill chunk; an embed batch's inputs are separate sequences."""
    if not job.input_lengths:
        return [(job.pos, n)]
    out: list[tuple[int, int]] = []
    start, pos, end = 0, job.pos, job.pos + n
    for length in job.input_lengths:
        lo, hi = max(pos, start), min(end, start + length)
        if hi > lo:
            out.append((lo - start, hi - lo))
        start += length
    return out


class _Runner:
    def __init__(
        self, engine: SimEngine, model: ModelFacts, num_ctx: int, num_batch: int, size_bytes: int, size_vram_bytes: int
    ) -> None:
        self.engine = engine
        self.model = model
        self.num_ctx = num_ctx
        self.num_batch = num_batch
        self.num_gpu = -1  # Ollama's num_gpu option it was loaded with (-1 = auto)
        self.size_bytes = size_bytes
        self.size_vram_bytes = size_vram_bytes
        self.vram_fraction = size_vram_bytes / size_bytes if size_bytes else 0.0
        self.keep_alive_ns = engine.default_keep_alive_ns
        # Ollama sets expires_at when a runner goes idle; until then it shows the load-time value.
        self.expires_at_unix_s: float | None = time.time() + self.keep_alive_ns / 1e9 if self.keep_alive_ns >= 0 else None
        self.refs = 0
        self.last_used_ns = time.monotonic_ns()
        self.slots = [_Slot(i) for i in range(engine.num_parallel)]
        self._waiters: deque[tuple[asyncio.Future[_Slot], list[int]]] = deque()
        self.jobs: list[_Job] = []
        self._wake = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batch-{model.name}")

    # --- slots -------------------------------------------------------------
    def _pick_slot(self, prompt_ids: list[int]) -> _Slot | None:
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        # llama-server prefers the slot whose cache shares the longest prefix, else the least recently used.
        best = max(free, key=lambda s: (common_prefix(s.cache_ids, prompt_ids), -s.last_used_ns))
        if common_prefix(best.cache_ids, prompt_ids) == 0:
            best = min(free, key=lambda s: s.last_used_ns)
        return best

    async def acquire_slot(self, prompt_ids: list[int]) -> _Slot:
        """A free slot, waiting first-come first-served; cancelling the wait leaves the queue."""
        if not self._waiters:
            slot = self._pick_slot(prompt_ids)
            if slot is not None:
                slot.busy = True
                return slot
        fut: asyncio.Future[_Slot] = asyncio.get_running_loop().create_future()
        entry = (fut, prompt_ids)
        self._waiters.append(entry)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release_slot(fut.result())
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)
            raise

    def release_slot(self, slot: _Slot) -> None:
        slot.busy = False
        slot.last_used_ns = time.monotonic_ns()
        while self._waiters:
            fut, prompt_ids = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            nxt = self._pick_slot(prompt_ids)
            if nxt is None:
                return
            self._waiters.popleft()
            nxt.busy = True
            fut.set_result(nxt)

    # --- batch loop --------------------------------------------------------
    def submit(self, job: _Job) -> None:
        self.jobs.append(job)
        self._wake.set()

    def finish(self, job: _Job) -> None:
        """The request ended (done, failed or client gone): leave the batch, keep what is cached."""
        job.active = False
        if job in self.jobs:
            self.jobs.remove(job)
        # An embedding leaves nothing a later generation could reuse.
        job.slot.cache_ids = [] if job.embed else job.prompt_ids[: job.pos] + job.generated
        self.release_slot(job.slot)

    async def _loop(self) -> None:
        target_ns: int | None = None
        while True:
            if not self.jobs:
                self._wake.clear()
                await self._wake.wait()
                target_ns = None
                continue
            try:
                target_ns = await self._step(target_ns)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug must not leave streams hanging: fail this batch, keep serving
                traceback.print_exc(file=sys.stderr)
                for j in list(self.jobs):
                    j.active = False
                    j.queue.put_nowait(Failed(f"{type(e).__name__}: {e}"))
                    if j.done is not None and not j.done.done():
                        j.done.set_exception(RuntimeError(f"{type(e).__name__}: {e}"))
                self.jobs.clear()
                target_ns = None

    async def _step(self, target_ns: int | None) -> int:
        """Run one batch step; returns its planned end on the virtual timeline."""
        profile = self.engine.profile
        decoders, chunks = self._batch()
        work = timing.StepWork([j.context_len for j in decoders], [seg for j, n in chunks for seg in _segments(j, n)])
        step_s = timing.step_seconds(self.model, profile, self.vram_fraction, work)
        floor_ns = int(timing.floor_seconds(self.model, profile, self.vram_fraction, work) * 1e9)
        stall_s = self._stall_s(decoders, chunks)
        step_s += stall_s
        start = time.monotonic_ns()
        for j, _ in chunks:
            if j.prefill_start_ns is None:
                j.prefill_start_ns = start
                j.req.truth.prefill_start_ns = start
        # A stall fault is a real-time hiccup: it restarts the timeline instead of absorbing earlier lateness.
        late = target_ns is None or start - target_ns > MAX_CARRY_NS or stall_s > 0
        base = start if late or target_ns is None else target_ns
        # Catching up may shorten a step to its physical floor (one read of the weights and KV at full
        # bandwidth, or its FLOPs at full compute), never below: no engine is faster than that.
        target_ns = max(base + int(step_s * 1e9), start + floor_ns)
        self.engine.gpu.record_step(start, target_ns, self._compute_share(work))
        delay = (target_ns - time.monotonic_ns()) / 1e9
        # Always yield, so writers run between steps even while catching up.
        await asyncio.sleep(max(delay, 0.0))
        # Timers may fire a little early (uvloop counts whole milliseconds): hold the floor exactly.
        while (early_ns := start + floor_ns - time.monotonic_ns()) > 0:
            await asyncio.sleep(early_ns / 1e9)
        self._advance(decoders, chunks, time.monotonic_ns())
        return target_ns

    def _batch(self) -> tuple[list[_Job], list[tuple[_Job, int]]]:
        """This step's work: every decoding generation's next token, then prompt chunks (oldest job first) filling
        the rest of the batch's tokens."""
        decoders = [j for j in self.jobs if j.decoding and not j.embed]
        budget = max(self.num_batch - len(decoders), 0)
        chunks: list[tuple[_Job, int]] = []
        for j in self.jobs:
            if not j.decoding and budget > 0:
                n = min(budget, len(j.prompt_ids) - j.pos)
                chunks.append((j, n))
                budget -= n
        return decoders, chunks

    def _advance(self, decoders: list[_Job], chunks: list[tuple[_Job, int]], end: int) -> None:
        """The step ended at ``end``: each decoder's token, each chunk read; a prompt read to its end yields its
        first token (or its embedding)."""
        for j in decoders:
            if j.active:
                self._emit(j, end)
        for j, n in chunks:
            if j.active:
                j.pos += n
                if j.decoding:
                    j.req.truth.prefill_end_ns = end
                    if j.embed:
                        self._embedded(j, end)
                    else:
                        self._emit(j, end)

    def _stall_s(self, decoders: list[_Job], chunks: list[tuple[_Job, int]]) -> float:
        stall = 0.0
        for j in [*decoders, *(j for j, _ in chunks)]:
            ms = j.req.faults.get("stall_ms")
            if ms is None:
                continue
            after = int(j.req.faults.get("stall_after_tokens", 1))
            # The step that yields token number `after` (1 = the first) is the slow one.
            will_emit = j.decoding or j.pos + next(n for jj, n in chunks if jj is j) >= len(j.prompt_ids)
            if will_emit and len(j.generated) + 1 >= after:
                stall = max(stall, ms / 1000.0)
                j.req.faults.pop("stall_ms")
        return stall

    def _embedded(self, job: _Job, at_ns: int) -> None:
        job.active = False
        self.jobs.remove(job)
        if job.done is not None and not job.done.done():
            job.done.set_result(at_ns)

    def _compute_share(self, work: timing.StepWork) -> float:
        spec = self.engine.profile.spec
        weights, kv = timing.step_bytes(self.model, work)
        mem_s = (weights + kv) / (spec.eta_bw_quant * spec.bandwidth_bytes_s)
        flop_s = timing.step_flops(self.model, work) / (spec.eta_compute * spec.fp16_flops)
        return min(flop_s / mem_s, 1.0) if mem_s > 0 else 1.0

    def _emit(self, job: _Job, at_ns: int) -> None:
        # An answer that ends by itself ends on the end-of-generation token, sampled like any other.
        eos = job.length_reason == "stop" and len(job.generated) + 1 == job.max_tokens
        text = "" if eos else next(job.text)
        tid = EOS_TOKEN_ID if eos else token_id(text.strip())
        thinking = len(job.generated) < job.think_n
        if thinking:
            job.req.truth.thinking_tokens += 1
        job.generated.append(tid)
        if job.first_ns is None:
            job.first_ns = at_ns
        job.last_ns = at_ns
        job.req.truth.token_sampled_ns.append(at_ns)
        job.queue.put_nowait(Token(text, tid, at_ns, eos=eos, thinking=thinking and not eos))
        if len(job.generated) >= job.max_tokens:
            assert job.prefill_start_ns is not None
            job.queue.put_nowait(
                Done(
                    done_reason=job.length_reason,
                    prompt_eval_count=len(job.prompt_ids),
                    prompt_eval_cached_count=job.cached,
                    prompt_eval_ns=job.first_ns - job.prefill_start_ns,
                    eval_count=len(job.generated),
                    eval_ns=job.last_ns - job.first_ns,
                    context_ids=job.prompt_ids + job.generated,
                )
            )
            job.active = False
            self.jobs.remove(job)

    # --- keep-alive --------------------------------------------------------
    def mark_idle(self) -> None:
        """Called when the last request using this runner ends."""
        self.last_used_ns = time.monotonic_ns()
        if self._expiry:
            self._expiry.cancel()
            self._expiry = None
        ka = self.keep_alive_ns
        if ka < 0:
            self.expires_at_unix_s = None
            return
        self.expires_at_unix_s = time.time() + ka / 1e9
        if ka == 0:
            self.engine._unload_runner(self)
            return
        self._expiry = asyncio.get_running_loop().call_later(ka / 1e9, self._expire)

    def mark_busy(self) -> None:
        if self._expiry:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        if self.refs == 0:
            self.engine._unload_runner(self)

    def stop(self) -> None:
        if self._expiry:
            self._expiry.cancel()
        self._task.cancel()
        for j in list(self.jobs):
            j.queue.put_nowait(Failed("model runner has unexpectedly stopped"))
            if j.done is not None and not j.done.done():
                j.done.set_exception(EngineError(500, "model runner has unexpectedly stopped"))


class SimEngine:
    """The physical-model backend. See ``sim.backend`` for the interface."""

    def __init__(
        self,
        profile: SimProfile,
        *,
        num_parallel: int = 1,
        max_queue: int = 512,
        default_keep_alive_ns: int = 5 * 60 * 10**9,
        faults: Faults | None = None,
        max_loaded_models: int = 0,
        context_length: int | None = None,
        context_shift: bool = True,
    ) -> None:
        self.profile = profile
        # OLLAMA_MAX_LOADED_MODELS: a load beyond it evicts the least recently used idle model first.
        self.max_loaded_models = max_loaded_models if max_loaded_models > 0 else MODELS_PER_GPU
        self.context_length = context_length  # OLLAMA_CONTEXT_LENGTH; None: the VRAM-based default
        self.context_shift = context_shift  # False: a model whose runner cannot shift (a long prompt is a 400)
        self.num_parallel = num_parallel
        self.max_queue = max_queue
        self.default_keep_alive_ns = default_keep_alive_ns
        self.faults = faults or Faults()
        self.gpu = VirtualGpu(profile)
        self.runners: dict[str, _Runner] = {}
        self._sched_lock = asyncio.Lock()
        self._pending = 0

    def catalog(self) -> list[ModelFacts]:
        return list(MODELS)

    # --- loading -------------------------------------------------------------
    def _memory_plan(self, model: ModelFacts, num_ctx: int, num_gpu: int = -1) -> tuple[int, int]:
        """(size, size_vram) for a runner: weights + KV for all slots + compute buffers; whole layers on the GPU.

        Like Ollama, the compute buffers go to the GPU first, then as many whole layers (weights and KV) as
        fit; the rest run from system memory. ``num_gpu`` (Ollama's option: layers on the GPU, -1 = as many
        as fit) caps the layers; 0 keeps everything in system memory.
        """
        kv = int(model.kv_bytes_per_token * num_ctx * self.num_parallel)
        size = model.size_bytes + kv + GRAPH_BYTES
        used = sum(r.size_vram_bytes for r in self.runners.values())
        free = max(self.profile.vram_bytes - used, 0)
        per_layer = (model.size_bytes + kv) / model.block_count
        layers = int((free - GRAPH_BYTES) // per_layer) if free > GRAPH_BYTES else 0
        layers = min(layers, model.block_count) if num_gpu < 0 else min(layers, num_gpu, model.block_count)
        if layers <= 0:
            return size, 0
        if layers == model.block_count:
            return size, size
        return size, GRAPH_BYTES + int(layers * per_layer)

    def _free_memory_for(self, size: int) -> None:
        """Evict idle runners, least recently used first, until ``size`` fits or none is idle."""
        while True:
            used = sum(r.size_vram_bytes for r in self.runners.values())
            over_count = len(self.runners) >= self.max_loaded_models
            if used + size <= self.profile.vram_bytes and not over_count:
                return
            idle = [r for r in self.runners.values() if r.refs == 0]
            if not idle:
                return
            self._unload_runner(min(idle, key=lambda r: r.last_used_ns))

    def _unload_runner(self, runner: _Runner) -> None:
        if self.runners.get(runner.model.name) is runner:
            del self.runners[runner.model.name]
        runner.stop()
        self.gpu.models_vram_bytes = sum(r.size_vram_bytes for r in self.runners.values())

    def _num_ctx(self, model: ModelFacts, num_ctx: int | None) -> int:
        ctx = num_ctx if num_ctx and num_ctx > 0 else self.context_length or self.profile.default_num_ctx
        return min(ctx, model.context_length)

    async def _get_runner(
        self,
        model: ModelFacts,
        num_ctx: int | None,
        keep_alive_ns: int | None,
        truth: Any,
        num_batch: int | None = None,
        num_gpu: int = -1,
    ) -> _Runner:
        """A ready runner with one reference taken; loads (through the bounded pending queue) when needed."""
        ctx = self._num_ctx(model, num_ctx)
        batch = num_batch if num_batch and num_batch > 0 else timing.default_num_batch(ctx)

        def stale(r: _Runner | None) -> bool:
            # Load-time options that differ from the running model's force a reload, as in Ollama's needsReload
            # (docs/ollama-api.md §5); a request with num_gpu -1 (auto) takes the runner as it is loaded.
            return r is not None and (r.num_ctx != ctx or r.num_batch != batch or (num_gpu >= 0 and r.num_gpu != num_gpu))

        runner = self.runners.get(model.name)
        if runner is None or stale(runner):
            # Like Ollama's pendingReqCh: the request the scheduler is loading has left the queue.
            waiting = self._pending - (1 if self._sched_lock.locked() else 0)
            if waiting >= self.max_queue:
                raise QueueFullError()
            self._pending += 1
            # The load goes on when the client leaves (as Ollama's scheduler does); the model then idles.
            task = asyncio.ensure_future(self._load_locked(model, ctx, batch, num_gpu, stale, truth))
            try:
                runner = await asyncio.shield(task)
            except asyncio.CancelledError:
                task.add_done_callback(self._orphaned_load)
                raise
            finally:
                self._pending -= 1
        runner.refs += 1
        runner.mark_busy()
        if keep_alive_ns is not None:
            runner.keep_alive_ns = keep_alive_ns  # a request's keep_alive sticks to the runner
        return runner

    async def _load_locked(
        self, model: ModelFacts, ctx: int, batch: int, num_gpu: int, stale: Callable[[_Runner | None], bool], truth: Any
    ) -> _Runner:
        async with self._sched_lock:
            runner = self.runners.get(model.name)
            if runner is not None and stale(runner):
                # A load-time option changed: wait until it is idle, then reload.
                while runner.refs > 0:
                    await asyncio.sleep(0.005)
                self._unload_runner(runner)
                runner = None
            if runner is None:
                runner = await self._load(model, ctx, batch, num_gpu, truth)
            return runner

    def _orphaned_load(self, task: asyncio.Future[_Runner]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        runner = task.result()
        if runner.refs == 0 and self.runners.get(runner.model.name) is runner:
            runner.mark_idle()

    async def _load(self, model: ModelFacts, ctx: int, batch: int, num_gpu: int, truth: Any) -> _Runner:
        start = time.monotonic_ns()
        if truth is not None:
            truth.load_start_ns = start
        size, _ = self._memory_plan(model, ctx, num_gpu)
        layers_share = 1.0 if num_gpu < 0 else min(num_gpu, model.block_count) / model.block_count
        self._free_memory_for(int(size * layers_share))
        size, size_vram = self._memory_plan(model, ctx, num_gpu)
        failure = self.faults.take_load_failure()
        load_s = timing.load_seconds(model, self.profile)
        if failure is not None:
            await asyncio.sleep(min(load_s, 0.05))
            if truth is not None:
                truth.load_end_ns = time.monotonic_ns()
            raise EngineError(500, failure)
        await asyncio.sleep(load_s)
        runner = _Runner(self, model, ctx, batch, size, size_vram)
        runner.num_gpu = num_gpu
        self.runners[model.name] = runner
        self.gpu.models_vram_bytes = sum(r.size_vram_bytes for r in self.runners.values())
        if truth is not None:
            truth.load_end_ns = time.monotonic_ns()
        return runner

    def _release(self, runner: _Runner) -> None:
        runner.refs -= 1
        if runner.refs == 0 and self.runners.get(runner.model.name) is runner:
            runner.mark_idle()

    # --- Backend API ---------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncGenerator[Event, None]:
        truth = req.truth
        num_gpu = req.options.get("num_gpu", -1)
        num_gpu = int(num_gpu) if isinstance(num_gpu, int | float) and not isinstance(num_gpu, bool) else -1
        runner = await self._get_runner(req.model, req.num_ctx, req.keep_alive_ns, truth, req.num_batch, num_gpu)
        slot: _Slot | None = None
        job: _Job | None = None
        try:
            yield Loaded(time.monotonic_ns())
            prompt_ids = fit_prompt(req.prompt_ids, runner.num_ctx, can_shift=self.context_shift and req.shift)
            prompt_ids = prompt_ids or [special_id(0)]  # an empty text still evaluates BOS
            slot = await runner.acquire_slot(prompt_ids)
            # llama-server always evaluates at least the last prompt token.
            cached = min(common_prefix(slot.cache_ids, prompt_ids), max(len(prompt_ids) - 1, 0))
            now = time.monotonic_ns()
            truth.slot_acquired_ns = now
            truth.prompt_tokens = len(prompt_ids)
            truth.cached_tokens = cached
            yield SlotAcquired(now, cached)
            words = TextStream(req.seed)
            think_n = thinking_length(req.think, req.seed) if req.think else 0
            pieces = req.answer_pieces
            room = max(runner.num_ctx - len(prompt_ids), 1)
            if req.num_predict > 0 and req.num_predict <= room:
                max_tokens, reason = req.num_predict, "length"
            else:
                natural = think_n + (len(pieces) if pieces is not None else words.plausible_length())
                # natural visible tokens, then the end-of-generation token
                max_tokens, reason = (natural + 1, "stop") if natural + 1 <= room else (room, "length")
            text = _answer_text(think_n, words, pieces)
            job = _Job(req, slot, prompt_ids, cached, max_tokens, reason, text, pos=cached, think_n=think_n)
            runner.submit(job)
            raise_after = req.faults.get("raise_after_tokens")
            visible = 0
            while True:
                if raise_after is not None and visible >= raise_after:
                    raise RuntimeError(f"fault: engine bug after {visible} tokens")
                ev = await job.queue.get()
                yield ev
                if isinstance(ev, Done | Failed):
                    return
                if isinstance(ev, Token) and not ev.eos:
                    visible += 1
        finally:
            if job is not None:
                runner.finish(job)
            elif slot is not None:
                runner.release_slot(slot)
            self._release(runner)

    async def embed(self, req: EmbedRequest) -> EmbedDone:
        """All inputs prefilled in the batch loop (steps of up to ``num_batch`` tokens shared with other slots)."""
        runner = await self._get_runner(req.model, req.num_ctx, req.keep_alive_ns, req.truth)
        slot: _Slot | None = None
        job: _Job | None = None
        try:
            loaded_ns = time.monotonic_ns()
            ids = [t for one in req.inputs for t in one]
            req.truth.prompt_tokens = len(ids)
            if not ids:
                return EmbedDone(loaded_ns, 0, 0)
            slot = await runner.acquire_slot([])
            req.truth.slot_acquired_ns = time.monotonic_ns()
            gen = GenRequest(model=req.model, prompt_ids=ids, truth=req.truth)
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            job = _Job(
                gen, slot, ids, 0, 0, "stop", iter(()), embed=True, done=done, input_lengths=[len(one) for one in req.inputs]
            )
            runner.submit(job)
            end_ns = await done
            assert job.prefill_start_ns is not None
            return EmbedDone(loaded_ns, len(ids), end_ns - job.prefill_start_ns)
        finally:
            if job is not None:
                runner.finish(job)
            elif slot is not None:
                runner.release_slot(slot)
            self._release(runner)

    async def load(self, model: ModelFacts, num_ctx: int | None, keep_alive_ns: int | None) -> None:
        runner = await self._get_runner(model, num_ctx, keep_alive_ns, None)
        self._release(runner)

    async def unload(self, model: ModelFacts) -> None:
        runner = self.runners.get(model.name)
        if runner is None:
            return
        runner.keep_alive_ns = 0
        runner.expires_at_unix_s = time.time()
        if runner.refs == 0:
            self._unload_runner(runner)

    def queued(self) -> dict[str, int]:
        return {name: len(r._waiters) for name, r in self.runners.items()}

    def loaded(self) -> list[LoadedInfo]:
        return [
            LoadedInfo(r.model, r.size_bytes, r.size_vram_bytes, r.num_ctx, r.expires_at_unix_s) for r in self.runners.values()
        ]

    def gpu_state(self) -> dict[str, Any] | None:
        if self.profile.vram_bytes == 0:
            return None
        return self.gpu.state()

    async def close(self) -> None:
        for r in list(self.runners.values()):
            self._unload_runner(r)
