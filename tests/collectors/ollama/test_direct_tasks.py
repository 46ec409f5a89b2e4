"""``collectors.ollama.direct.DirectTasks``: runner tasks no proxied request claims become direct records, once.

Fed the lines the real runner writes (tests/data/llama_server_logs) and /slots readings as llama-server gives
them, on a clock the test moves; the engine test (test_direct_engine.py) runs the same against the real runner.
"""

from __future__ import annotations

import pytest

from analysis.phases import split_record
from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from collectors.ollama.direct import GRACE_S, LOG_WAIT_S, MAX_FINISHED, DirectTasks, RunnerRef
from collectors.ollama.log import go_duration_s, parse_line
from collectors.ollama.slots import SlotReading

RUNNER = RunnerRef(pid=4242, port=39511, model="gemma3:270m")
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def tasks(clock: Clock) -> DirectTasks:
    return DirectTasks(clock=clock, mono_ns=lambda: 10**12 + round((clock.now - T0) * 1e9))


def slot(
    task: int | None,
    *,
    busy: bool,
    processed: int | None = None,
    cached: int | None = 0,
    decoded: int | None = None,
    ctx: int | None = None,
) -> SlotReading:
    return SlotReading(0, 2048, busy, task, ctx, processed, cached, decoded)


def log_lines(d: DirectTasks, at: float, *lines: str) -> None:
    events = [e for line in lines if (e := parse_line(line, at)) is not None]
    assert len(events) == len(lines), lines
    d.log_events(events, lambda _task: RUNNER)


TASK_LINES = (
    "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0",
    "slot   operator(): id  0 | task 7 | new prompt, n_ctx_slot = 2048, n_keep = 0, task.n_tokens = 136",
)
TIMING_LINES = (
    "slot print_timing: id  0 | task 7 | prompt eval time =   10535.65 ms /   100 tokens (  105.36 ms per token,   9.49 "
    "tokens per second)",
    "slot print_timing: id  0 | task 7 |        eval time =   15042.16 ms /    24 tokens (  626.76 ms per token,   1.60 "
    "tokens per second)",
    "slot print_timing: id  0 | task 7 |       total time =   25577.81 ms /   124 tokens",
    "slot      release: id  0 | task 7 | stop processing: n_tokens = 159, truncated = 0",
)


def finished(d: DirectTasks) -> list[RequestRecord]:
    out, _ = d.drain()
    return [r for r in out if r.outcome != Outcome.IN_FLIGHT]


def test_the_log_gives_a_direct_generation_exactly() -> None:
    clock = Clock()
    d = tasks(clock)
    log_lines(d, T0, *TASK_LINES)
    clock.now += 26.0
    log_lines(d, clock.now, *TIMING_LINES)
    d.step()
    assert finished(d) == []  # waits for the proxy to finish a request it may be
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.seen_from == SeenFrom.RUNNER and rec.runner_source == "log" and rec.runner_task_id == 7
    assert rec.metrics is not None
    m = rec.metrics
    assert (m.prompt_eval_count, m.prompt_eval_cached_count, m.eval_count) == (136, 36, 24)
    assert (m.prompt_eval_duration_ns, m.eval_duration_ns) == (10_535_650_000, 15_042_160_000)
    assert rec.endpoint is None and rec.client_addr is None and rec.stream is None  # no access line: unknown
    ph = split_record(rec)
    assert ph.prefill_s == 10.53565 and ph.decode_s == 15.04216 and ph.prompt_tokens == 136
    assert ph.prefill_source == ph.decode_source == ph.prompt_tokens_source == "log"
    assert ph.ttft_s is None and ph.client_s is None and ph.transport_s is None  # no client side was seen
    assert rec.wall_s(rec.final_chunk_ns or 0) == clock.now - GRACE_S  # ends when its release line was read
    d.step()
    assert finished(d) == []  # once


