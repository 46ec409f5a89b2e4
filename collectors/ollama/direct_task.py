"""One runner task as ``DirectTasks`` knows it (``collectors.ollama.direct``): what /slots showed of it, its log lines,
and what /slots readings tell of its times and counts.

Each moment /slots tells lies between the last poll that did not see it and the first that did, so a moment is kept
as that interval; ``read_slot`` folds one reading into the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.ollama.log import AccessLine, LogEvent
from collectors.ollama.slots import SlotReading

# Contexts kept per task from the polls that saw it read its prompt: one per batch it was seen in (a 2,048-token
# batch: 64 of them is a 131,072-token prompt); past it the rest are not kept, so only those kept can confirm.
MAX_PREFILL_CTX_KEPT = 64


@dataclass
class RunnerRef:
    """The runner a task ran on."""

    pid: int
    port: int
    model: str | None


@dataclass(frozen=True)
class LogFigures:
    """One task's figures from its log lines, once /slots agrees with them."""

    prompt_total: int  # task.n_tokens (the computed count when no "new prompt" line was read)
    computed: int  # prompt tokens evaluated (the cached part not)
    has_total: bool
    prefill_ms: float
    output: int
    decode_ms: float
    release_unix_s: float  # when its release line was read
    release_ctx: int  # the slot's context at release: prompt + output - 1


@dataclass
class Task:
    runner: RunnerRef
    task_id: int
    slot_id: int | None
    first_seen_unix_s: float  # when this collector first knew of it (a poll)
    # /slots: each moment lies between the last poll that did not see it and the first that did
    start: tuple[float, float] | None = None
    start_lo: float | None = None  # the poll before it was first seen, when there was one (its start's lower bound)
    decode_start: tuple[float, float] | None = None
    end: tuple[float, float] | None = None
    first_processing_s: float | None = None  # the first and last polls that saw it running
    last_processing_s: float | None = None
    last_prefill_s: float | None = None  # the last poll that saw it reading its prompt
    prompt_tokens: int | None = None  # exact (processed + cached, once decoding began)
    # The context polls saw while it read its prompt (at most its whole prompt): what confirms its log lines when no
    # poll saw it decode or released (a reply shorter than a poll's interval, the next task in its slot at once).
    prefill_ctx: set[int] = field(default_factory=set)
    cached_tokens: int | None = None
    decoded: list[tuple[float, int]] = field(default_factory=list)  # (poll time, tokens decoded): first and last
    output_exact: int | None = None  # from the slot's context after its release
    final_ctx: int | None = None  # the slot's context after its release (prompt + output - 1)
    seen_processing: bool = False
    gone: bool = False  # its runner went away: no line is its any more
    lines: list[LogEvent] = field(default_factory=list)  # its log lines, as read (at most direct.MAX_LINES_PER_TASK)
    load_s: float | None = None
    between: bool = False  # known only from its slot's step over its id between two polls: an embedding input or nothing
    # deciding
    claimed_by: str | None = None  # a proxied request's id, from the live join
    emitted: bool = False  # an in-flight direct row was written
    unclaimed_polls: int = 0
    access: AccessLine | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.runner.pid, self.task_id)

    @property
    def ended_unix_s(self) -> float | None:
        """When /slots saw it end (a log line alone never ends a task: anyone can write one)."""
        return self.end[1] if self.end is not None else None

    @property
    def log_done(self) -> bool:
        """Its prompt eval, eval and release lines were read (whether /slots agrees is decided later)."""
        kinds = {e.kind for e in self.lines}
        return {"prompt_eval", "eval", "release"} <= kinds

    @property
    def id(self) -> str:
        return f"direct-{self.runner.port}-{self.runner.pid}-{self.task_id}-{int(self.first_seen_unix_s)}"


def mid(interval: tuple[float, float]) -> float:
    return (interval[0] + interval[1]) / 2


def half(interval: tuple[float, float]) -> float:
    return (interval[1] - interval[0]) / 2


def read_slot(task: Task, slot: SlotReading, ts: float, prev: float | None) -> None:
    """One /slots reading of the slot running ``task``, answered by ``ts`` (the poll before at ``prev``)."""
    if slot.is_processing:
        if not task.seen_processing:
            task.seen_processing = True
            task.start = (prev if prev is not None else ts, ts)
            task.start_lo = prev
            task.first_processing_s = ts
        task.last_processing_s = ts
        if slot.decoding:
            if task.decode_start is None:
                since = task.last_prefill_s if task.last_prefill_s is not None else task.start[0] if task.start else ts
                task.decode_start = (since, ts)
            if slot.prompt_size_tokens is not None:
                task.prompt_tokens = max(task.prompt_tokens or 0, slot.prompt_size_tokens)
                task.cached_tokens = slot.cached_tokens
            if slot.decoded_tokens is not None:
                point = (ts, slot.decoded_tokens)
                task.decoded = [task.decoded[0], point] if task.decoded else [point]
        else:
            task.last_prefill_s = ts
            if slot.ctx_tokens is not None and len(task.prefill_ctx) < MAX_PREFILL_CTX_KEPT:
                task.prefill_ctx.add(slot.ctx_tokens)
        task.end = None
    elif task.seen_processing and task.end is None:
        task.end = (prev if prev is not None else ts, ts)
        task.final_ctx = slot.ctx_tokens
        if slot.ctx_tokens is not None and task.prompt_tokens is not None and slot.ctx_tokens >= task.prompt_tokens:
            task.output_exact = slot.ctx_tokens - task.prompt_tokens + 1  # the last token is not put in the context
