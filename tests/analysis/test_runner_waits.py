"""The runner's own waits read from its lines (analysis.runner_wait_lines, runner_wait_fold): the exact forms llama-server prints
(tools/server/server-context.cpp, server-task.cpp of the llama.cpp the project builds), and the H200 run's log."""

from __future__ import annotations

import pytest

from analysis.log_grammar import MAX_LINE_CHARS
from analysis.runner_wait_fold import WaitJoiner
from analysis.runner_wait_lines import MIB, WaitLine, WaitLineKind, parse_wait_line
from analysis.runner_wait_tasks import WaitKind
from analysis.runner_wait_words import waits_label, what_changes
from collectors.ollama.log import parse_line
from tests.support.real_gpu import LOG

LINES: list[tuple[str, WaitLine]] = [
    (
        "srv    load_model: initializing, n_slots = 2, n_ctx_slot = 20480, kv_unified = 'false'",
        WaitLine(WaitLineKind.N_SLOTS, tokens=2),
    ),
    (
        "srv   prompt_save:  - saving prompt with length 16669, total state size = 1362.016 MiB (draft: 0.000 MiB)",
        WaitLine(WaitLineKind.SAVE, size_bytes=round(1362.016 * MIB), tokens=16669),
    ),
    ("srv         alloc:  - prompt is already in the cache, skipping", WaitLine(WaitLineKind.SAVE_SKIPPED)),
    (
        "srv         alloc:  - prompt state size 9000.000 MiB exceeds cache size limit 8192.000 MiB, skipping",
        WaitLine(WaitLineKind.SAVE_SKIPPED),
    ),
    (
        "srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 593.063 MiB)",
        WaitLine(WaitLineKind.CACHE_EVICT, size_bytes=round(593.063 * MIB)),
    ),
    ("srv          load:  - found better prompt with f_keep = 0.950, f_sim = 0.990", WaitLine(WaitLineKind.CACHE_LOAD)),
    ("srv  get_availabl: prompt cache update took 1.08 ms", WaitLine(WaitLineKind.CACHE_UPDATE, duration_ms=1.08)),
    ("slot process_sing: id  1 | task -1 | saving idle slot to prompt cache", WaitLine(WaitLineKind.IDLE_SAVE, slot_id=1)),
    (
        "slot   operator(): id  0 | task 7 | restored context checkpoint (pos_min = 0, pos_max = 267, n_tokens = 268, "
        "n_past = 268, size = 83.754 MiB)",
        WaitLine(WaitLineKind.CHECKPOINT_RESTORE, 0, 7, round(83.754 * MIB), 268),
    ),
    (
        "slot   operator(): id  1 | task 806 | forcing full prompt re-processing due to lack of cache data (likely due to SWA "
        "or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)",
        WaitLine(WaitLineKind.FULL_REPROCESS, 1, 806),
    ),
    (
        "slot   operator(): id  0 | task 1112 | erased invalidated context checkpoint (pos_min = 2065, pos_max = 3600, "
        "n_tokens = 3601, n_swa = 1024, pos_next = 0, size = 320.013 MiB)",
        WaitLine(WaitLineKind.CHECKPOINT_ERASE, 0, 1112, round(320.013 * MIB), 3601),
    ),
    (
        "slot create_check: id  0 | task 5 | created context checkpoint 1 of 32 (pos_min = 0, pos_max = 267, n_tokens = 268, "
        "size = 83.754 MiB)",
        WaitLine(WaitLineKind.CHECKPOINT_CREATE, 0, 5, round(83.754 * MIB), 268),
    ),
    # With --log-prefix --log-timestamps the runner puts its clock and level first.
    (
        "0.12.345.678 I srv   prompt_save:  - saving prompt with length 5, total state size = 1.876 MiB (draft: 0.000 MiB)",
        WaitLine(WaitLineKind.SAVE, size_bytes=round(1.876 * MIB), tokens=5),
    ),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_each_line_the_runner_prints(line: str, expected: WaitLine) -> None:
    assert parse_wait_line(line) == expected
    assert parse_wait_line(line + "\r\n") == expected


@pytest.mark.parametrize(
    "line",
    [
        "srv  get_availabl: updating prompt cache",  # says nothing of a cost
        "srv   prompt_save:  - saving prompt with length 5, total state size = lots MiB (draft: 0.000 MiB)",
        "user text: saving idle slot to prompt cache",  # not at the start of a runner's line
        "slot process_sing: id  1 | task -1 | saving idle slot to prompt cache" + " " * 2 + "x",
        "slot   operator(): id  0 | task 5 | forcing full prompt re-processing due to lack of cache data " + "x" * MAX_LINE_CHARS,
    ],
)
def test_other_lines_are_not_waits(line: str) -> None:
    assert parse_wait_line(line) is None


def fold(lines: list[str]) -> WaitJoiner:
    """Lines through Ollama's log reader and this module, as the collector's runner reader feeds them."""
    j = WaitJoiner()
    for line in lines:
        event = parse_line(line, 0.0)
        if event is None:
            continue
        if event.kind == "runner_wait" and event.wait is not None:
            j.wait(event.wait)
        elif event.kind == "launch" and event.task_id is not None:
            j.launch(event.slot_id, event.task_id)
        elif event.kind == "new_prompt" and event.task_id is not None:
            j.new_prompt(event.task_id)
        elif event.kind == "release" and event.task_id is not None:
            j.release(event.slot_id, event.task_id)
    return j


def test_the_h200_runs_waits_are_joined_to_the_task_they_precede() -> None:
    j = fold(LOG.read_text().splitlines())
    assert j.n_slots == 2
    # The 272-token prompt after the 16k one: the runner saved the idle slot's 16,669-token state (1,362 MiB) into its
    # RAM prompt cache after launching the task and before reading its prompt; the LRU save before the launch was
    # "already in the cache" and copied nothing.
    t = j.tasks[1112]
    assert (t.slot_id, t.n_slots, t.other_slots_busy) == (0, 2, 0)
    save = t.waits[WaitKind.PROMPT_CACHE_SAVE]
    assert (save.count, save.size_bytes, save.tokens) == (1, round(1362.016 * MIB), 16669)
    assert t.waits[WaitKind.CHECKPOINT_ERASE].count == 2 and "full_reprocess" in t.waits
    said = "prompt-cache save 1,362 MiB + 2 context checkpoints erased (640 MiB) + full re-processing (cache lost)"
    assert waits_label(t) == said
    assert "--cache-ram 0" in what_changes(t) and "OLLAMA_NUM_PARALLEL" in what_changes(t)
    assert t.new_prompt_seen and t.released
    # The first task: nothing was cached yet, so nothing was saved.
    assert j.tasks[0].before_prefill() == []
    # The document sent beside the chat: the chat held the other slot.
    assert j.tasks[2779].other_slots_busy == 1


def test_a_save_the_cache_already_holds_copies_nothing() -> None:
    j = fold(
        [
            "srv  get_availabl: updating prompt cache",
            "srv   prompt_save:  - saving prompt with length 527, total state size = 197.638 MiB (draft: 0.000 MiB)",
            "srv         alloc:  - prompt is already in the cache, skipping",
            "srv          load:  - found better prompt with f_keep = 0.950, f_sim = 0.990",
            "srv  get_availabl: prompt cache update took 12.50 ms",
            "slot launch_slot_: id  0 | task 9 | processing task, is_child = 0",
            "slot   operator(): id  0 | task 9 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 600",
            "slot   operator(): id  0 | task 9 | restored context checkpoint (pos_min = 0, pos_max = 511, n_tokens = 512, "
            "n_past = 512, size = 40.000 MiB)",
        ]
    )
    t = j.tasks[9]
    assert "prompt_cache_save" not in t.waits and t.cache_update_ms == 12.5
    assert waits_label(t) == "prompt loaded from the cache + context checkpoint restored 40 MiB"


# A flood of launch lines on new slot ids must fold in time linear in its lines (issue 39 F9: 15,000 took 22 s on
# this machine at e5fe76a, 30,000 took 101 s, every launch summing over every slot id seen); it takes ~0.3 s now.
FLOOD_LAUNCHES = 30_000
FLOOD_BUDGET_S = 5.0  # room for two CPU-bound processes beside it


def test_launch_lines_on_new_slot_ids_fold_in_linear_time_and_bounded_tables() -> None:
    import time

    from analysis.runner_wait_fold import MAX_SLOTS_BELIEVED, MAX_TASKS_KEPT

    for slots in (None, 2):
        joiner = WaitJoiner(slots)
        start = time.perf_counter()
        for i in range(FLOOD_LAUNCHES):
            joiner.launch(1000 + i, 5_000_000 + i)
            joiner.launch(i % 4, 9_000_000 + i)
        took_s = time.perf_counter() - start
        assert took_s < FLOOD_BUDGET_S, f"{2 * FLOOD_LAUNCHES} launches took {took_s:.1f} s"
        limit = slots or MAX_SLOTS_BELIEVED
        assert len(joiner._busy) <= limit and len(joiner.tasks) <= MAX_TASKS_KEPT
        assert all(t.slot_id is not None and t.slot_id < limit for t in joiner.tasks.values())
        assert joiner.dropped >= FLOOD_LAUNCHES


def test_a_slot_or_slot_count_the_runner_does_not_run_with_is_dropped() -> None:
    joiner = WaitJoiner(2)  # started with -np 2
    assert joiner.launch(7, 5) == [] and 5 not in joiner.tasks
    assert joiner.wait(WaitLine(WaitLineKind.N_SLOTS, tokens=64)) == [] and joiner.n_slots == 2
    assert joiner.wait(WaitLine(WaitLineKind.IDLE_SAVE, slot_id=9)) == []
    assert joiner.dropped == 3
    (task,) = joiner.launch(1, 6)
    assert (task.slot_id, task.n_slots) == (1, 2)
