"""The plain-words layer: every sentence carries the numbers passed in."""

from __future__ import annotations

import re

from analysis.ceilings import CeilingModel, ceilings_for, starting_efficiencies
from analysis.diagnose import diagnose_request
from analysis.explain import explain_rates, explain_request
from analysis.hardware import spec_by_key
from analysis.interference import Interference
from analysis.phases import split_record
from analysis.story import RateSample, Story, build_story
from tests.support.diagnose_cases import FACTS, SPEC, loaded, make_record

NUMBER = re.compile(r"\d")


def test_explain_request_where_time_went() -> None:
    rec = make_record(load_ms=2500, prompt=1200, prefill_ms=300, output=80, token_gap_ms=10)
    ph = split_record(rec)
    lines = explain_request(rec, ph)
    assert len(lines) == 1
    s = lines[0]
    assert s.startswith("Of 3.59 s in Ollama,")  # Ollama's total, not the client's beside it (issue 42)
    assert "2.50 s loading llama3.1:8b" in s
    assert "300 ms reading 1,200 prompt tokens at 4,000 tok/s" in s
    assert "790 ms writing 80 tokens at 100 tok/s" in s
    assert "waiting" not in s  # 2 ms of queue is below the 2% cut


def test_explain_request_against_ceiling_or_warning() -> None:
    rec = make_record()
    ph = split_record(rec)
    c = ceilings_for(SPEC, FACTS, context_tokens=225, prompt_tokens=200)
    lines = explain_request(rec, ph, ceilings=c)
    assert len(lines) == 2
    assert "Decode reached 59% of the 189 tok/s that 936 GB/s allows" in lines[1]
    # When something held the request back, the warning replaces the comparison.
    slow = make_record(token_gap_ms=60)
    ds = diagnose_request(slow, split_record(slow), spec=SPEC, facts=FACTS, loaded=loaded(10e9, 6e9), host_bandwidth_bytes_s=60e9)
    lines = explain_request(slow, split_record(slow), ceilings=c, diagnoses=ds)
    assert lines[1] == ds[0].sentence and "system memory" in lines[1]


def test_explain_request_without_metrics() -> None:
    rec = make_record()
    rec.metrics = None
    lines = explain_request(rec, split_record(rec))
    assert "no timing from Ollama" in lines[0] and "50 token chunks" in lines[0]


def story(key: str, samples: list[RateSample] | None = None) -> Story:
    spec = spec_by_key(key)
    return build_story(CeilingModel(spec, FACTS, starting_efficiencies(spec, FACTS.quantization)), samples or [])


def test_explain_rates_carries_the_numbers() -> None:
    st = story("rtx-3090", [RateSample("r1", 512, 4030.0, 512.0, 100, 115.4)])
    c = st.ceilings
    lines = explain_rates(st, hardware_name="RTX 3090", model_name="llama3.1:8b")
    text = " ".join(lines)
    assert "4,030 tok/s" in text and "115 tok/s" in text and "35×" in text and "(one request, 512 prompt tokens)" in text
    assert f"about {c.prefill_expected_tok_s:,.0f} tok/s and" in text  # the expected rates at the same prompt and context
    assert "4.92 GB of weights" in text and "936 GB/s" in text and "142 TFLOP/s" in text
    assert f"{c.ridge_point_flop_per_byte:.0f} FLOP per byte" in text
    assert "at 512 prompt tokens the ceiling is" in text and "at 512 tokens of context" in text
    assert all(NUMBER.search(s) for s in lines), "every sentence must carry a number"


def test_explain_rates_differs_with_hardware() -> None:
    # Nothing generic: on different hardware every sentence reads differently.
    a = explain_rates(story("rtx-4090"), hardware_name="RTX 4090", model_name="m")
    b = explain_rates(story("m2-ultra"), hardware_name="M2 Ultra", model_name="m")
    assert len(a) == len(b) >= 6
    for sa, sb in zip(a, b, strict=True):
        assert sa != sb


def test_explain_rates_quotes_measured_interference() -> None:
    i = Interference("a", "b", 6, 10.0, 50.0, 55.0, 40.0, 240.0, 300.0, 4096, "m", "m")
    lines = explain_rates(story("rtx-4090"), hardware_name="RTX 4090", model_name="m", interference=[i])
    assert lines[-1].startswith("Measured here: while another request read its 4,096-token prompt")
    assert "40 ms per token" in lines[-1]


def test_explain_energy() -> None:
    from analysis.energy import PhaseEnergy
    from analysis.explain import explain_energy

    e = PhaseEnergy(150.0, 300.0, 800, 100, 0.1875, 3.0, "energy_counter", False)
    s = explain_energy(e)
    assert s is not None
    assert "0.188 J per token" in s and "3.00 J per token" in s and "16×" in s and "energy counter" in s
    assert "rough" in (explain_energy(PhaseEnergy(1.0, 1.0, 10, 10, 0.1, 0.1, "power_samples", True)) or "")
    assert explain_energy(PhaseEnergy(None, 300.0, None, 100, None, 3.0, "energy_counter", False)) is None


def test_this_computers_cpu_is_not_yours_twice() -> None:
    st = story("rtx-3090", [RateSample("r1", 512, 4030.0, 512.0, 100, 115.4)])
    assert explain_rates(st, hardware_name="this computer's CPU", model_name="m")[0].startswith("On this computer's CPU, m ")
    assert explain_rates(st, hardware_name="RTX 3090", model_name="m")[0].startswith("On your RTX 3090, m ")
