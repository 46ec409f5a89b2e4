"""The runner's own waits before a prompt is read, in its own words: prompt-cache saves and loads, context
checkpoints, a full re-processing forced by a lost cache.

llama.cpp's ``llama-server`` (``tools/server/server-context.cpp``, ``server-task.cpp``) prints these at
``--log-verbosity 4`` and Ollama passes them into its log. Each pattern below is the exact message the runner prints
after the prefix ``analysis.log_grammar`` splits off (``slot %12.*s: id %2d | task %d | …`` and ``srv  %12.*s: …``:
the function's name cut to 12 characters and right-aligned in 12)::

    srv    load_model: initializing, n_slots = 2, n_ctx_slot = 20480, kv_unified = 'false'
    srv  get_availabl: updating prompt cache
    srv   prompt_save:  - saving prompt with length 16669, total state size = 1362.016 MiB (draft: 0.000 MiB)
    srv         alloc:  - prompt is already in the cache, skipping
    srv         alloc:  - prompt state size 9000.000 MiB exceeds cache size limit 8192.000 MiB, skipping
    srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 593.063 MiB)
    srv          load:  - found better prompt with f_keep = 0.950, f_sim = 0.990
    srv  get_availabl: prompt cache update took 1.08 ms
    slot launch_slot_: id  0 | task 1112 | processing task, is_child = 0
    slot process_sing: id  1 | task -1 | saving idle slot to prompt cache
    slot   operator(): id  0 | task 1112 | new prompt, n_ctx_slot = 20480, n_keep = 0, task.n_tokens = 272
    slot   operator(): id  0 | task 1112 | restored context checkpoint (pos_min = 0, pos_max = 267, n_tokens = 268,
        n_past = 268, size = 83.754 MiB)                                                       (one line)
    slot   operator(): id  0 | task 1112 | forcing full prompt re-processing due to lack of cache data (likely due to SWA …)
    slot   operator(): id  0 | task 1112 | erased invalidated context checkpoint (pos_min = 2065, pos_max = 3600,
        n_tokens = 3601, n_swa = 1024, pos_next = 0, size = 320.013 MiB)                       (one line)
    slot create_check: id  0 | task 1112 | created context checkpoint 1 of 32 (pos_min = 0, pos_max = 267,
        n_tokens = 268, size = 83.754 MiB)                                                     (one line)
    slot      release: id  0 | task 1112 | stop processing: n_tokens = 527, truncated = 0

The lines carry no time. Which task a wait belongs to: a line with a task id is that task's; the prompt-cache
lines carry none, and are the next task's when printed before its launch line (the runner updates its cache while
it picks a slot for it), the launched task's when printed after (it saves the idle slots once the new task holds its
slot). A save followed by "already in the cache" or "exceeds cache size limit" copied nothing. A line longer than
``MAX_LINE_CHARS`` is not read. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from analysis import wording as w
from analysis.log_grammar import MAX_LINE_CHARS, RunnerLine, runner_line
from analysis.model_names import same_model
from analysis.records import RequestRecord

MIB = 1024 * 1024


class WaitLineKind(StrEnum):
    """What one of the runner's wait lines says (``WaitLine.kind``): each has its patterns below."""

    N_SLOTS = "n_slots"
    SAVE = "save"
    SAVE_SKIPPED = "save_skipped"
    CACHE_EVICT = "cache_evict"
    CACHE_LOAD = "cache_load"
    CACHE_UPDATE = "cache_update"
    IDLE_SAVE = "idle_save"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    FULL_REPROCESS = "full_reprocess"
    CHECKPOINT_ERASE = "checkpoint_erase"
    CHECKPOINT_CREATE = "checkpoint_create"


class WaitKind(StrEnum):
    """A named part of the time before (or during) prefill, as stored in ``request_waits`` (its values never change)."""

    PROMPT_CACHE_SAVE = "prompt_cache_save"
    PROMPT_CACHE_LOAD = "prompt_cache_load"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    CHECKPOINT_ERASE = "checkpoint_erase"
    FULL_REPROCESS = "full_reprocess"
    CHECKPOINT_CREATE = "checkpoint_create"


_WAIT_KIND_VALUES = frozenset(k.value for k in WaitKind)

