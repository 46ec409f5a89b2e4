"""The runner's waits in words: each named part, a task's time before prefill, what changes it, and whether every
slot was busy (only then can a wait before prefill be a queue for a slot)."""

from __future__ import annotations

from analysis import wording as w
from analysis.runner_wait_tasks import RunnerWait, TaskWaits, WaitKind

# The named parts of the time before prefill, and what each one is in words.
WAIT_NAMES: dict[WaitKind, str] = {
    WaitKind.PROMPT_CACHE_SAVE: "prompt-cache save",
    WaitKind.PROMPT_CACHE_LOAD: "prompt loaded from the cache",
    WaitKind.CHECKPOINT_RESTORE: "context checkpoint restored",
    WaitKind.CHECKPOINT_ERASE: "context checkpoints erased",
    WaitKind.FULL_REPROCESS: "full re-processing (cache lost)",
    WaitKind.CHECKPOINT_CREATE: "context checkpoints written",
}


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
