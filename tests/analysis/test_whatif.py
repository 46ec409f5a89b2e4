"""analysis.whatif: predictions from the Why page's ceiling model under other settings, and the suggestions."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from analysis.ceilings import CeilingModel, starting_efficiencies
from analysis.hardware import BY_KEY
from analysis.memory import RunnerSettings
from analysis.model_facts import TYPICAL_8B_Q4_K_M, ModelFacts
from analysis.whatif import MIN_GAIN, Workload, predict, suggest
from tests.support.paths import REPO

RTX_4090 = BY_KEY["rtx-4090"]
LLAMA_8B = replace(TYPICAL_8B_Q4_K_M, ffn_length=14336)  # Llama 3.1 8B
LLAMA_70B = ModelFacts(
    architecture="llama",
    params=70.55e9,
    total_params=70.55e9,
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    head_dim=128,
    value_head_dim=128,
    context_length=131072,
    quantization="Q4_K_M",
    weights_bytes=42.52e9,
    weights_bytes_estimated=False,
    ffn_length=28672,
)
WORK = Workload(prompt_tokens=1200, prompt_p90_tokens=3500, context_tokens=1500, longest_prompt_tokens=3900)
FREE = RTX_4090.memory_bytes


def test_the_rates_are_the_ceiling_models() -> None:
    s = RunnerSettings(num_ctx=8192)
    p = predict(LLAMA_8B, RTX_4090, s, WORK, free_vram_bytes=FREE)
    model = CeilingModel(RTX_4090, LLAMA_8B, starting_efficiencies(RTX_4090, "Q4_K_M"), 1.0, None, None, 512)
    assert p.memory.fits
    assert p.decode_tok_s == model.at(1200, 1500).decode_expected_tok_s
    assert p.ttft_s() == pytest.approx(1200 / model.at(1200, 1500).prefill_expected_tok_s)


def test_two_long_contexts_spill_and_the_suggestions_bring_the_model_back() -> None:
    s = RunnerSettings(num_ctx=131072, num_parallel=2)
    now = predict(LLAMA_8B, RTX_4090, s, WORK, free_vram_bytes=FREE)
    assert now.memory.fits is False and now.memory.spill_bytes > 5e9
    found = suggest(now, LLAMA_8B, RTX_4090, WORK, free_vram_bytes=FREE)
    assert found, "a spilling model has changes worth making"
    assert [f.gain for f in found] == sorted((f.gain for f in found), reverse=True)
    assert all(f.gain > 1 + MIN_GAIN for f in found)
    best = found[0]
    assert best.prediction.memory.fits and "keeps the model in GPU memory" in best.what_improves
    assert any(f.change.startswith("num_ctx 131,072 → ") and "OLLAMA_CONTEXT_LENGTH" in f.how for f in found)
    assert any(f.change == "KV cache f16 → q8_0" and "OLLAMA_KV_CACHE_TYPE=q8_0" in f.how for f in found)
    # Never below what the user's longest prompt and a reply as long need.
    assert all(f.prediction.settings.num_ctx >= 2 * WORK.longest_prompt_tokens for f in found)


def test_a_70b_on_24_gib_spills_at_any_context_and_less_context_still_speeds_it() -> None:
    now = predict(LLAMA_70B, RTX_4090, RunnerSettings(num_ctx=32768), WORK, free_vram_bytes=FREE)
    assert now.memory.fits is False
    found = suggest(now, LLAMA_70B, RTX_4090, WORK, free_vram_bytes=FREE)
    ctx = next(f for f in found if f.change.startswith("num_ctx"))
    assert ctx.prediction.memory.spill_bytes < now.memory.spill_bytes
    assert ctx.prediction.decode_tok_s > now.decode_tok_s * (1 + MIN_GAIN)
    assert ctx.prediction.memory.fits is False  # 42.5 GB of weights never fit 24 GiB: said, not hidden


def test_a_model_that_fits_gets_no_change_under_the_threshold() -> None:
    small = RunnerSettings(num_ctx=4096)
    now = predict(LLAMA_8B, RTX_4090, small, WORK, free_vram_bytes=FREE)
    for f in suggest(now, LLAMA_8B, RTX_4090, WORK, free_vram_bytes=FREE):
        assert f.gain > 1 + MIN_GAIN


def test_another_quantization_changes_weights_by_bits_per_weight() -> None:
    s = RunnerSettings(num_ctx=8192)
    q4 = predict(LLAMA_8B, RTX_4090, s, WORK, free_vram_bytes=FREE)
    q8 = predict(LLAMA_8B, RTX_4090, s, WORK, free_vram_bytes=FREE, quant="Q8_0")
    assert q8.memory.weights_bytes == pytest.approx(4.92e9 * 8.5008 / 4.8944)
    assert q8.decode_tok_s < q4.decode_tok_s


def test_the_command_line_names_kv_bytes_fit_and_spill() -> None:
    args = [
        "--gpu",
        "rtx-4090",
        "--weights-bytes",
        "4.92e9",
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
        "--quant",
        "Q4_K_M",
        "--num-ctx",
        "131072",
        "--num-parallel",
        "2",
        "--kv-type",
        "f16",
        "--flash-attn",
        "on",
        "--json",
    ]
    out = subprocess.run([sys.executable, "-m", "analysis.whatif", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["kv_bytes"] == 2 * 32 * 8 * 128 * 2 * 262144
    assert got["fits"] is False and got["spill_bytes"] > 0
    assert got["decode_tok_s"] > 0 and got["suggestions"]
    bad = subprocess.run(
        [sys.executable, "-m", "analysis.whatif", *args[:-5], "--kv-type", "q8_0", "--flash-attn", "off"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "needs flash attention" in bad.stderr
