"""Where a runner put its model, from its own load lines (analysis.runner_load_lines, runner_placement).

The H200 lines are the real runner's (llama.cpp from llama-cpp-python 0.3.36, built with CUDA, Gemma 3 12B's
shape); the two-GPU partial offload is printed with the format strings of that llama.cpp's ``src/llama.cpp``
("%s: using device %s (%s) (%s) - %zu MiB free"), ``src/llama-model.cpp`` ("%s: offloaded %d/%d layers to GPU",
"%s: %12s model buffer size = %8.2f MiB"), ``src/llama-kv-cache.cpp`` and ``src/llama-context.cpp``
("%s: %10s KV/compute buffer size = %8.2f MiB"). The hybrid model's lines (``hybrid_qwen3next_two_gpus.log``) are
written with the format strings of the llama-server this project builds (``strings llama-server``):
"%s: %10s RS buffer size = %8.2f MiB" (``llama_memory_recurrent``) and "%s: %10s  output buffer size = %8.2f MiB"
(``llama_context``, two spaces); their sizes are a qwen3-next-shaped model's, not a capture. ``hybrid_lfm2_cpu_captured.log``
is a capture: that llama-server (CPU only) loading an LFM2-shaped hybrid GGUF of random weights
(``make_lfm2_gguf.py`` beside it: short-convolution layers with a recurrent state, two attention layers with a KV
cache), started with Ollama's flags and ``-c 2048 -np 2 -t 2``."""

from __future__ import annotations

import pytest

from analysis.log_grammar import MAX_LINE_CHARS
from analysis.runner_load_lines import MIB, parse_load_line
from analysis.runner_load_rows import placement_from_rows, placement_rows
from analysis.runner_placement import PlacementReader, placement_from_lines
from sim.ollama_placement import ps_sizes
from tests.support.paths import REPO

DATA = REPO / "tests" / "data" / "runner_load"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def test_h200_cuda_lines_put_every_layer_on_cuda0() -> None:
    p = placement_from_lines(lines("h200_cuda_gemma3_12b.log"))
    assert p is not None
    assert (p.layers_offloaded, p.layers_total, p.gpu_fraction) == (49, 49, 1.0)
    (cuda0,) = p.devices
    assert (cuda0.device, cuda0.description, cuda0.layers, cuda0.layers_estimated) == ("CUDA0", "NVIDIA H200", 49, False)
    assert round((cuda0.model_bytes or 0) / MIB) == 6314  # "CUDA0 model buffer size =  6314.23 MiB"
    assert cuda0.kv_bytes == (2560 + 960) * MIB  # the full-attention and the sliding-window caches
    assert round((cuda0.compute_bytes or 0) / MIB, 2) == 874.02
    assert cuda0.free_bytes_at_load == 142629 * MIB and cuda0.total_bytes == 143155 * MIB
    assert p.host_model_bytes == 540 * MIB  # the input embedding, read one row per token: not a layer


def test_two_gpus_and_a_partial_offload() -> None:
    p = placement_from_lines(lines("two_gpus_partial_30_of_49.log"))
    assert p is not None
    assert (p.layers_offloaded, p.layers_total) == (30, 49)
    assert p.gpu_fraction == pytest.approx(30 / 49)
    by = {d.device: d for d in p.devices}
    assert list(by) == ["CUDA0", "CUDA1"]
    assert by["CUDA0"].description == "NVIDIA GeForce RTX 3090" and by["CUDA1"].description == "NVIDIA GeForce RTX 3060"
    assert by["CUDA0"].model_bytes == round(2590.12 * MIB) and by["CUDA1"].model_bytes == round(1310.05 * MIB)
    assert by["CUDA0"].kv_bytes == 1216 * MIB and by["CUDA1"].kv_bytes == 640 * MIB
    assert by["CUDA1"].compute_bytes == round(310.50 * MIB)
    assert by["CUDA0"].free_bytes_at_load == 23800 * MIB
    # The runner does not print each GPU's layers at INFO: shared out by model bytes, and said to be estimated.
    assert (by["CUDA0"].layers, by["CUDA1"].layers) == (20, 10)
    assert by["CUDA0"].layers_estimated and by["CUDA1"].layers_estimated
    assert p.host_model_bytes == round(2690.34 * MIB) and p.host_kv_bytes == 1216 * MIB


