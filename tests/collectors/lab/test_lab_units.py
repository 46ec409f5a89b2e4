"""Pure parts of the Lab: conclusions from hand-made points, costs, URLs, result files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.lab import conclusions
from collectors.lab.client import LabError, normalize_url
from collectors.lab.experiments import EXPERIMENTS, doubling, make_params
from collectors.lab.prompts import TokenEstimator, random_words
from collectors.lab.results import CANCELLED, ExperimentResult, ResultFileError, list_results, read_result, write_result


def test_doubling_ladder_ends_at_the_cap() -> None:
    assert doubling(64, 8192) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert doubling(64, 3000) == [64, 128, 256, 512, 1024, 2048, 3000]
    assert doubling(1, 4) == [1, 2, 4]
    assert doubling(100, 50) == []


@pytest.mark.parametrize(
    ("given_url", "expected"),
    [
        ("127.0.0.1", "http://127.0.0.1:11434"),
        ("127.0.0.1:11435", "http://127.0.0.1:11435"),
        ("http://box:8080/", "http://box:8080"),
        ("[::1]", "http://[::1]:11434"),
        ("https://ollama.example", "https://ollama.example:443"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),  # a bind-all server address, connected to locally
    ],
)
def test_normalize_url(given_url: str, expected: str) -> None:
    assert normalize_url(given_url) == expected


def test_unsupported_scheme_is_a_lab_error() -> None:
    with pytest.raises(LabError, match="not supported"):
        normalize_url("ftp://box")


def test_estimator_learns_from_the_server_count() -> None:
    est = TokenEstimator()
    est.learn(100, 130)
    assert est.words_for(1300) == 1000
    est.learn(10, 1000)  # too short to tell: ignored
    assert est.tokens_per_word == pytest.approx(1.3)


def test_random_words_are_unique_and_sized() -> None:
    a = random_words(50, random.Random(1))
    b = random_words(50, random.Random(2))
    assert a != b and len(a.split()) == 50


def test_prompt_length_conclusion_rise_and_flat() -> None:
    pts = [
        {"prompt_tokens": n, "prefill_tok_s": r, "ttft_s": t}
        for n, r, t in [(64, 1000, 0.07), (128, 1800, 0.08), (256, 2900, 0.1), (512, 3000, 0.18), (1024, 3050, 0.34)]
    ]
    summary, text = conclusions.prompt_length(pts)
    assert summary["rise_factor"] == pytest.approx(3.05)
    assert summary["flat_from_prompt_tokens"] == 256
    assert "1,000 tok/s" in text and "3,050 tok/s" in text and "from about 256 tokens" in text
    flat_summary, flat_text = conclusions.prompt_length([{**p, "prefill_tok_s": 100.0} for p in pts])
    assert flat_summary["rise_factor"] == 1.0 and "hardly changed" in flat_text


def test_concurrency_conclusion_tells_serial_from_parallel() -> None:
    one = {"streams": 1, "total_tok_s": 100.0, "per_stream_tok_s": 100.0, "mean_active_streams": 1.0, "generation_s": 0.5}
    par = {"streams": 4, "total_tok_s": 340.0, "per_stream_tok_s": 88.0, "mean_active_streams": 3.8, "ttft_s_max": 0.1}
    ser = {"streams": 4, "total_tok_s": 101.0, "per_stream_tok_s": 100.0, "mean_active_streams": 1.0, "ttft_s_max": 1.5}
    s, text = conclusions.concurrency([one, par])
    assert s["served_serially"] is False and "3.4× one stream" in text
    s, text = conclusions.concurrency([one, ser])
    assert s["served_serially"] is True and s["waited_generations"] == pytest.approx(3.0)
    assert "one stream at a time" in text
    _, text = conclusions.concurrency([par])
    assert text.startswith("Too few")


def test_interference_conclusion_measures_the_stall() -> None:
    gaps = [("before", g) for g in (10.0, 11.0, 9.0, 10.0)] + [("during", g) for g in (10.0, 130.0, 128.0, 12.0)]
    pts = [{"phase": ph, "gap_ms": g} for ph, g in gaps]
    facts = {"long_prompt_tokens": 4096, "long_prefill_s": 1.0, "long_prefill_tok_s": 4000.0, "served_serially": False}
    s, text = conclusions.interference(pts, facts)
    assert s["baseline_gap_ms"] == 10.0 and s["max_gap_ms"] == 130.0 and s["stall_ms"] == 120.0
    assert s["stall_prompt_tokens"] == pytest.approx(480.0)
    assert s["gaps_over_3x_during_prefill"] == 2
    assert "130 ms" in text and "480 prompt tokens" in text


def test_context_depth_conclusion() -> None:
    pts = [{"context_tokens": 256, "decode_tok_s": 100.0}, {"context_tokens": 8192, "decode_tok_s": 80.0}]
    s, text = conclusions.context_depth(pts)
    assert s["drop_fraction"] == pytest.approx(0.2) and "20% slower" in text


def test_cold_warm_and_prompt_cache_conclusions() -> None:
    s, text = conclusions.cold_warm(
        [{"state": "cold", "load_s": 2.0, "ttft_s": 2.1}, {"state": "warm", "load_s": 0.01, "ttft_s": 0.1}], 4_000_000_000
    )
    assert s["load_read_bytes_s"] == 2e9 and "2.00 GB/s" in text and "saves 2.00 s" in text
    first = {"attempt": 1, "prefix_tokens": 2048, "prompt_tokens": 2070, "prefill_s": 0.5, "prefill_tok_s": 4140.0}
    second = {"attempt": 2, "prefix_tokens": 2048, "prompt_tokens": 2070, "prefill_s": 0.01, "cached_tokens": None}
    s, text = conclusions.prompt_cache([first, second])
    assert s["saved_fraction"] == pytest.approx(0.98)
    assert s["cached_tokens_inferred"] == pytest.approx(2070 - 41.4)
    assert "does not report cached tokens" in text


@given(st.lists(st.fixed_dictionaries({"prompt_tokens": st.integers(1, 10**6), "prefill_tok_s": st.floats(0, 1e7)})))
def test_conclusions_never_raise_on_partial_points(pts: list[dict[str, float]]) -> None:
    for fn in (conclusions.prompt_length, conclusions.context_depth, conclusions.concurrency, conclusions.prompt_cache):
        summary, text = fn(pts)
        assert isinstance(summary, dict) and text


def test_every_experiment_has_a_bounded_cost() -> None:
    for name, spec in EXPERIMENTS.items():
        cost = spec.cost(make_params(name), 4096)
        assert 1 <= cost.requests <= 16, name
        assert cost.prompt_tokens <= 40_000 and cost.output_tokens <= 2_000, name
        assert cost.seconds(prefill_tok_s=1000, decode_tok_s=20) > 0
    assert EXPERIMENTS["cold-warm"].cost(make_params("cold-warm"), None).unloads_model
    # Capped by the context the model gets.
    small = EXPERIMENTS["prompt-length"].cost(make_params("prompt-length"), 2048)
    assert small.prompt_tokens < EXPERIMENTS["prompt-length"].cost(make_params("prompt-length"), 32768).prompt_tokens


def test_make_params_rejects_unknown_names_and_bad_values() -> None:
    with pytest.raises(ValueError, match="known: max_prompt_tokens"):
        make_params("prompt-length", {"streams": 3})
    with pytest.raises(ValueError, match="num_predict must be a positive number"):
        make_params("prompt-length", {"num_predict": 0})
    with pytest.raises(ValueError, match=r"min_prompt_tokens \(512\) is larger than max_prompt_tokens \(256\)"):
        make_params("prompt-length", {"min_prompt_tokens": 512, "max_prompt_tokens": 256})


def _result(run_id: str, started: float) -> ExperimentResult:
    return ExperimentResult("prompt-length", run_id, "m", "http://x:1", {"a": 1}, started, points=[{"x_s": 1.5}])


def test_result_files_round_trip_and_skip_garbage(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    write_result(lab / "a.json", _result("a", 1.0))
    b = _result("b", 2.0)
    b.state = CANCELLED
    write_result(lab / "b.json", b)
    (lab / "junk.json").write_text("{not json")
    (lab / "other.json").write_text(json.dumps({"hello": 1}))
    runs = list_results(tmp_path)
    assert [r.run_id for r in runs] == ["b", "a"]
    assert runs[0].state == CANCELLED and runs[1].points == [{"x_s": 1.5}]
    assert read_result(lab / "a.json") == _result("a", 1.0)
    with pytest.raises(ResultFileError):
        read_result(lab / "junk.json")
    assert not list(lab.glob(".*.tmp"))  # atomic writes leave no temp files behind


def test_a_run_document_is_found_by_its_id_through_the_launcher(tmp_path: Path) -> None:
    # The Lab page asks the launcher for a run by id instead of building the run file's path itself.
    from collectors import api

    assert api.read_run(tmp_path, "r1") is None  # the process has not written it yet
    write_result(tmp_path / "lab" / "r1.json", _result("r1", 1.0))  # where the run's process writes it
    assert api.read_run(tmp_path, "r1") == _result("r1", 1.0)
