"""Queue, the runner's own wait and interference on real requests: sim's roofline engine → recording proxy → records
→ ``analysis.wait_split`` → verdicts.

sim batches as llama-server does (a step carries every decoding slot's token and up to a batch of prompt tokens,
the slot that came first filling it), so a long prompt read on one slot delays a new task's prompt on the other
slot until its batches end, and stretches the other slot's gaps between tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis.diagnose import INTERFERENCE
from analysis.phases import split_record
from analysis.records import RequestRecord
from collectors.metrics import RequestStats
from collectors.wait_metrics import WaitSplits
from pages.requests.view import build_detail
from pages.shared.charts import OTHERS_ROW
from pages.why.view import build_why, why_json
from sim.tokens import make_prompt
from store.rows import request_row
from store.tables import PHASES_VERSION
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimFactory, SimProcess
from tests.support.wait_split_cases import codes, computed_prompt, long_then_short, saved_state, send, verdicts, write_store

pytestmark = pytest.mark.slow

HARDWARE = "rtx-3090"
MODEL = "llama3.1:8b"
CTX = {"num_ctx": 8192}
LONG_PROMPT_TOKENS = 6000
QUEUE_AGREEMENT = 0.20  # a queued request's queue time vs its wait behind the others


def body(prompt: str, num_predict: int, *, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "stream": stream, "options": {"num_predict": num_predict, **CTX}}


@pytest.fixture(scope="module")
def two_slots(start_sims: SimFactory) -> Iterator[ProxyThread]:
    yield from _warm(start_sims("--hardware", HARDWARE, "--num-parallel", "2", "--disk-gbs", "100"))


@pytest.fixture(scope="module")
def one_slot(start_sims: SimFactory) -> Iterator[ProxyThread]:
    yield from _warm(start_sims("--hardware", HARDWARE, "--num-parallel", "1", "--disk-gbs", "100"))


def _warm(sim: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(sim.base_url) as p:
        send(p, body("warm up", 2, stream=False), [])
        yield p


def pair(proxy: ProxyThread, *, gap_s: float | None) -> tuple[RequestRecord, RequestRecord]:
    seed = int(time.time() * 1000) % 100_000  # a fresh prompt each time: no cache hit
    long = body(make_prompt(LONG_PROMPT_TOKENS, seed=seed), 20, stream=True)
    return long_then_short(proxy, long, body(make_prompt(20, seed=seed + 1), 60, stream=True), gap_s=gap_s)


def test_two_slots_short_chat_during_a_long_prompt_names_it(two_slots: ProxyThread) -> None:
    long, short = pair(two_slots, gap_s=0.4)
    split, ds = verdicts(short, [long], 2)
    assert split.queue_s == 0.0  # a slot was free
    assert split.hits and split.hits[0].other.id == long.id
    hit = [d for d in ds if d.code == INTERFERENCE]
    assert len(hit) == 1, [d.sentence for d in ds]
    assert f"{computed_prompt(long):,}-token prompt" in hit[0].sentence
    assert hit[0].numbers["lost_s"] >= 0.5
    assert not codes(ds) & {"ttft_prompt", "decode_slow", "ttft_runner_wait", "ttft_wait_unexplained", "ttft_queue"}
    # The long request is not blamed on the short one.
    _, long_ds = verdicts(long, [short], 2)
    assert INTERFERENCE not in codes(long_ds)


def test_one_slot_short_chat_queues_behind_the_long_prompt(one_slot: ProxyThread) -> None:
    long, short = pair(one_slot, gap_s=0.4)
    split, ds = verdicts(short, [long], 1)
    assert split.hits == ()
    assert split.queue_s is not None and split.queue_s > 0.5
    assert [o.id for o in split.holders] == [long.id]
    assert "ttft_queue" in codes(ds) and INTERFERENCE not in codes(ds), [d.sentence for d in ds]


def test_long_prompt_finished_first_gives_neither(two_slots: ProxyThread) -> None:
    long, short = pair(two_slots, gap_s=None)
    split, ds = verdicts(short, [long], 2)
    assert split.hits == () and not split.queue_s
    assert not codes(ds) & {INTERFERENCE, "ttft_queue"}


def test_one_slot_four_at_once_queue_is_the_wait_behind_the_others(one_slot: ProxyThread) -> None:
    ids: list[str] = []
    seed = int(time.time() * 1000) % 100_000
    # A long streamed generation first, then three non-streamed ones: all four at once on one slot.
    bodies = [body(make_prompt(200, seed=seed), 300, stream=True)]
    bodies += [body(make_prompt(200, seed=seed + i), 80, stream=False) for i in (1, 2, 3)]
    threads = [threading.Thread(target=send, args=(one_slot, b, ids)) for b in bodies]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=120)
    recs = [one_slot.wait_record(i) for i in ids]
    queued = 0
    for rec in recs:
        others = [o for o in recs if o.id != rec.id]
        # The runner named a prompt-cache save for each task (as llama-server does): still a queue, not its work.
        split, ds = verdicts(rec, others, 1, saved_state(1))
        ph = split_record(rec)
        assert ph.prefill_start_ns is not None
        start = rec.wall_s(ph.prefill_start_ns)
        # Its wait behind the others, as the clients saw it: its arrival → the last reply before its prompt ended.
        ends = [o.wall_s(o.final_chunk_ns) for o in others if o.final_chunk_ns is not None]
        behind = max((e for e in ends if e <= start + 0.05), default=rec.started_at_unix_s) - rec.started_at_unix_s
        if behind < 1.0:
            continue
        queued += 1
        assert split.queue_s == pytest.approx(behind, rel=QUEUE_AGREEMENT)
        # The runner's part is only what is left after the slot came free: a step or two, not the queue.
        assert split.runner_wait_s < 0.1 * split.wait_s
        assert "ttft_runner_wait" not in codes(ds)
        assert "ttft_queue" in codes(ds), [d.sentence for d in ds]
    assert queued >= 2
    # /metrics takes the same split, from the stored rows in the order they finished (the collector's own order).
    stats = RequestStats(waits=WaitSplits(lambda _model: 1))
    splits = {rec.id: verdicts(rec, [o for o in recs if o.id != rec.id], 1)[0] for rec in recs}
    for rec in sorted(recs, key=lambda r: r.final_chunk_ns or 0):
        stats.observe(request_row(rec, split_record(rec), time.time(), PHASES_VERSION))
    queue = [h for (name, _), h in stats.histograms.items() if name == "phasewatch_request_slot_queue_seconds"]
    interference = [h for (name, _), h in stats.histograms.items() if name == "phasewatch_request_interference_seconds"]
    assert sum(h.count for h in queue) == 4
    assert sum(h.total for h in queue) == pytest.approx(sum(s.queue_s or 0.0 for s in splits.values()), rel=QUEUE_AGREEMENT)
    assert sum(h.total for h in interference) < 0.05 * sum(h.total for h in queue)


def test_requests_detail_and_why_tell_it_from_the_store(two_slots: ProxyThread, tmp_path: Path) -> None:
    """The same pair written to a real store: the Requests detail draws the other prefill beside the short request
    and its wait for those batches in red, and Why and the report count the verdict."""
    long, short = pair(two_slots, gap_s=0.4)
    path = write_store(tmp_path / "data", [long, short], model=MODEL, n_slots=2)
    d = build_detail(path, short.id)
    assert d is not None
    names = [t.name for t in d.waterfall.data]
    assert "waiting for another request's batches" in names, names
    tiles = {h.label: h.value for h in d.headlines}
    assert tiles["Queue"] == "0.0 ms" and "Behind others" in tiles, tiles
    beside = [t for t in d.waterfall.data if t.y[0] == OTHERS_ROW]
    assert [t.name for t in beside] == [f"another request's prefill: {computed_prompt(long):,}-token prompt"]
    # The most important verdict is worded among the detail's sentences, the rest listed below them.
    told = [*d.sentences, *(x.sentence for x in d.diagnoses)]
    assert sum(t.startswith("Another request's prompt, read on the same runner, cost this one") for t in told) == 1, told
    long_detail = build_detail(path, long.id)
    assert long_detail is not None and OTHERS_ROW not in [t.y[0] for t in long_detail.waterfall.data]
    why = build_why(path, MODEL, now_unix_s=time.time(), window_s=3600)
    assert why is not None
    verdicts_by_code = {v["code"]: v for v in why_json(why)["verdicts"]}
    assert list(verdicts_by_code[INTERFERENCE]["by_request"]) == [short.id]
