"""How Ollama places a model on a real ``llama-server``, imitated by sim (``sim.llama_server_engine``): the GPUs
``--list-devices`` prints, the ``-ngl`` Ollama would ask for, and the sizes Ollama's /api/ps answers from the runner's
load lines."""

from __future__ import annotations

import re

from analysis.log_grammar import MAX_LINE_CHARS
from analysis.runner_load_lines import DEVICE_NAME, MIB, LoadLine, LoadLineKind
from analysis.runner_placement import RunnerPlacement

# ``llama-server --list-devices`` (common/arg.cpp): "  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)", GPUs only.
_AVAILABLE = re.compile(r"^ {2}" + DEVICE_NAME + r": (?P<desc>.{1,160}) \((?P<total>\d{1,9}) MiB, (?P<free>\d{1,9}) MiB free\)$")


def parse_device_list(text: str) -> list[LoadLine]:
    """The GPUs ``llama-server --list-devices`` printed ([] for "(none)": a build with no GPU backend)."""
    out = []
    for line in text.splitlines()[:64]:
        if len(line) > MAX_LINE_CHARS:
            continue
        if m := _AVAILABLE.match(line.rstrip()):
            out.append(
                LoadLine(
                    LoadLineKind.DEVICE,
                    device=m.group("dev"),
                    description=m.group("desc"),
                    total_bytes=int(m.group("total")) * MIB,
                    free_bytes=int(m.group("free")) * MIB,
                )
            )
    return out


def ps_sizes(p: RunnerPlacement) -> tuple[int, int] | None:
    """(size, size_vram) as Ollama ≥ 0.30 answers /api/ps from its runner's load lines: every buffer the runner
    allocated, and the part of it on GPUs. None when the runner said no buffer size."""
    gpu, host = p.gpu_bytes, p.host_bytes
    if gpu is None and host is None:
        return None
    return (gpu or 0) + (host or 0), gpu or 0


def gpu_layers_to_ask(devices: list[LoadLine], need_bytes: int, layers_total: int) -> int:
    """The -ngl Ollama would pass: every layer (the model's + the output layer) when the model and its cache fit
    the GPUs' free memory, else the share of layers that fits, 0 with no GPU."""
    free = sum(d.free_bytes or 0 for d in devices)
    if free <= 0 or layers_total <= 0:
        return 0
    if need_bytes <= free:
        return layers_total
    return max(0, min(layers_total, int(layers_total * free / max(need_bytes, 1))))
