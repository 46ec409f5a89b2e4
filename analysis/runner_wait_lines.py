"""The runner's own waits before a prompt is read, in its own words, parsed: one ``WaitLine`` each (folded by
``analysis.runner_wait_fold``): prompt-cache saves and loads, context
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

import re
from dataclasses import dataclass
from enum import StrEnum

from analysis.log_grammar import MAX_LINE_CHARS, RunnerLine, runner_line

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
