"""Core roofline formulas against hand-computed physics.md examples."""

import pytest

from analysis import roofline
from analysis.hardware import spec_by_key


def test_kv_bytes_llama3_8b_is_128_kib_per_token() -> None:
    assert roofline.kv_bytes_per_token(32, 8, 128) == 128 * 1024


def test_decode_ceiling_rtx3090_llama3_8b() -> None:
    spec = spec_by_key("rtx-3090")
    ceiling = roofline.decode_ceiling_tok_s(spec.bandwidth_bytes_s, 4.92e9, 128 * 1024, 0)
    assert ceiling == pytest.approx(936e9 / 4.92e9)


def test_blended_bandwidth_is_between_and_harmonic() -> None:
    bw = roofline.blended_bandwidth_bytes_s(1000e9, 50e9, 0.5)
    assert 50e9 < bw < 1000e9
    assert bw == pytest.approx(1 / (0.5 / 1000e9 + 0.5 / 50e9))


def test_unknown_hardware_lists_known_keys() -> None:
    with pytest.raises(KeyError, match="rtx-4090"):
        spec_by_key("rtx-9999")
