"""Host bandwidth measured for real (small buffer); Apple parsing. (The collector stores it: test_collector_service.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from analysis.hardware import apple_gpu_cores_from_system_profiler, match_gpu
from collectors.host import bandwidth as hbw

SMALL = 8 * 2**20


def test_measure_is_a_plausible_bandwidth() -> None:
    hb = hbw.measure_host_bandwidth(buffer_bytes=SMALL, runs=2, threads=2)
    # Any machine this runs on copies faster than 200 MB/s and slower than 5 TB/s.
    assert 0.2e9 < hb.bandwidth_bytes_s < 5e12
    assert hb.threads == 2 and hb.buffer_bytes == SMALL


def test_measure_rejects_tiny_buffers() -> None:
    with pytest.raises(ValueError, match="1 MiB"):
        hbw.measure_host_bandwidth(buffer_bytes=1000)


def test_same_machine_is_told_by_cpu_count_and_memory() -> None:
    hb = hbw.measure_host_bandwidth(buffer_bytes=SMALL, runs=1, threads=1)
    assert hbw.same_machine(hb)
    assert not hbw.same_machine(replace(hb, mem_total_bytes=hb.mem_total_bytes + 1))
    assert not hbw.same_machine(replace(hb, cpu_count=hb.cpu_count + 1))


def test_detect_apple_gpu_is_none_off_macos() -> None:
    import sys

    from collectors.gpu.apple import detect_apple_gpu

    if sys.platform != "darwin":
        assert detect_apple_gpu() is None


def test_system_profiler_cores() -> None:
    report = {
        "SPDisplaysDataType": [
            {
                "_name": "kHW_AppleM3MaxItem",
                "sppci_model": "Apple M3 Max",
                "sppci_cores": "30",
                "sppci_device_type": "spdisplays_gpu",
            }
        ]
    }
    cores = apple_gpu_cores_from_system_profiler(report)
    assert cores == 30
    assert match_gpu("Apple M3 Max", gpu_cores=cores).key == "m3-max-30c"  # type: ignore[union-attr]
    assert apple_gpu_cores_from_system_profiler({"SPDisplaysDataType": [{"sppci_model": "AMD Radeon Pro 5500M"}]}) is None
    assert apple_gpu_cores_from_system_profiler({"SPDisplaysDataType": [{"sppci_model": "Apple M1", "sppci_cores": "x"}]}) is None
    assert apple_gpu_cores_from_system_profiler([]) is None
