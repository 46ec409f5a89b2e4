"""The virtual GPU never reports drawing more than its power limit, even when two models' steps overlap."""

from __future__ import annotations

import time

from sim.gpu import VirtualGpu
from sim.profiles import profile_by_key


def test_overlapping_steps_of_two_models_stay_under_the_power_limit() -> None:
    gpu = VirtualGpu(profile_by_key("rtx-4090"))
    now = time.monotonic_ns()
    # Two models each running compute-bound steps over the same whole second.
    for _ in range(2):
        gpu.record_step(now - 1_000_000_000, now, 1.0)
    state = gpu.state(now)
    assert state["util_gpu_pct"] == 100.0
    assert state["power_w"] == state["power_limit_w"]
