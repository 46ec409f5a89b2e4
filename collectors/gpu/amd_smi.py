"""AMD GPUs through ROCm's ``amdsmi`` Python module (injected, so tests pass a fake of it).

``amdsmi`` needs ROCm's ``libamd_smi.so``: the PyPI wheel imports only where ROCm is
installed, which is why it is an optional install. Units as amdsmi returns them: activity
in %, VRAM in MB, power in W, clocks in Hz (``amdsmi_get_clk_freq``), temperatures in °C.
amdsmi marks an absent reading with the text "N/A"; that and any AmdSmiLibraryException
(e.g. AMDSMI_STATUS_NOT_SUPPORTED) leave that field None, never 0.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from analysis.records import GpuKind, GpuSample
from collectors.gpu.state import NO_GPU_MEANING, GpuState

MIB = 1024 * 1024


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # "N/A" and anything else amdsmi could not read
    return float(value)


@dataclass
class AmdSmiSampler:
    """Samples every AMD GPU amdsmi lists (the ``GpuSampler`` interface)."""

    amdsmi: ModuleType | Any
    clock: Callable[[], float] = time.time
    name: str = "AMD (amdsmi)"
    state: GpuState = field(default=GpuState(GpuKind.NONE, "amdsmi not started"), init=False)
    unsupported: dict[int, set[str]] = field(default_factory=dict, init=False)
    _handles: list[Any] = field(default_factory=list, init=False)
    _names: dict[int, tuple[str, str]] = field(default_factory=dict, init=False)
    _initialized: bool = field(default=False, init=False)

    def open(self) -> GpuState:
        smi = self.amdsmi
        try:
            smi.amdsmi_init()
            self._initialized = True
            self._handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiException as exc:
            self.state = GpuState(GpuKind.NONE, f"amdsmi could not start ({exc}): {NO_GPU_MEANING}")
            return self.state
        if not self._handles:
            self.state = GpuState(GpuKind.NONE, f"amdsmi reports no AMD GPU: {NO_GPU_MEANING}")
        else:
            self.state = GpuState(GpuKind.AMDSMI, None)
        return self.state

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            self._handles = []
            with contextlib.suppress(self.amdsmi.AmdSmiException):
                self.amdsmi.amdsmi_shut_down()

    def _call(self, index: int, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.amdsmi, fn_name, None)
        if fn is None:  # an older amdsmi without it
            self.unsupported.setdefault(index, set()).add(fn_name)
            return None
        try:
            return fn(*args)
        except self.amdsmi.AmdSmiException:
            self.unsupported.setdefault(index, set()).add(fn_name)
            return None

    def _clock_mhz(self, index: int, handle: Any, clk_type: Any) -> tuple[int | None, int | None]:
        freq = self._call(index, "amdsmi_get_clk_freq", handle, clk_type)
        if not isinstance(freq, dict):
            return None, None
        levels_hz = [f for f in freq.get("frequency") or [] if _number(f)]
        current = freq.get("current")
        now_hz = levels_hz[current] if isinstance(current, int) and 0 <= current < len(levels_hz) else None
        return (
            None if now_hz is None else round(now_hz / 1e6),
            round(max(levels_hz) / 1e6) if levels_hz else None,
        )

    def _identity(self, index: int, handle: Any) -> tuple[str, str]:
        if index not in self._names:
            asic = self._call(index, "amdsmi_get_gpu_asic_info", handle) or {}
            market = asic.get("market_name")
            uuid = self._call(index, "amdsmi_get_gpu_device_uuid", handle)
            self._names[index] = (
                market if isinstance(market, str) and market != "N/A" else f"AMD GPU {index}",
                f"amdsmi-{uuid}" if isinstance(uuid, str) and uuid else f"amdsmi-index-{index}",
            )
        return self._names[index]

    def _sample_one(self, index: int, handle: Any, ts_unix_s: float) -> GpuSample:
        smi = self.amdsmi
        activity = self._call(index, "amdsmi_get_gpu_activity", handle) or {}
        vram = self._call(index, "amdsmi_get_gpu_vram_usage", handle) or {}
        power = self._call(index, "amdsmi_get_power_info", handle) or {}
        # amdsmi 6.x fills current_socket_power on RDNA and average_socket_power on MI; 7.x adds socket_power.
        power_w = next(
            (p for k in ("socket_power", "current_socket_power", "average_socket_power") if (p := _number(power.get(k)))),
            None,
        )
        temperature = self._call(
            index, "amdsmi_get_temp_metric", handle, smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CURRENT
        )
        mem_clock, mem_clock_max = self._clock_mhz(index, handle, smi.AmdSmiClkType.MEM)
        gfx_clock, gfx_clock_max = self._clock_mhz(index, handle, smi.AmdSmiClkType.GFX)
        used_mb, total_mb = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
        name, uuid = self._identity(index, handle)
        return GpuSample(
            ts_unix_s=ts_unix_s,
            index=index,
            name=name,
            uuid=uuid,
            util_gpu_pct=_number(activity.get("gfx_activity")),
            util_mem_pct=_number(activity.get("umc_activity")),
            mem_used_bytes=None if used_mb is None else int(used_mb * MIB),
            mem_total_bytes=None if total_mb is None else int(total_mb * MIB),
            power_w=power_w,
            power_limit_w=_number(power.get("power_limit")) or None,
            temperature_c=_number(temperature),
            sm_clock_mhz=gfx_clock,
            sm_clock_max_mhz=gfx_clock_max,
            mem_clock_mhz=mem_clock,
            mem_clock_max_mhz=mem_clock_max,
        )

    def sample(self, now: float | None = None) -> list[GpuSample]:
        if self.state.kind != GpuKind.AMDSMI:
            return []
        ts = self.clock() if now is None else now
        return [self._sample_one(i, h, ts) for i, h in enumerate(self._handles)]
