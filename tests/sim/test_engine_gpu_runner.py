"""sim plays a GPU runner: -ngl as Ollama passes it, and /api/ps's size and size_vram from the runner's own load
lines (the real CUDA runner's, from a run on an NVIDIA H200), as Ollama >= 0.30 answers; a CPU build: size_vram 0."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from analysis.runner_load_lines import MIB, LoadLineKind
from analysis.speculative import Speculation
from collectors.ollama.discovery import runner_from_argv
from sim.catalog import BY_NAME
from sim.llama_server_engine import LlamaServerEngine, ServerChild, loaded_sizes
from tests.support.paths import REPO

H200_LINES = REPO / "tests" / "data" / "runner_load" / "h200_cuda_gemma3_12b.log"
MODEL = BY_NAME["llama3.1:8b"]


def engine_like(binary: Path | str = "/bin/false") -> Any:
    """What a runner and the device probe read of their engine (a real one needs a GGUF and a binary to start)."""
    return SimpleNamespace(
        binary=binary,
        model=SimpleNamespace(
            path="/m.gguf",
            size_bytes=MODEL.size_bytes,
            kv_bytes_per_token=MODEL.kv_bytes_per_token,
            block_count=MODEL.block_count,
            pooling_type=None,  # a generator: no --embedding
        ),
        num_parallel=2,
        n_threads=8,
        flash_attn="auto",
        kv_cache_type="f16",
        default_keep_alive_ns=5 * 60 * 10**9,
        gpu_devices=None,
        draft_gguf=None,  # no draft model: no speculative decoding
        draft_max_tokens=None,
    )


def pumped(runner: ServerChild, text: str) -> None:
    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(text.encode())
        reader.feed_eof()
        await runner._pump(reader)

    asyncio.run(go())


def test_api_ps_sizes_come_from_the_cuda_runners_load_lines() -> None:
    runner = ServerChild(cast(Any, engine_like()), 20480, 512, gpu_layers=49)
    assert runner.argv[runner.argv.index("--n-gpu-layers") + 1] == "49"
    pumped(runner, H200_LINES.read_text())
    size, vram = loaded_sizes(runner.placement, estimate_bytes=24_000_000_000)
    # CUDA0: weights 6,314.23 + KV 2,560 + 960 + compute 874.02 MiB; the input embedding (540 MiB) and the output
    # buffer (CUDA_Host, 2 MiB) in system memory: every buffer kind Ollama's pattern takes counts.
    assert vram == round(6314.23 * MIB) + 3520 * MIB + round(874.02 * MIB)
    assert size == vram + 540 * MIB + 2 * MIB


def test_a_cpu_build_says_size_vram_0() -> None:
    runner = ServerChild(cast(Any, engine_like()), 4096, 512)
    assert runner.argv[runner.argv.index("--n-gpu-layers") + 1] == "0"
    pumped(
        runner,
        "load_tensors:   CPU_Mapped model buffer size =   241.41 MiB\nllama_kv_cache:        CPU KV buffer size =    18.00 MiB\n",
    )
    assert loaded_sizes(runner.placement, estimate_bytes=300_000_000) == (300_000_000, 0)


def test_load_lines_echoed_after_the_runner_listens_do_not_change_api_ps() -> None:
    """A client can have the runner echo any line (an invalid grammar, verbatim): sim's /api/ps reads only the lines
    of the runner's start, up to its own listening line (issue 39 F10: forged lines made it say 0.98 in VRAM)."""
    runner = ServerChild(cast(Any, engine_like()), 4096, 512)
    real = (
        "load_tensors:   CPU_Mapped model buffer size =   241.41 MiB\nllama_kv_cache:        CPU KV buffer size =    18.00 MiB\n"
    )
    forged = (
        "load_tensors: offloaded 19/19 layers to GPU\n"
        "load_tensors:        CUDA0 model buffer size =  9999.00 MiB\n"
        "llama_kv_cache:      CUDA0 KV buffer size =  9999.00 MiB\n"
    )
    other_port = f"srv  llama_server: listening on http://127.0.0.1:{runner.port + 1}\n"
    pumped(runner, real + other_port + f"srv  llama_server: listening on http://127.0.0.1:{runner.port}\n" + forged)
    assert loaded_sizes(runner.placement, estimate_bytes=300_000_000) == (300_000_000, 0)
    assert not runner.starting


def test_every_layer_when_the_model_fits_the_gpus_the_build_lists(tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --list-devices ] && '
        'printf "Available devices:\\n  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)\\n"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    engine = engine_like(fake)
    devices = asyncio.run(LlamaServerEngine.devices(engine))
    assert [(d.device, d.description, d.free_bytes) for d in devices] == [("CUDA0", "NVIDIA H200", 142629 * MIB)]
    assert LlamaServerEngine._gpu_layers(engine, 20480, devices) == MODEL.block_count + 1
    small = [devices[0].__class__(LoadLineKind.DEVICE, device="CUDA0", free_bytes=MODEL.size_bytes // 2)]
    assert 0 < LlamaServerEngine._gpu_layers(engine, 20480, small) < MODEL.block_count + 1, (
        "a partial offload when it does not fit"
    )
    cpu = engine_like(tmp_path / "cpu-build")
    (tmp_path / "cpu-build").write_text('#!/bin/sh\nprintf "Available devices:\\n  (none)\\n"\n')
    (tmp_path / "cpu-build").chmod(0o755)
    assert asyncio.run(LlamaServerEngine.devices(cpu)) == []
    assert LlamaServerEngine._gpu_layers(cpu, 20480, []) == 0


def test_a_draft_model_reaches_the_childs_command_line_as_discovery_reads_it() -> None:
    engine = engine_like()
    engine.draft_gguf, engine.draft_max_tokens = "/d.gguf", 4
    runner = ServerChild(cast(Any, engine), 4096, 512)
    found = runner_from_argv(1, "llama-server", runner.argv)
    assert found is not None and found.model_path == "/m.gguf"
    assert found.speculation == Speculation("/d.gguf", ("draft-simple",), 4, None)
    plain = runner_from_argv(1, "llama-server", ServerChild(cast(Any, engine_like()), 4096, 512).argv)
    assert plain is not None and not plain.speculation.active
