"""The runner's wait lines and the waits they name are two vocabularies (``WaitLineKind``, ``WaitKind``): their values
never change (``WaitKind``'s are stored in ``request_waits``), and every table keyed by them covers exactly the
members."""

from __future__ import annotations

import json

from analysis.runner_wait_fold import WAIT_OF_LINE
from analysis.runner_wait_lines import WaitLineKind, parse_wait_line
from analysis.runner_wait_tasks import BEFORE_PREFILL, TaskWaits, WaitKind
from analysis.runner_wait_words import WAIT_NAMES

LINE_KINDS = {
    "n_slots",
    "save",
    "save_skipped",
    "cache_evict",
    "cache_load",
    "cache_update",
    "idle_save",
    "checkpoint_restore",
    "full_reprocess",
    "checkpoint_erase",
    "checkpoint_create",
}
WAIT_KINDS = {
    "prompt_cache_save",
    "prompt_cache_load",
    "checkpoint_restore",
    "checkpoint_erase",
    "full_reprocess",
    "checkpoint_create",
}
# One line of each kind as llama-server prints it (analysis/runner_waits.py's docstring).
SAMPLES: dict[WaitLineKind, str] = {
    WaitLineKind.N_SLOTS: "srv    load_model: initializing, n_slots = 2, n_ctx_slot = 20480, kv_unified = 'false'",
    WaitLineKind.SAVE: "srv   prompt_save:  - saving prompt with length 16669, total state size = 1362.016 MiB",
    WaitLineKind.SAVE_SKIPPED: "srv         alloc:  - prompt is already in the cache, skipping",
    WaitLineKind.CACHE_EVICT: "srv         alloc:  - making room for prompt cache entry, removing oldest entry "
    "(size = 593.063 MiB)",
    WaitLineKind.CACHE_LOAD: "srv          load:  - found better prompt with f_keep = 0.950, f_sim = 0.990",
    WaitLineKind.CACHE_UPDATE: "srv  get_availabl: prompt cache update took 1.08 ms",
    WaitLineKind.IDLE_SAVE: "slot process_sing: id  1 | task -1 | saving idle slot to prompt cache",
    WaitLineKind.CHECKPOINT_RESTORE: "slot   operator(): id  0 | task 7 | restored context checkpoint (pos_min = 0, "
    "pos_max = 267, n_tokens = 268, n_past = 268, size = 83.754 MiB)",
    WaitLineKind.FULL_REPROCESS: "slot   operator(): id  1 | task 806 | forcing full prompt re-processing due to lack of "
    "cache data",
    WaitLineKind.CHECKPOINT_ERASE: "slot   operator(): id  0 | task 1112 | erased invalidated context checkpoint "
    "(pos_min = 2065, pos_max = 3600, n_tokens = 3601, n_swa = 1024, pos_next = 0, size = 320.013 MiB)",
    WaitLineKind.CHECKPOINT_CREATE: "slot create_check: id  0 | task 5 | created context checkpoint 1 of 32 (pos_min = 0, "
    "pos_max = 267, n_tokens = 268, size = 83.754 MiB)",
}


def test_the_values_are_the_released_ones() -> None:
    assert {k.value for k in WaitLineKind} == LINE_KINDS
    assert {k.value for k in WaitKind} == WAIT_KINDS


def test_a_real_line_of_each_kind_parses_to_that_kind() -> None:
    assert set(SAMPLES) == set(WaitLineKind)
    for kind, line in SAMPLES.items():
        parsed = parse_wait_line(line)
        assert parsed is not None and parsed.kind is kind, (kind, line)


def test_every_wait_has_its_name_and_nothing_else_does() -> None:
    assert set(WAIT_NAMES) == set(WaitKind)
    assert all(isinstance(k, WaitKind) and v.strip() for k, v in WAIT_NAMES.items())


def test_every_wait_comes_from_exactly_one_kind_of_line() -> None:
    assert all(isinstance(k, WaitLineKind) and isinstance(v, WaitKind) for k, v in WAIT_OF_LINE.items())
    assert sorted(WAIT_OF_LINE.values()) == sorted(WaitKind)


def test_before_prefill_is_every_wait_but_the_checkpoints_written_while_reading() -> None:
    assert set(BEFORE_PREFILL) == set(WaitKind) - {WaitKind.CHECKPOINT_CREATE}
    assert len(BEFORE_PREFILL) == len(set(BEFORE_PREFILL))


def test_stored_waits_read_back_as_members_and_an_unknown_kind_is_left_out() -> None:
    task = TaskWaits(task_id=7, slot_id=0, n_slots=2, other_slots_busy=0)
    task.add(WaitKind.PROMPT_CACHE_SAVE, 1024, 10)
    obj = json.loads(json.dumps(task.to_json()))
    assert obj["waits"][0]["kind"] == "prompt_cache_save"  # stored as its value, as before the enum
    obj["waits"].append({"kind": "a_newer_phasewatchs_wait", "count": 1, "size_bytes": 0, "tokens": None})
    obj["waits"].append({"kind": ["not", "a", "kind"], "count": 1, "size_bytes": 0, "tokens": None})
    back = TaskWaits.from_json(obj)
    assert list(back.waits) == [WaitKind.PROMPT_CACHE_SAVE]
    assert all(type(k) is WaitKind and type(v.kind) is WaitKind for k, v in back.waits.items())
