"""Whether an ended runner task was a proxied request (``collectors.ollama.direct``): by the exact figures the log
gives it, else by model, time and prompt size."""

from __future__ import annotations

from collections.abc import Container

from analysis.records import RequestRecord
from collectors.ollama.direct_task import LogFigures, Task

DURATION_MATCH_NS = 20_000  # the log's 0.01 ms rounding, twice


def owner_by_figures(task: Task, log: LogFigures, finished: list[RequestRecord]) -> str | None:
    """A task the log timed: the finished request with its exact figures, else the live claim when nothing
    can disprove it (still running, or a /v1 reply without durations)."""
    for rec in finished:
        if same_figures(log, rec):
            return rec.id
    if task.claimed_by is not None:
        claimer = next((rec for rec in finished if rec.id == task.claimed_by), None)
        if claimer is None or not has_durations(claimer):
            return task.claimed_by
    return None


def owner_by_time(task: Task, finished: list[RequestRecord], claiming: Container[str], now: float) -> str | None:
    """A task without log figures: a finished request of its model that claims no task (none in ``claiming``), ran
    at the same time, and whose prompt count does not disagree with the task's."""
    start = task.start[0] if task.start else task.first_seen_unix_s
    end = task.end[1] if task.end else (task.ended_unix_s or now)
    for rec in finished:
        if rec.id in claiming:
            continue
        rec_end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
        rec_end = rec.wall_s(rec_end_ns) if rec_end_ns is not None else now
        if rec.started_at_unix_s > end + 0.5 or rec_end < start - 0.5:
            continue  # not at the same time
        counted = rec.metrics.prompt_eval_count if rec.metrics is not None else None
        if task.prompt_tokens is not None and counted is not None and counted != task.prompt_tokens:
            continue  # another prompt
        return rec.id
    return None


def has_durations(rec: RequestRecord) -> bool:
    return rec.metrics is not None and rec.metrics.prompt_eval_duration_ns is not None


def same_figures(log: LogFigures, rec: RequestRecord) -> bool:
    m = rec.metrics
    if m is None:
        return False
    if m.prompt_eval_count != log.prompt_total or m.eval_count is None or abs(m.eval_count - log.output) > 1:
        return False
    if m.prompt_eval_duration_ns is None or m.eval_duration_ns is None:
        return True  # a /v1 reply: its counts are all it has
    return (
        abs(m.prompt_eval_duration_ns - log.prefill_ms * 1e6) <= DURATION_MATCH_NS
        and abs(m.eval_duration_ns - log.decode_ms * 1e6) <= DURATION_MATCH_NS
    )
