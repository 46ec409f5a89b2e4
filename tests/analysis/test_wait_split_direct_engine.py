"""The interference verdict for requests sent to Ollama directly (not through the proxy), recorded from the real
runner by the collector (its /slots and Ollama's log, ``python -m sim --engine llama-server --num-parallel 2``):
a long prompt and a short chat sent 1 s into it. The short record's task began when its slot was taken, and its
prompt was read only after the long prompt's batches: the Requests detail names the long prompt and the time it
cost, neither its own prompt nor a slow decode; the long one is not blamed on it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import ollama
import pytest

from analysis.diagnose import INTERFERENCE
from analysis.records import Outcome
from pages.requests.view import explain, load_request, runner_waits_of
from store import queries
from store.schema import db_path
from tests.support.collector_process import collector
from tests.support.engine_process import GREEDY, MODEL, start_server_engine, words_prompt
from tests.support.sim_process import truth
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(400)]

LONG_WORDS = 1500


def generate(base_url: str, prompt: str, num_predict: int) -> None:
    for _ in ollama.Client(host=base_url, timeout=300).generate(
        model=MODEL, prompt=prompt, stream=True, options={**GREEDY, "num_predict": num_predict}
    ):
        pass


def test_direct_short_chat_during_a_long_prompt(tmp_path: Path) -> None:
    log_file = tmp_path / "ollama.log"
    data = tmp_path / "data"
    with (
        start_server_engine("--num-parallel", "2", "--log-file", str(log_file)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")  # load first
        time.sleep(3.0)  # the collector sees the runner
        since = time.time()
        long = threading.Thread(target=generate, args=(sim.base_url, words_prompt(LONG_WORDS, seed=46), 8))
        long.start()
        time.sleep(1.0)
        generate(sim.base_url, "Say hello.", 24)
        long.join(timeout=300)

        def direct() -> list[str] | None:
            conn = queries.open_readonly(db_path(data))
            try:
                rows = [s.record for s in queries.requests_in_window(conn, since - 1, time.time() + 1)]
            finally:
                conn.close()
            done = [r for r in rows if r.direct and r.metrics is not None and r.started_at_unix_s >= since - 1]
            done.sort(key=lambda r: (r.metrics.prompt_eval_count or 0) if r.metrics is not None else 0)  # short first
            return [r.id for r in done] if len(done) >= 2 else None

        short_id, long_id = wait_until(direct, 90, "both direct records")[:2]
    path = db_path(data)
    short = load_request(path, short_id)
    assert short is not None
    waits, split = runner_waits_of(path, short.record, short.phases)
    assert split is not None and split.queue_s == 0.0, split  # the runner's -np 2: a slot was free
    assert split.hits and split.hits[0].other.id == long_id, split
    _, ds, _ = explain(path, short.record, short.phases, (waits, split))
    codes = {d.code for d in ds}
    assert INTERFERENCE in codes, [d.sentence for d in ds]
    assert not codes & {"ttft_prompt", "decode_slow", "ttft_runner_wait", "ttft_queue"}, [d.sentence for d in ds]
    long_rec = load_request(path, long_id)
    assert long_rec is not None
    _, long_ds, _ = explain(path, long_rec.record, long_rec.phases, runner_waits_of(path, long_rec.record, long_rec.phases))
    assert INTERFERENCE not in {d.code for d in long_ds}


def test_direct_four_at_once_on_one_slot_no_runner_wait_verdict(tmp_path: Path) -> None:
    """One slot, a streamed generation and three non-streamed ones sent at once, directly: the runner names a
    prompt-cache save before each task that takes the used slot, but what waited was the queue. A direct record
    begins when the runner took its task (its time in Ollama's queue is not seen), so no wait of it is the
    runner's beyond what is left after its slot came free, and no verdict calls it the runner's work. Its time
    before that comes from Ollama's access line (its whole latency, before the runner's release): each queued
    request's queue within 20% of its time in Ollama's queue as sim itself measured it (arrival to the slot, on
    its own clock: the clients' clock only says when the threads were started, not when each request arrived)."""
    log_file = tmp_path / "ollama.log"
    data = tmp_path / "data"
    with (
        start_server_engine("--num-parallel", "1", "--log-file", str(log_file)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")
        time.sleep(3.0)
        since = time.time()
        threads = [threading.Thread(target=generate, args=(sim.base_url, words_prompt(120, seed=50), 60))]
        threads += [threading.Thread(target=whole, args=(sim.base_url, words_prompt(100 + i, seed=51 + i))) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)

        def direct() -> list[str] | None:
            conn = queries.open_readonly(db_path(data))
            try:
                rows = [s.record for s in queries.requests_in_window(conn, since - 1, time.time() + 1)]
            finally:
                conn.close()
            done = [r.id for r in rows if r.direct and r.metrics is not None and r.started_at_unix_s >= since - 1]
            return done if len(done) >= 4 else None

        ids = wait_until(direct, 90, "four direct records")
        # sim's own account of each generation (prompt read, so not the empty load): in the order they took the slot
        truths = sorted((t for t in truth(sim) if t.get("prompt_tokens")), key=lambda t: t["slot_acquired_ns"])[-4:]
    path = db_path(data)
    stored = [load_request(path, rid) for rid in ids]
    stored.sort(key=lambda s: s.phases.prefill_start_ns or 0 if s else 0)  # the order they took the slot
    queued = unmatched = 0
    for s, told in zip(stored, truths, strict=True):
        assert s is not None
        assert s.phases.prompt_tokens == told["prompt_tokens"], (s.phases.prompt_tokens, told)  # the same generation
        waits, split = runner_waits_of(path, s.record, s.phases)
        assert split is not None and split.runner_wait_s <= split.wait_s + 1e-9
        _, ds, _ = explain(path, s.record, s.phases, (waits, split))
        assert "ttft_runner_wait" not in {d.code for d in ds}, [d.sentence for d in ds]
        in_queue_s = (told["slot_acquired_ns"] - told["received_ns"]) / 1e9  # Ollama's queue, as sim measured it
        if in_queue_s < 1.0:
            continue
        assert s.record.metrics is not None
        if s.record.metrics.total_duration_ns is None:  # no access line fitted it alone: its queue is not known
            assert (split.queue_s or 0.0) < 0.1, split  # not claimed: only the gap between its task and the last
            unmatched += 1
            continue
        queued += 1
        assert split.queue_s == pytest.approx(in_queue_s, rel=0.2), (split, in_queue_s)
    assert queued >= 2 and unmatched <= 1, (queued, unmatched)


def whole(base_url: str, prompt: str) -> None:
    ollama.Client(host=base_url, timeout=300).generate(
        model=MODEL, prompt=prompt, stream=False, options={**GREEDY, "num_predict": 20}
    )


def _direct_pair(data: Path, since: float, n: int) -> list[str] | None:
    """The ``n`` direct records finished since ``since``, in the order they began (None: not all written yet), the
    last with the runner's figures. The others may have none: a long prompt whose short reply no poll saw (the queued
    task took its slot at once, and no poll caught the context at its whole prompt) keeps no unconfirmed figure."""
    conn = queries.open_readonly(db_path(data))
    try:
        rows = [s.record for s in queries.requests_in_window(conn, since - 1, time.time() + 1)]
    finally:
        conn.close()
    done = [r for r in rows if r.direct and r.outcome is not Outcome.IN_FLIGHT and r.started_at_unix_s >= since - 1]
    done.sort(key=lambda r: r.started_at_unix_s)
    if len(done) < n or done[n - 1].metrics is None:
        return None
    return [r.id for r in done]


def test_direct_one_slot_queues_and_finished_first_gives_neither(tmp_path: Path) -> None:
    """Issue 46's other two cases, sent directly, on one slot (-np 1): a short chat sent 1 s into a 600-word
    prompt waits for the slot (ttft_queue naming the long one, not interference, its queue from Ollama's access
    line); the same pair with the long one finished before the short chat is sent gets neither verdict."""
    log_file = tmp_path / "ollama.log"
    data = tmp_path / "data"
    with (
        start_server_engine("--num-parallel", "1", "--log-file", str(log_file)) as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(log_file)),
    ):
        ollama.Client(host=sim.base_url).generate(model=MODEL, prompt="", keep_alive="10m")
        time.sleep(3.0)
        since = time.time()
        long = threading.Thread(target=generate, args=(sim.base_url, words_prompt(600, seed=60), 8))
        long.start()
        time.sleep(1.0)
        generate(sim.base_url, "Say hello.", 16)
        long.join(timeout=300)
        queued = wait_until(lambda: _direct_pair(data, since, 2), 90, "the queued pair")
        time.sleep(2.0)
        since_after = time.time()
        generate(sim.base_url, words_prompt(600, seed=61), 8)  # finished before the short chat is sent
        time.sleep(1.0)
        generate(sim.base_url, "Say hello.", 16)
        after = wait_until(lambda: _direct_pair(data, since_after, 2), 90, "the pair one after the other")
    path = db_path(data)
    for (long_id, short_id), queue_expected in ((queued[:2], True), (after[:2], False)):
        short = load_request(path, short_id)
        assert short is not None
        waits, split = runner_waits_of(path, short.record, short.phases)
        assert split is not None and split.hits == (), split
        _, ds, _ = explain(path, short.record, short.phases, (waits, split))
        codes = {d.code for d in ds}
        assert INTERFERENCE not in codes, [d.sentence for d in ds]
        assert "ttft_runner_wait" not in codes, [d.sentence for d in ds]
        assert short.record.metrics is not None
        if queue_expected and short.record.metrics.total_duration_ns is None:
            # No access line fitted it alone (seen in busy full runs): its arrival, so its queue, is not known, and
            # none is claimed.
            assert (split.queue_s or 0.0) < 0.1, split
        elif queue_expected:
            assert [o.id for o in split.holders] == [long_id], split
            assert split.queue_s is not None and split.queue_s > 0.5 * split.wait_s > 0.4, split  # sent 1 s in
        else:
            assert not split.queue_s and "ttft_queue" not in codes, (split, [d.sentence for d in ds])
