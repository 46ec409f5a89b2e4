"""The Ollama log parser: llama-server's own output (captured from the build in .cache, kept in tests/data),
the older line formats, mutated lines (never fatal), and following a file that grows, rotates and shrinks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.ollama.log import LogTail, parse_line
from tests.support.paths import DATA

CAPTURED = DATA / "runner_logs" / "llama_server_0.3.36_3601_tokens.log"  # a 3,601-token prompt, batch 512, 4 tokens decoded
# sim's llama-server engine's child, started with Ollama's flags (no prefix, no timestamps); each log has a .json of timings
SIM_LOGS = sorted((DATA / "llama_server_logs").glob("*.log"))
# The format strings of older llama.cpp servers (update_slots), as Ollama's log carried them.
SLOT = "slot update_slots: id  0 | task 7 | "  # a runner line's own prefix
OLDER = [
    "slot update_slots: id  0 | task 0 | prompt processing progress, n_tokens = 512, batch.n_tokens = 512, progress = 0.127937",
    "slot update_slots: id  0 | task 0 | prompt processing progress, n_tokens = 4002, batch.n_tokens = 418, progress = 1.000000",
    "slot update_slots: id  0 | task 0 | prompt processing done, n_tokens = 4002, batch.n_tokens = 418",
    "slot      release: id  0 | task 0 | stop processing: n_tokens = 4010, truncated = 0",
    "slot print_timing: id  0 | task 0 | ",
    "prompt eval time =    5843.21 ms /  4002 tokens (    1.46 ms per token,   684.91 tokens per second)",
    "       eval time =     160.34 ms /    16 tokens (   10.02 ms per token,    99.79 tokens per second)",
    "      total time =    6003.55 ms /  4018 tokens",
]


def test_captured_llama_server_output() -> None:
    lines = CAPTURED.read_text().splitlines()
    events = [e for e in (parse_line(line, 100.0) for line in lines) if e is not None]
    progress = [e for e in events if e.kind == "progress"]
    assert [e.tokens for e in progress] == [512, 1024, 1536, 2048, 2560, 3072, 3089, 3597]
    assert [e.fraction for e in progress][:2] == [0.14, 0.28]
    assert {(e.slot_id, e.task_id) for e in events if e.kind not in ("runner_wait", "runner_listening")} == {(0, 1)}
    assert [e.port for e in events if e.kind == "runner_listening"] == [36233]  # the end of its start
    # The runner's slot count (analysis.runner_wait_lines): nothing was cached yet, so no save and no forced re-processing.
    assert [e.wait.kind for e in events if e.wait is not None] == ["n_slots"]
    sizes = [e.prompt_size_tokens for e in progress]
    assert all(s is not None and abs(s - 3601) / 3601 < 0.04 for s in sizes), sizes  # the fraction is printed to 2 places
    timing = {e.kind: (e.duration_ms, e.tokens) for e in events if e.kind in ("prompt_eval", "eval", "total")}
    assert timing == {"prompt_eval": (87418.10, 3601), "eval": (5700.10, 4), "total": (93118.20, 3605)}
    # The task's start, its prompt's size and its end: what a direct generation's record is made of.
    task = [(e.kind, e.tokens) for e in events if e.kind in ("launch", "new_prompt", "release")]
    assert task == [("launch", 0), ("release", 3604)], task  # this build logs no "new prompt" line at this verbosity
    assert all(e.read_unix_s == 100.0 for e in events), "stamped on read: the lines carry no time of their own"
    assert len(lines) - len(events) == 12


@pytest.mark.parametrize("log", SIM_LOGS, ids=lambda p: p.stem)
def test_sim_engine_logs_add_up_to_their_timings(log: Path) -> None:
    facts = json.loads(log.with_suffix(".json").read_text())
    timings, batch = facts["timings"], facts["num_batch"]
    prompt_size = timings["prompt_n"] + timings["cache_n"]
    lines = log.read_text().splitlines()
    events = [e for e in (parse_line(line, 7.0) for line in lines) if e is not None]
    progress = [e.tokens for e in events if e.kind == "progress"]
    assert len(progress) >= 2 and progress == sorted(set(progress)), progress
    assert progress[-1] >= prompt_size - batch
    sizes = [e.prompt_size_tokens for e in events if e.kind == "progress"]
    assert all(s is not None and abs(s - prompt_size) / prompt_size < 0.04 for s in sizes), sizes
    [prompt_eval] = [e for e in events if e.kind == "prompt_eval"]
    [decode] = [e for e in events if e.kind == "eval"]
    assert prompt_eval.tokens == timings["prompt_n"] and prompt_eval.duration_ms == pytest.approx(timings["prompt_ms"], abs=0.01)
    assert decode.tokens == timings["predicted_n"] and decode.duration_ms == pytest.approx(timings["predicted_ms"], abs=0.01)
    assert len(lines) - len(events) > 200, "the rest (load messages, warnings) is skipped, not fatal"


def test_older_formats() -> None:
    events = [parse_line(line, 1.0) for line in OLDER]
    kinds = [(e.kind, e.tokens) if e else None for e in events]
    assert kinds == [
        ("progress", 512),
        ("progress", 4002),
        ("done", 4002),
        ("release", 4010),
        None,
        ("prompt_eval", 4002),
        ("eval", 16),
        ("total", 4018),
    ]
    first = events[0]
    assert first is not None and first.prompt_size_tokens == 4002 and first.task_id == 0
    assert events[5] is not None and events[5].task_id is None, "a bare timing line parses without its slot prefix"


def test_drifted_lines() -> None:
    """Lines that changed shape within the runner's own form: read when the numbers are still there, else
    skipped; never an error. A runner message outside a slot line is not the runner's (only the older timing
    block's lines stand bare)."""
    slot = "slot print_timing: id  0 | task 1 | "
    cases = {
        "slot print_timing: id 12 | task 99999 | prompt processing, n_tokens=1,progress=1": 1,
        slot + "prompt processing, n_tokens = 10, progress = 0.00, t = 0.1 s": 10,  # no size from a zero fraction
        slot + "prompt processing, n_tokens = 10, progress = 7.5": 10,  # nor from one above 1
    }
    for line, tokens in cases.items():
        event = parse_line(line, 1.0)
        assert event is not None and event.kind == "progress" and event.tokens == tokens, line
    assert parse_line(slot + "prompt processing, n_tokens = 10, progress = 0.00", 1.0).prompt_size_tokens is None  # type: ignore[union-attr]
    assert parse_line(slot + "prompt processing, n_tokens = 10, progress = 7.5", 1.0).prompt_size_tokens is None  # type: ignore[union-attr]
    for line in [
        slot + "prompt processing, n_tokens = many, progress = 0.5",
        slot + "prompt eval time = fast",
        slot + "eval time = -3 ms / 2 tokens",
        slot + "prompt processing progress",
        'time=2026-12-03T07:00:00 level=INFO source=server.go msg="prompt processing, n_tokens = 64, progress = 0.50"',
        "prompt processing, n_tokens = 10, progress = 0.5",
        "",
        "\x00\xff",
        "time" * 10_000,
    ]:
        assert parse_line(line, 1.0) is None, line


