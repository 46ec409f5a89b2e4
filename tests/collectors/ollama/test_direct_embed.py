"""Embed calls sent to Ollama directly (issue 41): each input is a runner task released right after its prompt;
``DirectTasks`` gathers the tasks of one call by its access line into ONE embedding record, never generations.

Fed the lines llama-server prints for an ``/embedding`` task (started with ``--embedding``, as Ollama starts the
runner of a GGUF that declares pooling) and /slots readings as it gives them, on a clock the test moves; the engine
test (test_direct_embed_engine.py) runs the same against the real runner.
"""

from __future__ import annotations

import time

from analysis.phases import split_record
from analysis.records import Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.direct import LOG_WAIT_S, DirectTasks, RunnerRef
from collectors.ollama.embed_calls import CALL_LINE_WAIT_S, EmbedInput, could_be_in
from collectors.ollama.log import AccessLine, parse_line
from collectors.ollama.slots import SlotReading

RUNNER = RunnerRef(pid=4343, port=39512, model="embedgemma:270m")
T0 = 1_800_000_000.0
SETTLE_S = 12.0  # past a call's line: its inputs' wait for lines, then the call's own


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def tasks(clock: Clock) -> DirectTasks:
    d = DirectTasks(clock=clock, mono_ns=lambda: 10**12 + round((clock.now - T0) * 1e9))
    d.log_readable = True
    return d


def idle(task: int | None, ctx: int | None) -> SlotReading:
    return SlotReading(0, 4096, False, task, ctx, 0, 0, 0)


def input_lines(task: int, n_tokens: int, slot: int = 0) -> list[str]:
    """What llama-server prints for one /embedding task: launched, its prompt, released at once (no timing line)."""
    return [
        f"slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0",
        f"slot   operator(): id  {slot} | task {task} | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = {n_tokens}",
        f"slot      release: id  {slot} | task {task} | stop processing: n_tokens = {n_tokens}, truncated = 0",
    ]


def gin(at_unix_s: float, latency: str, path: str = "/api/embed", status: int = 200, client: str = "10.0.0.9") -> str:
    stamp = time.strftime("%Y/%m/%d - %H:%M:%S", time.localtime(at_unix_s))
    return f'[GIN] {stamp} | {status} | {latency:>13} | {client:>15} | POST     "{path}"'


def feed(d: DirectTasks, at: float, *lines: str) -> None:
    events = [e for line in lines if (e := parse_line(line, at)) is not None]
    assert len(events) == len(lines), lines
    d.log_events(events)


def finished(d: DirectTasks) -> list[RequestRecord]:
    out, _ = d.drain()
    return [r for r in out if r.outcome != Outcome.IN_FLIGHT]


# Six inputs of one call on one slot (a /tokenize task between each): /slots shows 15 and 21, steps over the rest.
INPUTS = {11: 4, 13: 5, 15: 2, 17: 7, 19: 3, 21: 6}


def run_call(d: DirectTasks, clock: Clock, *, line: str | None) -> None:
    d.slots_read(RUNNER, [idle(9, 30)], clock.now, {})
    feed(d, clock.now + 0.3, *[x for t in (11, 13, 15) for x in input_lines(t, INPUTS[t])])
    clock.now += 1.0
    d.slots_read(RUNNER, [idle(15, INPUTS[15])], clock.now, {})
    feed(d, clock.now + 0.5, *[x for t in (17, 19, 21) for x in input_lines(t, INPUTS[t])])
    if line is not None:
        feed(d, clock.now + 0.6, line)
    clock.now += 1.0
    d.slots_read(RUNNER, [idle(21, INPUTS[21])], clock.now, {})
    for _ in range(int(SETTLE_S)):
        clock.now += 1.0
        d.slots_read(RUNNER, [idle(21, INPUTS[21])], clock.now, {})
        d.step()


def test_one_direct_embed_call_is_one_embedding_record_not_six_generations() -> None:
    clock = Clock()
    d = tasks(clock)
    run_call(d, clock, line=gin(T0 + 1.0, "1.6s"))
    recs = finished(d)
    assert len(recs) == 1, [(r.kind, r.runner_task_id) for r in recs]
    (rec,) = recs
    assert rec.kind is RequestKind.EMBED and rec.seen_from is SeenFrom.RUNNER
    assert rec.batch_size == 6 and rec.metrics is not None and rec.metrics.prompt_eval_count == sum(INPUTS.values())
    assert (rec.endpoint, rec.client_addr, rec.status_code) == ("/api/embed", "10.0.0.9", 200) and rec.client_unverified
    assert rec.metrics.total_duration_ns == 1_600_000_000 and rec.metrics.eval_count is None  # nothing decoded: unknown
    phases = split_record(rec)
    assert phases.output_tokens is None and phases.prompt_tokens == sum(INPUTS.values())
    assert phases.prefill_s is not None and 0 < phases.prefill_s <= 1.6  # the call's time less its load (none here)
    assert d.embeds.recorded_calls == 1 and d.recorded == 0


