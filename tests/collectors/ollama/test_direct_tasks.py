"""``collectors.ollama.direct.DirectTasks``: runner tasks no proxied request claims become direct records, once.

Fed the lines the real runner writes (tests/data/llama_server_logs) and /slots readings as llama-server gives
them, on a clock the test moves; the engine test (test_direct_engine.py) runs the same against the real runner.
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass, replace

import pytest

from analysis.phases import split_record
from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from collectors.ollama.direct import (
    GRACE_S,
    LOAD_KEPT_S,
    LOG_WAIT_S,
    MAX_FINISHED,
    MAX_LINES_PER_TASK,
    MAX_PENDING_TASKS,
    PENDING_TTL_S,
    DirectTasks,
    RunnerRef,
)
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
    d.log_events(events)


@dataclass
class Gen:
    """One generation as /slots shows it: its slot, prompt, output, and when it runs (from the first poll)."""

    task: int
    slot_id: int = 0
    prompt: int = 136
    cached: int = 36
    output: int = 24
    start_s: float = 0.0
    took_s: float = 26.0

    def reading(self, at_s: float) -> SlotReading:
        """The slot at ``at_s``: idle before, its prompt read then decoded, then released with prompt + output - 1
        tokens in its context (as llama-server shows them)."""
        if at_s <= self.start_s:
            return SlotReading(self.slot_id, 2048, False, None, None, None, None, None)
        if at_s >= self.start_s + self.took_s:
            return SlotReading(self.slot_id, 2048, False, self.task, self.prompt + self.output - 1, 0, 0, 0)
        half = self.took_s / 2
        ran = at_s - self.start_s
        if ran < half:
            read = min(self.prompt - self.cached, 64)
            return SlotReading(self.slot_id, 2048, True, self.task, self.prompt, read, self.cached, 0)
        decoded = max(1, round(self.output * (ran - half) / half))
        return SlotReading(
            self.slot_id, 2048, True, self.task, self.prompt + decoded, self.prompt - self.cached, self.cached, decoded
        )


def run_tasks(d: DirectTasks, clock: Clock, *gens: Gen, claims: dict[int, str] | None = None) -> None:
    """A /slots poll a second from ``clock.now`` until every generation has been seen released; ``clock.now`` is the
    last poll's time after."""
    start = clock.now
    last = max(g.start_s + g.took_s for g in gens)
    at = 0.0
    while True:
        clock.now = start + at
        d.slots_read(RUNNER, [g.reading(at) for g in gens], clock.now, claims or {})
        d.step()
        if at >= last:
            return
        at += 1.0


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
    log_lines(d, T0 + 0.5, *TASK_LINES)  # read before /slots shows the task: they wait for it
    run_tasks(d, clock, Gen(7))
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
    assert T0 + 25 <= rec.wall_s(rec.final_chunk_ns or 0) <= T0 + 26  # between the polls around its release
    d.step()
    assert finished(d) == []  # once
    assert d.dropped_lines == 0


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
    lines = (*TASK_LINES, *TIMING_LINES)
    short = [line.replace("10535.65 ms", "   35.65 ms").replace("15042.16 ms", "  142.16 ms") for line in lines]
    log_lines(d, clock.now + 0.5, *(line.replace("task 7", "task 11") for line in short))
    clock.now += 1.0
    d.slots_read(RUNNER, [slot(11, busy=False, ctx=159)], clock.now, {})  # its context: 136 + 24 - 1
    d.log_readable = True
    clock.now += LOG_WAIT_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_task_id == 11 and rec.runner_source == "log" and rec.metrics is not None
    assert rec.metrics.prompt_eval_count == 136


def test_a_proxied_request_that_ran_between_polls_is_not_recorded_again() -> None:
    clock = Clock()
    d = tasks(clock)
    log_lines(d, clock.now + 0.5, *TASK_LINES)
    run_tasks(d, clock, Gen(7))
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


def gin(at_unix_s: float, latency: str, client: str, path: str = "/api/chat", status: int = 200) -> str:
    stamp = time.strftime("%Y/%m/%d - %H:%M:%S", time.localtime(at_unix_s))
    return f'[GIN] {stamp} | {status} | {latency:>13} | {client:>15} | POST     "{path}"'


