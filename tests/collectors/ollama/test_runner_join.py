"""Joining a runner's busy slots to the in-flight requests of its model, and the prompt size arriving late."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from analysis.records import ProgressSource
from collectors.ollama.discovery import Runner
from collectors.ollama.log import parse_line
from collectors.ollama.runner_state import MAX_DECODE_ROWS_KEPT, MAX_PREFILL_ROWS_KEPT, RunnerState
from collectors.ollama.runners import (
    BUSY_INTERVAL_S,
    FIRST_READING_GRACE_S,
    IDLE_INTERVAL_S,
    STREAMED_DECODE_INTERVAL_S,
    RunnerReader,
)
from collectors.ollama.slots import SlotReading
from tests.support.reader_run import in_flight_record

MODEL = "gemma3:270m"


def reading(slot: int, task: int, processed: int, ctx: int, decoded: int = 0, busy: bool = True) -> SlotReading:
    return SlotReading(slot, 8192, busy, task, ctx, processed, 0, decoded)


def reader() -> tuple[RunnerReader, RunnerState]:
    r = RunnerReader("http://127.0.0.1:1", cast(Any, None), in_flight=list, loaded_models=list, clock=lambda: 0.0)
    state = RunnerState(Runner(100, 4000, "/m.gguf"), model=MODEL)
    r.runners[100] = state
    return r, state


def test_oldest_request_takes_the_oldest_task_and_keeps_it() -> None:
    r, state = reader()
    a, b = in_flight_record("a", MODEL, 10.0), in_flight_record("b", "gemma3:270M", 11.0)  # same model, other spelling
    other = in_flight_record("x", "llama3.2", 9.0)
    r._join(state, [reading(1, 8, 512, 1024), reading(0, 7, 512, 1024)], [b, other, a], 1.0)
    assert {(s.request_id, s.processed_tokens) for s in r.drain()} == {("a", 512), ("b", 512)}
    assert r._tasks == {(100, 7): "a", (100, 8): "b"}
    r._join(state, [reading(0, 7, 1024, 1536), reading(1, 8, 512, 1024)], [a, b], 2.0)
    assert [(s.request_id, s.processed_tokens) for s in r.drain()] == [("a", 1024)], "an unchanged slot adds no row"


def test_the_estimate_waits_for_a_readable_runners_first_reading() -> None:
    """The collector's estimate is held back while the runner of the request's model can be read and its first
    reading of the request is due (the Live card would show the estimate for a moment, then the reading)."""
    r, state = reader()
    a = in_flight_record("a", MODEL, 10.0)
    assert r.awaits_first_reading(a, 10.5)
    assert not r.awaits_first_reading(a, 10.0 + FIRST_READING_GRACE_S), "not read in time: the estimate after all"
    assert not r.awaits_first_reading(in_flight_record("x", "llama3.2", 10.0), 10.5), "no runner of its model"
    state.problem = "/slots answered HTTP 503"
    assert not r.awaits_first_reading(a, 10.5), "a runner that cannot be read gives no reading to wait for"
    state.problem = None
    r._join(state, [reading(0, 3, 0, 100)], [a], 10.4)
    assert not r.awaits_first_reading(a, 10.5), "read: its rows are written, the estimate may follow them"


def test_size_filled_in_once_decoding_begins() -> None:
    r, state = reader()
    a = in_flight_record("a", MODEL)
    r._join(state, [reading(0, 3, 512, 1024)], [a], 1.0)
    r._join(state, [reading(0, 3, 1024, 1200)], [a], 2.0)
    first = r.drain()
    assert [s.prompt_tokens for s in first] == [None, None], "n_prompt_tokens (1024, 1200) is not the size while reading"
    r._join(state, [reading(0, 3, 1200, 1201, decoded=1)], [a], 3.0)
    again = r.drain()
    assert [(s.ts_unix_s, s.prompt_tokens) for s in again] == [(1.0, 1200), (2.0, 1200), (3.0, 1200)]
    assert all(s.source is ProgressSource.SLOTS for s in again)


def test_log_size_first_then_exact() -> None:
    r, state = reader()
    a = in_flight_record("a", MODEL)
    r._join(state, [reading(0, 3, 512, 1024)], [a], 1.0)
    event = parse_line("slot print_timing: id  0 | task 3 | prompt processing, n_tokens = 512, progress = 0.42, t = 3 s", 1.5)
    assert event is not None
    r._add_log("a", event)
    rows = r.drain()
    assert [(s.source, s.prompt_tokens) for s in rows] == [
        (ProgressSource.SLOTS, None),
        (ProgressSource.SLOTS, 1219),
        (ProgressSource.LOG, 1219),
    ]
    r._join(state, [reading(0, 3, 1200, 1201, decoded=1)], [a], 3.0)
    assert [(s.ts_unix_s, s.prompt_tokens) for s in r.drain()] == [(1.0, 1200), (3.0, 1200)], "the exact size replaces it"


def test_finished_task_of_a_gone_request_is_not_joined() -> None:
    r, state = reader()
    r._join(state, [reading(0, 3, 512, 1024, busy=False)], [], 1.0)
    assert r.drain() == [] and r._tasks == {}


def test_a_low_first_size_is_raised() -> None:
    """A reading racing the prompt's last batch can show output begun with the prompt not all counted: the
    larger size read next replaces it on every row; a smaller one never does."""
    r, state = reader()
    a = in_flight_record("a", MODEL)
    r._join(state, [reading(0, 3, 3997, 4001)], [a], 1.0)
    r._join(state, [reading(0, 3, 3997, 4002, decoded=1)], [a], 2.0)
    assert [s.prompt_tokens for s in r.drain()] == [None, 3997, 3997]
    r._join(state, [reading(0, 3, 4001, 4003, decoded=2)], [a], 3.0)
    assert [(s.ts_unix_s, s.prompt_tokens) for s in r.drain()] == [(1.0, 4001), (2.0, 4001), (3.0, 4001)]
    r._join(state, [reading(0, 3, 3000, 4004, decoded=3)], [a], 4.0)
    assert [(s.ts_unix_s, s.prompt_tokens) for s in r.drain()] == [(4.0, 4001)]


def test_rows_kept_per_request_are_bounded() -> None:
    """A prompt read in more batches than MAX_PREFILL_ROWS_KEPT, then a long reply read at every poll: the reader
    keeps at most the named numbers of rows for the request, and a size learnt at the end re-sizes only those."""
    r, state = reader()
    a = in_flight_record("a", MODEL)
    batches = MAX_PREFILL_ROWS_KEPT + 100
    for i in range(1, batches + 1):
        r._join(state, [reading(0, 3, 16 * i, 16 * i + 16)], [a], float(i))
    prompt = 16 * batches
    for n in range(1, 5001):  # decode: every poll is a new reading
        r._join(state, [reading(0, 3, prompt, prompt + n, decoded=n)], [a], float(batches + n))
    written = r.drain()
    # every reading is written, and the kept prefill rows once more when the first decode reading sizes the prompt
    assert len(written) == batches + 5000 + MAX_PREFILL_ROWS_KEPT
    track = r._tracks["a"]
    assert len(track.prefill_rows) == MAX_PREFILL_ROWS_KEPT and len(track.decode_rows) == MAX_DECODE_ROWS_KEPT
    r._sized(track, prompt + 7, exact=True)  # a raise (a low first reading corrected)
    resized = r.drain()
    assert len(resized) == MAX_PREFILL_ROWS_KEPT + MAX_DECODE_ROWS_KEPT
    assert resized[0].ts_unix_s == float(batches - MAX_PREFILL_ROWS_KEPT + 1), "the oldest prefill rows were let go"
    assert resized[-1].ts_unix_s == float(batches + 5000), "the latest decode row is re-sized"
    assert {s.prompt_tokens for s in resized} == {prompt + 7}


def test_poll_pace_follows_what_the_requests_need() -> None:
    """4 Hz while a request reads its prompt, is not streamed, or has not been seen decoding; once a second while
    every request streams its tokens through the proxy and its prompt's size is read; idle pace with none."""
    r, state = reader()
    assert r._interval_s(state, []) == IDLE_INTERVAL_S
    a = in_flight_record("a", MODEL)
    assert r._interval_s(state, [a]) == BUSY_INTERVAL_S, "reading its prompt"
    r._join(state, [reading(0, 3, 512, 1024)], [a], 1.0)
    a.first_token_ns = 5
    assert r._interval_s(state, [a]) == BUSY_INTERVAL_S, "decoding, but no reading has seen it yet (size unknown)"
    r._join(state, [reading(0, 3, 1200, 1201, decoded=1)], [a], 2.0)
    assert r._interval_s(state, [a]) == STREAMED_DECODE_INTERVAL_S, "streamed and sized: the proxy sees its tokens"
    b = in_flight_record("b", MODEL)
    b.stream, b.first_token_ns = False, 6
    assert r._interval_s(state, [a, b]) == BUSY_INTERVAL_S, "a whole-body reply: only the runner shows its progress"
    other = in_flight_record("x", "llama3.2")
    assert r._interval_s(state, [a, other]) == STREAMED_DECODE_INTERVAL_S, "another model's request is not this runner's"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def log_reader(log: Path, clock: Clock) -> tuple[RunnerReader, RunnerState]:
    r = RunnerReader("http://127.0.0.1:1", cast(Any, None), in_flight=list, loaded_models=list, clock=clock, log_path=log)
    state = RunnerState(Runner(100, 4000, "/m.gguf"), model=MODEL)
    r.runners[100] = state
    log.write_text("")
    r._read_log([])  # the tail starts at the end of the file, as it does on a live log
    return r, state


