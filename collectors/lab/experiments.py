"""The six experiments: their parameters, what they will cost, and what they do.

Each body sends ordinary streaming requests, so through the recording proxy
every probe lands in the store like any other request. Bodies append points as
they go, so a cancelled run keeps what it measured.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from analysis.model_names import same_model
from collectors.lab import conclusions
from collectors.lab.prompts import random_words

if TYPE_CHECKING:  # the HTTP client (aiohttp) loads when a run starts, not when a page reads the catalogue
    from collectors.lab.client import Probe
    from collectors.lab.context import LabContext

NS = 1e9


def _p(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


# -- parameters -----------------------------------------------------------------------------------


@dataclass
class PromptLengthParams:
    min_prompt_tokens: int = _p(64, "shortest prompt")
    max_prompt_tokens: int = _p(8192, "longest prompt (capped by the model's context)")
    num_predict: int = _p(4, "tokens generated per probe")


@dataclass
class ContextDepthParams:
    min_context_tokens: int = _p(256, "first depth of the conversation")
    max_context_tokens: int = _p(8192, "deepest conversation (capped by the model's context)")
    num_predict: int = _p(48, "tokens generated per turn")


@dataclass
class ConcurrencyParams:
    max_streams: int = _p(4, "most streams at once (levels double from 1)")
    num_predict: int = _p(48, "tokens generated per stream")
    prompt_tokens: int = _p(64, "prompt length of each stream")


@dataclass
class InterferenceParams:
    long_prompt_tokens: int = _p(4096, "the long prompt that arrives (capped by the model's context)")
    chat_max_tokens: int = _p(1024, "at most this many chat tokens; the chat is closed once the long prompt is done")
    baseline_tokens: int = _p(16, "chat tokens before the long prompt is sent")
    after_tokens: int = _p(8, "chat tokens to keep after the long prompt's prefill")


@dataclass
class ColdWarmParams:
    num_predict: int = _p(8, "tokens generated per request")
    prompt_tokens: int = _p(64, "prompt length")
    unload_timeout_s: float = _p(60.0, "how long to wait for the model to leave /api/ps")


@dataclass
class PromptCacheParams:
    prefix_tokens: int = _p(2048, "shared prefix (capped by the model's context)")
    num_predict: int = _p(4, "tokens generated per request")


# -- cost -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """What a run will send, before it runs. Times are an upper guess from the given rates."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    unloads_model: bool = False
    notes: tuple[str, ...] = ()
    warm_up_requests: int = 0  # of ``requests``, those sent first to load the model: they give no point

    def seconds(self, prefill_tok_s: float, decode_tok_s: float, load_s: float = 0.0) -> float:
        loads = 1 if self.unloads_model else 0
        return self.prompt_tokens / prefill_tok_s + self.output_tokens / decode_tok_s + loads * load_s + 0.05 * self.requests

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "unloads_model": self.unloads_model,
            "notes": list(self.notes),
            "warm_up_requests": self.warm_up_requests,
        }


WARM_UP = (1, 64, 1)  # requests, prompt tokens, output tokens of the warm-up probe


def doubling(lo: int, hi: int) -> list[int]:
    """lo, 2·lo, 4·lo, … up to hi, and hi itself when it is not on the ladder."""
    out: list[int] = []
    n = max(1, lo)
    while n <= hi:
        out.append(n)
        n *= 2
    if hi >= lo and (not out or out[-1] != hi):
        out.append(hi)
    return out


def _cap(context_tokens: int | None, reserve: int) -> int:
    """Largest prompt the context allows; unknown context: no cap, so the estimate is an upper bound."""
    if context_tokens is None:
        return 10**9
    return int((context_tokens - reserve) * 0.9)


def cost_prompt_length(p: PromptLengthParams, context_tokens: int | None) -> Cost:
    lengths = doubling(p.min_prompt_tokens, min(p.max_prompt_tokens, _cap(context_tokens, p.num_predict)))
    r, pt, ot = WARM_UP
    return Cost(r + len(lengths), pt + sum(lengths), ot + p.num_predict * len(lengths), warm_up_requests=r)


def cost_context_depth(p: ContextDepthParams, context_tokens: int | None) -> Cost:
    depths = doubling(p.min_context_tokens, min(p.max_context_tokens, _cap(context_tokens, p.num_predict)))
    r, pt, ot = WARM_UP
    # Each turn extends the last one, so the prompt cache evaluates only the new part: the deepest turn's worth.
    return Cost(
        r + len(depths),
        pt + (max(depths) if depths else 0),
        ot + p.num_predict * len(depths),
        notes=(f"sends {sum(depths):,} prompt tokens in all; the prompt cache evaluates about the deepest turn's",),
        warm_up_requests=r,
    )


