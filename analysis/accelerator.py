"""Which hardware the ceilings are computed for: an NVIDIA GPU, an Apple chip, or this machine's CPU.

Pure: a GPU sample (or an Apple chip's name) in, a ``Hardware`` out; the host's memory
bandwidth comes from a callable, so measuring it stays with the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from analysis import wording as w
from analysis.hardware import BY_KEY, BandwidthChoice, HardwareSpec, choose_bandwidth, match_gpu, nvml_bandwidth_bytes_s
from analysis.records import GpuSample


class HardwareKind(StrEnum):
    GPU = "gpu"  # an NVIDIA GPU seen through NVML (or the simulator's)
    APPLE = "apple"  # an Apple chip's GPU (unified memory)
    CPU = "cpu"  # no GPU: this machine's CPU and memory


@dataclass(frozen=True)
class Hardware:
    """The accelerator the ceilings are computed for, and how we know its numbers."""

    kind: HardwareKind
    label: str  # as the machine reports it, e.g. "NVIDIA GeForce RTX 4090"
    spec: HardwareSpec | None  # None: a GPU the table does not know
    bandwidth_bytes_s: float | None  # the one the ceilings use
    bandwidth: BandwidthChoice | None = None  # table vs NVML, when there is a GPU
    simulated: bool = False
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    bus_width_bits: int | None = None
    gpu_count: int = 1
    host_bandwidth_bytes_s: float | None = None  # measured; for the offloaded part (or the whole model on a CPU)
    notes: tuple[str, ...] = ()


def resolve_hardware(
    sample: GpuSample | None,
    *,
    gpu_count: int = 1,
    apple_chip: tuple[str, int | None] | None = None,
    host_bandwidth: Callable[[], float | None] = lambda: None,
) -> Hardware:
    """The GPU of ``sample`` (its name and memory → table row; bandwidth from the driver's clock × width
    cross-checked against it where both are known); else the Apple chip; else this machine's CPU with its measured bandwidth."""
    if sample is not None:
        spec = match_gpu(sample.name, sample.mem_total_bytes)
        nvml_bw = None
        if sample.mem_clock_max_mhz and sample.mem_bus_width_bits:
            nvml_bw = nvml_bandwidth_bytes_s(sample.mem_clock_max_mhz, sample.mem_bus_width_bits)
        notes: list[str] = []
        choice = None
        if spec is None and nvml_bw is None:
            notes.append(
                f"{sample.name} is not in Phasewatch's hardware table and its driver gives no memory clock "
                "and bus width to compute a bandwidth from, "
                "so there are no ceilings to draw."
            )
        else:
            choice = choose_bandwidth(spec, nvml_bw)
            if choice.message:
                notes.append(choice.message + ".")
        if nvml_bw is None and sample.mem_clock_max_mhz and spec is not None:
            # AMD (sysfs, amdsmi) reports the memory clock but not the bus width: nothing to cross-check with.
            notes.append(
                f"The driver reports the memory clock ({sample.mem_clock_max_mhz:,} MHz at most) but not the bus width, "
                "so the bandwidth is the datasheet's, not cross-checked."
            )
        if spec is None and nvml_bw is not None:
            notes.append(
                f"{sample.name} is not in Phasewatch's hardware table: its bandwidth comes from its driver's clock and bus width "
                f"({w.gb_s(nvml_bw)}), but without its compute figure there is no prefill ceiling."
            )
        if spec is not None and spec.derived:
            notes.append(f"Some of the {spec.name}'s figures are derived, not published by the vendor.")
        return Hardware(
            kind=HardwareKind.GPU,
            label=sample.name,
            spec=spec,
            bandwidth_bytes_s=choice.bandwidth_bytes_s if choice else None,
            bandwidth=choice,
            simulated=sample.simulated,
            mem_clock_mhz=sample.mem_clock_mhz,
            mem_clock_max_mhz=sample.mem_clock_max_mhz,
            bus_width_bits=sample.mem_bus_width_bits,
            gpu_count=gpu_count,
            notes=tuple(notes),
        )
    if apple_chip is not None:
        chip, cores = apple_chip
        spec = match_gpu(chip, gpu_cores=cores)
        if spec is not None:
            label = chip + (f" ({cores}-core GPU)" if cores else "")
            return Hardware(HardwareKind.APPLE, label, spec, spec.bandwidth_bytes_s)
    host = host_bandwidth()
    cpu = BY_KEY["cpu"]
    notes = ["No GPU was found, so the ceilings are this computer's CPU and memory."]
    if host is None:
        notes.append(f"The host's memory bandwidth could not be measured; using a typical {w.gb_s(cpu.bandwidth_bytes_s)}.")
    return Hardware(
        kind=HardwareKind.CPU,
        label="this computer's CPU",
        spec=cpu,
        bandwidth_bytes_s=host or cpu.bandwidth_bytes_s,
        host_bandwidth_bytes_s=host,
        notes=tuple(notes),
    )