def write(log: Path, *lines: str) -> None:
    with log.open("a") as f:
        f.writelines(line + "\n" for line in lines)


def test_a_progress_line_counts_only_for_the_task_its_request_holds(tmp_path: Path) -> None:
    """A proxied request holds task 3 (/slots showed it); a forged line for a task no request holds, and one naming
    task 3 with more tokens than its slot's context, give it no row: both are dropped and counted. Its own line does."""
    log = tmp_path / "ollama.log"
    r, state = log_reader(log, Clock())
    a = in_flight_record("a", MODEL)
    state.slots = [reading(0, 3, 512, 1024)]
    r._join(state, state.slots, [a], 1.0)
    r.drain()
    write(
        log,
        "slot print_timing: id  0 | task 99 | prompt processing, n_tokens = 999999, progress = 0.5, t = 3 s",
        "slot print_timing: id  0 | task 3 | prompt processing, n_tokens = 999999, progress = 0.99, t = 3 s",
    )
    r._read_log([a])
    assert r.drain() == [] and r.log_lines_dropped == 2
    write(log, "slot print_timing: id  0 | task 3 | prompt processing, n_tokens = 1024, progress = 0.5, t = 3 s")
    r._read_log([a])
    assert [(s.request_id, s.processed_tokens) for s in r.drain() if s.source is ProgressSource.LOG] == [("a", 1024)]