def concurrency_levels(max_streams: int) -> list[int]:
    return doubling(1, max(1, max_streams))


def cost_concurrency(p: ConcurrencyParams, context_tokens: int | None) -> Cost:
    streams = sum(concurrency_levels(p.max_streams))
    r, pt, ot = WARM_UP
    return Cost(r + streams, pt + streams * p.prompt_tokens, ot + streams * p.num_predict, warm_up_requests=r)


def cost_interference(p: InterferenceParams, context_tokens: int | None) -> Cost:
    long = min(p.long_prompt_tokens, _cap(context_tokens, 1))
    r, pt, ot = WARM_UP
    return Cost(
        r + 2,
        pt + long + 16,
        ot + p.chat_max_tokens + 1,
        notes=("the chat is closed as soon as the long prompt is done, so it usually stops well before its limit",),
        warm_up_requests=r,
    )


def cost_cold_warm(p: ColdWarmParams, context_tokens: int | None) -> Cost:
    return Cost(
        3,
        2 * p.prompt_tokens,
        2 * p.num_predict,
        unloads_model=True,
        notes=("unloads the model first: anyone using it waits for it to load again",),
    )


def cost_prompt_cache(p: PromptCacheParams, context_tokens: int | None) -> Cost:
    prefix = min(p.prefix_tokens, _cap(context_tokens, p.num_predict + 32))
    r, pt, ot = WARM_UP
    return Cost(r + 2, pt + 2 * (prefix + 16), ot + 2 * p.num_predict, warm_up_requests=r)


# -- bodies ---------------------------------------------------------------------------------------


async def run_prompt_length(ctx: LabContext, p: PromptLengthParams) -> None:
    await ctx.warm_up()
    lengths = doubling(p.min_prompt_tokens, min(p.max_prompt_tokens, ctx.prompt_cap(p.num_predict)))
    ctx.set_total(1 + len(lengths))
    ctx.step("model loaded")
    for n in lengths:
        ctx.say(f"prompt of {n:,} tokens")
        prompt, words = ctx.fresh_prompt(n)  # fresh random words: nothing for the prompt cache to reuse
        probe = await ctx.generate(prompt, p.num_predict)
        ctx.estimator.learn(words, probe.prompt_tokens)
        ctx.add_point(
            {
                "prompt_tokens_target": n,
                "prompt_tokens": probe.prompt_tokens,
                "cached_tokens": probe.cached_tokens,
                "prefill_s": probe.prefill_s,
                "prefill_tok_s": probe.prefill_tok_s,
                "ttft_s": probe.ttft_s,
                "load_s": probe.load_s,
                "queue_s": probe.queue_s,
                "output_tokens": probe.eval_count,
            }
        )
        ctx.step(f"prompt of {n:,} tokens done")


CHAT_QUESTION = "Tell me a long story about a river, a stone and a green cloud."


