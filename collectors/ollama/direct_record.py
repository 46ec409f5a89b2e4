"""A direct task as a request record: its times and counts from the log (exact) or from /slots (bounded), and the
``RequestRecord`` written from them (``collectors.ollama.direct``'s module doc says which source wins)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.direct_task import LogFigures, Task, half, mid
from collectors.ollama.log import AccessLine

LOG_TIMING_BOUND_S = 5e-6  # the runner prints its timings to 0.01 ms


@dataclass
class Figures:
    """What a record says of its task's times and counts, from the log (exact) or from /slots (bounded)."""

    source: str  # "log" | "slots"
    start: float
    decode_start: float | None
    end: float | None
    ends_bound: float
    prompt: int | None
    cached: int | None
    prefill_s: float | None
    prefill_bound: float | None
    decode_s: float | None
    decode_bound: float | None
    output: int | None
    output_bound: int | None


def log_figures(task: Task, log: LogFigures, log_read_bound_s: float) -> Figures:
    """Exact: the runner's own timings; the end is when its release line was read (or the poll that saw it)."""
    prefill_s, decode_s = log.prefill_ms / 1000, log.decode_ms / 1000
    end = log.release_unix_s if task.end is None else min(mid(task.end), log.release_unix_s)
    cached = log.prompt_total - log.computed if log.has_total else None
    return Figures(
        source="log",
        start=end - prefill_s - decode_s,
        decode_start=end - decode_s,
        end=end,
        ends_bound=half(task.end) if task.end is not None else log_read_bound_s,
        prompt=log.prompt_total,
        cached=cached,
        prefill_s=prefill_s,
        prefill_bound=LOG_TIMING_BOUND_S,
        decode_s=decode_s,
        decode_bound=LOG_TIMING_BOUND_S,
        output=log.output,
        output_bound=0,
    )


def slots_figures(task: Task, log_read_bound_s: float) -> Figures:
    """Bounded: each moment between two polls, kept with the half-widths of those intervals."""
    start = mid(task.start) if task.start else task.first_seen_unix_s
    start_bound = half(task.start) if task.start else 0.0
    decode_start = mid(task.decode_start) if task.decode_start else None
    ds_bound = half(task.decode_start) if task.decode_start else 0.0
    end = mid(task.end) if task.end else None
    prefill_s = decode_start - start if decode_start is not None else None
    decode_s = (end - decode_start) if end is not None and decode_start is not None else None
    output, output_bound = slots_output(task, end)
    return Figures(
        source="slots",
        start=start,
        decode_start=decode_start,
        end=end,
        ends_bound=max(start_bound, half(task.end) if task.end else log_read_bound_s),
        prompt=task.prompt_tokens,
        cached=task.cached_tokens,
        prefill_s=prefill_s,
        prefill_bound=start_bound + ds_bound if prefill_s is not None else None,
        decode_s=decode_s,
        decode_bound=ds_bound + (half(task.end) if task.end else 0.0) if decode_s is not None else None,
        output=output,
        output_bound=output_bound,
    )


def slots_output(task: Task, end: float | None) -> tuple[int | None, int | None]:
    """Output tokens from /slots: exact from the released context, else the last count and the rate after it."""
    if task.output_exact is not None:
        return task.output_exact, 0
    if not task.decoded:
        return None, None
    (t0, n0), (t1, n1) = task.decoded[0], task.decoded[-1]
    if end is None or t1 <= t0:
        return n1, None  # the rate is not known: at least n1
    rate = (n1 - n0) / (t1 - t0)
    extra = rate * max(0.0, end - t1)
    bound = rate * (half(task.end) if task.end else 0.0) + 1
    return n1 + round(extra), round(bound + 0.5)


def task_record(task: Task, f: Figures, *, final: bool, to_mono: Callable[[float], int]) -> RequestRecord:
    """The task as a request record (in flight until ``final``); ``to_mono`` turns a wall time into the collector's
    monotonic nanoseconds."""
    metrics = None
    if final and (f.prompt is not None or f.output is not None):
        metrics = FinalMetrics(
            load_duration_ns=round(task.load_s * 1e9) if task.load_s is not None else None,
            prompt_eval_count=f.prompt,
            prompt_eval_cached_count=f.cached,
            prompt_eval_duration_ns=round(f.prefill_s * 1e9) if f.prefill_s is not None else None,
            eval_count=f.output,
            eval_duration_ns=round(f.decode_s * 1e9) if f.decode_s is not None and f.decode_s >= 0 else None,
            total_duration_ns=round(task.access.latency_s * 1e9) if task.access is not None else None,
        )
    started = f.start - (task.load_s or 0.0)
    received_ns = to_mono(started)
    access = task.access
    return RequestRecord(
        id=task.id,
        started_at_unix_s=started,
        client_addr=access.client if access is not None else None,
        client_unverified=access is not None,
        endpoint=access.path if access is not None else None,
        model=task.runner.model or "",
        stream=None,
        kind=RequestKind.GENERATE,
        received_ns=received_ns,
        forwarded_ns=received_ns,
        first_token_ns=to_mono(f.decode_start) if f.decode_start is not None else None,
        final_chunk_ns=to_mono(f.end) if final and f.end is not None else None,
        status_code=access.status if access is not None else None,
        outcome=outcome(access) if final else Outcome.IN_FLIGHT,
        metrics=metrics,
        thinking_chunks=None,
        seen_from=SeenFrom.RUNNER,
        runner_port=task.runner.port,
        runner_task_id=task.task_id,
        runner_source=f.source,
        ends_bound_s=f.ends_bound,
        prefill_bound_s=f.prefill_bound,
        decode_bound_s=f.decode_bound,
        output_tokens_bound=f.output_bound,
    )


def outcome(access: AccessLine | None) -> Outcome:
    if access is None or access.status < 400:
        return Outcome.OK
    return Outcome.CANCELLED if access.status == 499 else Outcome.HTTP_ERROR
