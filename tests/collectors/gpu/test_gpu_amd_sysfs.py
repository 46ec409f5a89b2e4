"""The AMD sysfs reader over a fake tree (as client_python tests its process collector over a fake /proc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.gpu.amd_sysfs import AmdSysfsSampler, find_cards, parse_dpm
from tests.support.fake_sysfs import FakeCard, write_tree
from tests.support.paths import REPO


def _sampler(root: Path, **kwargs: object) -> AmdSysfsSampler:
    s = AmdSysfsSampler(root, clock=lambda: 1000.0, **kwargs)  # type: ignore[arg-type]
    s.open()
    return s


def test_every_field_in_our_units(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    s = _sampler(root)
    assert s.state.kind == "amd-sysfs" and s.state.message is None
    (g,) = s.sample()
    assert (g.index, g.name, g.uuid, g.ts_unix_s, g.simulated) == (
        0,
        "AMD Radeon RX 7900 XTX",
        "amd-sysfs-0000:03:00.0",
        1000.0,
        False,
    )
    assert (g.util_gpu_pct, g.util_mem_pct) == (87.0, 41.0)
    assert (g.mem_used_bytes, g.mem_total_bytes) == (9_126_805_504, 25_753_026_560)
    assert (g.power_w, g.power_limit_w) == (291.0, 355.0)  # µW → W
    assert g.temperature_c == 61.0  # the edge sensor, m°C → °C
    assert (g.mem_clock_mhz, g.mem_clock_max_mhz) == (1249, 1249)
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz) == (2371, 2526)
    assert g.mem_bus_width_bits is None  # sysfs does not say
    assert s.unreadable == {}


def test_dpm_table_current_and_highest() -> None:
    assert parse_dpm("0: 96Mhz\n1: 456Mhz *\n2: 1249Mhz\n") == (456, 1249)
    assert parse_dpm("0: 96Mhz\n1: 456Mhz\n") == (None, 456)  # no level marked: current unknown, not 0
    assert parse_dpm("") == (None, None)
    assert parse_dpm("S: 19Mhz *\n0: 100Mhz\n") == (None, 100)  # the sleep level line is not a clock level


def test_missing_files_are_none_not_zero(tmp_path: Path) -> None:
    card = FakeCard(mem_busy_pct=None, mclk=None, sclk=None, power_average_uw=None, power_cap_uw=None, temps_mc={})
    s = _sampler(write_tree(tmp_path, card))
    (g,) = s.sample()
    assert g.util_gpu_pct == 87.0
    for name in (
        "util_mem_pct",
        "mem_clock_mhz",
        "mem_clock_max_mhz",
        "sm_clock_mhz",
        "power_w",
        "power_limit_w",
        "temperature_c",
    ):
        assert getattr(g, name) is None, name
    assert s.unreadable == {}  # absent files are the driver's choice, not a fault


def test_power_input_when_there_is_no_average(tmp_path: Path) -> None:
    s = _sampler(write_tree(tmp_path, FakeCard(power_average_uw=None, power_input_uw=150_500_000)))
    assert s.sample()[0].power_w == 150.5


def test_card_without_hwmon(tmp_path: Path) -> None:
    s = _sampler(write_tree(tmp_path, FakeCard(hwmon=False)))
    (g,) = s.sample()
    assert (g.power_w, g.power_limit_w, g.temperature_c) == (None, None, None)
    assert (g.util_gpu_pct, g.mem_clock_mhz) == (87.0, 1249)


def test_permission_errors_leave_the_field_none_and_say_why(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    denied = {"mem_info_vram_used", "power1_average"}

    def read(path: Path) -> str:
        if path.name in denied:  # as a non-root user meets a 0600 file (the tests run as root, so chmod would not bite)
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    s = _sampler(root, read=read)
    (g,) = s.sample()
    assert g.mem_used_bytes is None and g.power_w is None
    assert g.mem_total_bytes == 25_753_026_560 and g.power_limit_w == 355.0
    assert sorted(Path(p).name for p in s.unreadable) == sorted(denied)
    assert set(s.unreadable.values()) == {"Permission denied"}
    denied.clear()  # permission given back: the reading returns and the complaint goes
    assert s.sample()[0].mem_used_bytes == 9_126_805_504 and s.unreadable == {}


def test_garbage_in_a_file_is_none_and_reported(tmp_path: Path) -> None:
    root = write_tree(tmp_path)
    (root / "class/drm/card1/device/gpu_busy_percent").write_text("busy\n")
    s = _sampler(root)
    assert s.sample()[0].util_gpu_pct is None
    assert list(s.unreadable.values()) == ["not a number: 'busy'"]


def test_several_cards_in_card_number_order_connectors_skipped(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        FakeCard(number=10, product_name=None, pci_slot="0000:0a:00.0", busy_pct=5),
        FakeCard(number=2, product_name="AMD Radeon PRO W7900", pci_slot="0000:03:00.0", busy_pct=99),
    )
    assert [p.parent.name for p in find_cards(root)] == ["card2", "card10"]  # not card0 (no gpu_busy_percent), no DP-1
    a, b = _sampler(root).sample()
    assert (a.index, a.name, a.util_gpu_pct) == (0, "AMD Radeon PRO W7900", 99.0)
    assert (b.index, b.name, b.util_gpu_pct) == (1, "AMD GPU 1002:744c", 5.0)  # no product_name: the PCI id
    assert a.uuid != b.uuid


def test_no_card_is_a_state_with_the_path_tried(tmp_path: Path) -> None:
    s = _sampler(tmp_path)  # an empty tree: no class/drm at all
    assert s.state.kind == "none"
    assert str(tmp_path / "class/drm/card*/device/gpu_busy_percent") in (s.state.message or "")
    assert s.sample() == []


def test_cli_json_reports_the_fake_card(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "sys")
    env = {**os.environ, "PHASEWATCH_SYSFS_ROOT": str(root)}
    out = subprocess.run(
        [sys.executable, "-m", "collectors.gpu", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["source"] == "AMD (amdgpu sysfs)"
    assert report["state"] == {"kind": "amd-sysfs", "message": None}
    (g,) = report["samples"]
    assert (g["name"], g["util_gpu_pct"], g["mem_clock_mhz"], g["power_w"]) == ("AMD Radeon RX 7900 XTX", 87.0, 1249, 291.0)
    # NVML and amdsmi were tried first and each says why it was passed over (no NVIDIA driver, no ROCm here).
    assert [p["source"] for p in report["passed_over"]] == ["NVIDIA (NVML)", "AMD (amdsmi)"]
    assert all(p["why"] for p in report["passed_over"])


def test_cli_says_why_no_source_was_found(tmp_path: Path) -> None:
    env = {**os.environ, "PHASEWATCH_SYSFS_ROOT": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "collectors.gpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("No GPU source found. Tried:")
    for source in ("NVIDIA (NVML):", "AMD (amdsmi):", "AMD (amdgpu sysfs): no AMD card exposes", "Apple Silicon (macmon):"):
        assert source in out.stdout


@pytest.mark.parametrize("label_order", [("junction", "edge"), ("mem", "junction")])
def test_temperature_prefers_edge_then_junction(tmp_path: Path, label_order: tuple[str, str]) -> None:
    temps = {label_order[0]: 80_000, label_order[1]: 60_000}
    s = _sampler(write_tree(tmp_path, FakeCard(temps_mc=temps)))
    assert s.sample()[0].temperature_c == 60.0  # the preferred label (edge, else junction) wins over the hotter one


def test_bandwidth_cross_check_falls_back_to_the_table_and_says_so(tmp_path: Path) -> None:
    from analysis.accelerator import resolve_hardware
    from pages.why.view import hardware_line

    (g,) = _sampler(write_tree(tmp_path)).sample()
    hw = resolve_hardware(g)
    assert hw.spec is not None and hw.spec.key == "rx-7900-xtx"
    assert hw.bandwidth is not None and hw.bandwidth.source == "table"
    assert hw.bandwidth_bytes_s == hw.spec.bandwidth_bytes_s
    assert any("not the bus width" in n and "datasheet" in n for n in hw.notes)
    line = hardware_line(hw)
    assert "(datasheet)" in line and "memory clock now 1,249 of 1,249 MHz" in line


def test_ollama_share_from_api_ps_with_one_card_only(tmp_path: Path) -> None:
    one = AmdSysfsSampler(write_tree(tmp_path / "one"), ollama_vram_bytes=lambda: 3_000_000_000)
    one.open()
    assert one.sample()[0].ollama_mem_bytes == 3_000_000_000
    two = AmdSysfsSampler(write_tree(tmp_path / "two", FakeCard(number=1), FakeCard(number=2)), ollama_vram_bytes=lambda: 3)
    two.open()
    assert [g.ollama_mem_bytes for g in two.sample()] == [None, None]  # which card holds it is unknown: not guessed