_F = r"\d{1,12}\.\d{1,3}"
_I = r"-?\d{1,12}"
_MIB_G = r"(?P<mib>" + _F + r") MiB"
_POS = r"\(pos_min = " + _I + r", pos_max = " + _I + r", n_tokens = (?P<n>\d{1,12}), "
# The message after llama-server's "srv  <function>: " (analysis.log_grammar), each in its exact form.
_SRV_PATTERNS: tuple[tuple[WaitLineKind, re.Pattern[str]], ...] = (
    (WaitLineKind.N_SLOTS, re.compile(r"initializing, n_slots = (?P<n>\d{1,4}), n_ctx_slot = \d{1,9}(?:, .{0,80})?")),
    (
        WaitLineKind.SAVE,
        re.compile(
            r" - saving prompt with length (?P<n>\d{1,9}), total state size = " + _MIB_G + r"(?: \(draft: " + _F + r" MiB\))?"
        ),
    ),
    (WaitLineKind.SAVE_SKIPPED, re.compile(r" - prompt is already in the cache, skipping")),
    (
        WaitLineKind.SAVE_SKIPPED,
        re.compile(r" - prompt state size " + _F + r" MiB exceeds cache size limit " + _F + r" MiB, skipping"),
    ),
    (
        WaitLineKind.CACHE_EVICT,
        re.compile(r" - making room for prompt cache entry, removing oldest entry \(size = " + _MIB_G + r"\)"),
    ),
    (WaitLineKind.CACHE_LOAD, re.compile(r" - found better prompt with f_keep = " + _F + r", f_sim = " + _F)),
    (WaitLineKind.CACHE_UPDATE, re.compile(r"prompt cache update took (?P<ms>" + _F + r") ms")),
)
# The message after "slot <function>: id N | task N | ".
_SLOT_PATTERNS: tuple[tuple[WaitLineKind, re.Pattern[str]], ...] = (
    (WaitLineKind.IDLE_SAVE, re.compile(r"saving idle slot to prompt cache")),
    (
        WaitLineKind.CHECKPOINT_RESTORE,
        re.compile(r"restored context checkpoint " + _POS + r"n_past = " + _I + r", size = " + _MIB_G + r"\)"),
    ),
    (WaitLineKind.FULL_REPROCESS, re.compile(r"forcing full prompt re-processing due to lack of cache data\b.{0,300}")),
    (
        WaitLineKind.CHECKPOINT_ERASE,
        re.compile(
            r"erased invalidated context checkpoint "
            + _POS
            + r"n_swa = "
            + _I
            + r", pos_next = "
            + _I
            + r", size = "
            + _MIB_G
            + r"\)"
        ),
    ),
    (
        WaitLineKind.CHECKPOINT_CREATE,
        re.compile(r"created context checkpoint \d{1,6} of \d{1,6} " + _POS + r"size = " + _MIB_G + r"\)"),
    ),
)
# Cheap first test: every line above carries one of these.
_HINTS = ("prompt", "checkpoint", "n_slots", "idle slot")


@dataclass(frozen=True)
class WaitLine:
    """One understood line: what it says, the slot and task it names, and its figures."""

    kind: WaitLineKind
    slot_id: int | None = None
    task_id: int | None = None  # None: the line names no task ("task -1", or a srv line)
    size_bytes: int | None = None
    tokens: int | None = None  # save: the saved prompt's length; checkpoints: their n_tokens; n_slots: the count
    duration_ms: float | None = None  # cache_update: as the runner timed it


def parse_wait_line(line: str) -> WaitLine | None:
    """The wait a runner's line tells of, or None (also for a line over ``MAX_LINE_CHARS``)."""
    if len(line) > MAX_LINE_CHARS or not any(h in line for h in _HINTS):
        return None
    split = runner_line(line.rstrip("\r\n "))
    return wait_of(split) if split is not None else None


def wait_of(line: RunnerLine) -> WaitLine | None:
    """The wait one of llama-server's lines, already split (``analysis.log_grammar``), tells of; None for another."""
    if line.tag == "srv":
        patterns = _SRV_PATTERNS
    elif line.is_slot:
        patterns = _SLOT_PATTERNS
    else:
        return None
    message = line.message.rstrip(" ")
    for kind, pattern in patterns:
        m = pattern.fullmatch(message)
        if m is None:
            continue
        g = m.groupdict()
        return WaitLine(
            kind,
            slot_id=line.slot_id,
            task_id=line.task_id,
            size_bytes=round(float(g["mib"]) * MIB) if g.get("mib") else None,
            tokens=int(g["n"]) if g.get("n") else None,
            duration_ms=float(g["ms"]) if g.get("ms") else None,
        )
    return None


