"""A virtual GPU: what NVML would report for the simulated accelerator.

The engine reports each batch step (when, how long, how compute-bound); this
turns that into utilization over the last second, power between idle and
max, an energy counter, clocks that rise under load, and memory used by the
loaded models.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from typing import Any

from sim.profiles import SimProfile

WINDOW_NS = 1_000_000_000  # NVML averages utilization and (Ampere+) power over about a second
BASELINE_VRAM_BYTES = 350 * 1024**2  # desktop and driver


class VirtualGpu:
    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile
        self._steps: deque[tuple[int, int, float]] = deque()  # (start_ns, end_ns, compute share 0..1)
        self._t0_ns = time.monotonic_ns()
        self._extra_energy_j = 0.0
        self.models_vram_bytes = 0

    def record_step(self, start_ns: int, end_ns: int, compute_share: float) -> None:
        self._steps.append((start_ns, end_ns, compute_share))
        self._extra_energy_j += (end_ns - start_ns) / 1e9 * (self._busy_power_w(compute_share) - self.profile.idle_power_w)
        cutoff = end_ns - 2 * WINDOW_NS
        while self._steps and self._steps[0][1] < cutoff:
            self._steps.popleft()

    def _busy_power_w(self, compute_share: float) -> float:
        # Memory-bound decode draws about 60% of the board's range; compute-bound prefill all of it.
        p = self.profile
        return p.idle_power_w + (p.max_power_w - p.idle_power_w) * (0.6 + 0.4 * compute_share)

    def state(self, now_ns: int | None = None) -> dict[str, Any]:
        p = self.profile
        now = time.monotonic_ns() if now_ns is None else now_ns
        lo = now - WINDOW_NS
        busy_ns = 0.0
        mem_busy_ns = 0.0
        power_j = 0.0
        for start, end, share in self._steps:
            overlap = min(end, now) - max(start, lo)
            if overlap > 0:
                busy_ns += overlap
                mem_busy_ns += overlap * (1.0 - 0.5 * share)
                power_j += overlap / 1e9 * (self._busy_power_w(share) - p.idle_power_w)
        util = min(busy_ns / WINDOW_NS, 1.0)
        busy = util > 0.05
        elapsed_s = (now - self._t0_ns) / 1e9
        energy_j = p.idle_power_w * elapsed_s + self._extra_energy_j
        return {
            "index": 0,
            "name": p.gpu_name,
            "uuid": "GPU-51a11a7e-0000-4000-8000-" + f"{zlib.crc32(p.key.encode()):012d}",
            "util_gpu_pct": round(util * 100, 1),
            "util_mem_pct": round(min(mem_busy_ns / WINDOW_NS, 1.0) * 100, 1),
            "mem_used_bytes": BASELINE_VRAM_BYTES + self.models_vram_bytes,
            "mem_total_bytes": int(p.spec.memory_bytes),
            # Steps of two loaded models can overlap; a real board never draws past its enforced limit.
            "power_w": round(min(p.idle_power_w + power_j / (WINDOW_NS / 1e9), p.max_power_w), 2),
            "power_limit_w": p.max_power_w,
            "energy_j": round(energy_j, 3),
            "total_energy_mj": int(energy_j * 1000),
            "temperature_c": round(35 + 45 * util, 1),
            "sm_clock_mhz": p.sm_clock_busy_mhz if busy else p.sm_clock_idle_mhz,
            "sm_clock_max_mhz": p.sm_clock_max_mhz,
            "mem_clock_mhz": p.mem_clock_busy_mhz if busy else p.mem_clock_idle_mhz,
            "mem_clock_max_mhz": p.mem_clock_max_mhz,
            "mem_bus_width_bits": p.bus_width_bits,
            "pstate": 2 if busy else 8,
            "simulated": True,
        }
