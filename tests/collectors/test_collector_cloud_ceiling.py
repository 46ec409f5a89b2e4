"""A cloud model's request is set against no ceiling of this machine in the collector's metrics (issue 41: "no
ceilings"): through the whole collector (proxy → store → /phasewatch/metrics) in front of sim's virtual GPU, a local
chat's decode rate counts in ``phasewatch_request_decode_ceiling_ratio`` and the cloud chat's does not, though
ollama.com's ``/api/show`` gives the architecture a ceiling could be computed from (the same library model's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import pytest

from collectors.config import load_settings
from collectors.service import CollectorService
from tests.support.exposition import parse_exposition
from tests.support.fake_pynvml import FakeNvml
from tests.support.sim_process import SimProcess, start_sim

LOCAL = "qwen2.5:0.5b"
CLOUD = "qwen2.5:0.5b-cloud"  # the same library model, run on ollama.com
RATIO = "phasewatch_request_decode_ceiling_ratio_count"
ENERGY = "phasewatch_energy_joules"  # GPU energy over requests' phases, by phase
REQUESTS = "phasewatch_requests_total"


async def _until(cond: Callable[[], Any], timeout_s: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await cond()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@pytest.mark.slow
def test_a_cloud_request_counts_in_no_ceiling_ratio(tmp_path: Path) -> None:
    with start_sim("--hardware", "rtx-4090", "--disk-gbs", "60", "--cloud-model", CLOUD) as sim:
        asyncio.run(_scenario(sim, tmp_path))


async def _totals(host: str) -> dict[str, float]:
    """The collector's metrics, each family's samples summed over their labels."""
    async with aiohttp.ClientSession() as session, session.get(f"{host}/phasewatch/metrics") as resp:
        metrics = parse_exposition(await resp.text())
    out: dict[str, float] = {}
    for (name, _), value in metrics.items():
        out[name] = out.get(name, 0.0) + value
    return out


async def _scenario(sim: SimProcess, data: Path) -> None:
    args = ["--ollama", sim.base_url, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.2", "--demo"]
    service = CollectorService(load_settings(args, {}), nvml=FakeNvml([]))
    await service.start()
    try:
        host = f"http://{service.listen}"
        client = ollama.AsyncClient(host=host)
        messages = [{"role": "user", "content": "hello there"}]

        async def counted(n: int) -> bool:
            return (await _totals(host)).get(REQUESTS, 0) >= n

        # Streamed: the client's decode rate is known (a whole body has none to set against anything).
        parts = [p async for p in await client.chat(model=CLOUD, messages=messages, stream=True, options={"num_predict": 16})]
        assert parts[-1].done and parts[-1].eval_count == 16
        await _until(lambda: counted(1))
        await asyncio.sleep(2.0)  # sim's GPU sampled past the cloud chat's end: its phases' energy would be counted
        assert not any(name.startswith(ENERGY) for name in await _totals(host))  # none of this GPU's energy was for it

        await client.chat(model=LOCAL, messages=messages, options={"num_predict": 16})
        await _until(lambda: counted(2))
        # The cloud model's /api/show is read like any installed model's: give a wrongly counted ratio its chance.
        await _until(lambda: _shown(service, CLOUD))
        await _until(lambda: _has(host, RATIO))
        await asyncio.sleep(1.0)
        assert (await _totals(host))[RATIO] == 1  # the local chat's only
    finally:
        await service.stop()


async def _has(host: str, name: str) -> bool:
    return name in await _totals(host)


async def _shown(service: CollectorService, model: str) -> bool:
    return service.poller is not None and model in service.poller.shows
