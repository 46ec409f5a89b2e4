"""Choose the GPU source once at start: the first of these that works on this machine.

1. NVIDIA through NVML (``pynvml``), if NVML initialises and sees a GPU;
2. AMD through ``amdsmi``, if it imports (it needs ROCm) and sees a GPU;
3. AMD through sysfs, if a card under ``PHASEWATCH_SYSFS_ROOT`` (default /sys) has ``gpu_busy_percent``;
4. Apple Silicon through ``macmon-lib``, on macOS arm64;
5. Apple through the IORegistry (``ioreg``), on macOS;
6. none, with a plain reason for every source tried.

Module loaders are parameters so tests can hand in fakes of the drivers this machine lacks.
"""

from __future__ import annotations

import importlib
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from analysis.records import GpuKind
from collectors.gpu.amd_smi import AmdSmiSampler
from collectors.gpu.amd_sysfs import AmdSysfsSampler, sysfs_root
from collectors.gpu.apple import IoregSampler, MacmonSampler, OllamaVram, no_ollama_vram, run_ioreg
from collectors.gpu.nvml import NvmlGpuSource
from collectors.gpu.state import NO_GPU_MEANING, GpuSampler, GpuState
from collectors.host.sampler import OllamaProcesses

Loader = Callable[[], ModuleType | Any]


def _importer(name: str) -> Loader:
    return lambda: importlib.import_module(name)


LOAD_PYNVML = _importer("pynvml")
LOAD_AMDSMI = _importer("amdsmi")
LOAD_MACMON = _importer("macmon")  # the import name of macmon-lib


@dataclass
class GpuChoice:
    """The chosen sampler (None when no source works) and why each source before it was passed over."""

    sampler: GpuSampler | None
    passed_over: list[tuple[str, str]] = field(default_factory=list)  # (source name, why not)

    @property
    def state(self) -> GpuState:
        if self.sampler is not None:
            return self.sampler.state
        return GpuState(GpuKind.NONE, no_source_message(self.passed_over))


def no_source_message(passed_over: list[tuple[str, str]]) -> str:
    tried = "; ".join(f"{name}: {why}" for name, why in passed_over)
    return f"no GPU source found ({tried}): {NO_GPU_MEANING}"


def _why(message: str | None, default: str) -> str:
    """A source's own reason, without the sentence every source adds about what it means."""
    return (message or default).removesuffix(": " + NO_GPU_MEANING)


def _load(loader: Loader, what: str) -> tuple[Any, str | None]:
    try:
        return loader(), None
    except ImportError as exc:
        return None, f"{what} is not installed ({exc})"
    except Exception as exc:  # amdsmi raises KeyError('libamd_smi.so') when ROCm is missing
        return None, f"{what} cannot load ({type(exc).__name__}: {exc})"


def choose_gpu_sampler(
    *,
    nvml: Loader = LOAD_PYNVML,
    amdsmi: Loader = LOAD_AMDSMI,
    macmon: Loader = LOAD_MACMON,
    ioreg: Callable[[], str] = run_ioreg,
    root: Path | None = None,
    system: str = sys.platform,
    machine: str = platform.machine(),
    processes: OllamaProcesses | None = None,
    ollama_vram_bytes: OllamaVram = no_ollama_vram,
    ram_total_bytes: int | None = None,
) -> GpuChoice:
    """Open the first source that works; never raises."""
    passed: list[tuple[str, str]] = []

    module, why = _load(nvml, "nvidia-ml-py (pynvml)")
    if module is not None:
        source = NvmlGpuSource(module, processes=processes)
        if source.open().kind == GpuKind.NVML:
            return GpuChoice(source, passed)
        source.close()
        why = source.state.message
    passed.append(("NVIDIA (NVML)", _why(why, "no GPU")))

    module, why = _load(amdsmi, "amdsmi (ROCm)")
    if module is not None:
        smi = AmdSmiSampler(module)
        if smi.open().kind == GpuKind.AMDSMI:
            return GpuChoice(smi, passed)
        smi.close()
        why = smi.state.message
    passed.append(("AMD (amdsmi)", _why(why, "no GPU")))

    sysfs = AmdSysfsSampler(root if root is not None else sysfs_root(), ollama_vram_bytes=ollama_vram_bytes)
    if sysfs.open().kind == GpuKind.AMD_SYSFS:
        return GpuChoice(sysfs, passed)
    passed.append(("AMD (amdgpu sysfs)", _why(sysfs.state.message, "no card")))

    if system == "darwin" and machine == "arm64":
        module, why = _load(macmon, "macmon-lib")
        if module is not None:
            mac = MacmonSampler(module, ollama_vram_bytes=ollama_vram_bytes)
            if mac.open().kind == GpuKind.MACMON:
                return GpuChoice(mac, passed)
            why = mac.state.message
        passed.append(("Apple Silicon (macmon)", _why(why, "no GPU")))
    else:
        passed.append(("Apple Silicon (macmon)", "not macOS on Apple Silicon"))

    if system == "darwin":
        if ram_total_bytes is None:
            import psutil  # the system memory the Apple GPU shares

            ram_total_bytes = int(psutil.virtual_memory().total)
        io = IoregSampler(ioreg, ollama_vram_bytes=ollama_vram_bytes, ram_total_bytes=ram_total_bytes)
        if io.open().kind == GpuKind.IOREG:
            return GpuChoice(io, passed)
        passed.append(("Apple Silicon (IORegistry)", _why(io.state.message, "no accelerator")))
    else:
        passed.append(("Apple Silicon (IORegistry)", "not macOS"))
    return GpuChoice(None, passed)
