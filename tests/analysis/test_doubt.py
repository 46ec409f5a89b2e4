"""Evidence before assumption (analysis.doubt): most readings above their ceiling doubt the inputs, not the readings."""

from __future__ import annotations

from dataclasses import replace

from analysis.ceilings import CeilingModel, Efficiencies
from analysis.doubt import GPU, MODEL_SIZE, PLACEMENT, Doubt, doubt_inputs
from analysis.hardware import spec_by_key
from analysis.model_facts import ModelFacts
from analysis.story import RateSample, build_story

GIB = 2**30
FACTS = ModelFacts("llama", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128, 8192, "Q4_K_M", 4.58 * GIB, False)
SPEC = spec_by_key("rtx-4090")  # 1,008 GB/s: about 200 tok/s at most for 4.58 GiB of weights


def samples(decode_tok_s: list[float]) -> list[RateSample]:
    return [RateSample(f"r{i}", 1000, 5000.0, 1100.0, 200, rate) for i, rate in enumerate(decode_tok_s)]


def doubts(decode_tok_s: list[float], *, frac: float = 1.0, facts: ModelFacts = FACTS) -> list[Doubt]:
    model = CeilingModel(SPEC, facts, Efficiencies(0.70, 0.45), frac, 60e9)
    story = build_story(model, samples(decode_tok_s))
    return doubt_inputs(story, placement_source="so says Ollama's /api/ps", hardware_label="NVIDIA GeForce RTX 4090")


def test_readings_that_agree_with_the_inputs_doubt_nothing() -> None:
    assert doubts([120.0, 125.0, 130.0, 118.0]) == []
    assert doubts([900.0, 120.0, 125.0, 130.0]) == [], "one impossible reading is the reading's error"
    assert doubts([900.0, 950.0]) == [], "too few to say anything about the inputs"


def test_readings_that_fit_the_model_all_on_the_gpu_contradict_a_partial_placement() -> None:
    (d,) = doubts([120.0, 125.0, 130.0, 118.0], frac=0.5)
    assert (d.kind, d.contradicted, d.above, d.readings) == ("decode", PLACEMENT, 4, 4)
    assert d.withheld == {"partial_offload"} and "50% of the model in system memory" in d.text and "/api/ps" in d.text


def test_readings_above_every_ceiling_contradict_the_gpu_or_the_model_size() -> None:
    (d,) = doubts([900.0, 950.0, 1000.0])
    assert d.contradicted == GPU and "NVIDIA GeForce RTX 4090" in d.text and "decode_above_ceiling" in d.withheld
    (d,) = doubts([900.0, 950.0, 1000.0], facts=replace(FACTS, weights_bytes_estimated=True))
    assert d.contradicted == MODEL_SIZE and "estimated" in d.text