def test_the_access_line_tells_route_and_client_only_when_it_fits_one_generation_alone() -> None:
    clock = Clock()
    d = tasks(clock)
    log_lines(d, T0 + 0.5, *TASK_LINES)
    run_tasks(d, clock, Gen(7))
    log_lines(d, clock.now, *TIMING_LINES, gin(clock.now, "26.1s", "10.0.0.7"))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert (rec.endpoint, rec.client_addr, rec.status_code) == ("/api/chat", "10.0.0.7", 200)
    assert rec.client_unverified  # Ollama's text, not a socket the collector saw
    # Two generations of the same length ending in the same second, one line: which is whose is not known.
    d2 = tasks(clock)
    run_tasks(d2, clock, Gen(20, slot_id=0), Gen(21, slot_id=1))
    lines = (*TASK_LINES, *TIMING_LINES)
    two = [line.replace("task 7", f"task {t}").replace("id  0", f"id  {t % 2}") for t in (20, 21) for line in lines]
    log_lines(d2, clock.now, *two, gin(clock.now, "26.1s", "10.0.0.7"))
    clock.now += GRACE_S
    d2.step()
    recs = finished(d2)
    assert len(recs) == 2 and all(r.endpoint is None and r.client_addr is None for r in recs)
    assert all(r.runner_source == "log" for r in recs)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_the_coding_agents_routes_are_generations_whose_route_the_access_line_tells(path: str) -> None:
    """Claude Code's /v1/messages and Codex's /v1/responses sent straight to Ollama: its access line names the route."""
    clock = Clock()
    d = tasks(clock)
    log_lines(d, T0 + 0.5, *TASK_LINES)
    run_tasks(d, clock, Gen(7))
    log_lines(d, clock.now, *TIMING_LINES, gin(clock.now, "26.1s", "10.0.0.7", path))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert (rec.endpoint, rec.client_addr, rec.status_code) == (path, "10.0.0.7", 200)


def test_two_generations_ending_within_a_second_are_told_apart_by_their_latency() -> None:
    """Issue 34: a 26 s generation and a 3 s one end in the same second; the access lines' latencies (26.9 s,
    3.59 s) say which is whose: the short line fits only the short task, so the long one takes the other line."""
    clock = Clock()
    d = tasks(clock)
    run_tasks(d, clock, Gen(30, slot_id=0), Gen(31, slot_id=1, prompt=40, cached=0, output=8, start_s=23.0, took_s=3.0))
    lines = [gin(clock.now, "26.906856257s", "10.0.0.1", "/api/generate"), gin(clock.now, "3.590122277s", "10.0.0.2")]
    log_lines(d, clock.now, *lines)
    clock.now += GRACE_S
    d.step()
    recs = {r.runner_task_id: r for r in finished(d)}
    assert (recs[30].client_addr, recs[30].endpoint) == ("10.0.0.1", "/api/generate")
    assert (recs[31].client_addr, recs[31].endpoint) == ("10.0.0.2", "/api/chat")
    # A third line that fits the short one as well: two candidates are left, so it stays unknown.
    d2 = tasks(clock)
    start = clock.now
    run_tasks(d2, clock, Gen(40, prompt=40, cached=0, output=8, took_s=3.0))
    log_lines(d2, clock.now, gin(clock.now, "2.9s", "10.0.0.2"), gin(clock.now, "3.1s", "10.0.0.3"))
    clock.now += GRACE_S
    d2.step()
    (rec,) = finished(d2)
    assert rec.client_addr is None and rec.endpoint is None and start < rec.started_at_unix_s


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
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:431 msg="starting llama-server" '
        'cmd="/b/llama-server --model /m --port 40123"'
    )
    start = parse_line(start_line, 1.0)
    assert start is not None and start.kind == "runner_start" and start.port == 40123
    done = parse_line(
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama-server started in 2.31 seconds"',
        1.0,
    )
    assert done is not None and done.kind == "runner_started" and done.duration_ms == 2310.0


