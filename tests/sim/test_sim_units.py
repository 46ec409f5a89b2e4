"""Pure parts of sim: tokenizer, Go durations, step timing, profiles."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.quantization import file_type_name
from analysis.roofline import kv_bytes_per_token
from sim import timing
from sim.catalog import BY_NAME, MODELS, find_model
from sim.engine import common_prefix
from sim.ollama_time import format_go_duration, keep_alive_ns, parse_go_duration_ns, rfc3339nano
from sim.profiles import PROFILES
from sim.tokens import TextStream, count_tokens, encode, make_prompt
from tests.support.sim_process import start_sim


@settings(deadline=None, max_examples=50)  # the machine is shared: no per-example deadline
@given(st.integers(min_value=0, max_value=3000), st.integers(min_value=0, max_value=10**6))
def test_make_prompt_has_exactly_n_tokens(n: int, seed: int) -> None:
    text = make_prompt(n, seed)
    assert count_tokens(text) == n
    assert make_prompt(n, seed) == text


def test_generated_text_recounts_to_its_tokens() -> None:
    stream = TextStream("seed")
    pieces = [next(stream) for _ in range(500)]
    assert count_tokens("".join(pieces)) == 500
    again = TextStream("seed")
    assert [next(again) for _ in range(5)] == pieces[:5]
    assert encode("a, b") == encode("a , b") and len(encode("a, b")) == 3


@pytest.mark.parametrize(
    ("text", "ns"),
    [("5m", 300 * 10**9), ("1h30m", 5400 * 10**9), ("300ms", 300 * 10**6), ("0", 0), ("-1s", -(10**9)), ("1.5s", 1_500_000_000)],
)
def test_go_durations(text: str, ns: int) -> None:
    assert parse_go_duration_ns(text) == ns


def test_keep_alive_rules() -> None:
    assert keep_alive_ns(None) is None
    assert keep_alive_ns(30) == 30 * 10**9
    assert keep_alive_ns(-5) == -1 and keep_alive_ns("-1m") == -1
    with pytest.raises(ValueError, match="missing unit"):
        keep_alive_ns("10")
    with pytest.raises(ValueError, match="invalid duration"):
        keep_alive_ns("soon")


def test_rfc3339nano_trims_zeros() -> None:
    assert rfc3339nano(1_700_000_000_120_000_000) == "2023-11-14T22:13:20.12Z"
    assert rfc3339nano(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"


def test_catalogue_facts() -> None:
    m = BY_NAME["llama3.1:8b"]
    facts = (m.parameter_count, m.block_count, m.head_count_kv, m.head_dim, m.size_bytes)
    assert facts == (8_030_261_312, 32, 8, 128, 4_920_753_328)
    assert m.kv_bytes_per_token == kv_bytes_per_token(32, 8, 128) == 128 * 1024
    assert find_model("llama3.2") is BY_NAME["llama3.2:latest"] and find_model("llama3.1") is None
    assert BY_NAME["llama3.1:70b"].size_bytes > 24e9
    assert len({m.digest for m in MODELS}) == len(MODELS)


def test_decode_step_grows_by_the_kv_term() -> None:
    m, p = BY_NAME["llama3.1:8b"], PROFILES["rtx-3090"]
    t0 = timing.step_seconds(m, p, 1.0, timing.StepWork([0], []))
    t32k = timing.step_seconds(m, p, 1.0, timing.StepWork([32768], []))
    eta_bw = p.spec.eta_bw_quant * p.spec.bandwidth_bytes_s
    assert t32k - t0 == pytest.approx(32768 * m.kv_bytes_per_token / eta_bw, rel=1e-9)


def test_batching_amortizes_weights_until_compute_binds() -> None:
    m, p = BY_NAME["llama3.1:8b"], PROFILES["rtx-4090"]
    one = timing.step_seconds(m, p, 1.0, timing.StepWork([100], []))
    eight = timing.step_seconds(m, p, 1.0, timing.StepWork([100] * 8, []))
    assert eight < 1.2 * one  # memory-bound: 8 streams cost little more than one
    chunk = timing.step_seconds(m, p, 1.0, timing.StepWork([], [(0, 2048)]))
    assert chunk > 20 * one  # a big prefill chunk is compute-bound


def test_offload_makes_decode_slower() -> None:
    m, p = BY_NAME["llama3.1:70b"], PROFILES["rtx-3090"]
    full = timing.step_seconds(m, p, 1.0, timing.StepWork([10], []))
    half = timing.step_seconds(m, p, 0.5, timing.StepWork([10], []))
    assert half > 5 * full


def test_default_num_ctx_and_batch() -> None:
    assert PROFILES["rtx-3090"].default_num_ctx == 32768  # 24 GiB of VRAM: at least 23 GiB even once 3% is reserved
    assert PROFILES["rtx-3060"].default_num_ctx == 4096  # 12 GiB
    assert PROFILES["rtx-5090"].default_num_ctx == 32768
    assert PROFILES["m2-ultra"].default_num_ctx == 262144
    assert [timing.default_num_batch(c) for c in (4096, 8192, 65536)] == [512, 1024, 2048]
    assert PROFILES["cpu"].vram_bytes == 0


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (97, "97ns"),
        (830_000, "830µs"),
        (12_500_000, "12.5ms"),
        (1_234_567_891, "1.234567891s"),
        (62_500_000_000, "1m2.5s"),
    ],
)
def test_go_duration_strings(ns: int, text: str) -> None:
    assert format_go_duration(ns) == text


def test_cli_help_lists_profiles_and_models() -> None:
    out = subprocess.run([sys.executable, "-m", "sim", "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    for name in ("rtx-3060", "rtx-3090", "rtx-4090", "rtx-5090", "m1", "m2-ultra", "m3-max", "cpu"):
        assert f"  {name} " in out
    for model in MODELS:
        assert model.name in out
    bad = subprocess.run([sys.executable, "-m", "sim", "--hardware", "rtx-9999"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "rtx-9999" in bad.stderr


def test_sigterm_stops_cleanly() -> None:
    with start_sim() as sim:
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=10) == 0
        assert "sim: stopped" in sim.log()


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix(a: list[int], b: list[int]) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def test_every_catalog_model_carries_the_file_type_of_its_quantization() -> None:
    for model in MODELS:
        file_type = model.model_info()["general.file_type"]
        assert isinstance(file_type, int) and file_type_name(file_type) == model.quantization, model.name
