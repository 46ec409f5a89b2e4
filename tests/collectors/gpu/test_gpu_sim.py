"""Demo mode's GPU: the sim's virtual GPU read from ``GET /sim/gpu``."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from collectors.gpu.sim import SimGpuSource, gpu_samples_from_sim
from tests.support.ports import free_port
from tests.support.sim_process import start_sim


def test_sim_payload_becomes_simulated_samples() -> None:
    payload = {
        "simulated": True,
        "gpus": [{"index": 0, "name": "Simulated RTX", "uuid": "GPU-s", "power_w": 120.5, "total_energy_mj": 5, "pstate": 8}],
    }
    (s,) = gpu_samples_from_sim(payload, 7.0)
    assert (s.ts_unix_s, s.name, s.uuid, s.power_w, s.pstate, s.simulated) == (7.0, "Simulated RTX", "GPU-s", 120.5, 8, True)
    assert gpu_samples_from_sim({"simulated": True, "gpus": []}, 0) == []  # --hardware cpu


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("text", "did not return a JSON object or list of GPUs"),
        ({"gpus": "none"}, "did not return a JSON object or list of GPUs"),
        ([1], "not a JSON object"),
        ({"gpus": [{"power_w": "hot"}]}, "power_w='hot'"),
        ({"gpus": [{"index": True}]}, "index=True"),
        ({"gpus": [{"name": 3}]}, "name=3"),
        ([{"temperature_c": float("nan")}], "temperature_c=nan"),
    ],
)
def test_bad_payloads_are_a_clear_value_error(bad: object, needle: str) -> None:
    with pytest.raises(ValueError, match="/sim/gpu") as err:
        gpu_samples_from_sim(bad, 0)
    assert needle in str(err.value)


def test_reads_the_running_sim_and_says_when_it_cannot() -> None:
    async def scenario(base_url: str, dead_url: str) -> None:
        async with aiohttp.ClientSession() as session:
            live = SimGpuSource(base_url, session, clock=lambda: 1.0)
            (s,) = await live.sample()
            assert s.simulated and "RTX 3090" in s.name and s.mem_total_bytes and s.mem_total_bytes > 20e9
            assert live.state.kind == "simulated"
            dead = SimGpuSource(dead_url, session)
            assert await dead.sample() == []
            assert dead.state.kind == "simulated" and dead.state.message and "cannot read" in dead.state.message

    with start_sim("--hardware", "rtx-3090") as sim:
        asyncio.run(scenario(sim.base_url, f"http://127.0.0.1:{free_port()}"))
