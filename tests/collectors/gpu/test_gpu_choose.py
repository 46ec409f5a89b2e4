"""The GPU source is chosen once at start: the first that works, with a plain reason for each one passed over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml

from collectors.gpu.choose import choose_gpu_sampler
from tests.support.fake_amdsmi import AMDSMI_STATUS_DRIVER_NOT_LOADED, FakeAmdGpu, FakeAmdSmi
from tests.support.fake_macmon import FakeMacmon
from tests.support.fake_pynvml import FakeGpu, FakeNvml
from tests.support.fake_sysfs import write_tree
from tests.support.paths import DATA

IOREG_TEXT = (DATA / "ioreg_accelerator_m2max.txt").read_text()


def _missing(name: str) -> Any:
    def load() -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}")

    return load


def _no_nvml() -> FakeNvml:
    return FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def _choose(tmp_path: Path, **kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "nvml": _no_nvml,
        "amdsmi": _missing("amdsmi"),
        "macmon": _missing("macmon"),
        "ioreg": lambda: "",
        "root": tmp_path,
        "system": "linux",
        "machine": "x86_64",
    }
    return choose_gpu_sampler(**{**args, **kwargs})


def test_nvml_first_when_it_works(tmp_path: Path) -> None:
    write_tree(tmp_path)  # an AMD card too: NVML still wins, as it always did
    choice = _choose(tmp_path, nvml=lambda: FakeNvml([FakeGpu()]), amdsmi=lambda: FakeAmdSmi([FakeAmdGpu()]))
    assert choice.sampler.name == "NVIDIA (NVML)" and choice.state.kind == "nvml"
    assert choice.passed_over == []
    assert choice.sampler.sample(now=5.0)[0].ts_unix_s == 5.0


def test_amdsmi_when_there_is_no_nvidia_driver(tmp_path: Path) -> None:
    choice = _choose(tmp_path, amdsmi=lambda: FakeAmdSmi([FakeAmdGpu()]))
    assert choice.sampler.name == "AMD (amdsmi)"
    ((name, why),) = choice.passed_over
    assert name == "NVIDIA (NVML)" and "NVML Shared Library Not Found" in why


def test_sysfs_when_amdsmi_is_missing_or_fails(tmp_path: Path) -> None:
    write_tree(tmp_path)
    for amdsmi in (_missing("amdsmi"), lambda: FakeAmdSmi([], init_error=AMDSMI_STATUS_DRIVER_NOT_LOADED)):
        choice = _choose(tmp_path, amdsmi=amdsmi)
        assert choice.sampler.name == "AMD (amdgpu sysfs)" and choice.state.kind == "amd-sysfs"
        assert [n for n, _ in choice.passed_over] == ["NVIDIA (NVML)", "AMD (amdsmi)"]
    assert "DRIVER_NOT_LOADED" in choice.passed_over[1][1]


def test_amdsmi_that_cannot_find_rocm_is_passed_over_not_raised(tmp_path: Path) -> None:
    def rocm_missing() -> Any:
        raise KeyError("libamd_smi.so")  # what the PyPI wheel raises on import without ROCm

    choice = _choose(tmp_path, amdsmi=rocm_missing)
    assert choice.sampler is None
    assert dict(choice.passed_over)["AMD (amdsmi)"] == "amdsmi (ROCm) cannot load (KeyError: 'libamd_smi.so')"


def test_macmon_on_apple_silicon(tmp_path: Path) -> None:
    choice = _choose(tmp_path, system="darwin", machine="arm64", macmon=FakeMacmon, ollama_vram_bytes=lambda: 123)
    assert choice.sampler.name == "Apple Silicon (macmon)"
    assert choice.sampler.sample()[0].ollama_mem_bytes == 123


def test_ioreg_when_macmon_is_absent(tmp_path: Path) -> None:
    choice = _choose(tmp_path, system="darwin", machine="arm64", ioreg=lambda: IOREG_TEXT)
    assert choice.sampler.name == "Apple Silicon (IORegistry)" and choice.state.kind == "ioreg"
    assert dict(choice.passed_over)["Apple Silicon (macmon)"].startswith("macmon-lib is not installed")


def test_none_says_why_for_every_source(tmp_path: Path) -> None:
    choice = _choose(tmp_path)
    assert choice.sampler is None and choice.state.kind == "none"
    assert dict(choice.passed_over) == {
        "NVIDIA (NVML)": "no NVIDIA GPU found (NVML Shared Library Not Found)",
        "AMD (amdsmi)": "amdsmi (ROCm) is not installed (No module named 'amdsmi')",
        "AMD (amdgpu sysfs)": f"no AMD card exposes {tmp_path}/class/drm/card*/device/gpu_busy_percent",
        "Apple Silicon (macmon)": "not macOS on Apple Silicon",
        "Apple Silicon (IORegistry)": "not macOS",
    }
    message = choice.state.message
    assert message.startswith("no GPU source found (NVIDIA (NVML): no NVIDIA GPU found")
    assert message.endswith("GPU charts stay empty; Phasewatch still records requests")


def test_metrics_name_the_source() -> None:
    from collectors.metrics import MetricsSnapshot, render

    text = render(MetricsSnapshot(gpu_source="AMD (amdgpu sysfs)"))
    assert 'phasewatch_gpu_source_info{source="AMD (amdgpu sysfs)"} 1' in text
    assert "phasewatch_gpu_source_info" not in render(MetricsSnapshot())