async def run_context_depth(ctx: LabContext, p: ContextDepthParams) -> None:
    await ctx.warm_up()
    depths = doubling(p.min_context_tokens, min(p.max_context_tokens, ctx.prompt_cap(p.num_predict)))
    ctx.set_total(1 + len(depths))
    ctx.step("model loaded")
    history: list[dict[str, str]] = []
    counted = 0  # what the server counted for the last turn
    for depth in depths:
        ctx.say(f"conversation of {depth:,} tokens")
        # Grow the same conversation: earlier turns stay a prefix, as in a real chat.
        missing = depth - counted if counted else depth - 32
        while missing > 16:
            part = min(missing, 1024)
            words = ctx.estimator.words_for(part // 2)
            history.append({"role": "user", "content": random_words(words, ctx.rng)})
            history.append({"role": "assistant", "content": random_words(words, ctx.rng)})
            missing -= part
        probe = await ctx.chat([*history, {"role": "user", "content": CHAT_QUESTION}], p.num_predict)
        counted = probe.prompt_tokens or depth
        ctx.add_point(
            {
                "context_tokens_target": depth,
                "context_tokens": probe.prompt_tokens,
                "decode_tok_s": probe.decode_tok_s,
                "output_tokens": probe.eval_count,
                "cached_tokens": probe.cached_tokens,
                "prefill_s": probe.prefill_s,
                "ttft_s": probe.ttft_s,
            }
        )
        ctx.step(f"conversation of {depth:,} tokens done")


def _union_s(windows: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for a, b in sorted(windows):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / NS


async def run_concurrency(ctx: LabContext, p: ConcurrencyParams) -> None:
    await ctx.warm_up()
    levels = concurrency_levels(p.max_streams)
    ctx.set_total(1 + len(levels))
    ctx.step("model loaded")
    for n in levels:
        ctx.say(f"{n} stream{'s' if n > 1 else ''} at once")
        prompts = [ctx.fresh_prompt(p.prompt_tokens)[0] for _ in range(n)]
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(ctx.generate(pr, p.num_predict)) for pr in prompts]
        probes = [t.result() for t in tasks]
        ctx.add_point(_concurrency_point(n, probes))
        ctx.step(f"{n} stream{'s' if n > 1 else ''} done")


def _concurrency_point(n: int, probes: list[Probe]) -> dict[str, Any]:
    # A stream's generation window: its first token to its final chunk, as the client saw them.
    windows = [(pr.first_token_ns, pr.done_ns) for pr in probes if pr.first_token_ns is not None and pr.done_ns is not None]
    busy_s = sum(b - a for a, b in windows) / NS
    union_s = _union_s(windows)
    tokens = sum(pr.eval_count or 0 for pr in probes)
    span_s = (max(b for _, b in windows) - min(a for a, _ in windows)) / NS if windows else 0.0
    server_rates = [r for r in (pr.decode_tok_s for pr in probes) if r]
    ttfts = [t for t in (pr.ttft_s for pr in probes) if t is not None]
    queues = [q for q in (pr.queue_s for pr in probes) if q is not None]
    # Steady state: the stretch where every stream was decoding. Outside it some streams were still
    # prefilling (which stalls the others) or already done, so it is where "n streams at once" holds.
    total_tok_s: float | None = tokens / span_s if span_s > 0 else None
    per_stream = statistics.median(server_rates) if server_rates else None
    together_s = 0.0
    if len(windows) == n and windows:
        start, end = max(a for a, _ in windows), min(b for _, b in windows)
        together_s = max(0, end - start) / NS
        counts = [sum(1 for t in pr.token_ns if start <= t <= end) for pr in probes]
        if together_s > 0 and min(counts) >= 4:
            total_tok_s = sum(counts) / together_s
            per_stream = statistics.median(counts) / together_s
    return {
        "streams": n,
        "total_tok_s": total_tok_s,
        "per_stream_tok_s": per_stream,
        "per_stream_server_tok_s": statistics.median(server_rates) if server_rates else None,
        "slowest_stream_server_tok_s": min(server_rates) if server_rates else None,
        "together_s": together_s,
        "ttft_s_median": statistics.median(ttfts) if ttfts else None,
        "ttft_s_max": max(ttfts) if ttfts else None,
        "queue_s_max": max(queues) if queues else None,
        "mean_active_streams": busy_s / union_s if union_s > 0 else None,
        "generation_s": statistics.median([(b - a) / NS for a, b in windows]) if windows else None,
        "output_tokens": tokens,
    }


async def run_interference(ctx: LabContext, p: InterferenceParams) -> None:
    from collectors.lab.client import Probe

    warm = await ctx.warm_up()
    ctx.set_total(3)
    ctx.step("model loaded")
    long_tokens = min(p.long_prompt_tokens, ctx.prompt_cap(1))
    chat = Probe(sent_ns=0)
    baseline_reached = asyncio.Event()
    enough_after = asyncio.Event()
    after_from: list[int] = []  # token count when the long prompt finished

    def on_chat_token(pr: Probe) -> None:
        if len(pr.token_ns) >= p.baseline_tokens:
            baseline_reached.set()
        if after_from and len(pr.token_ns) >= after_from[0] + p.after_tokens:
            enough_after.set()

    ctx.say("chat streaming")
    chat_task = asyncio.create_task(
        ctx.chat([{"role": "user", "content": CHAT_QUESTION}], p.chat_max_tokens, probe=chat, on_token=on_chat_token)
    )
    cut_as_serial = False
    long_task: asyncio.Task[Probe] | None = None
    long = Probe(sent_ns=0)
    try:
        await _first(baseline_reached.wait(), chat_task)
        ctx.step("chat streaming")
        ctx.say(f"long prompt of {long_tokens:,} tokens arriving")
        prompt, words = ctx.fresh_prompt(long_tokens)
        long_task = asyncio.create_task(ctx.generate(prompt, 1, probe=long))
        # A server that runs one request at a time would make the long prompt wait for the whole chat.
        # If the long prompt has not started while the chat kept streaming without a stall for well over
        # the time its prefill should take, stop the chat: the wait, not a stall, is the finding.
        rate = warm.prefill_tok_s or 100.0
        patience_s = max(2.0, 4.0 * long_tokens / rate)
        base_gap_s = statistics.median(chat.gaps_ms()[: p.baseline_tokens] or [1.0]) / 1e3
        while not cut_as_serial:
            window_start = time.monotonic_ns()
            await asyncio.wait({long_task, chat_task}, timeout=patience_s, return_when=asyncio.FIRST_COMPLETED)
            if long_task.done() or long.first_token_ns is not None or chat_task.done():
                break
            # A prefill running beside the chat holds each chat token for a whole prompt batch, cutting its
            # rate several-fold. Still at a quarter of its usual rate or more over the last window, with the
            # long prompt not started: nothing is prefilling beside the chat.
            recent = sum(1 for t in chat.token_ns if t >= window_start)
            if recent * base_gap_s >= 0.25 * (time.monotonic_ns() - window_start) / NS:
                cut_as_serial = True
                chat_task.cancel()
        long = await long_task
        ctx.estimator.learn(words, long.prompt_tokens)
        after_from.append(len(chat.token_ns))
        if len(chat.token_ns) >= after_from[0] + p.after_tokens:
            enough_after.set()
        await _first(enough_after.wait(), chat_task)
    finally:
        chat_task.cancel()  # closes the chat's stream: the server frees its slot
        if long_task is not None:
            long_task.cancel()
        await asyncio.gather(chat_task, *([long_task] if long_task else []), return_exceptions=True)
    if chat_task.done() and not chat_task.cancelled() and chat_task.exception() is not None:
        raise chat_task.exception()  # type: ignore[misc]
    ctx.step("long prompt done")

    chat_end = chat.done_ns or (chat.token_ns[-1] if chat.token_ns else None)
    served_serially = cut_as_serial or (
        chat_end is not None and long.first_token_ns is not None and long.first_token_ns > chat_end
    )
    first = chat.first_token_ns or chat.sent_ns
    pre_end = long.first_token_ns or long.done_ns or time.monotonic_ns()
    pre_start = pre_end - int((long.prefill_s or 0.0) * NS)
    for i, (a, b) in enumerate(zip(chat.token_ns, chat.token_ns[1:], strict=False), start=1):
        if b <= long.sent_ns:
            phase = "before"
        elif a < pre_end and b > pre_start:
            phase = "during"  # the gap overlaps the long prompt's prefill
        else:
            phase = "after"
        ctx.add_point({"token_index": i, "t_s": (b - first) / NS, "gap_ms": (b - a) / 1e6, "phase": phase})
    ctx.result.summary.update(
        long_prompt_tokens=long.prompt_tokens,
        long_prefill_s=long.prefill_s,
        long_prefill_tok_s=long.prefill_tok_s,
        long_ttft_s=long.ttft_s,
        long_prompt_sent_s=(long.sent_ns - first) / NS,
        long_prefill_start_s=(pre_start - first) / NS,
        long_prefill_end_s=(pre_end - first) / NS,
        # Time the long prompt spent before its prefill began (waiting for a slot), as the client saw it.
        long_prompt_wait_s=max(0.0, (long.ttft_s or 0.0) - (long.prefill_s or 0.0)),
        served_serially=served_serially,
        chat_stopped_to_unblock=cut_as_serial,
        chat_tokens=len(chat.token_ns),
    )


async def _first(aw: Awaitable[Any], task: asyncio.Task[Any]) -> None:
    """Wait for ``aw`` unless ``task`` ends first (then its error, if any, surfaces)."""
    waiter = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


async def run_cold_warm(ctx: LabContext, p: ColdWarmParams) -> None:
    ctx.set_total(3)
    ctx.say("unloading the model")
    await ctx.client.unload(ctx.model)
    deadline = time.monotonic() + p.unload_timeout_s
    while any(same_model(str(m.get("name") or m.get("model")), ctx.model) for m in await ctx.client.ps()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ctx.model} was still loaded {p.unload_timeout_s:.0f} s after the unload request")
        await asyncio.sleep(0.1)
    ctx.step("model unloaded")
    for state in ("cold", "warm"):
        ctx.say(f"{state} request")
        prompt, _ = ctx.fresh_prompt(p.prompt_tokens)
        probe = await ctx.generate(prompt, p.num_predict)
        ctx.add_point(
            {
                "state": state,
                "load_s": probe.load_s,
                "ttft_s": probe.ttft_s,
                "prefill_s": probe.prefill_s,
                "total_s": probe.metric_s("total_duration"),
                "prompt_tokens": probe.prompt_tokens,
            }
        )
        if state == "cold":
            await ctx.learn_context()
        ctx.step(f"{state} request done")


async def run_prompt_cache(ctx: LabContext, p: PromptCacheParams) -> None:
    await ctx.warm_up()
    ctx.set_total(3)
    ctx.step("model loaded")
    prefix_tokens = min(p.prefix_tokens, ctx.prompt_cap(p.num_predict + 32))
    prefix, _ = ctx.fresh_prompt(prefix_tokens)
    for attempt in (1, 2):
        ctx.say(f"request {attempt} of 2")
        question = random_words(16, ctx.rng)  # a different question after the same prefix
        probe = await ctx.generate(f"{prefix}\n\n{question}", p.num_predict)
        ctx.add_point(
            {
                "attempt": attempt,
                "prefix_tokens": prefix_tokens,
                "prompt_tokens": probe.prompt_tokens,
                "cached_tokens": probe.cached_tokens,
                "prefill_s": probe.prefill_s,
                "prefill_tok_s": probe.prefill_tok_s,
                "ttft_s": probe.ttft_s,
            }
        )
        ctx.step(f"request {attempt} done")


# -- registry -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    title: str
    question: str  # what the experiment answers, for the page and --help
    params_cls: type
    run: Callable[[LabContext, Any], Awaitable[None]]
    cost: Callable[[Any, int | None], Cost]
    conclude: Callable[[LabContext], tuple[dict[str, Any], str]]

    def param_names(self) -> list[str]:
        return [f.name for f in fields(self.params_cls)]


def _pts(ctx: LabContext) -> list[dict[str, Any]]:
    return ctx.result.points


EXPERIMENTS: dict[str, ExperimentSpec] = {
    s.name: s
    for s in (
        ExperimentSpec(
            "prompt-length",
            "Prompt length",
            "How do prefill speed and time to first token grow with the prompt?",
            PromptLengthParams,
            run_prompt_length,
            cost_prompt_length,
            lambda ctx: conclusions.prompt_length(_pts(ctx)),
        ),
        ExperimentSpec(
            "context-depth",
            "Context depth",
            "How does decode speed fall as the conversation grows?",
            ContextDepthParams,
            run_context_depth,
            cost_context_depth,
            lambda ctx: conclusions.context_depth(_pts(ctx)),
        ),
        ExperimentSpec(
            "concurrency",
            "Concurrency",
            "What do several streams at once get, each and in total?",
            ConcurrencyParams,
            run_concurrency,
            cost_concurrency,
            lambda ctx: conclusions.concurrency(_pts(ctx)),
        ),
        ExperimentSpec(
            "interference",
            "Interference",
            "What happens to a chat when someone sends a long document?",
            InterferenceParams,
            run_interference,
            cost_interference,
            lambda ctx: conclusions.interference(_pts(ctx), ctx.result.summary),
        ),
        ExperimentSpec(
            "cold-warm",
            "Cold versus warm",
            "How much does loading the model cost?",
            ColdWarmParams,
            run_cold_warm,
            cost_cold_warm,
            lambda ctx: conclusions.cold_warm(_pts(ctx), ctx.result.model_facts.get("model_bytes")),
        ),
        ExperimentSpec(
            "prompt-cache",
            "Prompt cache",
            "What does the prompt cache save when a long prefix repeats?",
            PromptCacheParams,
            run_prompt_cache,
            cost_prompt_cache,
            lambda ctx: conclusions.prompt_cache(_pts(ctx)),
        ),
    )
}


def make_params(name: str, values: dict[str, Any] | None = None) -> Any:
    """Build an experiment's parameters; unknown keys are an error that names the known ones."""
    spec = EXPERIMENTS[name]
    values = dict(values or {})
    known = set(spec.param_names())
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{name} has no parameter {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    params = spec.params_cls(**values)
    for f in fields(params):
        v = getattr(params, f.name)
        if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{f.name} must be a positive number, got {v!r}")
        if f.name.startswith("min_") and v > getattr(params, "max_" + f.name[4:], v):
            raise ValueError(f"{f.name} ({v}) is larger than max_{f.name[4:]} ({getattr(params, 'max_' + f.name[4:])})")
    return params
