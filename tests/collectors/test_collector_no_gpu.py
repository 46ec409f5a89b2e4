"""A host without a GPU source (CPU-only, Intel GPU, a container): what the collector keeps per request stays
bounded. Issue 25 finding 1: every finished request was kept for the GPU energy count, which only a GPU drains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from collectors.config import load_settings
from collectors.gpu.choose import GpuChoice
from collectors.service import CollectorService
from tests.support.sim_process import SimProcess, start_sim

MODEL = "qwen2.5:0.5b"
REQUESTS = 300
PROMPT_CHARS = 20_000
CLIENTS = 6


def _no_gpu(**_: object) -> GpuChoice:
    return GpuChoice(None, [("all", "no GPU on this host")])


@pytest.mark.slow  # 300 requests through a real collector: 9-10 s on this shared machine
def test_no_gpu_source_keeps_nothing_per_request(tmp_path: Path) -> None:
    with start_sim("--hardware", "cpu") as sim:
        held_rows, held_text_chars, counted = asyncio.run(_flood(sim, tmp_path))
    assert counted >= REQUESTS  # every request was counted for /metrics...
    assert held_rows == 0  # ...and none is kept for an energy or ceiling count that can never come
    assert held_text_chars == 0


async def _flood(sim: SimProcess, data: Path) -> tuple[int, int, int]:
    argv = ["--ollama", sim.base_url, "--listen", "127.0.0.1:0", "--data", str(data), "--interval", "0.2", "--record-text"]
    service = CollectorService(load_settings(argv, {}), gpu_choose=_no_gpu, host_bandwidth=None)
    await service.start()
    try:
        assert service._gpu is None and service._sim_source is None  # the host this test is about
        url = f"http://{service.listen}/api/generate"
        body = {"model": MODEL, "prompt": "x" * PROMPT_CHARS, "stream": False, "options": {"num_predict": 3}}
        todo = list(range(REQUESTS))
        async with aiohttp.ClientSession() as session:

            async def client() -> None:
                while todo:
                    todo.pop()
                    async with session.post(url, json=body) as resp:
                        assert resp.status == 200
                        await resp.read()

            await asyncio.gather(*(client() for _ in range(CLIENTS)))
        assert service.writer is not None and service.writer.flush(30.0)
        for _ in range(100):  # the counts reach the loop after the commit
            if service.stats.histogram("gen_ai_server_request_duration_seconds").count >= REQUESTS:
                break
            await asyncio.sleep(0.05)
        held = [*service._energy_pending, *(r for _, r in service._ceiling_pending)]
        text = sum(len(getattr(r, "prompt_text", None) or "") + len(getattr(r, "response_text", None) or "") for r in held)
        counted = service.stats.histogram("gen_ai_server_request_duration_seconds").count
        return len(held), text, counted
    finally:
        await service.stop()
