"""Memory sizes in the hardware table are binary (GiB), as GPUs have them; bandwidth and FLOPS stay decimal."""

from __future__ import annotations

import pytest

from analysis.hardware import GB, GIB, SPECS, match_gpu, spec_by_key

MIB = 2**20


@pytest.mark.parametrize(
    ("key", "nvml_total_mib"),
    [("rtx-3090", 24576), ("rtx-4090", 24564), ("rtx-3060", 12288), ("rtx-4060", 8188), ("a100-80gb", 81920)],
)
def test_table_memory_is_what_nvml_reports_in_mib(key: str, nvml_total_mib: int) -> None:
    # NVML's total is the card's GiB (less a few MiB the driver keeps on some boards).
    spec = spec_by_key(key)
    assert spec.memory_bytes == pytest.approx(nvml_total_mib * MIB, rel=0.002)


def test_every_memory_size_is_a_whole_number_of_gib_and_bandwidth_stays_decimal() -> None:
    for s in SPECS:
        assert s.memory_bytes % GIB == 0, s.key
    assert spec_by_key("rtx-3090").memory_bytes == 24 * GIB
    assert spec_by_key("rtx-3090").bandwidth_bytes_s == 936 * GB  # GB/s as the datasheet prints it
    assert spec_by_key("m2-ultra").memory_bytes == 192 * GIB


def test_nvml_total_memory_picks_the_variant_in_gib() -> None:
    # The 10 GB and 12 GB RTX 3080 share a name; NVML's MiB pick the row, as does "12GB" in a name.
    assert match_gpu("NVIDIA GeForce RTX 3080", memory_bytes=10240 * MIB).key == "rtx-3080"  # type: ignore[union-attr]
    assert match_gpu("NVIDIA GeForce RTX 3080", memory_bytes=12288 * MIB).key == "rtx-3080-12gb"  # type: ignore[union-attr]
    assert match_gpu("NVIDIA GeForce RTX 3080 12GB").key == "rtx-3080-12gb"  # type: ignore[union-attr]
    # A 4060 Ti 16 GB: NVML reports 16,380 MiB.
    assert match_gpu("NVIDIA GeForce RTX 4060 Ti", memory_bytes=16380 * MIB).key == "rtx-4060-ti-16gb"  # type: ignore[union-attr]
