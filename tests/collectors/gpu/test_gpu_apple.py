"""Apple Silicon: the macmon-lib sampler over a fake checked against the real package, and the IORegistry parser."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from collectors.gpu.apple import IoregSampler, MacmonSampler, parse_ioreg
from tests.support import fake_macmon
from tests.support.api_shape import MACMON_NAMES, installed_sources, load_snapshot, shape_of_object, shape_of_source
from tests.support.fake_macmon import FakeMacmon, SamplingFailedError, decode_metrics
from tests.support.paths import DATA

IOREG_TEXT = (DATA / "ioreg_accelerator_m2max.txt").read_text()
OLLAMA_VRAM = 38_000_000_000


def _real_shapes() -> list[dict[str, Any]]:
    shapes: list[dict[str, Any]] = [load_snapshot("macmon")]
    sources = installed_sources("macmon", ("__init__.py",))
    if sources:
        shapes.append(shape_of_source(sources, MACMON_NAMES))
    return shapes


@pytest.mark.parametrize("real", _real_shapes())
def test_fake_has_the_real_classes_fields_and_errors(real: dict[str, dict[str, Any]]) -> None:
    fake = shape_of_object(FakeMacmon(), MACMON_NAMES)
    for name in MACMON_NAMES:
        if "params" in real[name]:
            assert fake[name]["params"] == real[name]["params"], name
            continue
        assert fake[name]["bases"] == real[name]["bases"], name
        assert fake[name]["fields"] == real[name]["fields"], name
        for method, params in fake[name]["methods"].items():
            assert real[name]["methods"][method] == params, f"{name}.{method}"


def _macmon(**kwargs: object) -> tuple[FakeMacmon, MacmonSampler]:
    mod = FakeMacmon(**kwargs)  # type: ignore[arg-type]
    s = MacmonSampler(mod, ollama_vram_bytes=lambda: OLLAMA_VRAM, clock=lambda: 700.0)
    s.open()
    return mod, s


def test_macmon_fields_in_our_units() -> None:
    _, s = _macmon()
    assert s.state.kind == "macmon" and s.name == "Apple Silicon (macmon)"
    (g,) = s.sample()
    assert (g.name, g.index, g.ts_unix_s) == ("Apple M2 Max", 0, 700.0)
    assert g.util_gpu_pct == pytest.approx(92.0)  # active ratio 0.92 → %
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz) == (1398, 1398)
    assert (g.power_w, g.temperature_c) == (21.4, 58.5)
    # Unified memory: Ollama's share of system memory is the "VRAM" line; the total is the system memory.
    assert (g.ollama_mem_bytes, g.mem_total_bytes, g.mem_used_bytes) == (OLLAMA_VRAM, 64 * 2**30, None)
    assert (g.mem_clock_mhz, g.util_mem_pct, g.mem_bus_width_bits) == (None, None, None)


def test_macmon_no_temperature_sensor_is_none() -> None:
    _, s = _macmon(readings=[decode_metrics(gpu_temp_c=0.0)])
    assert s.sample()[0].temperature_c is None


def test_macmon_failed_read_is_a_message_then_recovers() -> None:
    _, s = _macmon(readings=[SamplingFailedError("IOReport subscription lost"), decode_metrics()])
    assert s.sample() == []
    assert s.state.kind == "macmon" and "IOReport subscription lost" in (s.state.message or "")
    assert len(s.sample()) == 1 and s.state.message is None


def test_macmon_init_failure_is_a_state() -> None:
    mod, s = _macmon(init_error=fake_macmon.InitializationFailedError("IOReport channel not found"))
    assert s.state.kind == "none" and "IOReport channel not found" in (s.state.message or "")
    assert s.sample() == []
    s.close()
    assert mod.closed == 0


def test_ioreg_parse_real_looking_output() -> None:
    (r,) = parse_ioreg(IOREG_TEXT)
    assert (r.model, r.gpu_cores) == ("Apple M2 Max", 38)
    assert r.stats["Device Utilization %"] == 91 and r.stats["In use system memory"] == 9_428_598_784
    assert parse_ioreg("") == [] and parse_ioreg("+-o IOAccelerator  <class X>\n    {\n    }\n") == []


def test_ioreg_sampler() -> None:
    s = IoregSampler(lambda: IOREG_TEXT, ollama_vram_bytes=lambda: OLLAMA_VRAM, ram_total_bytes=64 * 2**30, clock=lambda: 9.0)
    assert s.open().kind == "ioreg"
    (g,) = s.sample()
    assert (g.name, g.util_gpu_pct, g.mem_used_bytes, g.ollama_mem_bytes) == ("Apple M2 Max", 91.0, 9_428_598_784, OLLAMA_VRAM)
    assert (g.power_w, g.temperature_c, g.sm_clock_mhz) == (None, None, None)  # the IORegistry has none of these


def test_ioreg_failure_says_why() -> None:
    def fail() -> str:
        raise subprocess.TimeoutExpired(["ioreg"], 2.0)

    s = IoregSampler(fail)
    assert s.open().kind == "none" and "ioreg failed" in (s.state.message or "")