def test_a_forged_runner_start_line_does_not_blind_the_log(tmp_path: Path) -> None:
    """ "starting llama-server … --port 1" (no runner there, ever): the log's figures of the runner that is there are
    still used for its direct generation."""
    log = tmp_path / "ollama.log"
    clock = Clock()
    r, state = log_reader(log, clock)
    write(
        log,
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:431 msg="starting llama-server" '
        'cmd="/b/llama-server --model /m --port 1"',
    )
    r._read_log([])
    t0 = clock.now
    polls = [(0.0, reading(0, 4, 0, 0, busy=False))]
    polls += [(float(i), reading(0, 7, 64 * i, 64 * i + 64)) for i in range(1, 11)]
    polls += [(float(i), reading(0, 7, 136, 136 + i - 10, decoded=i - 10)) for i in range(11, 26)]
    polls += [(26.0, reading(0, 7, 0, 159, busy=False))]
    for at, slot in polls:
        clock.now = t0 + at
        state.slots = [slot]
        r._join(state, [slot], [], clock.now)
        if at == 1.0:
            write(
                log,
                "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0",
                "slot   operator(): id  0 | task 7 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 136",
            )
            r._read_log([])
    write(
        log,
        "slot print_timing: id  0 | task 7 | prompt eval time =   10535.65 ms /   100 tokens (  105.36 ms per token)",
        "slot print_timing: id  0 | task 7 |        eval time =   15042.16 ms /    24 tokens (  626.76 ms per token)",
        "slot      release: id  0 | task 7 | stop processing: n_tokens = 159, truncated = 0",
    )
    r._read_log([])
    clock.now += 5.0
    r.direct.step()
    recs, _ = r.drain_direct()
    (rec,) = [x for x in recs if x.final_chunk_ns is not None]
    assert rec.runner_source == "log" and rec.metrics is not None and rec.metrics.prompt_eval_count == 136


def test_a_launch_line_for_a_task_no_reading_shows_brings_the_next_poll_forward() -> None:
    """Issue 40: a direct task shorter than the idle interval that a queued one follows at once on its slot is never
    shown by /slots (its id is passed over) unless the reader looks while it runs: its launch line asks for a look now.
    A task the last reading shows already asks for nothing (the line is only a hint: what counts is /slots)."""
    r, state = reader()
    state.slots = [reading(0, 7, 64, 64)]
    later = time.monotonic() + IDLE_INTERVAL_S
    state.next_poll_s = later
    launch = "slot launch_slot_: id  0 | task {} | processing task, is_child = 0"
    shown = parse_line(launch.format(7), 1.0)
    assert shown is not None
    r._look_at_launches([shown])
    assert state.next_poll_s == later
    unseen = parse_line(launch.format(9), 1.0)
    assert unseen is not None
    r._look_at_launches([unseen])
    assert state.next_poll_s <= time.monotonic()