# The named parts of the time before prefill, and what each one is in words.
WAIT_NAMES: dict[WaitKind, str] = {
    WaitKind.PROMPT_CACHE_SAVE: "prompt-cache save",
    WaitKind.PROMPT_CACHE_LOAD: "prompt loaded from the cache",
    WaitKind.CHECKPOINT_RESTORE: "context checkpoint restored",
    WaitKind.CHECKPOINT_ERASE: "context checkpoints erased",
    WaitKind.FULL_REPROCESS: "full re-processing (cache lost)",
    WaitKind.CHECKPOINT_CREATE: "context checkpoints written",
}
# Kinds that happen before the prompt is read (checkpoint_create happens while it is read).
BEFORE_PREFILL = (
    WaitKind.PROMPT_CACHE_SAVE,
    WaitKind.PROMPT_CACHE_LOAD,
    WaitKind.CHECKPOINT_RESTORE,
    WaitKind.CHECKPOINT_ERASE,
    WaitKind.FULL_REPROCESS,
)


@dataclass
class RunnerWait:
    """One kind of wait in one task, summed: how often, how many bytes, how many tokens (the largest)."""

    kind: WaitKind
    count: int = 0
    size_bytes: int = 0
    tokens: int | None = None


@dataclass
class TaskWaits:
    """What the runner did for one task besides reading its prompt and decoding."""

    task_id: int
    slot_id: int | None
    n_slots: int | None  # the runner's slot count, from its load line
    other_slots_busy: int  # slots processing another task when this one was launched
    cache_update_ms: float = 0.0  # the runner's own timing of its cache update while picking the slot
    waits: dict[WaitKind, RunnerWait] = field(default_factory=dict)
    new_prompt_seen: bool = False
    released: bool = False

    def add(self, kind: WaitKind, size_bytes: int | None, tokens: int | None) -> None:
        wait = self.waits.setdefault(kind, RunnerWait(kind))
        wait.count += 1
        wait.size_bytes += size_bytes or 0
        if tokens is not None:
            wait.tokens = max(wait.tokens or 0, tokens)

    def before_prefill(self) -> list[RunnerWait]:
        return [self.waits[k] for k in BEFORE_PREFILL if k in self.waits]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["waits"] = [asdict(v) for v in self.waits.values()]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TaskWaits:
        # A kind this version does not know (a newer Phasewatch's) is left out, never guessed at.
        waits = {
            WaitKind(v["kind"]): RunnerWait(**{**v, "kind": WaitKind(v["kind"])})
            for v in obj.get("waits", [])
            if isinstance(v, dict) and isinstance(v.get("kind"), str) and v["kind"] in _WAIT_KIND_VALUES
        }
        fields = {k: obj.get(k) for k in ("task_id", "slot_id", "n_slots", "other_slots_busy")}
        return cls(
            **fields,  # type: ignore[arg-type]
            cache_update_ms=float(obj.get("cache_update_ms") or 0.0),
            waits=waits,
            new_prompt_seen=bool(obj.get("new_prompt_seen")),
            released=bool(obj.get("released")),
        )


@dataclass(frozen=True)
class RequestWaitsRow:
    """One request's runner waits as stored (v16 ``request_waits``): the task's ``TaskWaits`` as JSON."""

    request_id: str
    ts_unix_s: float  # when the lines were read
    port: int | None  # the runner's
    task_id: int
    waits_json: str

    @property
    def waits(self) -> TaskWaits:
        return TaskWaits.from_json(json.loads(self.waits_json))


def waits_row(request_id: str, task: TaskWaits, *, ts_unix_s: float, port: int | None) -> RequestWaitsRow:
    return RequestWaitsRow(request_id, ts_unix_s, port, task.task_id, json.dumps(task.to_json(), sort_keys=True))


# Bounds on what one runner's lines can make the joiner keep (each line names its slot and task, and anyone can have
# lines printed): tasks whose waits are kept, task-less lines waiting for the next launch, slots believed.
MAX_TASKS_KEPT = 256
MAX_PENDING_LINES = 64
MAX_SLOTS_BELIEVED = 256  # the same bound as /slots' (collectors.ollama.slots.MAX_SLOTS)
# The lines that are waits, and the wait each one is (the other lines steer the joiner: slots, skipped saves, timing).
WAIT_OF_LINE: dict[WaitLineKind, WaitKind] = {
    WaitLineKind.SAVE: WaitKind.PROMPT_CACHE_SAVE,
    WaitLineKind.CACHE_LOAD: WaitKind.PROMPT_CACHE_LOAD,
    WaitLineKind.CHECKPOINT_RESTORE: WaitKind.CHECKPOINT_RESTORE,
    WaitLineKind.CHECKPOINT_ERASE: WaitKind.CHECKPOINT_ERASE,
    WaitLineKind.FULL_REPROCESS: WaitKind.FULL_REPROCESS,
    WaitLineKind.CHECKPOINT_CREATE: WaitKind.CHECKPOINT_CREATE,
}


