"""Cancelling an experiment closes its streams at once; sim's truth shows the requests cancelled."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from collectors.lab.results import CANCELLED
from collectors.lab.runner import run_experiment
from tests.support.sim_process import SimProcess

# A slow machine and a small model: a 3,000-token prefill takes seconds, the chat streams every few ms.
MODEL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "m1", "--num-parallel", "2")


def truth(sim: SimProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=5) as r:
        return list(json.load(r)["requests"])


def clear_truth(sim: SimProcess) -> None:
    urllib.request.urlopen(urllib.request.Request(sim.base_url + "/sim/truth", method="DELETE"), timeout=5).close()


def test_cancel_closes_every_inflight_request_at_once(sim: SimProcess) -> None:
    clear_truth(sim)

    async def go() -> tuple[Any, int]:
        cancel = asyncio.Event()
        task = asyncio.create_task(
            run_experiment(
                "interference",
                sim.base_url,
                MODEL,
                {"long_prompt_tokens": 3000, "chat_max_tokens": 3000},
                cancel=cancel,
            )
        )
        deadline = time.monotonic() + 30
        # Wait for the moment both are in flight: the chat streaming and the long prompt prefilling.
        while True:
            assert time.monotonic() < deadline, "the experiment never had two requests in flight"
            assert not task.done(), task.result().error if not task.cancelled() else "cancelled"
            live = [r for r in await asyncio.to_thread(truth, sim) if r["done_ns"] is None]
            prefilling = [r for r in live if r["prefill_start_ns"] and not r["prefill_end_ns"]]
            streaming = [r for r in live if len(r["token_sampled_ns"]) > 5]
            if prefilling and streaming:
                break
            await asyncio.sleep(0.05)
        t_cancel = time.monotonic_ns()
        cancel.set()
        return await asyncio.wait_for(task, 10), t_cancel

    result, t_cancel_ns = asyncio.run(go())
    assert result.state == CANCELLED
    assert result.conclusion.startswith("Cancelled")
    records = truth(sim)
    cancelled = [r for r in records if r["cancelled"]]
    assert len(cancelled) == 2, records
    for r in cancelled:
        # The server saw the client go within a fraction of a second and stopped generating.
        assert r["done_ns"] is not None
        assert (r["done_ns"] - t_cancel_ns) / 1e9 < 1.0  # vs ~25 s of generation left
    chat = next(r for r in cancelled if r["endpoint"] == "/api/chat")
    assert len(chat["token_sampled_ns"]) < 3000
    # Nothing is left running on the server.
    assert all(r["done_ns"] is not None for r in records)


def test_outer_task_cancellation_also_closes_the_streams(sim: SimProcess) -> None:
    clear_truth(sim)

    async def go() -> int:
        task = asyncio.create_task(run_experiment("concurrency", sim.base_url, MODEL, {"max_streams": 2, "num_predict": 3000}))
        deadline = time.monotonic() + 30
        while not any(len(r["token_sampled_ns"]) > 5 and r["done_ns"] is None for r in await asyncio.to_thread(truth, sim)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        t = time.monotonic_ns()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return t

    t_cancel_ns = asyncio.run(go())
    # The server notices the closed connection on its next write; give it a moment.
    deadline = time.monotonic() + 5
    while any(r["done_ns"] is None for r in truth(sim)) and time.monotonic() < deadline:
        time.sleep(0.05)
    streams = [r for r in truth(sim) if r["cancelled"]]
    assert streams and all((r["done_ns"] - t_cancel_ns) / 1e9 < 1.0 for r in streams)
