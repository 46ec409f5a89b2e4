"""Direct requests Ollama answered with an error, from its access line (issue 40 item 3): recorded as failures with
their route, and a direct success ending in the same second keeps its own line (route, client, total) instead of
losing it to the failure's. Fed /slots readings as llama-server gives them and the access lines as gin prints
them, on a clock the test moves (the engine test in test_direct_failures_sim.py runs it against sim)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from analysis.phases import PhaseSource, split_record
from analysis.records import Outcome, RequestRecord, SeenFrom
from collectors.ollama.access_failures import FAILED_WAIT_S, MAX_FAILED_PER_MIN
from collectors.ollama.direct import GRACE_S, DirectTasks, RunnerRef
from collectors.ollama.log import parse_line
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


def gin(at_unix_s: float, latency: str, client: str, status: int, path: str = "/api/chat") -> str:
    stamp = time.strftime("%Y/%m/%d - %H:%M:%S", time.localtime(at_unix_s))
    return f'[GIN] {stamp} | {status} | {latency:>13} | {client:>15} | POST     "{path}"'


def log_lines(d: DirectTasks, at: float, *lines: str) -> None:
    events = [e for line in lines if (e := parse_line(line, at)) is not None]
    assert len(events) == len(lines), lines
    d.log_events(events)


def run_task(d: DirectTasks, clock: Clock, task: int, start_s: float, took_s: float, prompt: int = 40, output: int = 8) -> None:
    """One task on slot 0, polled every 0.5 s: its prompt read in the first half of ``took_s``, its reply in the
    second, then released (its context: prompt + output - 1). ``clock.now`` is the poll that saw it released."""
    t0 = clock.now
    at = 0.0
    while True:
        clock.now = t0 + at
        if at <= start_s:
            reading = SlotReading(0, 2048, False, None, None, None, None, None)
        elif at >= start_s + took_s:
            reading = SlotReading(0, 2048, False, task, prompt + output - 1, 0, 0, 0)
        elif at < start_s + took_s / 2:
            reading = SlotReading(0, 2048, True, task, prompt, 16, 0, 0)
        else:
            decoded = max(1, round(output * (at - start_s - took_s / 2) / (took_s / 2)))
            reading = SlotReading(0, 2048, True, task, prompt + decoded, prompt, 0, decoded)
        d.slots_read(RUNNER, [reading], clock.now, {})
        d.step()
        if at >= start_s + took_s:
            return
        at += 0.5


def finished(d: DirectTasks) -> list[RequestRecord]:
    out, _ = d.drain()
    return [r for r in out if r.outcome != Outcome.IN_FLIGHT]


def settle(d: DirectTasks, clock: Clock) -> list[RequestRecord]:
    """Step past every wait (the task's and an error line's); the records decided meanwhile."""
    out: list[RequestRecord] = []
    for _ in range(int(FAILED_WAIT_S + GRACE_S) + 3):
        clock.now += 1.0
        d.step()
        out += finished(d)
    return out


def by_status(recs: Sequence[RequestRecord]) -> dict[int | None, RequestRecord]:
    return {r.status_code: r for r in recs}


def test_a_direct_500_is_a_failure_and_the_success_of_its_second_keeps_its_line() -> None:
    """The issue's case: a 29 s chat that waited ~27 s for the slot and ran 2 s on the runner, and a chat Ollama
    answered 500 after 28 s, both ending in the same second. Before: both lines fitted the task, so neither was
    taken (route, client and total lost) and the 500 was recorded nowhere."""
    clock = Clock()
    d = tasks(clock)
    run_task(d, clock, task=50, start_s=27.0, took_s=2.0)
    log_lines(d, clock.now, gin(clock.now, "29.104s", "10.0.0.5", 200), gin(clock.now, "28.2s", "10.0.0.6", 500))
    recs = by_status(settle(d, clock))
    assert set(recs) == {200, 500}, recs
    ok, failed = recs[200], recs[500]
    assert ok.runner_task_id == 50 and ok.outcome is Outcome.OK
    assert (ok.endpoint, ok.client_addr) == ("/api/chat", "10.0.0.5") and ok.client_unverified
    assert ok.metrics is not None and ok.metrics.total_duration_ns == 29_104_000_000
    assert failed.outcome is Outcome.HTTP_ERROR and failed.seen_from is SeenFrom.RUNNER
    assert (failed.endpoint, failed.client_addr) == ("/api/chat", "10.0.0.6") and failed.client_unverified
    assert failed.runner_task_id is None and failed.runner_source == PhaseSource.ACCESS
    assert failed.model == ""  # the line names none: unknown, not guessed
    assert failed.metrics is None  # no runner ran it: no figures
    ph = split_record(failed)
    assert ph.total_s is not None and abs(ph.total_s - 28.2) < 1e-6  # the line's latency
    assert ph.prefill_s is None and ph.decode_s is None and ph.queue_s is None and ph.output_tokens is None  # never 0
    assert settle(d, clock) == []  # each once


def test_a_500_line_is_never_a_task_that_ran_to_its_end() -> None:
    """One task, one 500 line alone in its second: still not the task's (Ollama answered the task's request)."""
    clock = Clock()
    d = tasks(clock)
    run_task(d, clock, task=60, start_s=1.0, took_s=2.0)
    log_lines(d, clock.now, gin(clock.now, "3.5s", "10.0.0.6", 500))
    recs = by_status(settle(d, clock))
    assert recs[None].runner_task_id == 60 and recs[None].endpoint is None  # its own line was not read
    assert recs[500].runner_task_id is None and recs[500].outcome is Outcome.HTTP_ERROR


def test_a_line_shorter_than_the_runners_own_span_is_not_the_tasks() -> None:
    clock = Clock()
    d = tasks(clock)
    run_task(d, clock, task=61, start_s=1.0, took_s=6.0)
    log_lines(d, clock.now, gin(clock.now, "1.2s", "10.0.0.7", 200))
    (rec,) = settle(d, clock)
    assert rec.runner_task_id == 61 and rec.endpoint is None and rec.client_addr is None


def test_a_proxied_requests_500_is_not_recorded_again_as_direct() -> None:
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [SlotReading(0, 2048, False, None, None, None, None, None)], clock.now, {})
    clock.now += 3.0
    end_s = clock.now
    proxied = RequestRecord(
        id="p500",
        started_at_unix_s=end_s - 2.0,
        client_addr="127.0.0.1:5000",
        endpoint="/api/chat",
        model="gemma3:270m",
        stream=False,
        received_ns=0,
        closed_ns=2_000_000_000,
        status_code=500,
        outcome=Outcome.HTTP_ERROR,
    )
    d.proxied_finished(proxied)
    # Two 500 lines of that second: one is the proxied request's, the other no one's but a direct client's.
    log_lines(d, clock.now, gin(end_s, "1.99s", "127.0.0.1", 500), gin(end_s, "1.5s", "127.0.0.1", 500))
    (rec,) = settle(d, clock)
    assert rec.runner_task_id is None and rec.status_code == 500 and rec.direct
    assert d.recorded_failed == 1


def test_error_lines_alone_are_recorded_at_most_a_bounded_number_a_minute() -> None:
    """Anyone who can make a runner print a line can forge access lines: a flood writes at most
    MAX_FAILED_PER_MIN records a minute, the rest counted."""
    clock = Clock()
    d = tasks(clock)
    lines = [gin(clock.now, "0.01s", f"10.0.{k // 250}.{k % 250}", 500) for k in range(MAX_FAILED_PER_MIN + 40)]
    log_lines(d, clock.now, *lines)
    recs = settle(d, clock)
    assert len(recs) == MAX_FAILED_PER_MIN
    assert d.dropped.get("access_flood") == 40 and d.recorded_failed == MAX_FAILED_PER_MIN


def test_a_line_that_a_task_recorded_without_one_may_own_is_not_a_second_record() -> None:
    """Two tasks whose runner went away mid-prompt, two 500 lines that fit both: neither task takes one, and the
    lines are not recorded again as two more failures (each may be a task's)."""
    clock = Clock()
    d = tasks(clock)
    idle = SlotReading(0, 2048, False, None, None, None, None, None)
    d.slots_read(RUNNER, [idle, SlotReading(1, 2048, False, None, None, None, None, None)], clock.now, {})
    clock.now += 0.5
    busy = [SlotReading(0, 2048, True, 70, 40, 16, 0, 0), SlotReading(1, 2048, True, 71, 40, 16, 0, 0)]
    d.slots_read(RUNNER, busy, clock.now, {})
    clock.now += 1.0
    d.runner_gone(RUNNER.pid)
    log_lines(d, clock.now, gin(clock.now, "1.6s", "10.0.0.1", 500), gin(clock.now, "1.7s", "10.0.0.2", 500))
    recs = settle(d, clock)
    assert sorted(r.runner_task_id or 0 for r in recs) == [70, 71]
    assert all(r.endpoint is None for r in recs)
    assert d.dropped.get("access_ambiguous") == 2 and d.recorded_failed == 0