def test_without_the_calls_line_each_input_is_an_embedding_alone_never_a_generation() -> None:
    clock = Clock()
    d = tasks(clock)
    run_call(d, clock, line=None)
    assert finished(d) == []  # they wait for their call's line...
    clock.now += CALL_LINE_WAIT_S
    d.step()
    recs = finished(d)  # ...then each is recorded alone: an embedding of its own tokens, its call's size unknown
    assert len(recs) == len(INPUTS) and {r.runner_task_id for r in recs} == set(INPUTS)
    assert all(r.kind is RequestKind.EMBED and r.batch_size is None and r.endpoint is None for r in recs)
    assert {r.runner_task_id: r.metrics.prompt_eval_count if r.metrics else None for r in recs} == INPUTS


def test_a_forged_embed_line_alone_makes_no_record_and_forged_task_lines_no_input() -> None:
    clock = Clock()
    d = tasks(clock)
    # An access line and a task's lines printed by a client (a runner echoes text into Ollama's log): no runner's
    # slot stepped over task 500, none showed it.
    feed(d, clock.now, gin(clock.now, "3.0s"), *input_lines(500, 99))
    for _ in range(int(SETTLE_S)):
        clock.now += 1.0
        d.slots_read(RUNNER, [idle(9, 30)], clock.now, {})
        d.step()
    assert finished(d) == [] and d.embeds.recorded_calls == 0
    # A second prompt line for a real input's id: its lines no longer say one prompt released at once.
    d2 = tasks(clock)
    feed(d2, clock.now + 0.1, input_lines(13, 50)[1])
    run_call(d2, clock, line=gin(clock.now + 1.0, "1.6s"))
    (rec,) = finished(d2)
    assert rec.batch_size == 5 and rec.metrics is not None and rec.metrics.prompt_eval_count == sum(INPUTS.values()) - 5


def test_a_generation_beside_it_stays_a_generation() -> None:
    """A task that printed its timing lines is a generation whatever its neighbours: the embed path never takes it."""
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [idle(3, 30)], clock.now, {})
    feed(
        d,
        clock.now + 0.2,
        *input_lines(5, 20)[:2],
        "slot print_timing: id  0 | task 5 | prompt eval time =      35.65 ms /    20 tokens (    1.78 ms per token, "
        "560.98 tokens per second)",
        "slot print_timing: id  0 | task 5 |        eval time =     142.16 ms /     4 tokens (   35.54 ms per token,  "
        "28.14 tokens per second)",
        "slot      release: id  0 | task 5 | stop processing: n_tokens = 23, truncated = 0",
    )
    clock.now += 1.0
    d.slots_read(RUNNER, [idle(5, 23)], clock.now, {})
    clock.now += LOG_WAIT_S
    d.step()
    (rec,) = finished(d)
    assert rec.kind is RequestKind.GENERATE and rec.metrics is not None and rec.metrics.eval_count == 4


def test_a_proxied_embed_call_is_the_proxys_even_when_it_finishes_after_its_inputs_were_gathered() -> None:
    clock = Clock()
    d = tasks(clock)
    d.slots_read(RUNNER, [idle(9, 30)], clock.now, {})
    feed(d, clock.now + 0.3, *[x for t in (11, 13, 15) for x in input_lines(t, INPUTS[t])])
    clock.now += 1.0
    d.slots_read(RUNNER, [idle(15, INPUTS[15])], clock.now, {})
    feed(d, clock.now + 0.5, *[x for t in (17, 19, 21) for x in input_lines(t, INPUTS[t])], gin(T0 + 1.0, "1.6s"))
    clock.now += 1.0
    d.slots_read(RUNNER, [idle(21, INPUTS[21])], clock.now, {})
    for _ in range(4):  # its inputs are due and gathered by the line before the proxy has finished the request
        clock.now += 1.0
        d.step()
    proxied = RequestRecord(
        id="p-embed",
        started_at_unix_s=T0 + 0.2,
        client_addr="127.0.0.1",
        endpoint="/api/embed",
        model="embedgemma:270m",
        stream=False,
        kind=RequestKind.EMBED,
        batch_size=6,
        received_ns=0,
        closed_ns=round(1.7e9),
        outcome=Outcome.OK,
    )
    d.proxied_finished(proxied)
    for _ in range(int(SETTLE_S)):
        clock.now += 1.0
        d.step()
    assert finished(d) == [] and d.embeds.proxied_inputs == len(INPUTS) and d.embeds.recorded_calls == 0


def test_a_call_read_before_an_input_ended_is_not_its_call() -> None:
    """Seen in a full run: a warm-up embed call, then 3 s later a call of 40 inputs whose first input a poll saw only
    by stepping over its id (its end known no better than "after the last idle poll", 2 s after the warm-up's
    line). The warm-up's line, stamped to the second and given 1.5 s of slack, took that input; but it was read
    before the input could have ended, and Ollama writes a call's line only once its inputs are answered."""
    t = 1_800_000_000.0
    warm_up = AccessLine(t, 200, 3.7, "127.0.0.1", "POST", "/api/embed", read_unix_s=t + 0.3)
    first_input = EmbedInput("direct-x", 1, 2, 5, "m", t + 2.1, t + 3.2, t + 2.1, t + 3.2, 9, None)
    assert not could_be_in(first_input, warm_up)
    unread = AccessLine(t, 200, 3.7, "127.0.0.1", "POST", "/api/embed")  # read time not known: the stamp's bounds
    assert could_be_in(first_input, unread)
    its_call = AccessLine(t + 4, 200, 2.5, "127.0.0.1", "POST", "/api/embed", read_unix_s=t + 4.2)
    assert could_be_in(first_input, its_call)