def test_slots_alone_give_exact_counts_and_bounded_times() -> None:
    clock = Clock()
    d = tasks(clock)
    polls = [
        (0.0, slot(None, busy=False)),
        (1.0, slot(3, busy=True, processed=512, decoded=0, ctx=1024)),  # started in (0, 1]
        (1.25, slot(3, busy=True, processed=900, decoded=0, ctx=1000)),
        (1.5, slot(3, busy=True, processed=1000, cached=0, decoded=2, ctx=1001)),  # first token in (1.25, 1.5]
        (2.5, slot(3, busy=True, processed=1000, cached=0, decoded=12, ctx=1011)),
        (3.0, slot(3, busy=False, processed=0, decoded=0, ctx=1016)),  # released in (2.5, 3.0]: 17 tokens
    ]
    for at, reading in polls:
        clock.now = T0 + at
        d.slots_read(RUNNER, [reading], clock.now, {})
        d.step()
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_source == "slots" and rec.metrics is not None
    assert rec.metrics.prompt_eval_count == 1000 and rec.metrics.eval_count == 17 and rec.output_tokens_bound == 0
    ph = split_record(rec)
    assert ph.prefill_source == ph.decode_source == "slots"
    assert rec.prefill_bound_s is not None and rec.decode_bound_s is not None
    assert abs((ph.prefill_s or 0) - 0.875) < 1e-6 and rec.prefill_bound_s == 0.5 + 0.125  # (1.375 - 0.5) ± both halves
    assert abs((ph.decode_s or 0) - 1.375) < 1e-6 and rec.decode_bound_s == 0.125 + 0.25


def test_a_claimed_task_is_the_proxys_and_a_retracted_one_is_deleted() -> None:
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [slot(None, busy=False)], clock.now, {})
    for i in range(1, 4):
        clock.now = T0 + i * 0.25
        d.slots_read(RUNNER, [slot(5, busy=True, processed=100 * i, decoded=0)], clock.now, {})
    out, gone = d.drain()
    assert out and out[-1].outcome == Outcome.IN_FLIGHT and gone == []  # shown as direct while unclaimed
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(5, busy=True, processed=400, decoded=0)], clock.now, {5: "proxied-1"})
    _, gone = d.drain()
    assert gone == [out[-1].id]  # a proxied request's after all: its direct row goes
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(5, busy=False, ctx=420)], clock.now, {5: "proxied-1"})
    clock.now += 200
    d.step()
    assert finished(d) == []


def test_a_task_between_two_polls_is_still_counted_and_filled_from_the_log() -> None:
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [slot(2, busy=False, ctx=50)], clock.now, {})
    clock.now += 1.0
    d.slots_read(RUNNER, [slot(9, busy=False, ctx=80)], clock.now, {})  # id_task stepped: a task ran meanwhile
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_task_id == 9 and rec.metrics is None  # counted; its counts are not known without the log
    clock.now += 1.0
    d.slots_read(RUNNER, [slot(11, busy=False, ctx=80)], clock.now, {})
    log_lines(d, clock.now, *(line.replace("task 7", "task 11") for line in (*TASK_LINES, *TIMING_LINES)))
    d.log_readable = True
    clock.now += LOG_WAIT_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_task_id == 11 and rec.runner_source == "log" and rec.metrics is not None
    assert rec.metrics.prompt_eval_count == 136


def test_a_proxied_request_that_ran_between_polls_is_not_recorded_again() -> None:
    clock = Clock()
    d = tasks(clock)
    log_lines(d, clock.now, *TASK_LINES)
    clock.now += 26.0
    log_lines(d, clock.now, *TIMING_LINES)
    proxied = RequestRecord(
        id="p1",
        started_at_unix_s=T0 - 0.1,
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model="gemma3:270m",
        stream=True,
        received_ns=0,
        final_chunk_ns=round(26.2e9),
        outcome=Outcome.OK,
        metrics=FinalMetrics(
            prompt_eval_count=136,
            prompt_eval_cached_count=36,
            prompt_eval_duration_ns=10_535_650_000,
            eval_count=24,
            eval_duration_ns=15_042_160_000,
        ),
    )
    d.proxied_finished(proxied)
    clock.now += GRACE_S
    d.step()
    assert finished(d) == [] and d.matched_proxied == 1