class WaitJoiner:
    """Folds one runner's lines, in the order it printed them, into each task's waits.

    ``launch``, ``new_prompt`` and ``release`` are the task lines ``collectors.ollama.log`` already reads; ``wait``
    takes this module's lines. Each returns the tasks whose waits changed (to store again); each costs time
    independent of how many lines came before (the tables are bounded), so a flood folds in time linear in its lines.

    ``slots``: how many slots the runner has, as a channel other than its lines says (its command line's ``-np``, or
    its ``/slots``); a line naming a slot beyond them, or a slot count that disagrees, is not the runner's: dropped
    and counted in ``dropped``. Which task a wait belongs to is still only the lines' word: a request gets a task's
    waits only once ``/slots`` showed that task serving it (the reader's join)."""

    def __init__(self, slots: int | None = None) -> None:
        self.slots = min(slots, MAX_SLOTS_BELIEVED) if slots is not None and slots > 0 else None
        self.n_slots: int | None = self.slots
        self.tasks: dict[int, TaskWaits] = {}  # in launch order: the oldest is let go first
        self.dropped = 0  # lines naming a slot the runner does not have, or a slot count it does not run with
        self._busy: dict[int, int] = {}  # slot → task processing in it (at most ``slots`` entries)
        self._pending: list[WaitLine] = []  # task-less lines printed before the next launch
        self._launched: int | None = None  # the task launched last, until its prompt arrives
        self._last_save: tuple[int, WaitLine] | None = None  # (task, line) of the last save, until skipped or not

    def _slot_believed(self, slot_id: int | None) -> bool:
        limit = self.slots if self.slots is not None else MAX_SLOTS_BELIEVED
        if slot_id is None or 0 <= slot_id < limit:
            return True
        self.dropped += 1
        return False

    def launch(self, slot_id: int | None, task_id: int) -> list[TaskWaits]:
        if not self._slot_believed(slot_id):
            return []
        others = sum(1 for s, t in self._busy.items() if s != slot_id and t != task_id)
        self.tasks.pop(task_id, None)  # launched again (a restarted runner): now the newest
        task = self.tasks[task_id] = TaskWaits(task_id, slot_id, self.n_slots, others)
        if slot_id is not None:
            self._busy[slot_id] = task_id
        self._launched = task_id
        pending, self._pending = self._pending, []
        for line in pending:
            self._apply(task, line)
        while len(self.tasks) > MAX_TASKS_KEPT:  # the oldest launched: dicts keep insertion order
            del self.tasks[next(iter(self.tasks))]
        return [task]

    def new_prompt(self, task_id: int) -> list[TaskWaits]:
        task = self.tasks.get(task_id)
        if task is None:
            return []
        task.new_prompt_seen = True
        if self._launched == task_id:
            self._launched = None
        return [task]

    def release(self, slot_id: int | None, task_id: int) -> list[TaskWaits]:
        if not self._slot_believed(slot_id):
            return []
        if slot_id is not None and self._busy.get(slot_id) == task_id:
            del self._busy[slot_id]
        task = self.tasks.get(task_id)
        if task is None:
            return []
        task.released = True
        return [task]

    def wait(self, line: WaitLine) -> list[TaskWaits]:
        if not self._slot_believed(line.slot_id):
            return []
        if line.kind is WaitLineKind.N_SLOTS:
            if line.tokens is None or (self.slots is not None and line.tokens != self.slots) or line.tokens > MAX_SLOTS_BELIEVED:
                self.dropped += 1
                return []
            self.n_slots = line.tokens
            self._busy.clear()  # a new load: no task runs
            return []
        if line.kind is WaitLineKind.SAVE_SKIPPED:
            return self._save_skipped()
        if line.task_id is not None:
            task = self.tasks.get(line.task_id)
        elif self._launched is not None:
            task = self.tasks.get(self._launched)
        else:
            self._pending.append(line)
            if line.kind is WaitLineKind.SAVE:
                self._last_save = (-1, line)
            del self._pending[:-MAX_PENDING_LINES]  # bounded: a runner that never launches a task
            return []
        if task is None:
            return []
        self._apply(task, line)
        return [task]

    def _save_skipped(self) -> list[TaskWaits]:
        """The save before this line copied nothing ("already in the cache", "exceeds cache size limit")."""
        if self._last_save is None:
            return []
        owner, save = self._last_save
        self._last_save = None
        task = self.tasks.get(owner)
        wait = task.waits.get(WaitKind.PROMPT_CACHE_SAVE) if task is not None else None
        if task is not None and wait is not None:
            wait.count -= 1
            wait.size_bytes -= save.size_bytes or 0
            if wait.count <= 0:
                del task.waits[WaitKind.PROMPT_CACHE_SAVE]
            return [task]
        if save in self._pending:
            self._pending.remove(save)
        return []

    def _apply(self, task: TaskWaits, line: WaitLine) -> None:
        kind = WAIT_OF_LINE.get(line.kind)
        if line.kind is WaitLineKind.CACHE_UPDATE and line.duration_ms is not None:
            task.cache_update_ms += line.duration_ms
        if kind is None:
            return
        task.add(kind, line.size_bytes, line.tokens)
        if line.kind is WaitLineKind.SAVE:
            self._last_save = (task.task_id, line)


