"""Core roofline formulas against hand-computed examples (docs/physics.md §2 to §4)."""

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


def test_short_prompts_are_memory_bound_long_ones_compute_bound() -> None:
    """RTX 3090, Llama-3-8B Q4_K_M: the weight read binds below a few dozen tokens, compute above."""
    from analysis.ceilings import compute_ceilings, starting_efficiencies

    spec = spec_by_key("rtx-3090")
    eff = starting_efficiencies(spec, "Q4_K_M")

    def ceiling(prompt_tokens: int) -> float:
        return compute_ceilings(
            bandwidth_bytes_s=spec.bandwidth_bytes_s,
            peak_flops=spec.fp16_flops,
            weights_bytes=4.92e9,
            params=8.03e9,
            layers=32,
            hidden=4096,
            kv_bytes_per_tok=128 * 1024,
            context_tokens=prompt_tokens,
            prompt_tokens=prompt_tokens,
            efficiencies=eff,
        ).prefill_ceiling_tok_s

    assert ceiling(8) == pytest.approx(936e9 * 8 / 4.92e9)  # one weight pass for 8 tokens
    assert ceiling(512) == pytest.approx(roofline.prefill_ceiling_tok_s(spec.fp16_flops, 8.03e9, 32, 4096, 512))
    assert ceiling(8) < ceiling(16) < ceiling(64)  # rising while memory-bound, then flat
