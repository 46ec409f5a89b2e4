"""The runner's load lines are one vocabulary (``LoadLineKind``): its values never change, and a real line of each kind
parses to it."""

from __future__ import annotations

from analysis.runner_load_lines import LoadLineKind, parse_load_line

RELEASED = {"device", "offloaded", "buffer", "layer", "draft"}
# One line of each kind as llama.cpp prints it (analysis/runner_load.py's docstring).
SAMPLES: dict[LoadLineKind, str] = {
    LoadLineKind.DEVICE: "llama_prepare_model_devices: using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 142629 MiB free",
    LoadLineKind.OFFLOADED: "load_tensors: offloaded 49/49 layers to GPU",
    LoadLineKind.BUFFER: "load_tensors:        CUDA0 model buffer size =  6314.23 MiB",
    LoadLineKind.LAYER: "load_tensors: layer  12 assigned to device CUDA1, is_swa = 0",
    LoadLineKind.DRAFT: "srv    load_model: loading draft model '/models/draft.gguf'",
}


def test_the_values_are_the_released_ones() -> None:
    assert {k.value for k in LoadLineKind} == RELEASED


def test_a_real_line_of_each_kind_parses_to_that_kind() -> None:
    assert set(SAMPLES) == set(LoadLineKind)
    for kind, line in SAMPLES.items():
        parsed = parse_load_line(line)
        assert parsed is not None and parsed.kind is kind, (kind, line)
