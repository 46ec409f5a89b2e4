"""One task's waits as the runner's lines told them (``TaskWaits``): each ``WaitKind`` summed, and the form the
store keeps them in (``RequestWaitsRow``, v16 ``request_waits``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class WaitKind(StrEnum):
    """A named part of the time before (or during) prefill, as stored in ``request_waits`` (its values never change)."""

    PROMPT_CACHE_SAVE = "prompt_cache_save"
    PROMPT_CACHE_LOAD = "prompt_cache_load"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    CHECKPOINT_ERASE = "checkpoint_erase"
    FULL_REPROCESS = "full_reprocess"
    CHECKPOINT_CREATE = "checkpoint_create"


_WAIT_KIND_VALUES = frozenset(k.value for k in WaitKind)

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