def test_a_hybrid_models_recurrent_state_and_output_buffers_are_placed_per_device() -> None:
    p = placement_from_lines(lines("hybrid_qwen3next_two_gpus.log"))
    assert p is not None
    by = {d.device: d for d in p.devices}
    assert list(by) == ["CUDA0", "CUDA1"]
    assert by["CUDA0"].rs_bytes == round(37.69 * MIB) and by["CUDA1"].rs_bytes == round(37.69 * MIB)
    assert by["CUDA0"].kv_bytes == 384 * MIB, "the RS buffers are not the KV cache"
    assert by["CUDA0"].output_bytes is None, "the output buffer is on the host, not CUDA0"
    assert p.host_output_bytes == round(0.58 * MIB)
    gpu_said = [21050.12, 20510.44, 384.0, 384.0, 37.69, 37.69, 300.75, 310.50]
    assert p.gpu_bytes == sum(round(m * MIB) for m in gpu_said)
    host = round(315.30 * MIB) + round(0.58 * MIB)
    assert ps_sizes(p) == (p.gpu_bytes + host, p.gpu_bytes), "/api/ps's size counts every buffer, as Ollama's does"


def test_a_captured_hybrid_models_kv_cache_and_recurrent_state() -> None:
    p = placement_from_lines(lines("hybrid_lfm2_cpu_captured.log"))
    assert p is not None and p.devices == () and p.gpu_fraction == 0.0
    assert p.host_kv_bytes == 2 * MIB, "llama_kv_cache:        CPU KV buffer size =     2.00 MiB"
    assert p.host_rs_bytes == round(0.02 * MIB), "llama_memory_recurrent:        CPU RS buffer size =     0.02 MiB"
    assert p.host_output_bytes == 0, "the runner said 0.00 MiB: known, and zero"
    assert p.host_bytes == round(14.80 * MIB) + 2 * MIB + round(0.02 * MIB)


def test_rs_and_output_buffers_in_the_stored_rows() -> None:
    p = placement_from_lines(lines("hybrid_qwen3next_two_gpus.log"))
    assert p is not None
    rows = {r.device: r for r in placement_rows(p, ts_unix_s=5.0, port=4000, model="m", digest=None)}
    # llama.cpp's own memory table counts the recurrent state in "context" with the KV cache.
    assert rows["CUDA1"].kv_bytes == 384 * MIB + round(37.69 * MIB)
    assert rows["CPU"].compute_bytes == round(0.58 * MIB)
    back = placement_from_rows(list(rows.values()))
    assert back is not None and back.gpu_bytes == p.gpu_bytes
    assert ps_sizes(back) == ps_sizes(p), "no byte the runner allocated is lost on the way through the store"


@pytest.mark.parametrize(
    "line",
    [
        "llama_memory_recurrent:      CUDA0  RS buffer size =    37.69 MiB",  # RS takes one space, not two
        "llama_context:  CUDA_Host output buffer size =     0.58 MiB",  # output takes two
        "llama_kv_cache:      CUDA0 RS buffer size =    37.69 MiB",  # not the function that prints it
        "sched_reserve:  CUDA_Host  output buffer size =     0.58 MiB",
    ],
)
def test_buffer_kinds_only_in_their_own_form(line: str) -> None:
    assert parse_load_line(line) is None


