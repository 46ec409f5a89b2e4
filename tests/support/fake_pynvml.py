"""A stand-in for the ``pynvml`` module (nvidia-ml-py) that needs no NVIDIA driver.

It behaves like the real module where our sampler can tell: the same function names and
parameters (a test checks them against the installed nvidia-ml-py), the same return
shapes (the real ctypes structures and ``nvmlFriendlyObject``), the same constants, and
the *real* error classes (``pynvml.NVMLError_NotSupported`` and friends), raised the way
the real module raises them: ``Uninitialized`` before ``nvmlInit``, ``InvalidArgument``
for a bad index or enum, and ``NVMLLibraryMismatchError`` from the unversioned process
calls when the driver lacks them.

Usage::

    nvml = FakeNvml([FakeGpu(name="NVIDIA GeForce RTX 4090"), FakeGpu(lost=True)])
    source = NvmlGpuSource(nvml)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

NVMLError = _real.NVMLError
NVMLLibraryMismatchError = _real.NVMLLibraryMismatchError


@dataclass
class FakeGpu:
    """One virtual GPU; values in NVML's own units (mW, mJ, KB/s, MHz, bytes)."""

    name: str = "NVIDIA GeForce RTX 4090"
    uuid: str = "GPU-5f3c2a9e-0000-4000-8000-000000000001"
    util_gpu_pct: int = 97
    util_mem_pct: int = 61
    mem_total_bytes: int = 24 * 1024**3
    mem_used_bytes: int = 9 * 1024**3
    power_mw: int = 312_456
    power_limit_mw: int = 450_000
    energy_mj: int = 123_456_789
    temperature_c: int = 71
    sm_clock_mhz: int = 2520
    sm_clock_max_mhz: int = 3105
    mem_clock_mhz: int = 10501
    mem_clock_max_mhz: int = 10501
    mem_bus_width_bits: int = 384
    pcie_tx_kib_s: int = 1200
    pcie_rx_kib_s: int = 35_000
    pstate: int = 2
    clocks_event_reasons: int = _real.nvmlClocksEventReasonSwPowerCap
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    # NVML function names this GPU answers with NVML_ERROR_NOT_SUPPORTED.
    not_supported: set[str] = field(default_factory=set)
    # NVML function names that raise a given NVML error code (e.g. NO_PERMISSION).
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False  # every call about this GPU raises NVMLError_GpuIsLost


class _Handle:
    """Opaque device handle (the real one is a ctypes pointer)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def _raise(code: int) -> None:
    raise NVMLError(code)  # NVMLError.__new__ picks the real subclass, as in pynvml


class FakeNvml:
    """Module-like object: pass it where the sampler takes the ``pynvml`` module.

    ``init_error``: an NVML error code ``nvmlInit`` raises (e.g. ``NVML_ERROR_LIBRARY_NOT_FOUND``).
    ``missing_functions``: functions this driver lacks (raise ``FunctionNotFound``, or
    ``NVMLLibraryMismatchError`` for the unversioned process calls, as the real module does).
    """

    NVMLError = _real.NVMLError
    NVMLLibraryMismatchError = _real.NVMLLibraryMismatchError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None, missing_functions: set[str] | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.missing_functions = set(missing_functions or ())
        self.refcount = 0
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        # Constants (NVML_*, nvmlClocksEventReason*) and error classes (NVMLError_*) are the real ones.
        if name.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "c_nvml")):
            return getattr(_real, name)
        raise AttributeError(name)

    # -- helpers -----------------------------------------------------------

    def _enter(self, fn: str) -> None:
        self.calls.append(fn)
        if self.refcount == 0:
            _raise(_real.NVML_ERROR_UNINITIALIZED)
        if fn in self.missing_functions:
            _raise(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _gpu(self, fn: str, handle: Any) -> FakeGpu:
        self._enter(fn)
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            _raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            _raise(_real.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            _raise(gpu.errors[fn])
        if fn in gpu.not_supported:
            _raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- library -----------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            _raise(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            _raise(_real.NVML_ERROR_GPU_IS_LOST)
        return _Handle(index)

    # -- per device --------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return _real.c_nvmlUtilization_t(gpu=gpu.util_gpu_pct, memory=gpu.util_mem_pct)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        if version:
            mem = _real.c_nvmlMemory_v2_t()
            mem.version = version
            mem.total, mem.used, mem.free = gpu.mem_total_bytes, gpu.mem_used_bytes, gpu.mem_total_bytes - gpu.mem_used_bytes
            return mem
        return _real.c_nvmlMemory_t(
            total=gpu.mem_total_bytes, free=gpu.mem_total_bytes - gpu.mem_used_bytes, used=gpu.mem_used_bytes
        )

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor not in (_real.NVML_TEMPERATURE_GPU,):
            _raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.temperature_c

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = _real.nvmlTemperature_v1) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureV", handle)
        if version != _real.nvmlTemperature_v1:
            _raise(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor not in (_real.NVML_TEMPERATURE_GPU,):
            _raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.temperature_c

    def _clock(self, gpu: FakeGpu, type: int, *, maximum: bool) -> int:
        if type == _real.NVML_CLOCK_SM:
            return gpu.sm_clock_max_mhz if maximum else gpu.sm_clock_mhz
        if type == _real.NVML_CLOCK_MEM:
            return gpu.mem_clock_max_mhz if maximum else gpu.mem_clock_mhz
        if 0 <= type < _real.NVML_CLOCK_COUNT:
            _raise(_real.NVML_ERROR_NOT_SUPPORTED)
        _raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError  # unreachable

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return self._clock(self._gpu("nvmlDeviceGetClockInfo", handle), type, maximum=False)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return self._clock(self._gpu("nvmlDeviceGetMaxClockInfo", handle), type, maximum=True)

    def nvmlDeviceGetMemoryBusWidth(self, device: Any) -> int:
        return self._gpu("nvmlDeviceGetMemoryBusWidth", device).mem_bus_width_bits

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", device)
        if counter == _real.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kib_s
        if counter == _real.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kib_s
        _raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError  # unreachable

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_event_reasons

    def _processes(self, fn: str, handle: Any, procs: list[tuple[int, int | None]]) -> list[Any]:
        try:
            self._gpu(fn, handle)
        except _real.NVMLError_FunctionNotFound:
            # pynvml's @throwOnVersionMismatch on the unversioned process calls.
            raise NVMLLibraryMismatchError(f"Unversioned function called ... {fn}_v2") from None
        return [
            _real.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid, used in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self.gpus[handle.index] if isinstance(handle, _Handle) and 0 <= handle.index < len(self.gpus) else None
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, gpu.compute_processes if gpu else [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self.gpus[handle.index] if isinstance(handle, _Handle) and 0 <= handle.index < len(self.gpus) else None
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, gpu.graphics_processes if gpu else [])


# The functions above, for the test that holds their names and parameters against the real module.
FAKED_FUNCTIONS = sorted(n for n in vars(FakeNvml) if n.startswith("nvml"))
