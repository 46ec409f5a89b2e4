"""Spec table and name matching against names NVML and the OS really report."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.hardware import (
    BY_KEY,
    GB,
    SPECS,
    HardwareSpec,
    apple_chip_name,
    choose_bandwidth,
    close_matches,
    match_gpu,
    nvml_bandwidth_bytes_s,
    resolve_spec,
    spec_by_key,
)

# Keys sim/ and earlier code rely on must stay.
ORIGINAL_KEYS = [
    "rtx-3060",
    "rtx-3070",
    "rtx-3080",
    "rtx-3090",
    "rtx-4060-ti-16gb",
    "rtx-4070",
    "rtx-4080",
    "rtx-4090",
    "rtx-5090",
    "a100-80gb",
    "h100-sxm",
    "h200",
    "m1",
    "m1-max",
    "m2-ultra",
    "m3-max",
    "cpu",
]


def test_original_keys_kept() -> None:
    for key in ORIGINAL_KEYS:
        assert spec_by_key(key).key == key


def test_keys_unique_and_values_sane() -> None:
    assert len(BY_KEY) == len(SPECS)
    for s in SPECS:
        assert 1 * GB <= s.memory_bytes <= 600 * GB, s.key
        assert 50 * GB <= s.bandwidth_bytes_s <= 10_000 * GB, s.key
        assert 0.5e12 <= s.fp16_flops <= 3e15, s.key
        for eta in (s.eta_bw_quant, s.eta_bw_f16, s.eta_compute):
            assert 0.2 <= eta <= 0.95, s.key


def test_physics_section_5_values() -> None:
    expected = {  # key: (GB/s, dense FP16 TFLOPS) from datasheets (docs/physics.md §8)
        "rtx-3090": (936, 142),
        "rtx-4090": (1008, 330),
        "rtx-a6000": (768, 154.8),
        "l40s": (864, 362),
        "a100-40gb": (1555, 312),
        "a100-80gb": (2039, 312),
        "h100-sxm": (3350, 989),
        "h100-pcie": (2000, 756),
        "h200": (4800, 989),
        "rx-7900-xtx": (960, 122.8),
        "m2-ultra": (800, 27.2),
        "m4-max": (546, 18),
        "m4-max-32c": (410, 14.4),
        "m3-max-30c": (300, 12),
    }
    for key, (bw, tf) in expected.items():
        s = spec_by_key(key)
        assert s.bandwidth_bytes_s == pytest.approx(bw * GB), key
        assert s.fp16_flops == pytest.approx(tf * 1e12, rel=0.01), key


def test_table_covers_the_families() -> None:
    keys = set(BY_KEY)
    for series in (
        "rtx-2080-ti",
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "rtx-a6000",
        "rtx-6000-ada",
        "v100-sxm2-32gb",
        "a100-80gb",
        "h100-sxm",
        "h200",
        "l40s",
        "rx-7900-xtx",
        "cpu",
    ):
        assert series in keys
    for gen in "1234":
        for tier in ("", "-pro", "-max"):
            assert f"m{gen}{tier}" in keys
    for gen in "123":
        assert f"m{gen}-ultra" in keys


@pytest.mark.parametrize(
    ("reported", "key"),
    [
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("nvidia  geforce   rtx4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "rtx-4070-ti-super"),
        ("NVIDIA GeForce RTX 4070 Ti", "rtx-4070-ti"),
        ("NVIDIA GeForce RTX 4070", "rtx-4070"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("Quadro RTX 6000", "quadro-rtx-6000"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie-32gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H200", "h200"),
        ("Apple M2 Ultra", "m2-ultra"),
        ("Apple M1", "m1"),
        ("Apple M3 Max", "m3-max"),
        ("Apple M3 Max (30-core GPU)", "m3-max-30c"),
        ("AMD Radeon RX 7900 XTX", "rx-7900-xtx"),
        ("Radeon RX 7900 XT", "rx-7900-xt"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "rtx-4090-laptop"),
        ("NVIDIA GeForce RTX 4060 Ti 16GB", "rtx-4060-ti-16gb"),
        ("Simulated NVIDIA GeForce RTX 3090", "rtx-3090"),  # what sim/ reports in demo mode
        ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"),
        ("NVIDIA GeForce RTX 5070 Ti", "rtx-5070-ti"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell"),
    ],
)
def test_match_reported_names(reported: str, key: str) -> None:
    spec = match_gpu(reported)
    assert spec is not None, reported
    assert spec.key == key


def test_laptop_name_never_gets_a_desktop_row() -> None:
    assert match_gpu("NVIDIA GeForce RTX 3070 Ti Laptop GPU") is None
    assert match_gpu("NVIDIA GeForce RTX 3080 with Max-Q Design") is None
    assert match_gpu("NVIDIA GeForce RTX 4090") is not None and not match_gpu("NVIDIA GeForce RTX 4090").laptop  # type: ignore[union-attr]


def test_memory_and_cores_pick_the_variant() -> None:
    # NVML reports both 3080s with the same name; total memory tells them apart (MiB as NVML gives).
    assert match_gpu("NVIDIA GeForce RTX 3080", memory_bytes=10240 * 2**20).key == "rtx-3080"  # type: ignore[union-attr]
    assert match_gpu("NVIDIA GeForce RTX 3080", memory_bytes=12288 * 2**20).key == "rtx-3080-12gb"  # type: ignore[union-attr]
    assert match_gpu("Apple M4 Max", gpu_cores=32).key == "m4-max-32c"  # type: ignore[union-attr]
    assert match_gpu("Apple M4 Max", gpu_cores=40).key == "m4-max"  # type: ignore[union-attr]


def test_unknown_names() -> None:
    assert match_gpu("NVIDIA GeForce GTX 1080") is None
    assert match_gpu("Intel(R) Core(TM) i7-12700K") is None
    assert match_gpu("") is None
    assert "NVIDIA GeForce RTX 4090" in close_matches("RTX 4095")
    assert any("A6000" in n for n in close_matches("RTX A6001"))


def test_resolve_spec_takes_keys_and_names() -> None:
    assert resolve_spec("rtx-4090") is spec_by_key("rtx-4090")
    assert resolve_spec("NVIDIA GeForce RTX 4090") is spec_by_key("rtx-4090")
    assert resolve_spec("nope") is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([s for s in SPECS if s.vendor != "cpu"]), st.data())
def test_every_row_name_survives_spacing_and_case(spec: HardwareSpec, data: st.DataObject) -> None:
    # Changing case and the separators between words must not change the match.
    words = spec.name.split()
    seps = data.draw(st.lists(st.sampled_from([" ", "  ", "-", "_", " - "]), min_size=len(words) - 1, max_size=len(words) - 1))
    mangled = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
    mangled = data.draw(st.sampled_from([mangled, mangled.lower(), mangled.upper()]))
    got = match_gpu(mangled, memory_bytes=spec.memory_bytes, gpu_cores=spec.gpu_cores)
    assert got is not None
    assert got.key == spec.key


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_match_never_raises_on_free_text(name: str) -> None:
    got = match_gpu(name)
    assert got is None or got.vendor in {"nvidia", "amd", "apple"}
    assert isinstance(close_matches(name), list)


def test_nvml_bandwidth_reproduces_spec_sheets() -> None:
    # docs/physics.md §8: max memory clock × bus width.
    assert nvml_bandwidth_bytes_s(10501, 384) == pytest.approx(1008e9, rel=1e-3)
    assert nvml_bandwidth_bytes_s(14001, 512) == pytest.approx(1792e9, rel=1e-3)
    assert nvml_bandwidth_bytes_s(9751, 384) == pytest.approx(936e9, rel=1e-3)


def test_choose_bandwidth_prefers_table_when_far_apart() -> None:
    spec = spec_by_key("rtx-3090")
    close = choose_bandwidth(spec, nvml_bandwidth_bytes_s(9751, 384))
    assert close.source == "nvml" and close.message is None
    far = choose_bandwidth(spec, nvml_bandwidth_bytes_s(9751, 256))
    assert far.source == "table"
    assert far.bandwidth_bytes_s == spec.bandwidth_bytes_s
    assert far.message is not None and "624 GB/s" in far.message and "936 GB/s" in far.message
    alone = choose_bandwidth(None, 500e9)
    assert alone.source == "nvml" and alone.bandwidth_bytes_s == 500e9
    with pytest.raises(ValueError, match="no bandwidth"):
        choose_bandwidth(None, None)


def test_apple_chip_name_from_brand_string() -> None:
    assert apple_chip_name("Apple M2 Ultra") == "Apple M2 Ultra"
    assert apple_chip_name("Apple M1") == "Apple M1"
    assert apple_chip_name("apple m4 pro") == "Apple M4 Pro"
    assert apple_chip_name("Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz") is None
    assert match_gpu(apple_chip_name("Apple M3 Max") or "") is spec_by_key("m3-max")