@pytest.mark.parametrize(
    ("line", "what", "device", "mib"),
    [
        ("llama_memory_recurrent:      CUDA0 RS buffer size =    37.69 MiB", "RS", "CUDA0", 37.69),
        ("llama_kv_cache_recurrent:        CPU RS buffer size =     0.55 MiB", "RS", "CPU", 0.55),
        ("llama_context:  CUDA_Host  output buffer size =     0.58 MiB", "output", "CUDA_Host", 0.58),
        ("llama_new_context_with_model:        CPU  output buffer size =     0.12 MiB", "output", "CPU", 0.12),
    ],
)
def test_rs_and_output_buffer_lines(line: str, what: str, device: str, mib: float) -> None:
    fact = parse_load_line(line)
    assert fact is not None and (fact.kind, fact.what, fact.device) == ("buffer", what, device)
    assert fact.size_bytes == round(mib * MIB)


SPEC_LOG = REPO / "tests" / "data" / "runner_logs" / "speculative_draft_simple_gemma3_270m.log"


def test_a_draft_models_load_is_its_own_not_the_models() -> None:
    """Captured: the real llama-server (CPU build) with Gemma 3 270M as its own draft (``-md``): two loads, each
    with its weights, its two KV caches (full and sliding-window) and its output and compute buffers."""
    p = placement_from_lines(SPEC_LOG.read_text().splitlines())
    assert p is not None and p.devices == () and p.gpu_fraction == 0.0
    assert p.host_kv_bytes == (6 + 15) * MIB, "the draft's KV caches are not added to the model's"
    assert p.host_model_bytes == round(235.16 * MIB) + round(12.66 * MIB)
    assert p.draft is not None and p.draft.host_kv_bytes == (6 + 15) * MIB
    assert p.draft.host_model_bytes == p.host_model_bytes and p.draft.host_output_bytes == 1 * MIB
    both = 2 * (round(235.16 * MIB) + round(12.66 * MIB) + 21 * MIB + 1 * MIB)
    assert p.host_bytes == both, "memory totals count the draft's buffers too"


def test_a_draft_on_the_gpu_leaves_the_models_placement_alone() -> None:
    draft = [
        "common_speculative_init_result: loading draft model '/models/draft-0.6b.gguf'",
        "load_tensors: offloaded 29/29 layers to GPU",
        "load_tensors:        CUDA0 model buffer size =   402.10 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =   224.00 MiB",
        "sched_reserve:      CUDA0 compute buffer size =   300.75 MiB",
    ]
    main = placement_from_lines(lines("h200_cuda_gemma3_12b.log"))
    p = placement_from_lines([*lines("h200_cuda_gemma3_12b.log"), *draft])
    assert main is not None and p is not None
    assert (p.layers_offloaded, p.layers_total) == (49, 49), "the draft's 29/29 is not the model's"
    assert p.devices == main.devices and p.gpu_model_bytes == main.gpu_model_bytes
    assert p.draft is not None and p.draft.gpu_model_bytes == round(402.10 * MIB)
    assert p.gpu_bytes == (main.gpu_bytes or 0) + round(402.10 * MIB) + 224 * MIB + round(300.75 * MIB)
    older = placement_from_lines(
        [*lines("h200_cuda_gemma3_12b.log"), "srv    load_model: loading draft model '/m/d.gguf'", *draft[1:]]
    )
    assert older is not None and older.layers_offloaded == 49 and older.draft is not None
    forged = placement_from_lines([*lines("h200_cuda_gemma3_12b.log"), "srv    load_model: loading draft model '/m/d.gguf' x"])
    assert forged is not None and forged.draft is None, "anchored at both ends"


def test_debug_lines_give_each_gpus_layers_exactly() -> None:
    debug = [
        f"load_tensors: layer {i:3d} assigned to device {'CPU' if i < 19 else 'CUDA0' if i < 40 else 'CUDA1'}, is_swa = 0"
        for i in range(49)
    ]
    p = placement_from_lines([*debug, *lines("two_gpus_partial_30_of_49.log")])
    assert p is not None
    by = {d.device: d for d in p.devices}
    assert (by["CUDA0"].layers, by["CUDA1"].layers) == (21, 9)
    assert not by["CUDA0"].layers_estimated


