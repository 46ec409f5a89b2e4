"""Hardware profiles: the shared spec table plus what only the simulator needs.

``analysis.hardware`` gives bandwidth, compute, memory and efficiency factors;
here we add how fast models load from disk, the system-memory path for
offloaded layers, the fixed cost of one batch step, and what a virtual NVML
would show (power range, clocks, bus width).
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.hardware import HardwareSpec, spec_by_key

GB = 1e9
GIB = 1024**3


@dataclass(frozen=True)
class SimProfile:
    spec: HardwareSpec
    disk_read_bytes_s: float  # loading a GGUF from a cold page cache
    host_bandwidth_bytes_s: float  # system RAM, for layers offloaded to the CPU
    host_flops: float  # CPU FP32 FMA peak, for offloaded layers at small batches
    pcie_bytes_s: float  # large batches stream offloaded weights to the GPU instead
    step_overhead_s: float  # kernel launches, sampling, scheduling per batch step
    usable_memory_fraction: float  # of spec memory the accelerator may fill with models (0 = CPU only)
    idle_power_w: float
    max_power_w: float
    sm_clock_idle_mhz: int
    sm_clock_busy_mhz: int
    sm_clock_max_mhz: int
    mem_clock_idle_mhz: int
    mem_clock_busy_mhz: int  # GeForce runs CUDA work in P2, a little below the maximum
    mem_clock_max_mhz: int
    bus_width_bits: int

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def gpu_name(self) -> str:
        return "Simulated " + self.spec.name

    @property
    def vram_bytes(self) -> int:
        """Accelerator memory models may use (0 for a CPU-only machine)."""
        return int(self.spec.memory_bytes * self.usable_memory_fraction)

    @property
    def default_num_ctx(self) -> int:
        """Ollama's default context by total VRAM (docs/ollama-api.md §7)."""
        vram = self.vram_bytes
        if vram >= 47 * GIB:
            return 262144
        if vram >= 23 * GIB:
            return 32768
        return 4096


def _nv(
    key: str,
    disk: float,
    host_bw: float,
    pcie: float,
    idle_w: float,
    max_w: float,
    sm: tuple[int, int, int],
    mem: tuple[int, int, int],
    bus: int,
) -> SimProfile:
    return SimProfile(
        spec_by_key(key),
        disk * GB,
        host_bw * GB,
        1.0e12,
        pcie * GB,
        0.0005,
        0.97,
        idle_w,
        max_w,
        sm[0],
        sm[1],
        sm[2],
        mem[0],
        mem[1],
        mem[2],
        bus,
    )


def _apple(key: str, disk: float, max_w: float, sm_mhz: int, mem_mhz: int, bus: int) -> SimProfile:
    # Unified memory: offloaded layers read the same RAM, only slower through the CPU.
    spec = spec_by_key(key)
    return SimProfile(
        spec,
        disk * GB,
        spec.bandwidth_bytes_s * 0.5,
        1.0e12,
        spec.bandwidth_bytes_s * 0.5,
        0.001,
        0.75,
        3.0,
        max_w,
        389,
        sm_mhz,
        sm_mhz,
        mem_mhz,
        mem_mhz,
        mem_mhz,
        bus,
    )


PROFILES: dict[str, SimProfile] = {
    p.key: p
    for p in (
        _nv("rtx-3060", 3.5, 60, 25, 13, 170, (210, 1777, 2100), (405, 7301, 7501), 192),
        _nv("rtx-3090", 3.5, 60, 25, 25, 350, (210, 1695, 2100), (405, 9501, 9751), 384),
        _nv("rtx-4090", 7.0, 80, 25, 20, 450, (210, 2520, 3105), (405, 10251, 10501), 384),
        _nv("rtx-5090", 7.0, 80, 50, 30, 575, (210, 2407, 3090), (405, 13801, 14001), 512),
        _apple("m1", 2.8, 20, 1278, 2133, 128),
        _apple("m2-ultra", 7.0, 90, 1398, 3125, 1024),
        _apple("m3-max", 7.0, 60, 1398, 3125, 512),
        # A desktop without a GPU: everything runs on the CPU from RAM.
        SimProfile(
            spec_by_key("cpu"), 3.5 * GB, 80 * GB, 1.0e12, 80 * GB, 0.001, 0.0, 20, 125, 800, 4500, 5200, 2500, 2500, 2500, 128
        ),
    )
}

DEFAULT_PROFILE = "rtx-4090"


def profile_by_key(key: str) -> SimProfile:
    """Look up a profile; KeyError names the known ones."""
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown hardware {key!r}; known: {', '.join(PROFILES)}") from None
