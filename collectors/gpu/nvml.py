"""NVIDIA GPUs through NVML, via an injected ``pynvml`` module (tests pass a fake of it).

Every NVML call goes through ``NvmlGpuSource._call``, which turns an unsupported
reading ("not supported", "function not found", "no permission", ...) into None for that
field only, as nvitop does, so a missing sensor never stops the others. A GPU that falls
off the bus (``GpuIsLost``) is skipped and retried each interval; the others go on.
No NVML at all is a state, not an error: ``state.kind == GpuKind.NONE`` with a message saying why
and what it means.
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
from collectors.host.sampler import OllamaProcesses

# pynvml error classes that mean "this GPU is gone until reset", not "this field is missing".
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound")
# ... and those from nvmlInit that mean there is no usable NVIDIA driver here.
_NO_DRIVER_ERRORS = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch")


class _GpuLost(Exception):
    pass


@dataclass
class _Device:
    """Per-GPU facts that do not change while the driver is loaded, read once."""

    handle: Any
    name: str
    uuid: str
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    mem_bus_width_bits: int | None


@dataclass
class NvmlGpuSource:
    """Samples every NVIDIA GPU through ``nvml`` (the ``pynvml`` module, or a fake of it).

    Units in the samples: bytes, watts, joules, degrees Celsius, MHz, bytes/s. The
    utilization figures are NVML's "% of time busy" over its last sample period (a
    kernel ran / memory was read or written), not a share of compute or of bandwidth.
    """

    nvml: ModuleType | Any
    processes: OllamaProcesses | None = None
    clock: Callable[[], float] = time.time
    name: str = "NVIDIA (NVML)"
    state: GpuState = field(default=GpuState(GpuKind.NONE, "NVML not started"), init=False)
    unsupported: dict[int, set[str]] = field(default_factory=dict, init=False)  # GPU index → NVML functions it lacks
    _devices: dict[int, _Device] = field(default_factory=dict, init=False)
    _count: int = field(default=0, init=False)
    _initialized: bool = field(default=False, init=False)
    _lost: dict[int, str] = field(default_factory=dict, init=False)

    # -- lifecycle ---------------------------------------------------------

    def open(self) -> GpuState:
        """Initialise NVML and count the GPUs; never raises."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            if type(exc).__name__ in _NO_DRIVER_ERRORS:
                self.state = GpuState(GpuKind.NONE, f"no NVIDIA GPU found ({exc}): {NO_GPU_MEANING}")
            else:
                self.state = GpuState(GpuKind.NONE, f"NVML could not start ({exc}): {NO_GPU_MEANING}")
            return self.state
        self._initialized = True
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self.state = GpuState(GpuKind.NONE, f"NVML could not count the GPUs ({exc}): {NO_GPU_MEANING}")
            return self.state
        if self._count == 0:
            self.state = GpuState(GpuKind.NONE, f"the NVIDIA driver reports no GPU: {NO_GPU_MEANING}")
        else:
            self.state = GpuState(GpuKind.NVML, None)
        return self.state

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            self._devices.clear()
            self.state = GpuState(GpuKind.NONE, "NVML closed")
            with contextlib.suppress(self.nvml.NVMLError):  # the driver may have gone away under us
                self.nvml.nvmlShutdown()

    # -- the one wrapper ---------------------------------------------------

    def _call(self, index: int, fn_name: str, *args: Any) -> Any:
        """Call ``nvml.<fn_name>(*args)``; None if this GPU or driver cannot answer it.

        Raises _GpuLost when the GPU itself is gone, so the caller can skip that GPU.
        """
        nvml = self.nvml
        fn = getattr(nvml, fn_name, None)
        if fn is None:  # an older nvidia-ml-py without this function
            self.unsupported.setdefault(index, set()).add(fn_name)
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if type(exc).__name__ in _LOST_ERRORS:
                raise _GpuLost(str(exc)) from exc
            self.unsupported.setdefault(index, set()).add(fn_name)
            return None
        except getattr(nvml, "NVMLLibraryMismatchError", ()):  # unversioned call on a driver that lacks it
            self.unsupported.setdefault(index, set()).add(fn_name)
            return None

    def _first(self, index: int, *calls: tuple[Any, ...]) -> Any:
        """The first of several equivalent calls that answers (newer API first)."""
        for fn_name, *args in calls:
            value = self._call(index, fn_name, *args)
            if value is not None:
                return value
        return None

    # -- sampling ----------------------------------------------------------

    def _device(self, index: int) -> _Device:
        dev = self._devices.get(index)
        if dev is not None:
            return dev
        nvml = self.nvml
        handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            raise _GpuLost("NVML gave no handle for it")
        name = self._call(index, "nvmlDeviceGetName", handle)
        uuid = self._call(index, "nvmlDeviceGetUUID", handle)
        dev = _Device(
            handle=handle,
            name=_text(name) or f"GPU {index}",
            uuid=_text(uuid) or f"index-{index}",
            sm_clock_max_mhz=_int(self._call(index, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM)),
            mem_clock_max_mhz=_int(self._call(index, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM)),
            mem_bus_width_bits=_int(self._call(index, "nvmlDeviceGetMemoryBusWidth", handle)),
        )
        self._devices[index] = dev
        return dev

    def _ollama_mem_bytes(self, index: int, handle: Any, ollama_pids: set[int] | None) -> int | None:
        if ollama_pids is None:
            return None
        compute = self._call(index, "nvmlDeviceGetComputeRunningProcesses", handle)
        graphics = self._call(index, "nvmlDeviceGetGraphicsRunningProcesses", handle)
        if compute is None and graphics is None:
            return None
        used_by_pid: dict[int, int] = {}
        for proc in [*(compute or []), *(graphics or [])]:
            used = getattr(proc, "usedGpuMemory", None)  # None where the OS hides it (Windows WDDM)
            if proc.pid in ollama_pids and used is not None:
                used_by_pid[proc.pid] = max(used_by_pid.get(proc.pid, 0), int(used))
        return sum(used_by_pid.values())

    def _sample_one(self, index: int, ts_unix_s: float, ollama_pids: set[int] | None) -> GpuSample:
        nvml = self.nvml
        dev = self._device(index)
        h = dev.handle
        util = self._call(index, "nvmlDeviceGetUtilizationRates", h)
        mem = self._call(index, "nvmlDeviceGetMemoryInfo", h)
        power_mw = self._call(index, "nvmlDeviceGetPowerUsage", h)
        limit_mw = self._call(index, "nvmlDeviceGetEnforcedPowerLimit", h)
        energy_mj = self._call(index, "nvmlDeviceGetTotalEnergyConsumption", h)
        temperature_c = self._first(
            index,
            ("nvmlDeviceGetTemperatureV", h, nvml.NVML_TEMPERATURE_GPU),
            ("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
        )
        # NVML reports PCIe throughput in KB/s (KiB, per nvitop) over a 20 ms window.
        tx_kib_s = self._call(index, "nvmlDeviceGetPcieThroughput", h, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx_kib_s = self._call(index, "nvmlDeviceGetPcieThroughput", h, nvml.NVML_PCIE_UTIL_RX_BYTES)
        pstate = _int(self._call(index, "nvmlDeviceGetPerformanceState", h))
        reasons = self._first(
            index,
            ("nvmlDeviceGetCurrentClocksEventReasons", h),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", h),  # the pre-12.2 name
        )
        return GpuSample(
            ts_unix_s=ts_unix_s,
            index=index,
            name=dev.name,
            uuid=dev.uuid,
            util_gpu_pct=None if util is None else float(util.gpu),
            util_mem_pct=None if util is None else float(util.memory),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            temperature_c=None if temperature_c is None else float(temperature_c),
            sm_clock_mhz=_int(self._call(index, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)),
            sm_clock_max_mhz=dev.sm_clock_max_mhz,
            mem_clock_mhz=_int(self._call(index, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM)),
            mem_clock_max_mhz=dev.mem_clock_max_mhz,
            mem_bus_width_bits=dev.mem_bus_width_bits,
            pcie_tx_bytes_s=None if tx_kib_s is None else tx_kib_s * 1024.0,
            pcie_rx_bytes_s=None if rx_kib_s is None else rx_kib_s * 1024.0,
            pstate=None if pstate is None or pstate == getattr(nvml, "NVML_PSTATE_UNKNOWN", 32) else pstate,
            throttle_reasons=_int(reasons),
            ollama_mem_bytes=self._ollama_mem_bytes(index, h, ollama_pids),
        )

    def sample(self, now: float | None = None) -> list[GpuSample]:
        """One reading per GPU that answers; blocking (tens of ms), so call it off the event loop."""
        if self.state.kind != GpuKind.NVML:
            return []
        ts = self.clock() if now is None else now
        ollama_pids = self.processes.pids() if self.processes is not None else None
        samples: list[GpuSample] = []
        for index in range(self._count):
            try:
                samples.append(self._sample_one(index, ts, ollama_pids))
                self._lost.pop(index, None)
            except _GpuLost as exc:
                # Forget the handle: after a reset the GPU may come back under a new one.
                self._devices.pop(index, None)
                self._lost[index] = str(exc)
        if self._lost:
            lost = "; ".join(f"GPU {i} is lost ({why})" for i, why in sorted(self._lost.items()))
            others = "the other GPUs are still sampled" if len(self._lost) < self._count else "no GPU answers"
            self.state = GpuState(GpuKind.NVML, f"{lost}: {others}")
        elif self.state.message is not None:
            self.state = GpuState(GpuKind.NVML, None)
        return samples


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