def test_a_direct_tasks_own_log_lines_find_its_record() -> None:
    """The runner reader routes a direct task's progress lines (the prompt's size, which /slots does not tell while
    the prompt is read) to that task's record: ``record_id`` names it, only while one unclaimed task has the id,
    and only once /slots has shown that task."""
    clock = Clock()
    d = tasks(clock)
    assert d.record_id(7) is None  # no such task yet
    log_lines(d, T0, *TASK_LINES)
    assert d.record_id(7) is None  # its lines alone make no task
    d.slots_read(RUNNER, [slot(None, busy=False)], clock.now, {})
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(7, busy=True, processed=64, decoded=0)], clock.now, {})
    rid = d.record_id(7)
    assert rid is not None and rid.startswith("direct-")
    assert d.record_id(8) is None


# -- what anyone who can reach the runner can make it print into Ollama's log ---------------------------------


def forged(task: int, prompt: int = 1, output: int = 9_999, decode_ms: float = 99_999.0) -> list[str]:
    return [
        f"slot launch_slot_: id  0 | task {task} | processing task, is_child = 0",
        f"slot   operator(): id  0 | task {task} | new prompt, n_ctx_slot = 2048, n_keep = 0, task.n_tokens = {prompt}",
        f"slot print_timing: id  0 | task {task} | prompt eval time =       1.00 ms /     {prompt} tokens",
        f"slot print_timing: id  0 | task {task} |        eval time =   {decode_ms:.2f} ms / {output} tokens",
        f"slot      release: id  0 | task {task} | stop processing: n_tokens = {prompt + output - 1}, truncated = 0",
    ]


def test_forged_lines_of_a_task_no_runner_showed_make_no_record() -> None:
    """A whole generation forged in the log, with a chosen client and route: /slots never showed its task, so nothing
    is recorded; its lines are dropped once they have waited PENDING_TTL_S, and counted."""
    clock = Clock()
    d = tasks(clock)
    d.log_readable = True
    d.slots_read(RUNNER, [slot(3, busy=False, ctx=10)], clock.now, {})
    log_lines(d, clock.now, *forged(777, prompt=1374, output=40, decode_ms=900.0), gin(clock.now, "1.2s", "10.6.6.6"))
    for _ in range(int(PENDING_TTL_S) + 5):
        clock.now += 1.0
        d.slots_read(RUNNER, [slot(3, busy=False, ctx=10)], clock.now, {})
        d.step()
    out, _ = d.drain()
    assert out == [] and d.recorded == 0
    assert d.dropped == {"unconfirmed": 5}


def test_forged_figures_for_a_real_task_do_not_rewrite_its_record() -> None:
    """Another client's generation (136 / 24 tokens), with forged lines naming its task (1 / 9,999 tokens, a 99.999 s
    decode) read after its own: only the runner's own lines agree with /slots, so the record keeps them."""
    clock = Clock()
    d = tasks(clock)
    log_lines(d, T0 + 0.5, *TASK_LINES)
    run_tasks(d, clock, Gen(7))
    log_lines(d, clock.now, *TIMING_LINES, *forged(7))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_source == "log" and rec.metrics is not None
    m = rec.metrics
    assert (m.prompt_eval_count, m.eval_count, m.eval_duration_ns) == (136, 24, 15_042_160_000)
    assert d.dropped == {}  # the task's lines were kept (capped), its figures chosen by /slots


def test_forged_figures_alone_give_way_to_the_slots_readings() -> None:
    """Forged lines for a task /slots saw, its own lines missing: they disagree with /slots, so the record keeps the
    readings (bounded), and the lines are counted as dropped."""
    clock = Clock()
    d = tasks(clock)
    run_tasks(d, clock, Gen(8))
    log_lines(d, clock.now, *forged(8))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.runner_source == "slots" and rec.metrics is not None
    assert (rec.metrics.prompt_eval_count, rec.metrics.eval_count) == (136, 24)
    assert d.dropped == {"disagrees": 5}


