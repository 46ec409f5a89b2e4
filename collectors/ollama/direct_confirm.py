"""Whether a task's log lines are believed: its figures count only when exactly one reading of its lines agrees with
what /slots showed of it (``collectors.ollama.direct``'s module doc: anyone who can send the runner a request can
make it print text into Ollama's log)."""

from __future__ import annotations

import itertools

from collectors.ollama.direct_task import LogFigures, Task
from collectors.ollama.log import LogEvent

WINDOW_SLACK_S = 0.5  # the log's durations against the polls around the task: a log read's tick and the rounding


def confirmed_log(task: Task) -> LogFigures | None:
    """The task's figures from its log lines, when exactly one reading of them agrees with /slots."""
    if not task.log_done:
        return None
    if task.prompt_tokens is None and task.final_ctx is None and task.output_exact is None and not task.prefill_ctx:
        return None  # /slots told nothing to check them against
    kinds: dict[str, list[LogEvent]] = {k: [] for k in ("new_prompt", "prompt_eval", "eval", "release")}
    for event in task.lines:
        if event.kind in kinds and (event.kind in ("new_prompt", "release") or event.duration_ms is not None):
            kinds[event.kind].append(event)
    totals: list[LogEvent | None] = [*kinds["new_prompt"]] or [None]
    fits: set[LogFigures] = set()
    for total, pe, ev, rel in itertools.product(totals, kinds["prompt_eval"], kinds["eval"], kinds["release"]):
        assert pe.duration_ms is not None and ev.duration_ms is not None
        figures = LogFigures(
            prompt_total=total.tokens if total is not None else pe.tokens,
            computed=pe.tokens,
            has_total=total is not None,
            prefill_ms=pe.duration_ms,
            output=ev.tokens,
            decode_ms=ev.duration_ms,
            release_unix_s=rel.read_unix_s,
            release_ctx=rel.tokens,
        )
        if agrees(task, figures):
            fits.add(figures)
    return fits.pop() if len(fits) == 1 else None


def agrees(task: Task, f: LogFigures) -> bool:
    """Whether the log's figures fit what /slots saw of the task: sizes, counts and the time between polls."""
    if f.computed > f.prompt_total or abs(f.release_ctx - (f.prompt_total + f.output - 1)) > 1:
        return False  # the runner's own lines always add up so
    if not sizes_agree(task, f):
        return False
    took_s = (f.prefill_ms + f.decode_ms) / 1000
    if task.start_lo is not None and task.end is not None and took_s > task.end[1] - task.start_lo + WINDOW_SLACK_S:
        return False  # longer than the polls around it allow
    if task.first_processing_s is not None and task.last_processing_s is not None:
        if took_s < task.last_processing_s - task.first_processing_s - WINDOW_SLACK_S:
            return False  # shorter than the polls that saw it running
        if f.release_unix_s < task.last_processing_s - WINDOW_SLACK_S:
            return False  # released before a poll saw it running
    return True


def sizes_agree(task: Task, f: LogFigures) -> bool:
    """The log's prompt, output and context sizes against those /slots showed of the task."""
    if task.prompt_tokens is not None and f.prompt_total != task.prompt_tokens:
        return False
    seen_only_reading = task.prompt_tokens is None and task.final_ctx is None and task.output_exact is None
    if seen_only_reading and f.prompt_total not in task.prefill_ctx:
        return False  # the size its lines name must be a context a poll saw it reach while reading its prompt
    if task.final_ctx is not None and abs(f.release_ctx - task.final_ctx) > 1:
        return False
    if task.output_exact is not None and abs(f.output - task.output_exact) > 1:
        return False
    return not (task.decoded and f.output < task.decoded[-1][1] - 1)  # not fewer than a poll saw decoded
