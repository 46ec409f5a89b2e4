"""GPU sampler over NVML: the fake driver (faithful to pynvml), and the real module here."""

from __future__ import annotations

import inspect
import os

import pynvml
import pytest

from collectors.gpu.report import NO_GPU_MEANING, NvmlGpuSource
from collectors.host.sampler import OllamaProcesses
from tests.support.fake_pynvml import FAKED_FUNCTIONS, FakeGpu, FakeNvml


def _open(gpus: list[FakeGpu], **kwargs: object) -> tuple[FakeNvml, NvmlGpuSource]:
    nvml = FakeNvml(gpus, **kwargs)  # type: ignore[arg-type]
    source = NvmlGpuSource(nvml, processes=OllamaProcesses(pids=[os.getpid()]), clock=lambda: 1000.0)
    source.open()
    return nvml, source


# -- the fake is faithful -------------------------------------------------------------


@pytest.mark.parametrize("name", FAKED_FUNCTIONS)
def test_fake_functions_have_the_real_names_and_parameters(name: str) -> None:
    real = getattr(pynvml, name)
    fake = getattr(FakeNvml([]), name)
    assert list(inspect.signature(fake).parameters) == list(inspect.signature(real).parameters)


def test_fake_raises_the_real_error_classes() -> None:
    nvml = FakeNvml([FakeGpu()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()  # before nvmlInit, like the real module
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert nvml.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)


# -- sampling ------------------------------------------------------------------------


def test_every_field_is_read_in_our_units() -> None:
    gpu = FakeGpu(
        compute_processes=[(os.getpid(), 5 * 1024**3), (1, 3 * 1024**3)],
        graphics_processes=[(os.getpid(), 5 * 1024**3)],  # same process in both lists: counted once
    )
    _, source = _open([gpu])
    assert source.state.kind == "nvml" and source.state.message is None
    (s,) = source.sample()
    assert (s.index, s.name, s.uuid, s.ts_unix_s, s.simulated) == (0, gpu.name, gpu.uuid, 1000.0, False)
    assert (s.util_gpu_pct, s.util_mem_pct) == (97.0, 61.0)
    assert (s.mem_used_bytes, s.mem_total_bytes) == (gpu.mem_used_bytes, gpu.mem_total_bytes)
    assert s.power_w == pytest.approx(312.456) and s.power_limit_w == pytest.approx(450.0)
    assert s.energy_j == pytest.approx(123456.789)
    assert s.temperature_c == 71.0
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz, s.mem_clock_mhz, s.mem_clock_max_mhz) == (2520, 3105, 10501, 10501)
    assert s.mem_bus_width_bits == 384
    assert s.pcie_tx_bytes_s == 1200 * 1024 and s.pcie_rx_bytes_s == 35_000 * 1024
    assert s.pstate == 2
    assert s.throttle_reasons == pynvml.nvmlClocksEventReasonSwPowerCap
    assert s.ollama_mem_bytes == 5 * 1024**3  # pid 1 is not Ollama
    assert source.unsupported == {}


def test_unsupported_fields_are_none_and_the_rest_still_read() -> None:
    gpu = FakeGpu(
        not_supported={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetMemoryBusWidth",
        },
        errors={
            "nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_UNKNOWN,
        },
    )
    _, source = _open([gpu])
    (s,) = source.sample()
    assert s.power_w is None and s.energy_j is None and s.power_limit_w is None
    assert s.pcie_tx_bytes_s is None and s.pcie_rx_bytes_s is None and s.mem_bus_width_bits is None
    assert s.util_gpu_pct is None and s.util_mem_pct is None
    assert s.mem_used_bytes == gpu.mem_used_bytes and s.temperature_c == 71.0 and s.sm_clock_mhz == 2520
    assert "nvmlDeviceGetPowerUsage" in source.unsupported[0]
    assert "nvmlDeviceGetEnforcedPowerLimit" in source.unsupported[0]


def test_older_driver_falls_back_and_missing_process_calls_give_none() -> None:
    nvml, source = _open(
        [FakeGpu(clocks_event_reasons=pynvml.nvmlClocksEventReasonHwThermalSlowdown)],
        missing_functions={
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        },
    )
    (s,) = source.sample()
    assert s.throttle_reasons == pynvml.nvmlClocksEventReasonHwThermalSlowdown  # via the pre-12.2 name
    assert s.temperature_c == 71.0  # via the deprecated nvmlDeviceGetTemperature
    assert s.ollama_mem_bytes is None  # NVMLLibraryMismatchError → unknown, not 0
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


def test_unknown_pstate_is_none() -> None:
    _, source = _open([FakeGpu(pstate=pynvml.NVML_PSTATE_UNKNOWN)])
    assert source.sample()[0].pstate is None


def test_a_lost_gpu_does_not_stop_the_others_and_comes_back() -> None:
    nvml, source = _open([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    assert [s.uuid for s in source.sample()] == ["GPU-a", "GPU-b"]
    nvml.gpus[0].lost = True
    assert [s.uuid for s in source.sample()] == ["GPU-b"]
    assert source.state.kind == "nvml"
    assert source.state.message is not None and "GPU 0 is lost" in source.state.message
    assert "other GPUs are still sampled" in source.state.message
    nvml.gpus[0].lost = False  # reset
    assert [s.uuid for s in source.sample()] == ["GPU-a", "GPU-b"]
    assert source.state.message is None


def test_several_gpus_are_sampled_separately() -> None:
    _, source = _open([FakeGpu(uuid="GPU-a", power_mw=100_000), FakeGpu(uuid="GPU-b", power_mw=250_000, name="NVIDIA A100")])
    a, b = source.sample()
    assert (a.index, a.uuid, a.power_w) == (0, "GPU-a", 100.0)
    assert (b.index, b.uuid, b.name, b.power_w) == (1, "GPU-b", "NVIDIA A100", 250.0)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_no_driver_is_a_clear_state(code: int, reason: str) -> None:
    nvml, source = _open([FakeGpu()], init_error=code)
    assert source.state.kind == "none"
    assert source.state.message == f"no NVIDIA GPU found ({reason}): {NO_GPU_MEANING}"
    assert source.sample() == []
    source.close()  # must not call nvmlShutdown on a library that never started
    assert "nvmlShutdown" not in nvml.calls


def test_no_gpus_and_other_init_failures_are_states_too() -> None:
    _, source = _open([])
    assert source.state.kind == "none" and "reports no GPU" in (source.state.message or "")
    _, source = _open([FakeGpu()], init_error=pynvml.NVML_ERROR_NO_PERMISSION)
    assert source.state.kind == "none" and "Insufficient Permissions" in (source.state.message or "")


def test_close_shuts_nvml_down() -> None:
    nvml, source = _open([FakeGpu()])
    source.sample()
    source.close()
    assert nvml.refcount == 0
    assert source.sample() == []  # after close: no handles, no crash
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_real_pynvml_on_this_machine() -> None:
    """This machine has no NVIDIA driver: the real module must give the "no NVIDIA GPU" state.

    On a machine with a driver it must read every GPU instead.
    """
    source = NvmlGpuSource(pynvml, processes=OllamaProcesses())
    state = source.open()
    try:
        if state.kind == "none":
            assert state.message is not None
            assert state.message.startswith("no NVIDIA GPU found (")
            assert NO_GPU_MEANING in state.message
            assert source.sample() == []
        else:
            samples = source.sample()
            assert samples and all(s.uuid and s.mem_total_bytes for s in samples)
    finally:
        source.close()