def _mutate(line: str, data: st.DataObject) -> str:
    ops = data.draw(st.lists(st.tuples(st.sampled_from("idr"), st.integers(0, max(0, len(line))), st.characters()), max_size=6))
    for op, pos, ch in ops:
        pos = min(pos, len(line))
        if op == "i":
            line = line[:pos] + ch + line[pos:]
        elif op == "d":
            line = line[:pos] + line[pos + 1 :]
        else:
            line = line[:pos] + ch + line[pos + 1 :]
    return line


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_lines_never_fatal(data: st.DataObject) -> None:
    lines = [line for path in (CAPTURED, *SIM_LOGS) for line in path.read_text().splitlines()] + OLDER
    line = _mutate(data.draw(st.sampled_from(lines)), data)
    event = parse_line(line, 5.0)
    if event is not None:
        kinds = (
            "progress",
            "done",
            "prompt_eval",
            "eval",
            "total",
            "launch",
            "new_prompt",
            "release",
            "access",
            "runner_start",
            "runner_started",
            "runner_load",
            "runner_listening",
            "prompt_fit",
            "runner_wait",
        )
        assert event.tokens >= 0 and event.kind in kinds
        w = event.wait
        assert w is None or all(v is None or v >= 0 for v in (w.size_bytes, w.tokens, w.duration_ms, w.slot_id, w.task_id))
        assert event.prompt_size_tokens is None or event.prompt_size_tokens >= 0


def test_tail_follows_growth_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    assert tail.read(1.0) == [] and tail.problem is not None and "cannot read" in tail.problem  # not there yet
    log.write_text(f"old line before we started\n{SLOT}prompt processing, n_tokens = 1, progress = 0.01\n")
    assert tail.read(2.0) == [], "starts at the end: what was written before is not news"
    with log.open("a") as f:
        f.write("noise\nslot print_timing: id  0 | task 7 | prompt processing, n_tokens = 512, progress = 0.25, t = 3.0 s / 1 ")
    assert tail.read(3.0) == [] and tail.unknown_lines == 1, "an unfinished line waits for its end"
    with log.open("a") as f:
        f.write("tokens per second\n")
    [event] = tail.read(4.0)
    got = (event.kind, event.tokens, event.task_id, event.read_unix_s, event.prompt_size_tokens)
    assert got == ("progress", 512, 7, 4.0, 2048)
    os.rename(log, tmp_path / "server.log.1")  # rotated: a new file under the old name
    log.write_text(f"{SLOT}prompt processing done, n_tokens = 2048, batch.n_tokens = 0\n")
    assert [e.kind for e in tail.read(5.0)] == ["done"]
    log.write_text("")  # truncated in place
    with log.open("a") as f:
        f.write("prompt eval time = 10.00 ms / 2048 tokens\n")
    assert [(e.kind, e.tokens) for e in tail.read(6.0)] == [("prompt_eval", 2048)]
    assert tail.problem is None and tail.known_lines == 3


def test_unchanged_says_when_a_read_would_find_nothing(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("before\n")
    tail = LogTail(log)
    assert not tail.unchanged(), "never read: it must be read once"
    assert tail.read(1.0) == [] and tail.unchanged()
    with log.open("a") as f:
        f.write(f"{SLOT}prompt processing done, n_tokens = 2048, batch.n_tokens = 0\n")
    assert not tail.unchanged(), "written since"
    assert [e.kind for e in tail.read(2.0)] == ["done"]
    assert tail.read(3.0) == [] and tail.unchanged(), "read to its end again"
    os.chmod(log, 0o200)  # its mode changed: a read must say whether it is still readable
    assert not tail.unchanged()
    os.chmod(log, 0o600)
    tail.read(4.0)
    os.rename(log, tmp_path / "server.log.1")
    log.write_text("")  # rotated, the new file as long as nothing
    assert not tail.unchanged()
    log.unlink()
    assert not tail.unchanged(), "gone: a read says so"
