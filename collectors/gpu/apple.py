"""Apple Silicon GPUs: ``macmon-lib`` (sudoless IOReport), else the IORegistry's PerformanceStatistics.

Never ``powermetrics``: it needs sudo. Apple GPUs share the system memory, so there is no
VRAM to read: the "VRAM used by Ollama" line is what Ollama's models hold of system memory
(``size_vram`` summed over ``/api/ps``), handed in as ``ollama_vram_bytes``, and the total
is the system memory.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from analysis.hardware import apple_chip_name, apple_gpu_cores_from_system_profiler
from analysis.records import GpuKind, GpuSample
from collectors.gpu.state import NO_GPU_MEANING, GpuState

IOREG_COMMAND = ("ioreg", "-r", "-d", "1", "-c", "IOAccelerator")
IOREG_TIMEOUT_S = 2.0

OllamaVram = Callable[[], int | None]


def no_ollama_vram() -> int | None:
    return None


# -- macmon-lib -----------------------------------------------------------------------


@dataclass
class MacmonSampler:
    """Samples the Apple GPU through the ``macmon`` module of macmon-lib (the ``GpuSampler`` interface).

    ``usage`` is macmon's GPU active ratio (0–1); powers are watts; temperatures °C.
    """

    macmon: ModuleType | Any
    ollama_vram_bytes: OllamaVram = no_ollama_vram
    clock: Callable[[], float] = time.time
    name: str = "Apple Silicon (macmon)"
    state: GpuState = field(default=GpuState(GpuKind.NONE, "macmon not started"), init=False)
    _sampler: Any = field(default=None, init=False)
    _chip: str = field(default="Apple GPU", init=False)
    _max_mhz: int | None = field(default=None, init=False)
    _ram_total_bytes: int | None = field(default=None, init=False)

    def open(self) -> GpuState:
        m = self.macmon
        try:
            info = m.soc_info()
            self._sampler = m.Sampler()
        except m.MacmonError as exc:
            self.state = GpuState(GpuKind.NONE, f"macmon could not start ({exc}): {NO_GPU_MEANING}")
            return self.state
        self._chip = info.chip_name or "Apple GPU"
        self._max_mhz = max(info.gpu_frequencies_mhz) if info.gpu_frequencies_mhz else None
        self._ram_total_bytes = int(info.memory_gb) * 1024**3 if info.memory_gb else None
        self.state = GpuState(GpuKind.MACMON, None)
        return self.state

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def sample(self, now: float | None = None) -> list[GpuSample]:
        if self._sampler is None:
            return []
        ts = self.clock() if now is None else now
        try:
            metrics = self._sampler.metrics()
        except self.macmon.MacmonError as exc:  # one failed read: say so, try again next interval
            self.state = GpuState(GpuKind.MACMON, f"macmon could not sample ({exc})")
            return []
        if self.state.message is not None:
            self.state = GpuState(GpuKind.MACMON, None)
        gpu = metrics.gpu_usage[0] if metrics.gpu_usage else None
        ollama = self.ollama_vram_bytes()
        ram_total = metrics.memory.ram_total or self._ram_total_bytes
        temperature_c = metrics.temperature.gpu_average
        return [
            GpuSample(
                ts_unix_s=ts,
                index=0,
                name=self._chip,
                uuid="macmon-0",
                util_gpu_pct=None if gpu is None else gpu.usage * 100.0,
                mem_total_bytes=int(ram_total) if ram_total else None,  # system memory: the GPU shares it
                power_w=metrics.power.gpu,
                temperature_c=temperature_c if temperature_c > 0 else None,  # macmon reports 0 where it has no sensor
                sm_clock_mhz=None if gpu is None else gpu.frequency_mhz,
                sm_clock_max_mhz=self._max_mhz,
                ollama_mem_bytes=ollama,
            )
        ]


# -- IORegistry -----------------------------------------------------------------------

_STATS = re.compile(r'"PerformanceStatistics"\s*=\s*\{([^}]*)\}')
_PAIR = re.compile(r'"([^"]+)"\s*=\s*(-?\d+)')
_MODEL = re.compile(r'"model"\s*=\s*"([^"]*)"')
_CORES = re.compile(r'"gpu-core-count"\s*=\s*(\d+)')


@dataclass(frozen=True)
class IoregReading:
    model: str | None
    gpu_cores: int | None
    stats: dict[str, int]


def parse_ioreg(text: str) -> list[IoregReading]:
    """One reading per accelerator in ``ioreg -r -d 1 -c IOAccelerator`` output (raises nothing)."""
    readings = []
    for block in re.split(r"^\+-o ", text, flags=re.MULTILINE):
        stats = _STATS.search(block)
        if stats is None:
            continue
        model, cores = _MODEL.search(block), _CORES.search(block)
        readings.append(
            IoregReading(
                model=model.group(1) if model else None,
                gpu_cores=int(cores.group(1)) if cores else None,
                stats={k: int(v) for k, v in _PAIR.findall(stats.group(1))},
            )
        )
    return readings


def run_ioreg() -> str:
    return subprocess.run(IOREG_COMMAND, capture_output=True, text=True, timeout=IOREG_TIMEOUT_S, check=True).stdout


@dataclass
class IoregSampler:
    """GPU utilisation and the GPU's in-use system memory from the IORegistry (the ``GpuSampler`` interface)."""

    run: Callable[[], str] = run_ioreg
    ollama_vram_bytes: OllamaVram = no_ollama_vram
    ram_total_bytes: int | None = None
    clock: Callable[[], float] = time.time
    name: str = "Apple Silicon (IORegistry)"
    state: GpuState = field(default=GpuState(GpuKind.NONE, "IORegistry not read yet"), init=False)

    def _read(self) -> list[IoregReading] | str:
        try:
            return parse_ioreg(self.run())
        except (OSError, subprocess.SubprocessError) as exc:
            return f"ioreg failed ({exc})"

    def open(self) -> GpuState:
        readings = self._read()
        if isinstance(readings, str):
            self.state = GpuState(GpuKind.NONE, f"{readings}: {NO_GPU_MEANING}")
        elif not readings:
            self.state = GpuState(GpuKind.NONE, f"no IOAccelerator has PerformanceStatistics: {NO_GPU_MEANING}")
        else:
            self.state = GpuState(GpuKind.IOREG, None)
        return self.state

    def close(self) -> None:
        pass

    def sample(self, now: float | None = None) -> list[GpuSample]:
        if self.state.kind != GpuKind.IOREG:
            return []
        ts = self.clock() if now is None else now
        readings = self._read()
        if isinstance(readings, str):
            self.state = GpuState(GpuKind.IOREG, readings)
            return []
        self.state = GpuState(GpuKind.IOREG, None)
        ollama = self.ollama_vram_bytes()
        samples = []
        for i, r in enumerate(readings):
            util = r.stats.get("Device Utilization %")
            in_use = r.stats.get("In use system memory")
            samples.append(
                GpuSample(
                    ts_unix_s=ts,
                    index=i,
                    name=r.model or "Apple GPU",
                    uuid=f"ioreg-{i}",
                    util_gpu_pct=None if util is None else float(util),
                    mem_used_bytes=in_use,  # what the GPU driver holds of system memory, all apps
                    mem_total_bytes=self.ram_total_bytes,
                    ollama_mem_bytes=ollama,
                )
            )
        return samples


# -- which chip, how many GPU cores (the collector stores them beside the host's bandwidth) ------------


def _run_text(cmd: list[str], timeout_s: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def detect_apple_gpu() -> tuple[str, int | None] | None:
    """("Apple M3 Max", 40) on Apple Silicon macOS, None elsewhere.

    The chip from ``sysctl -n machdep.cpu.brand_string``; the GPU core count from
    ``system_profiler SPDisplaysDataType -json`` (None if that fails), which tells
    core variants with different bandwidth apart (M3 Max 30 vs 40 cores).
    """
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return None
    brand = _run_text(["sysctl", "-n", "machdep.cpu.brand_string"])
    chip = apple_chip_name(brand or "")
    if chip is None:
        return None
    profile = _run_text(["system_profiler", "SPDisplaysDataType", "-json"], timeout_s=20.0)
    cores = None
    if profile:
        try:
            cores = apple_gpu_cores_from_system_profiler(json.loads(profile))
        except ValueError:
            cores = None
    return chip, cores
