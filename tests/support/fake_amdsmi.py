"""A fake of ROCm's ``amdsmi`` Python module, built from amdsmi 7.0.2's source (``amdsmi_interface.py``).

Same function names and parameters, same dict keys, the same "N/A" text for an absent
reading, and errors raised as ``AmdSmiLibraryException(status)`` with amdsmi's status codes
and message text. ``tests/collectors/gpu/test_gpu_amdsmi.py`` checks its shape against the real package's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
_ERR_INFO = {
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    AMDSMI_STATUS_NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}
NA = "N/A"  # what amdsmi puts in a dict for a reading the GPU does not give


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.set_err_info()

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code

    def set_err_info(self) -> None:
        self.err_info = _ERR_INFO.get(self.err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0  # an alias of SYS in amdsmi too
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


@dataclass
class FakeAmdGpu:
    """One GPU as amdsmi reports it (an RX 7900 XTX at work by default)."""

    market_name: str = "AMD Radeon RX 7900 XTX"
    uuid: str = "e1ff744c-0000-1000-8000-000000000000"
    gfx_activity: int | str = 93
    umc_activity: int | str = 57
    vram_total_mb: int = 24560
    vram_used_mb: int = 8704
    socket_power_w: int | str = NA  # amdsmi 7 on RDNA3 fills current_socket_power
    current_socket_power_w: int | str = 287
    average_socket_power_w: int | str = NA
    power_limit_w: int | str = 355
    mem_freqs_hz: list[int] = field(default_factory=lambda: [96_000_000, 456_000_000, 772_000_000, 1_249_000_000])
    mem_current: int = 3
    gfx_freqs_hz: list[int] = field(default_factory=lambda: [500_000_000, 2_371_000_000, 2_526_000_000])
    gfx_current: int = 1
    edge_temp_c: int = 62
    unsupported: set[str] = field(default_factory=set)  # functions that raise AMDSMI_STATUS_NOT_SUPPORTED


class _Handle:
    """Stands in for amdsmi_wrapper.amdsmi_processor_handle."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakeAmdSmi:
    """The ``amdsmi`` module over a list of FakeAmdGpu."""

    def __init__(self, gpus: list[FakeAmdGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False
        self.shut_down_calls = 0

    def _gpu(self, fn: str, processor_handle: Any) -> FakeAmdGpu:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        gpu = self.gpus[processor_handle.index]
        if fn in gpu.unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return gpu

    def amdsmi_init(self, flag: int = 2) -> None:  # AmdSmiInitFlags.INIT_AMD_GPUS
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialized = True

    def amdsmi_shut_down(self) -> None:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        self.initialized = False
        self.shut_down_calls += 1

    def amdsmi_get_processor_handles(self) -> list[_Handle]:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        return [_Handle(i) for i in range(len(self.gpus))]

    def amdsmi_get_gpu_asic_info(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_asic_info", processor_handle)
        return {
            "market_name": g.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x744c",
            "rev_id": "0xc8",
            "asic_serial": "0x0000000000000000",
            "oam_id": NA,
            "num_compute_units": 96,
            "target_graphics_version": "gfx1100",
            "subsystem_id": "0x0e3b",
        }

    def amdsmi_get_gpu_device_uuid(self, processor_handle: Any) -> str:
        return self._gpu("amdsmi_get_gpu_device_uuid", processor_handle).uuid

    def amdsmi_get_gpu_activity(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_activity", processor_handle)
        return {"gfx_activity": g.gfx_activity, "umc_activity": g.umc_activity, "mm_activity": NA}

    def amdsmi_get_gpu_vram_usage(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_gpu_vram_usage", processor_handle)
        return {"vram_total": g.vram_total_mb, "vram_used": g.vram_used_mb}

    def amdsmi_get_power_info(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_power_info", processor_handle)
        return {
            "socket_power": g.socket_power_w,
            "current_socket_power": g.current_socket_power_w,
            "average_socket_power": g.average_socket_power_w,
            "gfx_voltage": 1050,
            "soc_voltage": 850,
            "mem_voltage": 1250,
            "power_limit": g.power_limit_w,
        }

    def amdsmi_get_clk_freq(self, processor_handle: Any, clk_type: AmdSmiClkType) -> dict[str, Any]:
        g = self._gpu("amdsmi_get_clk_freq", processor_handle)
        if not isinstance(clk_type, AmdSmiClkType):
            raise AmdSmiException(f"{clk_type!r} is not an AmdSmiClkType")  # the real one: AmdSmiParameterException
        freqs, current = (g.mem_freqs_hz, g.mem_current) if clk_type == AmdSmiClkType.MEM else (g.gfx_freqs_hz, g.gfx_current)
        return {"num_supported": len(freqs), "current": current, "frequency": list(freqs)}

    def amdsmi_get_temp_metric(
        self, processor_handle: Any, sensor_type: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric
    ) -> int:
        g = self._gpu("amdsmi_get_temp_metric", processor_handle)
        if sensor_type != AmdSmiTemperatureType.EDGE or metric != AmdSmiTemperatureMetric.CURRENT:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g.edge_temp_c


# The module's classes as attributes (set here: in the class body they would shadow the annotations' types).
for _cls in (AmdSmiException, AmdSmiLibraryException, AmdSmiClkType, AmdSmiTemperatureType, AmdSmiTemperatureMetric):
    setattr(FakeAmdSmi, _cls.__name__, _cls)
FAKED_FUNCTIONS = tuple(n for n in vars(FakeAmdSmi) if n.startswith("amdsmi_"))
