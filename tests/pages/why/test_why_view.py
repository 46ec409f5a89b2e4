"""The Why page's hardware resolution and lines, without Streamlit: which GPU row, which bandwidth, and why."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from analysis.accelerator import resolve_hardware
from analysis.hardware import BY_KEY, GB
from analysis.records import HostBandwidth
from bench.pages_fixture import gpu_sample
from pages.why.view import build_why, hardware_line, model_choices
from store.ops import PutGpuSamples, PutHostBandwidth
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import MODEL, PLAIN, build_store


def test_nvml_bandwidth_agreeing_with_the_table_is_used_and_its_sum_shown() -> None:
    s = replace(gpu_sample(0.0, 50.0), mem_bus_width_bits=384, mem_clock_mhz=10251)
    hw = resolve_hardware(s)
    assert hw.spec is not None and hw.spec.key == "rtx-4090"
    assert hw.bandwidth is not None and hw.bandwidth.source == "nvml"
    assert hw.bandwidth_bytes_s == 2 * 10501e6 * 384 / 8
    line = hardware_line(hw)
    assert "NVML: 2 × 10,501 MHz × 384 bit ÷ 8" in line and "memory clock now 10,251 of 10,501 MHz" in line
    assert not hw.notes


def test_nvml_far_from_the_datasheet_keeps_the_datasheet_and_says_so() -> None:
    # A card whose NVML max memory clock reads low (a vBIOS quirk): 2 × 7,000 MHz × 384 bit ÷ 8 = 672 GB/s.
    s = replace(gpu_sample(0.0, 50.0), mem_bus_width_bits=384, mem_clock_max_mhz=7000)
    hw = resolve_hardware(s)
    assert hw.bandwidth_bytes_s == BY_KEY["rtx-4090"].bandwidth_bytes_s
    assert any("672 GB/s" in n and "1008 GB/s" in n and "using the datasheet figure" in n for n in hw.notes)
    assert "(datasheet)" in hardware_line(hw)


def test_a_gpu_missing_from_the_table_gets_nvml_bandwidth_and_no_prefill_ceiling() -> None:
    s = replace(gpu_sample(0.0, 50.0, name="NVIDIA Quantum X9000"), mem_bus_width_bits=256)
    hw = resolve_hardware(s)
    assert hw.spec is None and hw.bandwidth_bytes_s == 2 * 10501e6 * 256 / 8
    assert any("not in Phasewatch's hardware table" in n and "no prefill ceiling" in n for n in hw.notes)
    no_clock = resolve_hardware(replace(s, mem_clock_max_mhz=None))
    assert no_clock.bandwidth_bytes_s is None and any("no ceilings to draw" in n for n in no_clock.notes)


def test_apple_chip_and_cpu_fallbacks() -> None:
    hw = resolve_hardware(None, apple_chip=("Apple M3 Max", 30))
    assert hw.kind == "apple" and hw.spec is not None and hw.spec.key == "m3-max-30c"
    assert hw.bandwidth_bytes_s == 300 * GB
    measured = resolve_hardware(None, host_bandwidth=lambda: 55e9)
    assert measured.kind == "cpu" and measured.bandwidth_bytes_s == 55e9 and "measured on this machine" in hardware_line(measured)
    unmeasured = resolve_hardware(None)
    assert unmeasured.bandwidth_bytes_s == BY_KEY["cpu"].bandwidth_bytes_s
    assert any("could not be measured" in n for n in unmeasured.notes)


def test_unknown_gpu_still_draws_the_measured_points(tmp_path: Path) -> None:
    now = time.time()
    build_store(tmp_path, now, reqs=PLAIN[:4])
    known = build_why(db_path(tmp_path), "llama3.2:latest", now)
    assert known is not None and known.ceilings is not None and known.sentences
    other = tmp_path / "other"
    other.mkdir()
    build_store(other, now, reqs=PLAIN[:4], gpu=False)
    w_ = StoreWriter(db_path(other))
    try:  # the GPU of the readings' time is one the table does not know, with no clocks
        w_.write(PutGpuSamples([replace(gpu_sample(now - 600, 50.0, name="NVIDIA Quantum X9000"), mem_clock_max_mhz=None)]))
    finally:
        w_.close()
    m = build_why(db_path(other), "llama3.2:latest", now)
    assert m is not None and m.hardware.spec is None and m.ceilings is None and not m.sentences
    assert len(m.prefill_points) == 4 and m.ratio == known.ratio
    prefill = m.prefill_fig.to_dict()
    assert [t["name"] for t in prefill["data"]] == ["measured (one per request)"]


def test_model_choices_newest_first_then_loaded_without_tag_duplicates(tmp_path: Path) -> None:
    now = time.time()
    reqs = [replace(PLAIN[0], model="llama3.2", offset_s=10), replace(PLAIN[1], model="qwen2.5:0.5b", offset_s=50)]
    build_store(tmp_path, now, reqs=reqs)  # loads llama3.2:latest: the same model as the requests' "llama3.2"
    assert model_choices(db_path(tmp_path)) == ["llama3.2", "qwen2.5:0.5b"]
    m = build_why(db_path(tmp_path), "llama3.2", now)
    assert m is not None and m.facts is not None and m.loaded is not None  # /api/show and /api/ps found under the tag
    assert model_choices(tmp_path / "elsewhere.db") is None


def test_the_apple_chip_comes_from_the_store_not_from_the_page(tmp_path: Path) -> None:
    # The collector reads the chip (sysctl, system_profiler) and stores it beside the host's bandwidth; the Why
    # view explains with it where no GPU sample says more (here: an Apple chip on a machine that is not a Mac).
    now = time.time()
    build_store(tmp_path, now, gpu=False)
    w = StoreWriter(db_path(tmp_path))
    try:
        chip = HostBandwidth(400e9, now - 10, 2**28, 8, 3, 16, 64 * 2**30, apple_chip="Apple M3 Max", apple_gpu_cores=40)
        w.write(PutHostBandwidth(chip))
    finally:
        w.close()
    m = build_why(db_path(tmp_path), MODEL, now, 3600)
    assert m is not None
    assert m.hardware.kind == "apple" and m.hardware.label == "Apple M3 Max (40-core GPU)"
    assert m.hardware.spec is not None and m.hardware.spec.key == "m3-max"