def test_the_access_line_tells_route_and_client_only_when_it_fits_one_generation_alone() -> None:
    clock = Clock()
    d = tasks(clock)
    import time

    stamp = time.strftime("%Y/%m/%d - %H:%M:%S", time.localtime(T0 + 26))
    log_lines(d, T0, *TASK_LINES)
    clock.now += 26.0
    log_lines(d, clock.now, *TIMING_LINES, f'[GIN] {stamp} | 200 |     26.1s |       10.0.0.7 | POST     "/api/chat"')
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert (rec.endpoint, rec.client_addr, rec.status_code) == ("/api/chat", "10.0.0.7", 200)
    # Two generations ending in the same second: which line is whose is not known.
    d2 = tasks(clock)
    lines = (*TASK_LINES, *TIMING_LINES)
    two = [line.replace("task 7", f"task {t}").replace("id  0", f"id  {t % 2}") for t in (20, 21) for line in lines]
    log_lines(d2, clock.now, *two, f'[GIN] {stamp} | 200 |     26.1s |       10.0.0.7 | POST     "/api/chat"')
    clock.now += GRACE_S
    d2.step()
    recs = finished(d2)
    assert len(recs) == 2 and all(r.endpoint is None and r.client_addr is None for r in recs)


def test_a_task_whose_runner_went_away_ends_and_is_recorded() -> None:
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [slot(None, busy=False)], clock.now, {})
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(4, busy=True, processed=64, decoded=0)], clock.now, {})
    clock.now += 1.0
    d.runner_gone(RUNNER.pid)  # unloaded or killed mid-generation
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_task_id == 4 and rec.ends_bound_s is not None and rec.ends_bound_s >= 0.5


def test_finished_proxied_requests_kept_to_match_are_bounded_and_slim() -> None:
    clock = Clock()
    d = tasks(clock)
    for i in range(MAX_FINISHED + 100):
        rec = RequestRecord(
            id=f"p{i}",
            started_at_unix_s=T0,
            client_addr="c",
            endpoint="/api/chat",
            model="m",
            stream=True,
            received_ns=0,
            token_chunk_ns=list(range(50)),
            outcome=Outcome.OK,
        )
        d.proxied_finished(rec)
    assert len(d._finished) == MAX_FINISHED and d._finished[0][1].id == "p100"
    assert all(rec.token_chunk_ns == [] for _, rec in d._finished)


def test_access_and_load_lines_parse_and_hostile_ones_do_not() -> None:
    assert go_duration_s("36.33s") == 36.33 and go_duration_s("1m2.5s") == 62.5
    assert go_duration_s("512.3µs") == pytest.approx(512.3e-6)
    for bad in ("", "12", "1x", "-3s", "1e9h", "s"):
        assert go_duration_s(bad) is None, bad
    line = '[GIN] 2026/06/12 - 22:48:16 | 499 |       1.2ms |  ::1 | POST     "/api/generate"'
    event = parse_line(line, 1.0)
    assert event is not None and event.access is not None
    access = event.access
    assert (access.status, access.client, access.path) == (499, "::1", "/api/generate")
    assert access.latency_s == pytest.approx(0.0012)
    for hostile in ('[GIN] 2026/13/45 - 99:99:99 | 200 | 1s | x | POST "/api/chat"', "[GIN] | 200 |", "[GIN] " + "x" * 100_000):
        assert parse_line(hostile, 1.0) is None
    start_line = (
        'time=x level=INFO source=llama_server.go:431 msg="starting llama-server" cmd="/b/llama-server --model /m --port 40123"'
    )
    start = parse_line(start_line, 1.0)
    assert start is not None and start.kind == "runner_start" and start.port == 40123
    done = parse_line('time=x level=INFO source=llama_server.go:1362 msg="llama-server started in 2.31 seconds"', 1.0)
    assert done is not None and done.kind == "runner_started" and done.duration_ms == 2310.0


def test_a_direct_tasks_own_log_lines_find_its_record() -> None:
    """The runner reader routes a direct task's progress lines (the prompt's size, which /slots does not tell while
    the prompt is read) to that task's record: ``record_id`` names it, only while one unclaimed task has the id."""
    clock = Clock()
    d = tasks(clock)
    assert d.record_id(7) is None  # no such task yet
    log_lines(d, T0, *TASK_LINES)
    rid = d.record_id(7)
    assert rid is not None and rid.startswith("direct-")
    assert d.record_id(8) is None
