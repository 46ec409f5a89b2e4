"""Ceilings, expected rates, calibration and the roofline command.

The reference rows are llama-bench measurements (docs/physics.md §5, tests/data/reference_rows.json);
the expected rates must land near them without any per-row tuning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from analysis.ceilings import (
    CalibrationPoint,
    Efficiencies,
    calibrate,
    calibration_points,
    ceilings_for,
    compute_ceilings,
    curve_tokens,
    decode_curve,
    judge_decode,
    judge_prefill,
    prefill_curve,
    starting_efficiencies,
    vram_fraction,
)
from analysis.hardware import GB, spec_by_key
from analysis.model_facts import ModelFacts
from analysis.roofline import kv_bytes_per_token
from analysis.roofline_cli import main
from tests.support.paths import DATA

ROWS_PATH = DATA / "reference_rows.json"
GIB = 2**30


def _load_rows() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(ROWS_PATH.read_text())
    return data["models"], data["rows"]


def _expected_for_row(models: dict[str, Any], row: dict[str, Any]) -> tuple[float, float]:
    spec = spec_by_key(row["hardware"])
    m = models[row["model"]]
    weights = row["size_gib"] * GIB
    eff = starting_efficiencies(spec, row["quant"])
    kv = kv_bytes_per_token(m["layers"], m["kv_heads"], m["head_dim"])
    dec = compute_ceilings(
        bandwidth_bytes_s=spec.bandwidth_bytes_s,
        peak_flops=spec.fp16_flops,
        weights_bytes=weights,
        params=m["params"],
        layers=m["layers"],
        hidden=m["hidden"],
        kv_bytes_per_tok=kv,
        context_tokens=row["tg_context"],
        prompt_tokens=512,
        efficiencies=eff,
    )
    return dec.decode_expected_tok_s, dec.prefill_expected_tok_s


def test_reference_rows_have_sources_and_match_the_table() -> None:
    models, rows = _load_rows()
    assert len(rows) >= 10
    for row in rows:
        assert row["source"]
        assert row["model"] in models
        # The table's bandwidth is the one the row was measured against.
        assert spec_by_key(row["hardware"]).bandwidth_bytes_s == pytest.approx(row["bandwidth_gbs"] * GB), row["hardware"]


def test_expected_rates_match_reference_rows() -> None:
    models, rows = _load_rows()
    decode_ok = prefill_ok = 0
    report = []
    for row in rows:
        dec, pre = _expected_for_row(models, row)
        d_err = dec / row["tg_tok_s"] - 1
        p_factor = max(pre / row["pp512_tok_s"], row["pp512_tok_s"] / pre)
        decode_ok += abs(d_err) <= 0.25
        prefill_ok += p_factor <= 1.6
        report.append(
            f"{row['hardware']}: decode {dec:.1f} vs {row['tg_tok_s']} ({d_err:+.0%}), "
            f"prefill {pre:.0f} vs {row['pp512_tok_s']} (×{p_factor:.2f})"
        )
    text = "\n".join(report)
    assert decode_ok >= 0.8 * len(rows), text
    assert prefill_ok >= 0.8 * len(rows), text


def _llama3_8b(weights: float = 4.58 * GIB, quant: str = "Q4_K_M") -> ModelFacts:
    return ModelFacts("llama", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128, 8192, quant, weights, False)


def test_ceilings_for_uses_model_and_spec() -> None:
    spec = spec_by_key("rtx-3090")
    c = ceilings_for(spec, _llama3_8b(), context_tokens=0, prompt_tokens=512)
    assert c.decode_ceiling_tok_s == pytest.approx(936e9 / (4.58 * GIB))
    assert c.decode_expected_tok_s == pytest.approx(0.70 * c.decode_ceiling_tok_s)
    assert c.prefill_ceiling_tok_s == pytest.approx(142e12 / (2 * 8.03e9 + 2 * 32 * 4096 * 512))
    assert c.prefill_expected_tok_s == pytest.approx(0.45 * c.prefill_ceiling_tok_s)
    # Decode sits far below the ridge point, prefill far above: that is why pp ≫ tg.
    assert c.decode_intensity_flop_per_byte < 5 < c.ridge_point_flop_per_byte < c.prefill_intensity_flop_per_byte
    assert 25 < c.expected_ratio < 40


def test_longer_context_lowers_decode_ceiling() -> None:
    spec = spec_by_key("rtx-4090")
    short = ceilings_for(spec, _llama3_8b(), context_tokens=0, prompt_tokens=512)
    long = ceilings_for(spec, _llama3_8b(), context_tokens=32768, prompt_tokens=32768)
    # 32k tokens of KV at 128 KiB each = 4 GiB on top of 4.58 GiB of weights.
    assert long.decode_ceiling_tok_s == pytest.approx(1008e9 / (4.58 * GIB + 4 * GIB))
    assert long.prefill_ceiling_tok_s < short.prefill_ceiling_tok_s


def test_partial_offload_blends_bandwidth() -> None:
    spec = spec_by_key("rtx-3060")
    full = ceilings_for(spec, _llama3_8b(), context_tokens=0, prompt_tokens=512)
    half = ceilings_for(spec, _llama3_8b(), context_tokens=0, prompt_tokens=512, vram_fraction=0.5, host_bandwidth_bytes_s=60e9)
    assert half.bandwidth_bytes_s == pytest.approx(1 / (0.5 / 360e9 + 0.5 / 60e9))
    assert half.decode_ceiling_tok_s < full.decode_ceiling_tok_s
    assert half.full_gpu_decode_ceiling_tok_s == pytest.approx(full.decode_ceiling_tok_s)
    assert half.host_bandwidth_bytes_s == 60e9 and full.host_bandwidth_bytes_s is None
    # Never measured the host: fall back to the table's desktop CPU.
    guess = ceilings_for(spec, _llama3_8b(), context_tokens=0, prompt_tokens=512, vram_fraction=0.5)
    assert guess.host_bandwidth_bytes_s == spec_by_key("cpu").bandwidth_bytes_s


def test_vram_fraction() -> None:
    assert vram_fraction(10, 5) == 0.5
    assert vram_fraction(10, 20) == 1.0
    assert vram_fraction(None, 5) == 1.0
    assert vram_fraction(0, 0) == 1.0


def test_starting_efficiencies_follow_physics() -> None:
    assert starting_efficiencies(spec_by_key("rtx-4090"), "Q4_K_M").eta_bw == 0.70
    assert starting_efficiencies(spec_by_key("rtx-4090"), "F16").eta_bw == 0.82
    assert starting_efficiencies(spec_by_key("rtx-4090"), "q8_0").eta_bw == 0.82
    assert starting_efficiencies(spec_by_key("m2-ultra"), "Q4_K_M").eta_bw == 0.5
    assert starting_efficiencies(spec_by_key("m2-ultra"), "F16").eta_bw == 0.75
    assert starting_efficiencies(spec_by_key("m1"), "Q4_K_M").eta_bw == 0.75
    assert starting_efficiencies(spec_by_key("m1"), "Q4_K_M").eta_compute == 0.7
    assert starting_efficiencies(spec_by_key("h100-sxm"), None).eta_compute == 0.45


def test_judge_flags_rates_above_ceiling() -> None:
    c = ceilings_for(spec_by_key("rtx-3090"), _llama3_8b(), context_tokens=0, prompt_tokens=512)
    ok = judge_decode(115.4, c)
    assert 0.5 < ok.fraction_of_ceiling < 0.7 and not ok.above_ceiling
    assert ok.fraction_of_expected == pytest.approx(115.4 / c.decode_expected_tok_s)
    impossible = judge_prefill(c.prefill_ceiling_tok_s * 3, c)
    assert impossible.above_ceiling and impossible.fraction_of_ceiling == pytest.approx(3)


def test_calibrate_needs_five_of_each_and_takes_the_median() -> None:
    start = Efficiencies(0.7, 0.45)
    few = [CalibrationPoint("decode", 60, 100)] * 4
    assert calibrate(few, start) == start
    decode = [CalibrationPoint("decode", m, 100) for m in (50, 55, 60, 65, 90)]
    prefill = [CalibrationPoint("prefill", m, 1000) for m in (300, 310, 320, 330)]
    out = calibrate(decode + prefill, start)
    assert out.eta_bw == pytest.approx(0.60) and out.decode_samples == 5 and "5" in out.source_bw
    assert out.eta_compute == 0.45 and out.prefill_samples == 0  # only 4 prefill points
    # Impossible readings (cache-inflated prefill above the ceiling) never calibrate.
    inflated = [CalibrationPoint("prefill", 5000, 1000)] * 10 + [CalibrationPoint("prefill", 400, 1000)] * 5
    assert calibrate(inflated, start).eta_compute == pytest.approx(0.4)


def test_compute_ceilings_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="bandwidth_bytes_s"):
        compute_ceilings(
            bandwidth_bytes_s=0,
            peak_flops=1,
            weights_bytes=1,
            params=1,
            layers=1,
            hidden=1,
            kv_bytes_per_tok=0,
            context_tokens=0,
            prompt_tokens=0,
            efficiencies=Efficiencies(0.7, 0.45),
        )


# ---------------------------------------------------------------------------------------------
# Command line

ARGS = [
    "--weights-bytes",
    str(4.58 * GIB),
    "--params",
    "8.03e9",
    "--layers",
    "32",
    "--hidden",
    "4096",
    "--kv-heads",
    "8",
    "--head-dim",
    "128",
    "--context",
    "512",
    "--prompt-tokens",
    "512",
    "--quant",
    "Q4_K_M",
]


def test_cli_json_in_a_real_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "analysis.roofline_cli", "--gpu", "NVIDIA GeForce RTX 3090", *ARGS, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data = json.loads(out.stdout)
    for key in (
        "bandwidth_bytes_s",
        "peak_flops",
        "decode_ceiling_tok_s",
        "decode_expected_tok_s",
        "prefill_ceiling_tok_s",
        "prefill_expected_tok_s",
    ):
        assert isinstance(data[key], float), key
    assert data["bandwidth_bytes_s"] == 936e9
    assert data["gpu_key"] == "rtx-3090"
    # Within 25% of the measured 115.4 tok/s on this card (docs/physics.md §5).
    assert abs(data["decode_expected_tok_s"] / 115.4 - 1) < 0.25


def test_cli_speculative_decode_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: with a draft, one read of the weights yields the tokens a step accepts: the ceiling that many times."""
    assert main([*ARGS, "--bandwidth-gbs", "100", "--tflops", "10", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["speculative_decode_ceiling_tok_s"] is None and plain["tokens_per_step"] is None
    assert main([*ARGS, "--bandwidth-gbs", "100", "--tflops", "10", "--tokens-per-step", "2.5", "--json"]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert drafted["speculative_decode_ceiling_tok_s"] == pytest.approx(2.5 * plain["decode_ceiling_tok_s"])
    assert drafted["decode_ceiling_tok_s"] == plain["decode_ceiling_tok_s"], "the one-token ceiling stays"
    assert main([*ARGS, "--bandwidth-gbs", "100", "--tflops", "10", "--tokens-per-step", "2.5"]) == 0
    ceiling = drafted["speculative_decode_ceiling_tok_s"]
    assert f"decode with a draft: ceiling {ceiling:8.1f} tok/s at 2.50 tokens a step" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*ARGS, "--bandwidth-gbs", "100", "--tflops", "10", "--tokens-per-step", "0.5"])


def test_cli_unknown_gpu_exits_2_with_close_matches() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "analysis.roofline_cli", "--gpu", "RTX 4095", *ARGS, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "NVIDIA GeForce RTX 4090" in out.stderr
    assert out.stdout == ""


def test_cli_numbers_given_directly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--bandwidth-gbs", "100", "--tflops", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bandwidth_bytes_s"] == 100e9 and data["peak_flops"] == 10e12
    assert data["gpu"] is None
    # An unknown name is fine when the numbers are given.
    assert main([*ARGS, "--gpu", "My Custom Card", "--bandwidth-gbs", "100", "--tflops", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_flops"] == 10e12
    # --bandwidth-gbs overrides the table for a known card; compute still comes from the table.
    assert main([*ARGS, "--gpu", "rtx-4090", "--bandwidth-gbs", "500", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bandwidth_bytes_s"] == 500e9 and data["peak_flops"] == 330e12


def test_cli_needs_gpu_or_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*ARGS, "--bandwidth-gbs", "100"])
    assert e.value.code == 2
    assert "--gpu" in capsys.readouterr().err


def test_cli_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpu", "Apple M2 Ultra", *ARGS]) == 0
    text = capsys.readouterr().out
    assert "Apple M2 Ultra" in text and "800 GB/s" in text and "decode" in text and "prefill" in text


def test_batched_decode_follows_physics_section_6() -> None:
    c = ceilings_for(spec_by_key("rtx-3090"), _llama3_8b(), context_tokens=512, prompt_tokens=512)
    agg1, per1 = c.batched_decode_tok_s(1)
    assert agg1 == per1 == pytest.approx(c.decode_expected_tok_s)
    agg4, per4 = c.batched_decode_tok_s(4)
    # Memory-bound: the weights are read once for all four, so the total rises almost 4× and each stream slows a little.
    assert 3.5 * agg1 < agg4 < 4 * agg1
    assert 0.85 * per1 < per4 < per1
    # Far enough out the compute roof takes over and the total stops growing.
    agg_huge, _ = c.batched_decode_tok_s(4096)
    agg_more, _ = c.batched_decode_tok_s(8192)
    assert agg_more == pytest.approx(agg_huge, rel=0.2)


def test_curves_for_charts() -> None:
    xs = curve_tokens(32768, points=30)
    assert xs[0] == 1 and xs[-1] == 32768 and xs == sorted(set(xs))
    spec, f = spec_by_key("rtx-4090"), _llama3_8b()
    pre = prefill_curve(spec, f, [128, 4096, 32768])
    assert pre[0].ceiling_tok_s > pre[1].ceiling_tok_s > pre[2].ceiling_tok_s  # attention grows with the prompt
    assert pre[1].expected_tok_s == pytest.approx(0.45 * pre[1].ceiling_tok_s)
    dec = decode_curve(spec, f, [0, 32768])
    assert dec[0].ceiling_tok_s == pytest.approx(1008e9 / (4.58 * GIB))
    assert dec[1].ceiling_tok_s == pytest.approx(1008e9 / (4.58 * GIB + 4 * GIB))
    offloaded = decode_curve(spec, f, [0], vram_fraction=0.5, host_bandwidth_bytes_s=50e9)
    assert offloaded[0].ceiling_tok_s < dec[0].ceiling_tok_s / 5


def test_calibration_points_and_verdicts_from_a_request() -> None:
    c = ceilings_for(spec_by_key("rtx-3090"), _llama3_8b(), context_tokens=512, prompt_tokens=512)
    pts = calibration_points(115.0, 100, 4000.0, 512, c)
    assert [p.kind for p in pts] == ["decode", "prefill"]
    assert calibration_points(115.0, 3, 4000.0, 10, c) == []  # too short to time well
    assert judge_decode(115.0, c).fraction_of_ceiling == pytest.approx(115.0 / c.decode_ceiling_tok_s)
    # Five decent requests calibrate decode to what this machine really does.
    eff = calibrate(pts * 5, c.efficiencies)
    assert eff.eta_bw == pytest.approx(115.0 / c.decode_ceiling_tok_s)
