"""The amdsmi sampler over a fake amdsmi module whose shape is checked against the real package's source."""

from __future__ import annotations

from typing import Any

import pytest

from collectors.gpu.amd_smi import AmdSmiSampler
from tests.support.api_shape import AMDSMI_NAMES, installed_sources, load_snapshot, shape_of_object, shape_of_source
from tests.support.fake_amdsmi import (
    AMDSMI_STATUS_DRIVER_NOT_LOADED,
    AMDSMI_STATUS_NOT_SUPPORTED,
    NA,
    AmdSmiClkType,
    AmdSmiLibraryException,
    FakeAmdGpu,
    FakeAmdSmi,
)


def _real_shapes() -> list[dict[str, Any]]:
    """The snapshot read from the amdsmi 7.0.2 wheel, and the installed package's source where there is one."""
    shapes: list[dict[str, Any]] = [load_snapshot("amdsmi")]
    sources = installed_sources("amdsmi", ("amdsmi_interface.py", "amdsmi_exception.py"))
    if sources:
        shapes.append(shape_of_source(sources, AMDSMI_NAMES))
    return shapes


def _fake_call_keys() -> dict[str, list[str]]:
    smi = FakeAmdSmi([FakeAmdGpu()])
    smi.amdsmi_init()
    (h,) = smi.amdsmi_get_processor_handles()
    return {
        "amdsmi_get_gpu_activity": sorted(smi.amdsmi_get_gpu_activity(h)),
        "amdsmi_get_gpu_vram_usage": sorted(smi.amdsmi_get_gpu_vram_usage(h)),
        "amdsmi_get_power_info": sorted(smi.amdsmi_get_power_info(h)),
        "amdsmi_get_clk_freq": sorted(smi.amdsmi_get_clk_freq(h, AmdSmiClkType.MEM)),
        "amdsmi_get_gpu_asic_info": sorted(smi.amdsmi_get_gpu_asic_info(h)),
    }


@pytest.mark.parametrize("real", _real_shapes())
def test_fake_has_the_real_names_parameters_and_keys(real: dict[str, dict[str, Any]]) -> None:
    fake = shape_of_object(FakeAmdSmi([]), AMDSMI_NAMES)
    for name in AMDSMI_NAMES:
        if "params" in real[name]:
            assert fake[name]["params"] == real[name]["params"], name
        else:
            assert fake[name]["bases"] == real[name]["bases"], name
            assert set(fake[name]["fields"]) <= set(real[name]["fields"]), name  # enum members we use
            for method, params in fake[name]["methods"].items():
                assert real[name]["methods"][method] == params, f"{name}.{method}"
    for fn, keys in _fake_call_keys().items():
        assert keys == real[fn]["dict_keys"], fn


def _open(gpus: list[FakeAmdGpu], **kwargs: object) -> tuple[FakeAmdSmi, AmdSmiSampler]:
    smi = FakeAmdSmi(gpus, **kwargs)  # type: ignore[arg-type]
    sampler = AmdSmiSampler(smi, clock=lambda: 500.0)
    sampler.open()
    return smi, sampler


def test_every_field_in_our_units() -> None:
    _, s = _open([FakeAmdGpu()])
    assert s.state.kind == "amdsmi" and s.state.message is None
    (g,) = s.sample()
    assert (g.index, g.name, g.ts_unix_s) == (0, "AMD Radeon RX 7900 XTX", 500.0)
    assert g.uuid == "amdsmi-e1ff744c-0000-1000-8000-000000000000"
    assert (g.util_gpu_pct, g.util_mem_pct) == (93.0, 57.0)
    assert (g.mem_used_bytes, g.mem_total_bytes) == (8704 * 2**20, 24560 * 2**20)  # MB → bytes
    assert (g.power_w, g.power_limit_w, g.temperature_c) == (287.0, 355.0, 62.0)
    assert (g.mem_clock_mhz, g.mem_clock_max_mhz) == (1249, 1249)  # Hz → MHz, current level and highest
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz) == (2371, 2526)
    assert g.mem_bus_width_bits is None


def test_na_and_unsupported_are_none_not_zero() -> None:
    gpu = FakeAmdGpu(
        umc_activity=NA,
        current_socket_power_w=NA,
        power_limit_w=NA,
        unsupported={"amdsmi_get_temp_metric", "amdsmi_get_clk_freq"},
    )
    _, s = _open([gpu])
    (g,) = s.sample()
    assert g.util_gpu_pct == 93.0
    for name in ("util_mem_pct", "power_w", "power_limit_w", "temperature_c", "mem_clock_mhz", "mem_clock_max_mhz"):
        assert getattr(g, name) is None, name
    assert s.unsupported == {0: {"amdsmi_get_temp_metric", "amdsmi_get_clk_freq"}}


def test_average_socket_power_where_current_is_missing() -> None:
    _, s = _open([FakeAmdGpu(current_socket_power_w=NA, average_socket_power_w=540)])  # an MI300X reports this one
    assert s.sample()[0].power_w == 540.0


def test_init_failure_is_a_state_with_amdsmis_words() -> None:
    smi, s = _open([FakeAmdGpu()], init_error=AMDSMI_STATUS_DRIVER_NOT_LOADED)
    assert s.state.kind == "none"
    assert "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded" in (s.state.message or "")
    assert s.sample() == []
    s.close()
    assert smi.shut_down_calls == 0  # never initialised: nothing to shut down


def test_no_gpu_and_close() -> None:
    smi, s = _open([])
    assert s.state.kind == "none" and "no AMD GPU" in (s.state.message or "")
    s.close()
    assert smi.shut_down_calls == 1


def test_fake_raises_like_the_real_one() -> None:
    smi = FakeAmdSmi([FakeAmdGpu()])
    with pytest.raises(AmdSmiLibraryException) as exc:
        smi.amdsmi_get_processor_handles()  # before amdsmi_init
    assert exc.value.get_error_code() == 32 and "NOT_INIT" in str(exc.value)
    smi.amdsmi_init()
    (h,) = smi.amdsmi_get_processor_handles()
    smi.gpus[0].unsupported.add("amdsmi_get_power_info")
    with pytest.raises(AmdSmiLibraryException) as exc:
        smi.amdsmi_get_power_info(h)
    assert exc.value.err_code == AMDSMI_STATUS_NOT_SUPPORTED