def test_a_load_counts_only_within_its_own_lines_and_on_a_found_runners_port() -> None:
    """A forged "started in 86400 seconds" after a real "starting llama-server": a day of load in a few seconds is not
    the runner's; a real one, then a task on that port at once, is. A load for a port no task runs on is dropped."""
    clock = Clock()
    start = (
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:431 msg="starting llama-server" '
        f'cmd="/b/llama-server --model /m --port {RUNNER.port} -np 2"'
    )
    log_lines(d := tasks(clock), clock.now, start)
    clock.now += 2.5
    day = 'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama-server started in 86400.00 seconds"'
    log_lines(d, clock.now + 0.5, day)  # read half a second before /slots first shows the task
    run_tasks(d, clock, Gen(1, took_s=4.0))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.metrics is not None and rec.metrics.load_duration_ns is None
    assert d.dropped == {"load": 1}
    # The runner's own pair: its load is the next task's.
    d = tasks(clock)
    log_lines(d, clock.now, start)
    clock.now += 2.5
    log_lines(
        d,
        clock.now + 0.5,
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama-server started in 2.31 seconds"',
    )
    run_tasks(d, clock, Gen(1, took_s=4.0))
    clock.now += GRACE_S
    d.step()
    (rec,) = finished(d)
    assert rec.metrics is not None and rec.metrics.load_duration_ns == 2_310_000_000
    # A load on a port where no runner's task follows it: kept LOAD_KEPT_S, then dropped.
    log_lines(d, clock.now, start.replace(str(RUNNER.port), "1"))
    clock.now += 1.0
    log_lines(
        d,
        clock.now,
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama-server started in 0.50 seconds"',
    )
    clock.now += LOAD_KEPT_S + 1
    d.step()
    assert d.dropped == {"load": 1} and finished(d) == []


def test_forged_task_lines_pile_up_nowhere() -> None:
    """100,000 forged lines, each a new task id, and 10,000 for one id: what waits is capped (MAX_PENDING_TASKS ids,
    MAX_LINES_PER_TASK lines each), costs little memory and time, and no record comes of it, not even when the runner
    unloads."""
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [slot(None, busy=False)], clock.now, {})
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(5, busy=True, processed=64, decoded=0)], clock.now, {})  # one real task, running
    launch = parse_line("slot launch_slot_: id  0 | task 1000 | processing task, is_child = 0", clock.now)
    timing = parse_line("slot print_timing: id  0 | task 5 | prompt eval time =       1.00 ms /     1 tokens", clock.now)
    assert launch is not None and timing is not None
    events = [replace(launch, task_id=1000 + i) for i in range(100_000)] + [timing] * 10_000
    tracemalloc.start()
    began = time.perf_counter()
    d.log_readable = True
    for i in range(0, len(events), 1000):  # as the reader reads them: a batch a tick
        d.log_events(events[i : i + 1000])
        d.step()
    took_s = time.perf_counter() - began
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak_bytes < 20 << 20, peak_bytes  # the old code kept every line and a task per id: hundreds of MB
    assert took_s < 20.0, took_s  # a busy CI machine: wide; about a second here
    kept = len(d._pending), max(len(p.lines) for p in d._pending.values()), len(d._tasks[(RUNNER.pid, 5)].lines)
    d.runner_gone(RUNNER.pid)  # unloaded
    clock.now += PENDING_TTL_S + GRACE_S + 1
    d.step()
    recs = finished(d)
    assert [r.runner_task_id for r in recs] == [5]  # the real task only: no phantom
    assert kept == (MAX_PENDING_TASKS, 1, MAX_LINES_PER_TASK)
    assert d.dropped["capped"] == 10_000 - MAX_LINES_PER_TASK
    assert d.dropped["unconfirmed"] == 100_000 + MAX_LINES_PER_TASK and len(d._pending) == 0  # task 5's never added up


def test_a_proxied_claim_of_another_task_is_corrected_by_its_own_prompt_count() -> None:
    """Two slots: a direct generation (task 10, 500 prompt tokens) and a proxied one (task 11, 300) start in the same
    poll; the live join pairs the proxied request with task 10 (start order, a tie-break). Its reply's prompt count
    (300) disagrees with task 10's: the claim moves to task 11, and each is recorded once: task 10 as direct."""
    clock = Clock()
    d = tasks(clock)
    direct = Gen(10, slot_id=0, prompt=500, cached=0, output=30, took_s=8.0)
    proxied_gen = Gen(11, slot_id=1, prompt=300, cached=0, output=20, took_s=8.0)
    run_tasks(d, clock, direct, proxied_gen, claims={10: "p1"})
    proxied = RequestRecord(  # finished as its task was released, with the runner's own count
        id="p1",
        started_at_unix_s=T0,
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model="gemma3:270m",
        stream=True,
        received_ns=10**12,
        final_chunk_ns=10**12 + round(7.6e9),
        outcome=Outcome.OK,
        metrics=FinalMetrics(prompt_eval_count=300, eval_count=20),
    )
    d.proxied_finished(proxied)
    clock.now += GRACE_S
    d.step()
    recs = finished(d)
    assert [(r.runner_task_id, r.metrics.prompt_eval_count if r.metrics else None) for r in recs] == [(10, 500)]
    assert d.matched_proxied == 1 and d.claims_corrected == 1


