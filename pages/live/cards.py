"""The Live page's cards and "now" strip, from records and progress readings (pure: no Streamlit, no I/O, no clock).

One card per generation in flight, by phase: queued for a free slot of its loaded model (position), waiting for
another model to load first (Ollama loads one at a time), waiting for another model to finish so Ollama can unload
it to make room, loading its own model (each with the time spent in that state), prefill (tokens read of the
prompt, rate, ETA, marked "estimated" when the reading is the collector's estimate rather than the runner's),
decoding (tokens so far, live tok/s with a sparkline against the decode ceiling, context used of n_ctx, the reply
when text is recorded). A finished generation keeps its
card for ``FINISHED_KEEP_S`` with its phase durations, then the card goes (its Requests detail stays).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from analysis.client_program import process_label, program_label
from analysis.model_names import is_cloud, same_model, value_for_model
from analysis.phases import Flag
from analysis.progress import READ_SOURCES, preferred, prefill_eta_unix_s, prefill_rate_tok_s, prompt_size_tokens
from analysis.prompt_fit import cut_sentence
from analysis.records import Outcome, ProgressSample, ProgressSource, RequestRecord
from analysis.runner_wait_tasks import TaskWaits
from analysis.runner_wait_words import waits_label
from pages.live.timeline import UNKNOWN_CLIENT, UNKNOWN_ROUTE, live_tok_s
from store.tables import RequestSummary

FINISHED_KEEP_S = 8.0  # a finished generation's card stays this long
SPARK_S = 20  # the sparkline's span: tok/s per second over the last this many seconds
NOW_WINDOW_S = 60.0  # the "now" strip's share of GPU time: over the last minute
CLOUD_WAITS_FOR = "ollama.com (a cloud model: nothing of it runs on this machine)"
WAITING_PHASES = ("queued", "other_load", "unload_wait", "loading", "waiting")

DecodeCeiling = Callable[[str, int], float | None]  # (model, context tokens) → decode ceiling tok/s


@dataclass(frozen=True)
class PrefillView:
    processed_tokens: int
    prompt_tokens: int | None
    rate_tok_s: float | None  # analysis.progress.prefill_rate_tok_s: from the first reading to the latest count
    eta_s: float | None  # seconds left after the latest reading
    estimated: bool  # the collector's estimate, not a reading of the runner
    source: str
    size_estimated: bool = False  # the prompt's size from its characters: the runner has not said it yet

    @property
    def fraction(self) -> float | None:
        if not self.prompt_tokens:
            return None
        return min(max(self.processed_tokens / self.prompt_tokens, 0.0), 1.0)


def program_text(rec: RequestRecord | RequestSummary) -> str | None:
    """ "ollama-python 0.6.1 · python (pid 42, user ana)": what is known of the program that sent it; None: nothing."""
    parts = (
        program_label(rec.client_program, rec.client_program_version),
        process_label(rec.client_process, rec.client_pid, rec.client_user),
    )
    known = [p for p in parts if p is not None]
    return " · ".join(known) if known else None


@dataclass(frozen=True)
class Card:
    request_id: str
    model: str
    client: str
    endpoint: str
    phase: str  # "queued", "other_load", "unload_wait", "loading", "prefill", "waiting", "decoding", "finished"
    elapsed_s: float
    queue_position: int | None = None  # 1 = next
    waits_for: str | None = None
    prefill: PrefillView | None = None
    tokens_so_far: int = 0
    live_tok_s: float | None = None
    spark_tok_s: tuple[float, ...] = ()  # one value per second, oldest first
    decode_ceiling_tok_s: float | None = None
    ctx_used_tokens: int | None = None
    n_ctx: int | None = None
    silent_s: float | None = None  # decoding, no token for this long
    reply_text: str | None = None  # only when the collector records text
    outcome: str | None = None  # finished: how it ended
    phase_s: dict[str, float] = field(default_factory=dict)  # finished: queue/load/prefill/decode durations
    phase_started_unix_s: float | None = None  # running: when the phase now began (as far as known)
    prompt_chars: int | None = None  # the prompt's length as the proxy counted it
    state_s: float | None = None  # waiting or loading: how long in this state (a load starts when the one before ended)
    room_bytes: tuple[int, int] | None = None  # unload_wait: (what its model needs at least, what was free)
    direct: bool = False  # sent to Ollama directly, seen from its runner: no client-side times, no token gaps
    prompt_cut: str | None = None  # finished: the prompt did not fit the context (analysis.prompt_fit), in words
    slots: int | None = None  # queued: its model's slots (the runner's -np), None when not known
    slots_busy: int | None = None  # queued: how many of its model's generations a slot works on now
    runner_waits: str | None = None  # finished: what the runner did before reading the prompt, in its own words
    slowed_by: str | None = None  # running: another request's prompt being read beside it now (pages.live.slowed)
    # decoding: the reply's tokens are the runner's count (/slots n_decoded, the log's n_gen), not chunks the proxy
    # saw: a direct request, or one not streamed to its client.
    counted_by_runner: bool = False
    rate_so_far_tok_s: float | None = None  # decoding: the reply's tokens per second since they were first counted
    program: str | None = None  # which program sent it (User-Agent, local process): client text; None: not known

    @property
    def key(self) -> str:
        """Stable across refreshes (Streamlit element keys)."""
        return self.request_id


@dataclass(frozen=True)
class NowStrip:
    prefill_tok_s: float | None  # prompt tokens read per second now, over the running generations
    decode_tok_s: float | None  # output tokens per second now
    prefill_share: float | None  # of the GPU time spent in prefill or decode over the last minute
    decode_share: float | None
    waiting: int  # generations queued or loading


@dataclass(frozen=True)
class LoadContext:
    """What tells the waits for a load apart: when each loaded model first appeared in /api/ps (within a look-back
    that covers the running requests), each installed model's file size, and the GPUs' free memory over time."""

    loaded_since_unix_s: dict[str, float] = field(default_factory=dict)  # loaded model name → first listed
    model_size_bytes: dict[str, int] = field(default_factory=dict)  # /api/tags: the GGUF's size, the least a load needs
    vram_free_bytes: tuple[tuple[float, int], ...] = ()  # (time, free memory of all GPUs), oldest first
    # (model, first token, end) of recently finished requests. A model's load is seen ended by its first token, often
    # before the /api/ps listing is stored: without this, a request whose wait ended with such a short generation
    # showed its whole wait as its own load (a CI run: 6.9 s at 0.35 s into the load).
    served_unix_s: tuple[tuple[str, float, float], ...] = ()

    def free_at(self, t_unix_s: float) -> int | None:
        """Free GPU memory at ``t_unix_s``: the last reading before it, else the first one after (None: no reading)."""
        before = [free for ts, free in self.vram_free_bytes if ts <= t_unix_s]
        if before:
            return before[-1]
        return self.vram_free_bytes[0][1] if self.vram_free_bytes else None

    def size_of(self, model: str) -> int | None:
        return value_for_model(self.model_size_bytes, model)


def prefill_view(samples: Sequence[ProgressSample]) -> PrefillView | None:
    """The prompt read so far, its rate and ETA: the readings ``analysis.progress`` prefers (slots, else the log,
    else the estimate), and its rate and ETA, the ones the tests hold to the runner's real end of prefill."""
    chosen = preferred(samples)
    if not chosen:
        return None
    last = chosen[-1]
    size, size_read = prompt_size_tokens(samples)
    eta_unix_s = prefill_eta_unix_s(samples)
    return PrefillView(
        processed_tokens=last.processed_tokens,
        prompt_tokens=None if size is None else size - (last.cached_tokens or 0),
        rate_tok_s=prefill_rate_tok_s(samples),
        eta_s=None if eta_unix_s is None else max(0.0, eta_unix_s - last.ts_unix_s),
        estimated=last.source is ProgressSource.ESTIMATE,
        source=str(last.source),
        size_estimated=size is not None and not size_read,
    )


