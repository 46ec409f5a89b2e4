"""Live's timeline and in-flight list from the records: pure helpers, no Streamlit, no I/O, no clock.

Everything here takes the current time as an argument so that tests and the benchmark can call it with fixed
values.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from analysis.model_names import same_model
from analysis.records import GpuSample, LoadedModel, RequestRecord
from pages.shared.derive import Band, Interval
from store.tables import RequestSummary

# What a generation sent to Ollama directly shows where the runner does not tell (no access line fitted it).
UNKNOWN_CLIENT = "direct client (address not known)"
UNKNOWN_ROUTE = "route not known"


@dataclass(frozen=True)
class InFlightView:
    """What the Live page shows for one generation that has not finished."""

    request_id: str
    model: str
    client_addr: str
    endpoint: str
    phase: str  # "loading model", "waiting or prefill (no tokens yet)", "decoding"
    elapsed_s: float
    tokens_so_far: int
    live_tok_s: float | None  # over the last few seconds of chunks


def live_phase(record: RequestRecord, loaded_model_names: Iterable[str]) -> str:
    """Phase of an in-flight request as far as the proxy can tell.

    Before the first token the client sees no bytes, so waiting for a slot and
    prefill cannot be told apart; a model missing from /api/ps is still loading.
    """
    if record.first_token_ns is not None or record.token_chunk_ns:
        return "decoding"
    names = set(loaded_model_names)
    if not any(same_model(record.model, n) for n in names):
        return "loading model"
    return "waiting or prefill (no tokens yet)"


def live_tok_s(token_chunk_ns: Sequence[int], now_ns: int, lookback_ns: int = 3_000_000_000) -> float | None:
    """Tokens per second over the last ``lookback_ns`` before ``now_ns`` (0 during a stall).

    None until the stream is older than the look-back window or has two tokens.
    """
    if len(token_chunk_ns) < 2:
        return None
    start_ns = now_ns - lookback_ns
    if token_chunk_ns[0] > start_ns:
        # Younger than the window: the rate so far, first to last token.
        span_ns = token_chunk_ns[-1] - token_chunk_ns[0]
        return (len(token_chunk_ns) - 1) / (span_ns / 1e9) if span_ns > 0 else None
    recent = len(token_chunk_ns) - bisect.bisect_left(token_chunk_ns, start_ns)
    return recent / (lookback_ns / 1e9)


def in_flight_view(record: RequestRecord, now_unix_s: float, loaded_model_names: Iterable[str]) -> InFlightView:
    # The record's times are the collector's monotonic clock; place "now" on it through the wall clock.
    now_ns = record.received_ns + int((now_unix_s - record.started_at_unix_s) * 1e9)
    phase = live_phase(record, loaded_model_names)
    if phase == "decoding" and record.token_chunk_ns:
        silent_s = (now_ns - record.token_chunk_ns[-1]) / 1e9
        if silent_s >= 2.0:
            phase = f"decoding, no token for {silent_s:.0f} s"
    return InFlightView(
        request_id=record.id,
        model=record.model,
        client_addr=record.client_addr or UNKNOWN_CLIENT,
        endpoint=record.endpoint or UNKNOWN_ROUTE,
        phase=phase,
        elapsed_s=max(0.0, now_unix_s - record.started_at_unix_s),
        tokens_so_far=len(record.token_chunk_ns),
        live_tok_s=live_tok_s(record.token_chunk_ns, now_ns),
    )


def assign_lanes(bands: Sequence[Band]) -> list[Band]:
    """Pack requests into as few lanes as possible: a request takes the first lane free at its start.

    All bands of one request share its lane, so one lane reads as one request after another.
    """
    spans: dict[str, tuple[float, float]] = {}
    for b in bands:
        lo, hi = spans.get(b.request_id, (b.start_unix_s, b.end_unix_s))
        spans[b.request_id] = (min(lo, b.start_unix_s), max(hi, b.end_unix_s))
    lane_free_at: list[float] = []
    lane_of: dict[str, int] = {}
    for request_id, (lo, hi) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        for lane, free_at in enumerate(lane_free_at):
            if free_at <= lo:
                lane_free_at[lane] = hi
                lane_of[request_id] = lane
                break
        else:
            lane_of[request_id] = len(lane_free_at)
            lane_free_at.append(hi)
    return [Band(b.request_id, b.model, b.phase, b.start_unix_s, b.end_unix_s, lane_of[b.request_id]) for b in bands]


def unexplained_gpu_activity(
    samples: Sequence[GpuSample],
    busy_intervals: Sequence[Interval],
    util_threshold_pct: float = 20.0,
    slack_s: float = 1.5,
    min_duration_s: float = 2.0,
) -> list[Interval]:
    """Stretches where a GPU was busy while no recorded request ran (proxied, or direct from the runner): another
    program, or a client whose generations the runner did not show.

    ``busy_intervals`` are the recorded requests' lifetimes; ``slack_s`` widens them because
    samples arrive once a second and a model keeps the GPU busy briefly after the last chunk.
    """
    covered = sorted((i.start_unix_s - slack_s, i.end_unix_s + slack_s) for i in busy_intervals)
    starts = [c[0] for c in covered]
    # Running maximum of ends, so one bisect answers "is t inside any interval?".
    max_end: list[float] = []
    running = float("-inf")
    for _, hi in covered:
        running = max(running, hi)
        max_end.append(running)

    def explained(t: float) -> bool:
        k = bisect.bisect_right(starts, t) - 1
        return k >= 0 and max_end[k] >= t

    found: list[Interval] = []
    run_start: float | None = None
    last_t = 0.0
    for s in sorted(samples, key=lambda s: s.ts_unix_s):
        busy = s.util_gpu_pct is not None and s.util_gpu_pct >= util_threshold_pct
        if busy and not explained(s.ts_unix_s):
            if run_start is None:
                run_start = s.ts_unix_s
            last_t = s.ts_unix_s
        elif run_start is not None:
            if last_t - run_start >= min_duration_s:
                found.append(Interval(run_start, last_t))
            run_start = None
    if run_start is not None and last_t - run_start >= min_duration_s:
        found.append(Interval(run_start, last_t))
    return found


def loaded_names(models: Iterable[LoadedModel]) -> set[str]:
    names: set[str] = set()
    for m in models:
        names.add(m.name)
        names.add(m.model)
    return names


def bands_of(row: RequestSummary) -> list[Band]:
    """Phase bands of one finished request from its stored wall-clock boundaries."""
    rid, model = row.id, row.model
    load_start = row.load_start_unix_s
    prefill_start = row.prefill_start_unix_s
    decode_start = row.decode_start_unix_s
    decode_end = row.decode_end_unix_s
    out: list[Band] = []
    if load_start is not None and row.load_s is not None:  # a load request has a load and nothing after it
        load_end = load_start + row.load_s
        if load_end > load_start:
            out.append(Band(rid, model, "load", load_start, load_end))
        if prefill_start is not None and prefill_start > load_end:
            out.append(Band(rid, model, "queue", load_end, prefill_start))
    if prefill_start is not None and decode_start is not None and decode_start > prefill_start:
        out.append(Band(rid, model, "prefill", prefill_start, decode_start))
    if decode_start is not None and decode_end is not None and decode_end > decode_start:
        out.append(Band(rid, model, "decode", decode_start, decode_end))
    return out
