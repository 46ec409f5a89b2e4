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

import httpx
import pytest

from analysis.diagnose import INTERFERENCE, Diagnosis, diagnose_request
from analysis.phases import split_record
from analysis.records import RequestRecord
from analysis.wait_split import WaitSplit, split_for
from collectors.proxy.recording import RECORD_ID_HEADER
from sim.tokens import make_prompt
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimFactory, SimProcess

pytestmark = pytest.mark.slow

HARDWARE = "rtx-3090"
MODEL = "llama3.1:8b"
CTX = {"num_ctx": 8192}
LONG_PROMPT_TOKENS = 6000
QUEUE_AGREEMENT = 0.20  # a queued request's queue time vs its wait behind the others


def send(proxy: ProxyThread, prompt: str, num_predict: int, *, stream: bool, out: list[str]) -> None:
    resp = httpx.post(
        proxy.base_url + "/api/generate",
        json={"model": MODEL, "prompt": prompt, "stream": stream, "options": {"num_predict": num_predict, **CTX}},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    out.append(resp.headers[RECORD_ID_HEADER])


@pytest.fixture(scope="module")
def two_slots(start_sims: SimFactory) -> Iterator[ProxyThread]:
    yield from _warm(start_sims("--hardware", HARDWARE, "--num-parallel", "2", "--disk-gbs", "100"))


@pytest.fixture(scope="module")
def one_slot(start_sims: SimFactory) -> Iterator[ProxyThread]:
    yield from _warm(start_sims("--hardware", HARDWARE, "--num-parallel", "1", "--disk-gbs", "100"))


def _warm(sim: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(sim.base_url) as p:
        send(p, "warm up", 2, stream=False, out=[])
        yield p


def long_then_short(proxy: ProxyThread, *, gap_s: float | None) -> tuple[RequestRecord, RequestRecord]:
    """A long prompt streamed, and a short streamed chat sent ``gap_s`` after it (None: after it finished)."""
    long_id: list[str] = []
    short_id: list[str] = []
    seed = int(time.time() * 1000) % 100_000  # a fresh prompt each time: no cache hit
    t = threading.Thread(
        target=send, args=(proxy, make_prompt(LONG_PROMPT_TOKENS, seed=seed), 20), kwargs={"stream": True, "out": long_id}
    )
    t.start()
    if gap_s is None:
        t.join(timeout=120)
    else:
        time.sleep(gap_s)
    send(proxy, make_prompt(20, seed=seed + 1), 60, stream=True, out=short_id)
    t.join(timeout=120)
    return proxy.wait_record(long_id[0]), proxy.wait_record(short_id[0])


def verdicts(rec: RequestRecord, others: list[RequestRecord], n_slots: int) -> tuple[WaitSplit, list[Diagnosis]]:
    ph = split_record(rec)
    split = split_for(rec, ph, [(o, split_record(o)) for o in others], n_slots=n_slots)
    return split, diagnose_request(rec, ph, split=split)


def codes(ds: list[Diagnosis]) -> set[str]:
    return {d.code for d in ds}


def test_two_slots_short_chat_during_a_long_prompt_names_it(two_slots: ProxyThread) -> None:
    long, short = long_then_short(two_slots, gap_s=0.4)
    split, ds = verdicts(short, [long], 2)
    assert split.queue_s == 0.0  # a slot was free
    assert split.hits and split.hits[0].other.id == long.id
    hit = [d for d in ds if d.code == INTERFERENCE]
    assert len(hit) == 1, [d.sentence for d in ds]
    lph = split_record(long)
    assert f"{(lph.prompt_tokens or 0) - (lph.cached_tokens or 0):,}-token prompt" in hit[0].sentence
    print(hit[0].sentence)
    assert hit[0].numbers["lost_s"] >= 0.5
    assert not codes(ds) & {"ttft_prompt", "decode_slow", "ttft_runner_wait", "ttft_wait_unexplained", "ttft_queue"}
    # The long request is not blamed on the short one.
    _, long_ds = verdicts(long, [short], 2)
    assert INTERFERENCE not in codes(long_ds)


def test_one_slot_short_chat_queues_behind_the_long_prompt(one_slot: ProxyThread) -> None:
    long, short = long_then_short(one_slot, gap_s=0.4)
    split, ds = verdicts(short, [long], 1)
    assert split.hits == ()
    assert split.queue_s is not None and split.queue_s > 0.5
    assert [o.id for o in split.holders] == [long.id]
    assert "ttft_queue" in codes(ds) and INTERFERENCE not in codes(ds), [d.sentence for d in ds]


def test_long_prompt_finished_first_gives_neither(two_slots: ProxyThread) -> None:
    long, short = long_then_short(two_slots, gap_s=None)
    split, ds = verdicts(short, [long], 2)
    assert split.hits == () and not split.queue_s
    assert not codes(ds) & {INTERFERENCE, "ttft_queue"}


def test_one_slot_four_at_once_queue_is_the_wait_behind_the_others(one_slot: ProxyThread) -> None:
    ids: list[str] = []
    seed = int(time.time() * 1000) % 100_000
    threads = [
        threading.Thread(target=send, args=(one_slot, make_prompt(200, seed=seed), 300), kwargs={"stream": True, "out": ids})
    ]
    threads += [
        threading.Thread(target=send, args=(one_slot, make_prompt(200, seed=seed + i), 80), kwargs={"stream": False, "out": ids})
        for i in (1, 2, 3)
    ]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=120)
    recs = [one_slot.wait_record(i) for i in ids]
    queued = 0
    for rec in recs:
        others = [o for o in recs if o.id != rec.id]
        split, ds = verdicts(rec, others, 1)
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
        assert split.runner_wait_s == 0.0  # no runner lines read: nothing is the runner's
        assert "ttft_runner_wait" not in codes(ds)
        assert "ttft_queue" in codes(ds), [d.sentence for d in ds]
    assert queued >= 2