def spark(token_chunk_ns: Sequence[int], now_ns: int, span_s: int = SPARK_S) -> tuple[float, ...]:
    """Tokens per second in each of the last ``span_s`` whole seconds (from the stream's start when younger)."""
    if not token_chunk_ns:
        return ()
    first = token_chunk_ns[0]
    seconds = min(span_s, max(1, int((now_ns - first) // 1_000_000_000)))
    out = []
    for k in range(seconds, 0, -1):
        lo, hi = now_ns - k * 1_000_000_000, now_ns - (k - 1) * 1_000_000_000
        out.append(float(bisect.bisect_left(token_chunk_ns, hi) - bisect.bisect_left(token_chunk_ns, lo)))
    return tuple(out)


def _loaded(model: str, loaded: dict[str, int | None]) -> bool:
    return any(same_model(model, name) for name in loaded)


def _needing_load(
    ordered: list[RequestRecord], loaded: dict[str, int | None], runner_busy: Mapping[str, int]
) -> list[RequestRecord]:
    """The requests whose model is not in memory and no runner works on (a cloud model's loads nothing here: it runs
    on ollama.com)."""
    return [r for r in ordered if not is_cloud(r.model) and not _loaded(r.model, loaded) and not runner_busy.get(r.model)]


def _local_only(decode_ceiling: DecodeCeiling) -> DecodeCeiling:
    """The ceiling of this machine for its own models; none for a cloud model's request (it runs on ollama.com)."""
    return lambda model, context_tokens: None if is_cloud(model) else decode_ceiling(model, context_tokens)


def in_flight_cards(
    records: Sequence[RequestRecord],
    progress: dict[str, list[ProgressSample]],
    loaded: dict[str, int | None],
    now_unix_s: float,
    decode_ceiling: DecodeCeiling = lambda _m, _c: None,
    loads: LoadContext | None = None,
) -> list[Card]:
    """A card per running generation, oldest first. ``loaded``: loaded model name → its context length."""
    loads = loads or LoadContext()
    decode_ceiling = _local_only(decode_ceiling)
    cards: list[Card] = []
    # Queue: a token-less request with no reading, behind others of its model the runner is working on.
    runner_busy, ready_unix_s = _runner_work(records, progress, loads.served_unix_s)
    ordered = sorted(records, key=lambda r: r.started_at_unix_s)
    # Ollama's scheduler loads one model at a time, in the order requests came: the oldest request whose model is
    # not in memory names the model being loaded (or waiting for room); requests for other models wait behind it.
    needs_load = _needing_load(ordered, loaded, runner_busy)
    head = needs_load[0] if needs_load else None
    needs_load_ids = {r.id for r in needs_load}
    queued_seen: dict[str, int] = {}
    loading_seen: dict[str, int] = {}
    for rec in ordered:
        now_ns = rec.received_ns + int((now_unix_s - rec.started_at_unix_s) * 1e9)
        samples = progress.get(rec.id, [])
        base = _waiting_card(rec, samples, loaded, now_unix_s)
        # No chunk seen (direct, or not streamed to its client): whether it decodes is what the runner says now.
        decoded = _decoded_readings(samples) if not rec.token_chunk_ns else []
        if decoded:
            cards.append(_runner_decode_card(base, samples, decoded, now_unix_s, decode_ceiling))
            continue
        if rec.token_chunk_ns:
            cards.append(_chunk_decode_card(base, rec, samples, now_ns, decode_ceiling))
            continue
        if is_cloud(rec.model):  # no runner, no load, no slot here: only ollama.com's answer is awaited
            cards.append(replace(base, waits_for=CLOUD_WAITS_FOR, state_s=base.elapsed_s))
            continue
        if head is not None and rec.id in needs_load_ids:
            ready = {m: min(t, ready_unix_s.get(m, t)) for m, t in loads.loaded_since_unix_s.items()}
            ready = {**ready_unix_s, **ready}
            cards.append(_load_card(base, rec, head, loaded, runner_busy, ready, loads, loading_seen, now_unix_s))
            continue
        cards.append(_before_decode_card(base, rec, samples, runner_busy, queued_seen))
    return cards


def _waiting_card(
    rec: RequestRecord, samples: Sequence[ProgressSample], loaded: dict[str, int | None], now_unix_s: float
) -> Card:
    """What every card shows, as a request that waits: the phase-specific cards replace parts of it."""
    return Card(
        request_id=rec.id,
        model=rec.model,
        client=rec.client_addr or UNKNOWN_CLIENT,
        program=program_text(rec),
        endpoint=rec.endpoint or UNKNOWN_ROUTE,
        phase="waiting",
        elapsed_s=max(0.0, now_unix_s - rec.started_at_unix_s),
        n_ctx=rec.num_ctx or _context_of(rec.model, loaded) or _last(samples, "n_ctx"),
        reply_text=rec.response_text,
        prompt_chars=rec.prompt_chars,
        direct=rec.direct,
    )


def _before_decode_card(
    base: Card,
    rec: RequestRecord,
    samples: Sequence[ProgressSample],
    runner_busy: dict[str, int],
    queued_seen: dict[str, int],
) -> Card:
    """A request whose model is loaded and that decodes nothing yet: reading its prompt, queued, or waiting.
    ``queued_seen`` counts the queued ones of each model so far (the next one's position), and is updated."""
    view = prefill_view(samples)
    if view is None and rec.direct:
        return base  # the runner took its task (that is how it was seen), no reading of it yet
    if view is None:
        if runner_busy.get(rec.model, 0) > 0:
            n = queued_seen.get(rec.model, 0) + 1
            queued_seen[rec.model] = n
            slot = f"a free slot of {rec.model}"
            return replace(base, phase="queued", queue_position=n, waits_for=slot, state_s=base.elapsed_s)
        return base  # no reading yet: waiting for a slot or reading the prompt
    began = min(s.ts_unix_s for s in preferred(samples))
    return replace(base, phase="prefill", prefill=view, phase_started_unix_s=began)


def _chunk_decode_card(
    base: Card, rec: RequestRecord, samples: Sequence[ProgressSample], now_ns: int, decode_ceiling: DecodeCeiling
) -> Card:
    """A streamed generation writing its reply, from the chunks the proxy saw (each one token)."""
    tokens = len(rec.token_chunk_ns)
    prompt = _last(samples, "prompt_tokens")
    ctx_used = _last(samples, "ctx_used_tokens") or (None if prompt is None else prompt + tokens)
    # Without a prompt size the ceiling is taken at the reply's own length (a lower bound on the context).
    silent = (now_ns - rec.token_chunk_ns[-1]) / 1e9
    return replace(
        base,
        phase="decoding",
        tokens_so_far=tokens,
        live_tok_s=live_tok_s(rec.token_chunk_ns, now_ns),
        spark_tok_s=spark(rec.token_chunk_ns, now_ns),
        decode_ceiling_tok_s=decode_ceiling(rec.model, ctx_used if ctx_used is not None else tokens),
        ctx_used_tokens=ctx_used,
        silent_s=silent if silent >= 2.0 else None,
        phase_started_unix_s=rec.wall_s(rec.token_chunk_ns[0]),
        rate_so_far_tok_s=rate_so_far_tok_s([(rec.wall_s(ns), k + 1) for k, ns in enumerate(rec.token_chunk_ns)]),
    )


def _runner_work(
    records: Sequence[RequestRecord],
    progress: dict[str, list[ProgressSample]],
    served_unix_s: Sequence[tuple[str, float, float]],
) -> tuple[dict[str, int], dict[str, float]]:
    """(model → its running requests the runner works on, model → the first sign the runner worked on it: a token,
    a reading, or the first token of a request that finished while the running ones waited)."""
    busy: dict[str, int] = {}
    ready: dict[str, float] = {}
    for rec in records:
        if _runner_read(rec, progress):
            busy[rec.model] = busy.get(rec.model, 0) + 1
            first = _runner_first_unix_s(rec, progress)
            ready[rec.model] = min(ready.get(rec.model, first), first)
    oldest_unix_s = min((r.started_at_unix_s for r in records), default=None)
    for model, first, ended in served_unix_s:
        if oldest_unix_s is not None and ended >= oldest_unix_s:  # its model was ready by its first token
            ready[model] = min(ready.get(model, first), first)
    return busy, ready


def _load_card(
    base: Card,
    rec: RequestRecord,
    head: RequestRecord,
    loaded: dict[str, int | None],
    runner_busy: dict[str, int],
    ready_unix_s: dict[str, float],
    loads: LoadContext,
    loading_seen: dict[str, int],
    now_unix_s: float,
) -> Card:
    """A request whose model is not in memory: behind another model's load, waiting for room, or loading its own."""
    if rec.model != head.model:
        return replace(
            base,
            phase="other_load",
            waits_for=f"{head.model} to load first (Ollama loads one model at a time)",
            state_s=base.elapsed_s,
        )
    # Its own load began when it came, or when a load it waited behind ended: that model appeared in /api/ps, or
    # the runner began on one of its requests (often before the next /api/ps poll).
    others = [t for name, t in ready_unix_s.items() if not same_model(name, rec.model) and t <= now_unix_s]
    began = max([rec.started_at_unix_s, *others])
    n = loading_seen.get(rec.model, 0)
    loading_seen[rec.model] = n + 1
    card = replace(
        base,
        phase="loading",
        phase_started_unix_s=began,
        state_s=max(0.0, now_unix_s - began),
        queue_position=n + 1 if n else None,
        waits_for=f"{rec.model} to load into memory" if n else None,
    )
    # No room: Ollama must unload another model first, and waits until that model's generations finish.
    need, free = loads.size_of(rec.model), loads.free_at(began)
    busy = sorted({name for name in loaded if runner_busy.get(name, 0) and not same_model(name, rec.model)})
    if need is not None and free is not None and need > free and busy:
        return replace(
            card,
            phase="unload_wait",
            queue_position=None,
            room_bytes=(need, free),
            waits_for=f"{', '.join(busy)} to finish its generations, so Ollama can unload it to make room",
        )
    return card


def _decoded_readings(samples: Sequence[ProgressSample]) -> list[tuple[float, int]]:
    """(time, tokens written so far) from the runner's readings once it writes, oldest first: its /slots, else the
    log (the two are read at different moments: mixed, the count could step back)."""
    for source in READ_SOURCES:
        runner = sorted((s for s in samples if s.source is source), key=lambda s: s.ts_unix_s)
        decoded = [(s.ts_unix_s, s.decoded_tokens) for s in runner if s.decoded_tokens]
        if decoded:
            return decoded
    return []


def rate_so_far_tok_s(counts: Sequence[tuple[float, int]]) -> float | None:
    """The reply's tokens per second so far: the tokens counted after the first count, over the time between the
    first count and the latest one. ``counts``: (time, tokens so far), oldest first. None (unknown, not 0) until
    two counts apart in time."""
    if len(counts) < 2:
        return None
    (t0, n0), (t1, n1) = counts[0], counts[-1]
    return max(n1 - n0, 0) / (t1 - t0) if t1 > t0 else None


def _runner_decode_card(
    base: Card,
    samples: Sequence[ProgressSample],
    decoded: list[tuple[float, int]],
    now_unix_s: float,
    decode_ceiling: DecodeCeiling,
) -> Card:
    """A generation writing its reply that the proxy sees no chunk of (a direct one, or one not streamed to its
    client), from the runner's token counts: no gaps between tokens."""
    tokens = decoded[-1][1]
    ctx_used = _last(samples, "ctx_used_tokens")
    return replace(
        base,
        phase="decoding",
        tokens_so_far=tokens,
        live_tok_s=_readings_rate(decoded, now_unix_s),
        spark_tok_s=_readings_spark(decoded, now_unix_s),
        decode_ceiling_tok_s=decode_ceiling(base.model, ctx_used if ctx_used is not None else tokens),
        ctx_used_tokens=ctx_used,
        n_ctx=base.n_ctx or _last(samples, "n_ctx"),
        phase_started_unix_s=decoded[0][0],
        counted_by_runner=True,
        rate_so_far_tok_s=rate_so_far_tok_s(decoded),
    )


def _readings_rate(decoded: Sequence[tuple[float, int]], now_unix_s: float, lookback_s: float = 3.0) -> float | None:
    """Tokens per second over the readings of the last ``lookback_s`` (from the first reading when younger)."""
    recent = [r for r in decoded if r[0] >= now_unix_s - lookback_s]
    earlier = [r for r in decoded if r[0] < now_unix_s - lookback_s]
    first = earlier[-1] if earlier else decoded[0]
    last = decoded[-1]
    if not recent or last[0] <= first[0]:
        return None if not earlier else 0.0  # no reading lately: nothing written that the runner told
    return (last[1] - first[1]) / (last[0] - first[0])


def _readings_spark(decoded: Sequence[tuple[float, int]], now_unix_s: float, span_s: int = SPARK_S) -> tuple[float, ...]:
    """Tokens written in each of the last whole seconds, by the runner's count at each second's edges."""
    times = [t for t, _n in decoded]

    def count_at(t: float) -> int:
        k = bisect.bisect_right(times, t)
        return decoded[k - 1][1] if k else 0

    seconds = min(span_s, max(1, int(now_unix_s - decoded[0][0])))
    edges = [now_unix_s - k for k in range(seconds, -1, -1)]
    return tuple(float(max(count_at(b) - count_at(a), 0)) for a, b in itertools.pairwise(edges))


def _runner_read(rec: RequestRecord, progress: dict[str, list[ProgressSample]]) -> bool:
    """The runner is working on it (it wrote a token, the runner reported its progress, or the record comes from
    the runner itself): its model is loaded."""
    return rec.direct or bool(rec.token_chunk_ns) or any(s.source in READ_SOURCES for s in progress.get(rec.id, []))


def _runner_first_unix_s(rec: RequestRecord, progress: dict[str, list[ProgressSample]]) -> float:
    readings = [s.ts_unix_s for s in progress.get(rec.id, []) if s.source in READ_SOURCES]
    token = [rec.wall_s(rec.token_chunk_ns[0])] if rec.token_chunk_ns else []
    return min([*readings, *token, *([rec.started_at_unix_s] if rec.direct else [])])


def finished_cards(
    rows: Iterable[RequestSummary],
    now_unix_s: float,
    keep_s: float = FINISHED_KEEP_S,
    waits: Mapping[str, TaskWaits] | None = None,
    splits: Mapping[str, dict[str, float]] | None = None,
) -> list[Card]:
    """Generations that ended in the last ``keep_s``, newest last, with their phase durations; ``waits``: the
    runner's own waits before each one's prompt (``analysis.runner_wait_lines``), by request id."""
    cards = []
    for r in rows:
        if r.outcome is Outcome.IN_FLIGHT or r.ended_at_unix_s is None or now_unix_s - r.ended_at_unix_s > keep_s:
            continue
        # The wait before prefill in its parts where the split told them (pages.live.slowed), else Ollama's figure.
        waited: Mapping[str, float | None] = (splits or {}).get(r.id) or {"queue": r.queue_s}
        named = [*waited.items(), ("load", r.load_s), ("prefill", r.prefill_s), ("decode", r.decode_s)]
        phases = {name: value for name, value in named if value is not None and (value > 0 or name not in waited)}
        cards.append(
            Card(
                request_id=r.id,
                model=r.model,
                client=r.client_addr or UNKNOWN_CLIENT,
                program=program_text(r),
                endpoint=r.endpoint or UNKNOWN_ROUTE,
                phase="finished",
                elapsed_s=max(0.0, r.ended_at_unix_s - r.started_at_unix_s),
                tokens_so_far=r.output_tokens if r.output_tokens is not None else r.tokens_so_far,
                live_tok_s=r.decode_tok_s,
                outcome=str(r.outcome),
                phase_s=phases,
                direct=r.direct,
                prompt_cut=_prompt_cut(r),
                runner_waits=waits_label(waits[r.id]) if waits and r.id in waits else None,
                prefill=None
                if r.prompt_tokens is None
                else PrefillView(r.computed_prompt_tokens or 0, r.computed_prompt_tokens, r.prefill_tok_s, 0.0, False, "final"),
            )
        )
    return sorted(cards, key=lambda c: c.elapsed_s)


def _prompt_cut(r: RequestSummary) -> str | None:
    """The prompt_truncated flag's numbers in the card's words (the whole sentence, with the fix, in Requests)."""
    if Flag.PROMPT_TRUNCATED not in r.flags:
        return None
    kept = r.prompt_kept_tokens if r.prompt_kept_tokens is not None else r.prompt_tokens
    refused = r.outcome is Outcome.HTTP_ERROR
    return cut_sentence(r.prompt_sent_tokens, kept, r.num_ctx_in_force, r.num_ctx_source, refused=refused)


def now_strip(
    cards: Sequence[Card], recent: Iterable[RequestSummary], now_unix_s: float, window_s: float = NOW_WINDOW_S
) -> NowStrip:
    """Rates now over the running generations, and the last minute's split of GPU time between prefill and decode
    (phase boundaries of the requests that overlap it, running ones counted up to now)."""
    running = [c for c in cards if c.phase != "finished"]
    prefill_rates = [c.prefill.rate_tok_s for c in running if c.phase == "prefill" and c.prefill and c.prefill.rate_tok_s]
    decode_rates = [c.live_tok_s for c in running if c.phase == "decoding" and c.live_tok_s is not None]
    prefill_s, decode_s = _phase_seconds(running, recent, now_unix_s - window_s, now_unix_s)
    busy = prefill_s + decode_s
    return NowStrip(
        prefill_tok_s=_summed_rate(prefill_rates, running, "prefill"),
        decode_tok_s=_summed_rate(decode_rates, running, "decoding"),
        prefill_share=prefill_s / busy if busy > 0 else None,
        decode_share=decode_s / busy if busy > 0 else None,
        waiting=sum(1 for c in running if c.phase in WAITING_PHASES),
    )


def _summed_rate(rates: Sequence[float], running: Sequence[Card], phase: str) -> float | None:
    """The rates summed; 0 when no generation is in ``phase``; None when some are and none has a rate yet."""
    if rates:
        return sum(rates)
    return 0.0 if not any(c.phase == phase for c in running) else None


def _phase_seconds(
    running: Sequence[Card], recent: Iterable[RequestSummary], start_unix_s: float, now_unix_s: float
) -> tuple[float, float]:
    """(prefill, decode) seconds inside [start, now]: finished requests' phases, running ones' up to now."""
    prefill_s = decode_s = 0.0
    for r in recent:
        if r.outcome is Outcome.IN_FLIGHT:
            continue
        prefill_s += _overlap(r.prefill_start_unix_s, r.decode_start_unix_s, start_unix_s, now_unix_s)
        decode_s += _overlap(r.decode_start_unix_s, r.decode_end_unix_s, start_unix_s, now_unix_s)
    for c in running:
        if c.phase == "prefill":
            prefill_s += _overlap(c.phase_started_unix_s, now_unix_s, start_unix_s, now_unix_s)
        elif c.phase == "decoding":
            decode_s += _overlap(c.phase_started_unix_s, now_unix_s, start_unix_s, now_unix_s)
    return prefill_s, decode_s


def _overlap(a: float | None, b: float | None, lo: float, hi: float) -> float:
    if a is None or b is None:
        return 0.0
    return max(0.0, min(b, hi) - max(a, lo))


def _context_of(model: str, loaded: dict[str, int | None]) -> int | None:
    return value_for_model(loaded, model)


def _last(samples: Sequence[ProgressSample], attr: str) -> int | None:
    for s in sorted(samples, key=lambda s: s.ts_unix_s, reverse=True):
        value = getattr(s, attr)
        if value is not None:
            return int(value)
    return None
