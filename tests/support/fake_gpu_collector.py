"""``python -m tests.support.fake_gpu_collector apple <collector options>``: the real collector, on a fake Apple GPU.

This machine is Linux without an Apple GPU, so the browser test runs the collector with the
chooser told it is on macOS arm64 and handed the macmon-lib fake, an M3 Max whose busy ratio and
power follow the simulator's virtual GPU (``GET /sim/gpu``), so they rise with the requests the
sim serves. Everything else is the real ``python -m collectors``.
(The AMD browser test needs none of this: it points ``PHASEWATCH_SYSFS_ROOT`` at a fake tree.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collectors.config import load_settings
from collectors.gpu.choose import GpuChoice, choose_gpu_sampler
from collectors.service import CollectorService
from tests.support.fake_macmon import FakeMacmon, MacmonError, Metrics, SamplingFailedError, SocInfo, decode_metrics

M3_MAX = SocInfo("Mac15,9", "Apple M3 Max", 128, [], 40, [338, 618, 796, 924, 952, 1056, 1062, 1182, 1242, 1312, 1398])


def sim_gpu(sim_url: str) -> tuple[float, float, float]:
    """(busy ratio 0–1, memory busy ratio 0–1, watts) of the simulator's virtual GPU now."""
    with urllib.request.urlopen(sim_url.rstrip("/") + "/sim/gpu", timeout=2) as r:
        payload = json.load(r)
    gpu = (payload.get("gpus") or [payload])[0] if isinstance(payload, dict) else payload[0]
    busy, mem_busy = (float(gpu.get(k) or 0.0) / 100.0 for k in ("util_gpu_pct", "util_mem_pct"))
    return busy, mem_busy, float(gpu.get("power_w") or 0.0)


@dataclass
class SimMirroringMacmon(FakeMacmon):
    sim_url: str = ""

    def next_reading(self) -> Metrics | MacmonError:
        try:
            busy, _, watts = sim_gpu(self.sim_url)
        except OSError as exc:
            return SamplingFailedError(f"no reading ({exc})")
        return decode_metrics(gpu_usage=busy, gpu_w=watts, ram_gib=128)


def _no_nvml() -> Any:
    raise ModuleNotFoundError("No module named 'pynvml'")


def apple_choice(sim_url: str) -> Callable[..., GpuChoice]:
    def choose(**kwargs: Any) -> GpuChoice:
        macmon = SimMirroringMacmon(soc=M3_MAX, sim_url=sim_url)
        kwargs.update(nvml=_no_nvml, system="darwin", machine="arm64", macmon=lambda: macmon)
        return choose_gpu_sampler(**kwargs)

    return choose


async def _run(argv: list[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    settings = load_settings(argv, os.environ)
    service = CollectorService(settings, gpu_choose=apple_choice(settings.ollama_url))
    await service.run_until(stop)


if __name__ == "__main__":
    if sys.argv[1] != "apple":
        raise SystemExit("usage: python -m tests.support.fake_gpu_collector apple <collector options>")
    asyncio.run(_run(sys.argv[2:]))
