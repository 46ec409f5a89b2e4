"""analysis.story: readings against their own ceilings, flags that keep readings out of medians and
calibration, and an expected ratio computed at the measured prompt lengths and contexts."""

from __future__ import annotations

import statistics

from analysis import wording as w
from analysis.ceilings import MIN_RATE_TOKENS, CeilingModel, ollama_num_batch, starting_efficiencies
from analysis.explain import explain_rates
from analysis.hardware import spec_by_key
from analysis.model_facts import TYPICAL_8B_Q4_K_M as FACTS
from analysis.story import RATIO_SPREAD, RateSample, Status, build_story

SPEC = spec_by_key("rtx-4090")
START = CeilingModel(SPEC, FACTS, starting_efficiencies(SPEC, FACTS.quantization))


def _sample(i: int, prompt: int, prefill: float, ctx: int = 1000, out: int = 100, decode: float = 120.0) -> RateSample:
    return RateSample(f"r{i}", prompt, prefill, float(ctx), out, decode)


def test_each_reading_is_judged_at_its_own_prompt_length() -> None:
    # 14 tokens at 151,691 tok/s: one read of 4.92 GB of weights per micro-batch allows 14 x 1,008 GB/s / 4.92 GB.
    short_ceiling = START.at(14, 14).prefill_ceiling_tok_s
    assert 2_500 < short_ceiling < 3_000
    story = build_story(
        START, [_sample(0, 14, 151_691.0), _sample(1, 20, 2_000.0), _sample(2, 2_000, 8_000.0), _sample(3, 4_000, 80_000.0)]
    )
    status = {r.request_id: r.status for r in story.prefill}
    assert status == {"r0": Status.IMPOSSIBLE, "r1": Status.TINY, "r2": Status.COUNTED, "r3": Status.IMPOSSIBLE}
    assert story.prefill_median_tok_s == 8_000.0  # only the reading that counts


def test_too_short_replies_and_impossible_decodes_stay_out_of_the_median() -> None:
    ceiling = START.at(0, 1000).decode_ceiling_tok_s
    samples = [
        _sample(0, 500, 8000.0, out=MIN_RATE_TOKENS, decode=150.0),  # 31 intervals: too short
        _sample(1, 500, 8000.0, out=200, decode=3 * ceiling),
        _sample(2, 500, 8000.0, out=200, decode=100.0),
    ]
    story = build_story(START, samples)
    assert [r.status for r in story.decode] == [Status.TINY, Status.IMPOSSIBLE, Status.COUNTED]
    assert story.decode_median_tok_s == 100.0


def test_expected_ratio_is_over_the_measured_prompts_and_contexts() -> None:
    prompts, contexts = [40, 64, 3000, 9000], [100, 600, 5000, 12000]
    samples = [_sample(i, p, 5_000.0, ctx=c) for i, (p, c) in enumerate(zip(prompts, contexts, strict=True))]
    story = build_story(START, samples)
    exp_pp = statistics.median(START.at(p, p).prefill_expected_tok_s for p in prompts)
    exp_tg = statistics.median(START.at(0, c).decode_expected_tok_s for c in contexts)
    assert story.expected_ratio == exp_pp / exp_tg
    # Not the ratio at one typical length: that is what made 75x stand beside 17x.
    assert story.expected_ratio != START.at(16, 16).expected_ratio


def test_calibration_ignores_flagged_readings() -> None:
    good = [_sample(i, 1000 + 100 * i, 10_000.0) for i in range(5)]
    flagged = [_sample(10 + i, 12, 400.0) for i in range(5)] + [_sample(20, 2000, 900_000.0)]
    story = build_story(START, good + flagged)
    assert story.model.efficiencies.prefill_samples == 5
    ratios = [10_000.0 / START.at(1000 + 100 * i, 1000 + 100 * i).prefill_ceiling_tok_s for i in range(5)]
    assert story.model.efficiencies.eta_compute == statistics.median(ratios)


def test_verdicts_follow_the_numbers() -> None:
    # Short prompts only: prefill is below the ridge, memory-bound like decode.
    short = build_story(START, [_sample(i, 40 + i, 5_000.0) for i in range(3)])
    text = " ".join(explain_rates(short, hardware_name="RTX 4090", model_name="m"))
    assert short.ceilings.prefill_intensity_flop_per_byte < short.ceilings.ridge_point_flop_per_byte
    assert "41-token prefill sits" in text and "below it too, waiting on memory" in text and "set by memory" in text
    assert "limited by compute" not in text
    long = build_story(START, [_sample(i, 4000 + i, 9_000.0) for i in range(3)])
    text = " ".join(explain_rates(long, hardware_name="RTX 4090", model_name="m"))
    assert "4,001-token prefill sits" in text and "above it, limited by compute" in text and "set by compute" in text


def test_a_difference_beyond_the_spread_gets_one_sentence() -> None:
    # Decode at a third of what is expected: the two ratios differ by about 3x.
    expected_decode = START.at(0, 1000).decode_expected_tok_s
    story = build_story(
        START, [_sample(i, 2000, START.at(2000, 2000).prefill_expected_tok_s, decode=expected_decode / 3) for i in range(3)]
    )
    assert story.ratios_differ
    lines = explain_rates(story, hardware_name="RTX 4090", model_name="m")
    differ = [s for s in lines if s.startswith("The two ratios differ")]
    assert (
        len(differ) == 1 and f"more than {w.times(RATIO_SPREAD)}" in differ[0] and "decode is the one to look into" in differ[0]
    )
    calm = build_story(
        START, [_sample(i, 2000, START.at(2000, 2000).prefill_expected_tok_s, decode=expected_decode) for i in range(3)]
    )
    assert not calm.ratios_differ
    assert not any(s.startswith("The two ratios differ") for s in explain_rates(calm, hardware_name="x", model_name="m"))


def test_ollamas_micro_batch_by_context() -> None:
    assert [ollama_num_batch(n) for n in (None, 2048, 4096, 4097, 32768, 32769)] == [512, 512, 512, 1024, 1024, 2048]
    big_batch = CeilingModel(SPEC, FACTS, START.efficiencies, vram_fraction=0.1, ubatch_tokens=2048)
    # Mostly offloaded, prefill is memory-bound at 512: a 2,048-token micro-batch shares each weight read four times as
    # widely, until compute binds.
    assert (
        big_batch.at(4000, 4000).prefill_ceiling_tok_s
        > 2 * CeilingModel(SPEC, FACTS, START.efficiencies, vram_fraction=0.1).at(4000, 4000).prefill_ceiling_tok_s
    )