def part_words(wait: RunnerWait) -> str:
    """One named part in words: "prompt-cache save 1,362 MiB", "2 context checkpoints erased (640 MiB)"."""
    name = WAIT_NAMES[wait.kind]
    if wait.kind is WaitKind.FULL_REPROCESS:
        return name
    if wait.kind in (WaitKind.CHECKPOINT_ERASE, WaitKind.CHECKPOINT_CREATE):
        n = f"{wait.count} " if wait.count > 1 else "1 "
        noun = name.replace("checkpoints", "checkpoint" if wait.count == 1 else "checkpoints")
        return f"{n}{noun}" + (f" ({w.mib(wait.size_bytes)})" if wait.size_bytes else "")
    times = f"{wait.count}× " if wait.count > 1 else ""
    return f"{times}{name}" + (f" {w.mib(wait.size_bytes)}" if wait.size_bytes else "")


def waits_label(waits: TaskWaits, *, short: bool = False) -> str | None:
    """The time before prefill in words: its named parts, or None when the runner named none. ``short`` (a chart's
    bar and legend): the first part and how many more."""
    parts = [part_words(x) for x in waits.before_prefill()]
    if not parts:
        return None
    if short and len(parts) > 1:
        return f"{parts[0]} +{len(parts) - 1} more"
    return " + ".join(parts)


def what_changes(waits: TaskWaits) -> str:
    """What changes these waits, in words (llama-server's own options; Ollama sets some of them for it)."""
    kinds = {x.kind for x in waits.before_prefill()}
    out = []
    if WaitKind.PROMPT_CACHE_SAVE in kinds or WaitKind.PROMPT_CACHE_LOAD in kinds:
        out.append(
            "the runner copies an idle slot's state from the GPU into its RAM prompt cache before it takes a new prompt: "
            "fewer slots (OLLAMA_NUM_PARALLEL) or a shorter context leave less to copy, and llama-server's --cache-ram 0 "
            "turns the prompt cache off"
        )
    if kinds & {WaitKind.FULL_REPROCESS, WaitKind.CHECKPOINT_ERASE, WaitKind.CHECKPOINT_RESTORE}:
        out.append(
            "with a sliding-window model the runner keeps context checkpoints and, when none fits the new prompt, drops "
            "them and reads the whole prompt again: a prompt that repeats the earlier prefix keeps them usable, and "
            "llama-server's --ctx-checkpoints sets how many are kept"
        )
    return "; ".join(out)


def all_slots_busy(rec: RequestRecord, others: Sequence[RequestRecord], slots: int | None) -> bool | None:
    """Whether every one of the runner's ``slots`` served another request of the model when ``rec`` arrived (None:
    the slot count is not known). Only then can its wait before prefill be a queue for a slot."""
    if not slots or slots <= 0:
        return None
    busy = 0
    for o in others:
        end_ns = o.final_chunk_ns or o.closed_ns
        if o.id == rec.id or not same_model(o.model, rec.model) or end_ns is None:
            continue
        if o.started_at_unix_s <= rec.started_at_unix_s < o.wall_s(end_ns):
            busy += 1
    return busy >= slots