def test_four_sent_at_once_on_one_slot_each_take_their_own_access_line() -> None:
    """Issue 40: four requests sent together to a one-slot runner end about a second apart (each ~1 s of work in
    turn). Each line fits only the generation whose end, as bounded by the polls around it (4 Hz), meets the line's
    second: every record gets its own client. The rule before (a 1.5 s window either side of an end) let each line
    fit two or three of them, and none was told."""
    clock = Clock()
    d = tasks(clock)
    sent = clock.now
    took_s = (1.2, 1.0, 1.1, 1.3)
    starts = [sum(took_s[:i]) + 0.05 for i in range(4)]
    gens = [
        Gen(10 + 20 * i, prompt=100, cached=0, output=20, start_s=s, took_s=t)
        for i, (s, t) in enumerate(zip(starts, took_s, strict=True))
    ]

    def reading(at_s: float) -> SlotReading:
        begun = [g for g in gens if g.start_s < at_s]  # the slot shows the last task it took
        return begun[-1].reading(at_s) if begun else gens[0].reading(at_s)

    lines_at: list[tuple[float, str]] = []
    for i, g in enumerate(gens):
        end = sent + g.start_s + g.took_s + 0.01  # Ollama's handler returns just after the runner's last answer
        lines_at.append((end, gin(end, f"{end - sent:.6f}s", f"10.0.0.{i + 1}", "/api/generate")))
    at = 0.0
    while at <= starts[-1] + took_s[-1] + 0.5:
        clock.now = sent + at
        d.slots_read(RUNNER, [reading(at)], clock.now, {})
        log_lines(d, clock.now, *[line for end, line in lines_at if end <= clock.now])
        lines_at = [(end, line) for end, line in lines_at if end > clock.now]
        d.step()
        at += 0.25
    clock.now += GRACE_S
    d.step()
    recs = {r.runner_task_id: r for r in finished(d)}
    assert set(recs) == {g.task for g in gens}
    assert [recs[g.task].client_addr for g in gens] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert all((m := recs[g.task].metrics) is not None and m.total_duration_ns for g in gens)


def _seen_only_reading_its_prompt(ctx_seen: int) -> RequestRecord:
    """Task 7 seen by one poll reading its 136-token prompt (context ``ctx_seen``); the next poll finds task 8 in its
    slot: its reply was shorter than a poll's interval, so no poll saw it decode or released."""
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [slot(None, busy=False)], clock.now, {})
    log_lines(d, clock.now + 0.1, *TASK_LINES)
    clock.now += 0.25
    d.slots_read(RUNNER, [slot(7, busy=True, processed=64, cached=36, decoded=0, ctx=ctx_seen)], clock.now, {})
    clock.now += 26.0
    log_lines(d, clock.now - 0.1, *TIMING_LINES)
    d.slots_read(RUNNER, [slot(8, busy=True, processed=4, cached=0, decoded=0, ctx=4)], clock.now, {})
    d.step()
    clock.now += GRACE_S + LOG_WAIT_S
    d.step()
    (rec,) = [r for r in finished(d) if r.runner_task_id == 7]
    return rec


def test_a_task_seen_only_reading_its_prompt_is_confirmed_by_the_context_a_poll_saw() -> None:
    """Seen in full runs: a short reply on one slot, the queued task taking the slot at once; no poll saw it decode,
    so /slots had no size to check its log lines against, and its record kept no figures of the runner's. A poll
    that saw its context reach the whole prompt (136) confirms the lines that name that size; one that saw less
    (100: the prompt still being queued) confirms nothing, as before."""
    rec = _seen_only_reading_its_prompt(ctx_seen=136)
    assert rec.runner_source == "log" and rec.metrics is not None
    assert (rec.metrics.prompt_eval_count, rec.metrics.eval_count) == (136, 24)
    partial = _seen_only_reading_its_prompt(ctx_seen=100)
    assert partial.runner_source == "slots" and partial.metrics is None  # a size no poll saw: not the runner's word
