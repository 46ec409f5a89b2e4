"""Decode through a serving runner: time per token = bytes ÷ (η × bandwidth) + a fixed cost (docs/physics.md §5)."""

from __future__ import annotations

import pytest

from analysis.ceilings import (
    DECODE_FIXED_S_PER_LAYER,
    FIXED_STARTING_SOURCE,
    CalibrationPoint,
    Efficiencies,
    calibrate,
    ceilings_for,
)
from analysis.hardware import spec_by_key
from analysis.model_facts import ModelFacts

GIB = 2**30


def _llama3_8b() -> ModelFacts:
    return ModelFacts("llama", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128, 8192, "Q4_K_M", 4.58 * GIB, False)


def _points(eta: float, fixed_s: float, ceilings: list[float]) -> list[CalibrationPoint]:
    return [CalibrationPoint("decode", 1 / (1 / (eta * c) + fixed_s), c) for c in ceilings]


def test_expected_decode_adds_the_fixed_cost_per_token() -> None:
    eff = Efficiencies(0.70, 0.45).serving(32)
    assert eff.fixed_s_per_token == pytest.approx(32 * DECODE_FIXED_S_PER_LAYER) and eff.source_fixed == FIXED_STARTING_SOURCE
    assert eff.serving(80) is eff, "a fixed cost already set (calibrated) is kept"
    c = ceilings_for(spec_by_key("rtx-3090"), _llama3_8b(), context_tokens=512, prompt_tokens=512, efficiencies=eff)
    step_s = 1 / (0.70 * c.decode_ceiling_tok_s) + eff.fixed_s_per_token
    assert c.decode_expected_tok_s == pytest.approx(1 / step_s)
    agg, per = c.batched_decode_tok_s(1)
    assert agg == per == pytest.approx(c.decode_expected_tok_s)
    # llama-bench's tg (the published rows) samples nothing: no fixed cost unless asked for.
    bench = ceilings_for(spec_by_key("rtx-3090"), _llama3_8b(), context_tokens=512, prompt_tokens=512)
    assert bench.decode_expected_tok_s == pytest.approx(0.70 * bench.decode_ceiling_tok_s)


def test_calibration_fits_eta_and_the_fixed_cost() -> None:
    start = Efficiencies(0.70, 0.45).serving(48)
    out = calibrate(_points(0.22, 0.0045, [300, 400, 500, 600, 700]), start)
    assert out.eta_bw == pytest.approx(0.22) and out.fixed_s_per_token == pytest.approx(0.0045)
    assert out.decode_samples == 5 and "5 of your requests" in out.source_fixed and out.source_bw == out.source_fixed


def test_readings_at_one_context_keep_eta_and_take_the_rest_as_fixed_cost() -> None:
    start = Efficiencies(0.70, 0.45).serving(48)
    out = calibrate(_points(0.70, 0.003, [500, 505, 510, 500, 502]), start)
    assert out.eta_bw == 0.70 and out.fixed_s_per_token == pytest.approx(0.003, rel=1e-6)


def test_readings_faster_than_the_starting_eta_drop_the_fixed_cost() -> None:
    start = Efficiencies(0.70, 0.45).serving(48)
    out = calibrate(_points(0.90, 0.0, [500, 505, 510, 500, 502]), start)
    assert out.fixed_s_per_token == 0.0 and out.eta_bw == pytest.approx(0.90)


def test_without_a_fixed_cost_calibration_is_the_median_as_before() -> None:
    out = calibrate(_points(0.60, 0.0, [300, 400, 500, 600, 700]), Efficiencies(0.70, 0.45))
    assert out.eta_bw == pytest.approx(0.60) and out.fixed_s_per_token == 0.0
