"""AMD GPUs through the amdgpu driver's sysfs files (no ROCm needed).

Read under a root from ``PHASEWATCH_SYSFS_ROOT`` (default ``/sys``) so tests and users can
point it at another tree. A card is ``class/drm/card<N>`` whose ``device/`` has
``gpu_busy_percent``; connector entries (``card0-DP-1``) and other vendors are skipped.
A file that is missing or cannot be read leaves its field None (never 0), and the reason
is kept in ``unreadable`` for ``python -m collectors.gpu --json``.

Units on disk: percent, bytes, µW (power), m°C (temperatures), MHz (``pp_dpm_*``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from analysis.records import GpuKind, GpuSample
from collectors.gpu.state import NO_GPU_MEANING, GpuState

SYSFS_ROOT_ENV = "PHASEWATCH_SYSFS_ROOT"
_CARD = re.compile(r"card(\d+)")
_DPM_LINE = re.compile(r"^\s*\d+:\s*(\d+)\s*mhz\s*(\*)?", re.IGNORECASE | re.MULTILINE)
# Which temperature stands for "the GPU" (NVML's core temperature is closest to amdgpu's edge).
_TEMP_PREFERENCE = ("edge", "junction", "mem")

Reader = Callable[[Path], str]


def sysfs_root() -> Path:
    return Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


def find_cards(root: Path) -> list[Path]:
    """The ``class/drm/card<N>/device`` folders of AMD GPUs under ``root``, by card number."""
    drm = root / "class" / "drm"
    try:
        entries = list(drm.iterdir())
    except OSError:
        return []
    cards = [(int(m.group(1)), e) for e in entries if (m := _CARD.fullmatch(e.name))]
    return [e / "device" for _, e in sorted(cards) if (e / "device" / "gpu_busy_percent").exists()]


def parse_dpm(text: str) -> tuple[int | None, int | None]:
    """(current MHz, highest MHz) from a ``pp_dpm_mclk``/``pp_dpm_sclk`` table; the current level has ``*``."""
    current = None
    levels: list[int] = []
    for m in _DPM_LINE.finditer(text):
        levels.append(int(m.group(1)))
        if m.group(2):
            current = int(m.group(1))
    return current, (max(levels) if levels else None)


@dataclass
class AmdSysfsSampler:
    """Samples every AMD card under ``root`` (the ``GpuSampler`` interface)."""

    root: Path = field(default_factory=sysfs_root)
    read: Reader = _read_text
    # sysfs has no per-process VRAM: Ollama's share comes from /api/ps (size_vram), with one card only.
    ollama_vram_bytes: Callable[[], int | None] = lambda: None
    clock: Callable[[], float] = time.time
    name: str = "AMD (amdgpu sysfs)"
    state: GpuState = field(default=GpuState(GpuKind.NONE, "sysfs not read yet"), init=False)
    unreadable: dict[str, str] = field(default_factory=dict, init=False)  # path → why it could not be read
    _cards: list[Path] = field(default_factory=list, init=False)

    def open(self) -> GpuState:
        self._cards = find_cards(self.root)
        if self._cards:
            self.state = GpuState(GpuKind.AMD_SYSFS, None)
        else:
            where = self.root / "class/drm/card*/device/gpu_busy_percent"
            self.state = GpuState(GpuKind.NONE, f"no AMD card exposes {where}: {NO_GPU_MEANING}")
        return self.state

    def close(self) -> None:
        self._cards = []

    # -- reading -----------------------------------------------------------------

    def _text(self, path: Path) -> str | None:
        try:
            text = self.read(path).strip()
        except FileNotFoundError:
            return None  # the driver does not offer it on this card: not worth reporting
        except OSError as exc:  # permission denied, EBUSY/EINVAL while the card sleeps, ...
            self.unreadable[str(path)] = exc.strerror or type(exc).__name__
            return None
        self.unreadable.pop(str(path), None)
        return text

    def _int(self, path: Path) -> int | None:
        text = self._text(path)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            self.unreadable[str(path)] = f"not a number: {text[:40]!r}"
            return None

    def _hwmon(self, device: Path) -> Path | None:
        try:
            found = sorted(p for p in (device / "hwmon").iterdir() if p.name.startswith("hwmon"))
        except OSError:
            return None
        return found[0] if found else None

    def _temperature_c(self, hwmon: Path) -> float | None:
        by_label: dict[str, int] = {}
        first: int | None = None
        for n in range(1, 4):
            value = self._int(hwmon / f"temp{n}_input")
            if value is None:
                continue
            first = value if first is None else first
            label = self._text(hwmon / f"temp{n}_label")
            if label:
                by_label[label.lower()] = value
        for label in _TEMP_PREFERENCE:
            if label in by_label:
                return by_label[label] / 1000.0
        return None if first is None else first / 1000.0

    def _name(self, device: Path) -> str:
        product = self._text(device / "product_name")
        if product:
            return product
        vendor, dev = self._text(device / "vendor"), self._text(device / "device")
        if vendor and dev:
            return f"AMD GPU {vendor.removeprefix('0x')}:{dev.removeprefix('0x')}"
        return f"AMD GPU {device.parent.name}"

    def _pci_slot(self, device: Path) -> str:
        uevent = self._text(device / "uevent") or ""
        for line in uevent.splitlines():
            if line.startswith("PCI_SLOT_NAME="):
                return line.split("=", 1)[1]
        return device.parent.name

    def _sample_one(self, index: int, device: Path, ts_unix_s: float, ollama: int | None) -> GpuSample:
        hwmon = self._hwmon(device)
        mem_clock, mem_clock_max = parse_dpm(self._text(device / "pp_dpm_mclk") or "")
        sclk, sclk_max = parse_dpm(self._text(device / "pp_dpm_sclk") or "")
        power_uw = limit_uw = None
        temperature_c = None
        if hwmon is not None:
            power_uw = self._int(hwmon / "power1_average")
            if power_uw is None:
                power_uw = self._int(hwmon / "power1_input")  # newer kernels on some cards offer only this
            limit_uw = self._int(hwmon / "power1_cap")
            temperature_c = self._temperature_c(hwmon)
        busy = self._int(device / "gpu_busy_percent")
        mem_busy = self._int(device / "mem_busy_percent")
        return GpuSample(
            ts_unix_s=ts_unix_s,
            index=index,
            name=self._name(device),
            uuid=f"amd-sysfs-{self._pci_slot(device)}",
            util_gpu_pct=None if busy is None else float(busy),
            util_mem_pct=None if mem_busy is None else float(mem_busy),
            mem_used_bytes=self._int(device / "mem_info_vram_used"),
            mem_total_bytes=self._int(device / "mem_info_vram_total"),
            power_w=None if power_uw is None else power_uw / 1e6,
            power_limit_w=None if limit_uw is None else limit_uw / 1e6,
            temperature_c=temperature_c,
            sm_clock_mhz=sclk,
            sm_clock_max_mhz=sclk_max,
            mem_clock_mhz=mem_clock,
            mem_clock_max_mhz=mem_clock_max,
            mem_bus_width_bits=None,  # sysfs does not say; the hardware table supplies the bandwidth
            ollama_mem_bytes=ollama,
        )

    def sample(self, now: float | None = None) -> list[GpuSample]:
        ts = self.clock() if now is None else now
        # /api/ps does not say which card holds a model: with several cards the share is unknown, not guessed.
        ollama = self.ollama_vram_bytes() if len(self._cards) == 1 else None
        return [self._sample_one(i, device, ts, ollama) for i, device in enumerate(self._cards)]
