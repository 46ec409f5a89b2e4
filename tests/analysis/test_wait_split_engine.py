"""The interference verdict on the real llama.cpp runner (Gemma 3 270M on the CPU, two slots, ``python -m sim
--engine llama-server``) through the recording proxy: a long prompt streamed and a short chat sent while it is
read; the same on one slot (a queue, not interference) and with the long prompt finished first (neither).
llama-server fills each batch with the long prompt's slot first, so the short task waits for those batches
and its tokens come between them; the verdict must name the long prompt and the time it cost, not the short
request's own prompt or a slow decode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from analysis.diagnose import INTERFERENCE
from tests.support.engine_process import GREEDY, MODEL, start_server_engine, words_prompt
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.wait_split_cases import codes, computed_prompt, long_then_short, send, verdicts

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(300)]

LONG_WORDS = 1500  # ~1,500 tokens: tens of seconds of prefill on 2 busy CPU threads
SHORTER_WORDS = 600  # where the long prompt's length is not the point: a shorter wait


def body(prompt: str, num_predict: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "stream": True, "options": {"num_predict": num_predict, **GREEDY}}


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyThread]:
    with start_server_engine("--num-parallel", "2") as sim, run_proxy(sim.base_url) as p:
        send(p, body("warm up", 2), [])
        yield p


@pytest.fixture(scope="module")
def one_slot() -> Iterator[ProxyThread]:
    with start_server_engine("--num-parallel", "1") as sim, run_proxy(sim.base_url) as p:
        send(p, body("warm up", 2), [])
        yield p


def test_short_chat_during_a_long_prompt_on_the_real_runner(proxy: ProxyThread) -> None:
    long, short = long_then_short(proxy, body(words_prompt(LONG_WORDS, seed=31), 8), body("Say hello.", 24), gap_s=1.0)
    split, ds = verdicts(short, [long], 2)
    assert split.queue_s == 0.0  # the other slot was free
    assert split.hits and split.hits[0].other.id == long.id
    hit = [d for d in ds if d.code == INTERFERENCE]
    assert len(hit) == 1, [d.sentence for d in ds]
    assert f"{computed_prompt(long):,}-token prompt" in hit[0].sentence
    assert hit[0].numbers["lost_s"] >= 1.0
    assert not codes(ds) & {"ttft_prompt", "decode_slow", "ttft_runner_wait", "ttft_wait_unexplained", "ttft_queue"}
    _, long_ds = verdicts(long, [short], 2)
    assert INTERFERENCE not in codes(long_ds), [d.sentence for d in long_ds]


def test_one_slot_the_short_chat_queues_on_the_real_runner(one_slot: ProxyThread) -> None:
    long, short = long_then_short(one_slot, body(words_prompt(SHORTER_WORDS, seed=32), 8), body("Say hi.", 12), gap_s=1.0)
    split, ds = verdicts(short, [long], 1)
    assert split.hits == () and [o.id for o in split.holders] == [long.id], split
    assert split.queue_s is not None and split.queue_s > 0.5 * split.wait_s
    # Queue, not interference, nor the runner's work. Whether its first token was slow enough for a verdict at all
    # depends on the machine's speed (none in a busy full run; ttft_queue or ttft_prompt alone).
    assert not codes(ds) & {INTERFERENCE, "ttft_runner_wait"}, [d.sentence for d in ds]


def test_long_prompt_finished_first_gives_neither_on_the_real_runner(proxy: ProxyThread) -> None:
    long, short = long_then_short(proxy, body(words_prompt(SHORTER_WORDS, seed=33), 4), body("Say hey.", 12), gap_s=None)
    split, ds = verdicts(short, [long], 2)
    assert split.hits == () and not split.queue_s, split
    assert not codes(ds) & {INTERFERENCE, "ttft_queue"}, [d.sentence for d in ds]