@pytest.mark.parametrize(
    ("line", "device", "description"),
    [
        (
            "llama_model_load_from_file_impl: using device ROCm0 (AMD Radeon RX 7900 XTX) - 24390 MiB free",
            "ROCm0",
            "AMD Radeon RX 7900 XTX",
        ),
        (
            "llama_prepare_model_devices: using device Vulkan0 (AMD Radeon Graphics (RADV GFX1103_R1)) (0000:c5:00.0)"
            " - 15990 MiB free",
            "Vulkan0",
            "AMD Radeon Graphics (RADV GFX1103_R1)",
        ),
        (
            "0.00.090.578 I llama_prepare_model_devices: using device MTL0 (Apple M2 Max) (unknown id) - 49151 MiB free",
            "MTL0",
            "Apple M2 Max",
        ),
    ],
)
def test_backend_names(line: str, device: str, description: str) -> None:
    fact = parse_load_line(line)
    assert fact is not None and (fact.kind, fact.device, fact.description) == ("device", device, description)


def test_metal_mapped_weights_count_on_the_gpu() -> None:
    p = placement_from_lines(
        [
            "load_tensors: offloaded 29/29 layers to GPU",
            "load_tensors:   CPU_Mapped model buffer size =   308.23 MiB",
            "load_tensors:  MTL0_Mapped model buffer size =  1918.35 MiB",
            "llama_kv_cache:       MTL0 KV buffer size =   896.00 MiB",
        ]
    )
    assert p is not None and p.gpu_fraction == 1.0
    assert [(d.device, d.layers, round((d.model_bytes or 0) / MIB)) for d in p.devices] == [("MTL0", 29, 1918)]


def test_a_build_without_a_gpu_backend_is_all_in_system_memory() -> None:
    p = placement_from_lines(
        [
            "load_tensors:   CPU_Mapped model buffer size =  6314.23 MiB",
            "llama_kv_cache:        CPU KV buffer size =  2560.00 MiB",
        ]
    )
    assert p is not None and p.devices == () and p.gpu_fraction == 0.0 and p.layers_offloaded == 0
    assert placement_from_lines(["srv  load_model: loading model '/m.gguf'"]) is None, "no figure: unknown, not 0"


def test_lines_are_anchored_and_capped() -> None:
    good = "load_tensors: offloaded 49/49 layers to GPU"
    assert parse_load_line(good) is not None
    assert parse_load_line(good + " and more") is None
    assert parse_load_line('msg="user said: load_tensors: offloaded 49/49 layers to GPU" extra') is None
    assert parse_load_line("x" * MAX_LINE_CHARS + "load_tensors: offloaded 49/49 layers to GPU") is None
    assert (
        parse_load_line("srv   prompt_save:  - saving prompt with length 5, total state size = 1.876 MiB (draft: 0.000 MiB)")
        is None
    )


def test_stored_rows_give_the_same_placement_back() -> None:
    p = placement_from_lines(lines("two_gpus_partial_30_of_49.log"))
    assert p is not None
    rows = placement_rows(p, ts_unix_s=5.0, port=4000, model="m", digest=None)
    assert [r.device for r in rows] == ["CUDA0", "CUDA1", "CPU"]
    assert placement_from_rows(rows) == p


def test_a_second_load_replaces_the_first_weights() -> None:
    reader = PlacementReader()
    for line in [*lines("two_gpus_partial_30_of_49.log"), *lines("h200_cuda_gemma3_12b.log")]:
        reader.feed_line(line)
    p = reader.placement()
    assert p is not None and (p.layers_offloaded, p.layers_total) == (49, 49)
    assert round((p.gpu_model_bytes or 0) / MIB) == 6314, "the first load's weights are not counted again"
