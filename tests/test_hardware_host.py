"""Host bandwidth measured for real (small buffer), cached in a real file; Apple parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.hardware import apple_gpu_cores_from_system_profiler, match_gpu
from collectors import host_bandwidth as hbw

SMALL = 8 * 2**20


def test_measure_is_a_plausible_bandwidth() -> None:
    hb = hbw.measure_host_bandwidth(buffer_bytes=SMALL, runs=2, threads=2)
    # Any machine this runs on copies faster than 200 MB/s and slower than 5 TB/s.
    assert 0.2e9 < hb.bandwidth_bytes_s < 5e12
    assert hb.threads == 2 and hb.buffer_bytes == SMALL


def test_measure_rejects_tiny_buffers() -> None:
    with pytest.raises(ValueError, match="1 MiB"):
        hbw.measure_host_bandwidth(buffer_bytes=1000)


def test_cache_is_written_then_reused(tmp_path: Path) -> None:
    first = hbw.host_bandwidth(tmp_path, buffer_bytes=SMALL)
    path = tmp_path / hbw.CACHE_FILE
    assert json.loads(path.read_text())["bandwidth_bytes_s"] == first.bandwidth_bytes_s
    again = hbw.host_bandwidth(tmp_path, buffer_bytes=SMALL)
    assert again == first  # read back, not measured again (a new run would differ in time)
    fresh = hbw.host_bandwidth(tmp_path, refresh=True, buffer_bytes=SMALL)
    assert fresh.measured_unix_s >= first.measured_unix_s


def test_bad_or_foreign_cache_is_measured_again(tmp_path: Path) -> None:
    path = tmp_path / hbw.CACHE_FILE
    path.write_text("{not json")
    hb = hbw.host_bandwidth(tmp_path, buffer_bytes=SMALL)
    assert hb.bandwidth_bytes_s > 0
    assert json.loads(path.read_text())["bandwidth_bytes_s"] == hb.bandwidth_bytes_s
    # A cache from another machine (different memory size) is not trusted.
    data = json.loads(path.read_text())
    data["mem_total_bytes"] += 1
    data["bandwidth_bytes_s"] = 1.0
    path.write_text(json.dumps(data))
    assert hbw.host_bandwidth(tmp_path, buffer_bytes=SMALL).bandwidth_bytes_s != 1.0


def test_detect_apple_gpu_is_none_off_macos() -> None:
    import sys

    if sys.platform != "darwin":
        assert hbw.detect_apple_gpu() is None


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
