"""Under concurrent mixed load, every reported number agrees with sim's own truth."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from sim.tokens import make_prompt
from tests.support.sim_process import SimProcess, start_sim, truth

MODEL = "llama3.2"


async def _one(session: aiohttp.ClientSession, url: str, i: int) -> tuple[str, list[dict[str, Any]]]:
    body: dict[str, Any] = {"model": MODEL, "prompt": make_prompt(20 + 350 * (i % 4), seed=i), "stream": True}
    if i % 3:
        body["options"] = {"num_predict": 5 + 7 * i}
    async with session.post(url + "/api/generate", json=body) as r:
        assert r.status == 200
        lines = [json.loads(line) async for line in r.content if line.strip()]
        return r.headers["X-Sim-Request-Id"], lines


async def _burst(url: str, n: int) -> list[tuple[str, list[dict[str, Any]]]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.sleep(0)
        return await asyncio.gather(*(_one(session, url, i) for i in range(n)))


def _check(sim: SimProcess, results: list[tuple[str, list[dict[str, Any]]]]) -> None:
    records = {r["id"]: r for r in truth(sim)}
    for rid, chunks in results:
        rec, final = records[rid], chunks[-1]
        content = chunks[:-1]
        assert final["done"] and not any(c["done"] for c in content)
        sampled, written = rec["token_sampled_ns"], rec["token_written_ns"]
        assert final["eval_count"] == len(sampled)
        assert len(written) == len(content) == len(sampled) - (final["done_reason"] == "stop")
        assert final["prompt_eval_duration"] == rec["prefill_end_ns"] - rec["prefill_start_ns"]
        assert final.get("eval_duration", 0) == sampled[-1] - sampled[0]
        assert final["load_duration"] <= final["total_duration"]
        assert final["total_duration"] >= final["load_duration"] + final["prompt_eval_duration"] + final.get("eval_duration", 0)
        assert rec["received_ns"] <= rec["slot_acquired_ns"] <= rec["prefill_start_ns"] < rec["prefill_end_ns"]
        assert rec["prefill_end_ns"] == sampled[0] and all(w >= s for w, s in zip(written, sampled, strict=False))
        assert 0 <= (rec["done_ns"] - rec["received_ns"]) - final["total_duration"] < 100_000_000
        assert rec["reported"]["total_duration"] == final["total_duration"]
        assert final["prompt_eval_count"] == rec["prompt_tokens"]


@pytest.mark.slow
def test_reported_numbers_match_truth_under_concurrency() -> None:
    with start_sim("--hardware", "rtx-3060", "--num-parallel", "3", "--disk-gbs", "50") as sim:
        results = asyncio.run(_burst(sim.base_url, 8))
        _check(sim, results)
        # Slots were shared: some requests waited, and some steps carried several streams.
        waits = [r["slot_acquired_ns"] - r["received_ns"] for r in truth(sim)]
        assert sum(w > 20_000_000 for w in waits) >= 3
        all_ticks = [t for r in truth(sim) for t in r["token_sampled_ns"]]
        assert len(set(all_ticks)) < len(all_ticks)  # tokens of different streams share a step's timestamp
