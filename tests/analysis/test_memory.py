"""analysis.memory: the KV cache, compute buffer and fit, by the formulas and against llama-server's own log."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.memory import CELL_PADDING, RunnerSettings, SettingsError, compute_buffer_bytes, kv_cache, plan_memory
from analysis.model_facts import TYPICAL_8B_Q4_K_M as LLAMA_8B
from analysis.model_facts import model_facts_from_show
from tests.support.engine_process import require_llama_server
from tests.support.model_shapes import GEMMA_3_270M as GEMMA

MiB = 1024 * 1024
# Gemma 3 270M as its GGUF describes it (llama-server's print_info): 18 layers, 15 of them sliding over 512 tokens.


def test_full_attention_kv_is_two_times_layers_heads_dim_cells_bytes() -> None:
    kv = kv_cache(LLAMA_8B, RunnerSettings(num_ctx=32768))
    assert kv.full_bytes == 2 * 32 * 8 * 128 * 32768 * 2 == 4 * 1024 * MiB  # docs/physics.md §2: 128 KiB/token, 4 GiB at 32k
    assert kv.swa_bytes == 0


def test_kv_type_scales_by_its_bytes_per_element() -> None:
    f16 = kv_cache(LLAMA_8B, RunnerSettings(num_ctx=8192)).bytes
    assert kv_cache(LLAMA_8B, RunnerSettings(num_ctx=8192, kv_type="q8_0")).bytes == pytest.approx(f16 * 34 / 64)
    assert kv_cache(LLAMA_8B, RunnerSettings(num_ctx=8192, kv_type="q4_0")).bytes == pytest.approx(f16 * 18 / 64)


def test_sliding_window_layers_hold_their_window_and_a_batch_per_sequence() -> None:
    kv = kv_cache(GEMMA, RunnerSettings(num_ctx=8192, num_parallel=2))
    assert kv.full_cells == 16384
    assert kv.swa_cells == 2 * 1024  # (512 + 512) per sequence, padded to 256
    # A context smaller than window + batch: the window layers hold the whole (padded) context.
    assert kv_cache(GEMMA, RunnerSettings(num_ctx=300)).swa_cells == CELL_PADDING * 2


def test_parallel_sequences_share_the_context_cells() -> None:
    one = kv_cache(LLAMA_8B, RunnerSettings(num_ctx=4096, num_parallel=1))
    four = kv_cache(LLAMA_8B, RunnerSettings(num_ctx=4096, num_parallel=4))
    assert four.full_bytes == 4 * one.full_bytes  # Ollama passes -c num_ctx × num_parallel


def test_flash_attention_shrinks_the_attention_scratch() -> None:
    on = compute_buffer_bytes(LLAMA_8B, RunnerSettings(num_ctx=32768, flash_attn=True))
    off = compute_buffer_bytes(LLAMA_8B, RunnerSettings(num_ctx=32768, flash_attn=False))
    assert off > 4 * on


def test_refused_combinations_say_why() -> None:
    with pytest.raises(SettingsError, match="needs flash attention"):
        kv_cache(GEMMA, RunnerSettings(num_ctx=4096, kv_type="q8_0", flash_attn=False))
    with pytest.raises(SettingsError, match="unknown KV cache type"):
        kv_cache(GEMMA, RunnerSettings(num_ctx=4096, kv_type="q3"))


def test_fit_counts_whole_layers_and_spill_is_the_rest() -> None:
    s = RunnerSettings(num_ctx=8192)
    roomy = plan_memory(LLAMA_8B, s, 24e9)
    assert roomy.fits and roomy.spill_bytes == 0 and roomy.vram_fraction == 1.0
    tight = plan_memory(LLAMA_8B, s, 3e9)
    assert tight.fits is False and 0 < tight.layers_on_gpu < 32
    assert tight.spill_bytes == pytest.approx(tight.total_bytes - tight.gpu_bytes) and tight.gpu_bytes <= 3e9
    none = plan_memory(LLAMA_8B, s, None)
    assert none.fits is None and none.vram_fraction == 0.0


def test_show_gives_the_window_and_pattern() -> None:
    info: dict[str, object] = {
        "general.architecture": "gemma3",
        "general.parameter_count": 268098176,
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.feed_forward_length": 2048,
        "gemma3.attention.sliding_window": 512,
    }
    show = {"model_info": info, "details": {"quantization_level": "Q4_K_M"}}
    f = model_facts_from_show(show, 253_000_000)
    assert (f.sliding_window, f.swa_layers, f.ffn_length) == (512, 15, 2048)
    per_layer = {**info, "gemma3.attention.sliding_window_pattern": [True, False] * 9}
    assert model_facts_from_show({**show, "model_info": per_layer}, 253_000_000).swa_layers == 9
    assert replace(f, kv_bytes_per_element=1.0).kv_bytes_per_token == f.kv_bytes_per_token / 2


# -- against the real runner ------------------------------------------------------------------------------

_KV_LINE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers")
_COMPUTE_LINE = re.compile(r"CPU compute buffer size = +([0-9.]+) MiB")


def _llama_server_memory(binary: Path, gguf: Path, s: RunnerSettings, log: Path) -> tuple[list[float], float]:
    """(KV cache MiB per cache, compute buffer MiB) as llama-server prints them, started with Ollama's flags."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [
        str(binary),
        "--model",
        str(gguf),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--no-webui",
        "--offline",
        "-c",
        str(s.num_ctx * s.num_parallel),
        "-np",
        str(s.num_parallel),
        "-b",
        str(s.ubatch_tokens),
        "-ub",
        str(s.ubatch_tokens),
        "--cache-type-k",
        s.kv_type,
        "--cache-type-v",
        s.kv_type,
        "--flash-attn",
        "on" if s.flash_attn else "off",
        "-t",
        "1",
        "--log-verbosity",
        "4",
        "--no-log-prefix",
        "--no-log-timestamps",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not _COMPUTE_LINE.search(log.read_text()):
                assert proc.poll() is None, f"llama-server exited: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, "llama-server printed no compute buffer size in 120 s"
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    text = log.read_text()
    kv = [float(m[1]) for m in _KV_LINE.finditer(text)]
    compute = _COMPUTE_LINE.search(text)
    assert compute is not None
    return kv, float(compute[1])


@pytest.mark.engine
@pytest.mark.parametrize("num_ctx", [2048, 8192, 32768])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_prediction_meets_llama_servers_own_figures(num_ctx: int, kv_type: str, tmp_path: Path) -> None:
    binary, gguf = require_llama_server()
    s = RunnerSettings(num_ctx=num_ctx, kv_type=kv_type, flash_attn=True)  # a quantized V cache needs flash attention
    kv_mib, compute_mib = _llama_server_memory(binary, gguf, s, tmp_path / "llama-server.log")
    kv = kv_cache(GEMMA, s)
    assert len(kv_mib) == 2, "a full-attention and a sliding-window cache"
    assert kv.full_bytes / MiB == pytest.approx(kv_mib[0], rel=0.10)
    assert kv.swa_bytes / MiB == pytest.approx(kv_mib[1], rel=0.10)
    assert compute_buffer_bytes(GEMMA, s) / MiB == pytest.approx(compute_mib, rel=0.10)
