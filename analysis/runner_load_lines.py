"""The load lines llama.cpp's ``llama-server`` prints, parsed: one ``LoadLine`` each (where a runner put its model,
in its own words; ``analysis.runner_placement`` folds them).

Ollama passes its runner's output into its own log, so the collector (``collectors.ollama.log``) and sim (which
starts a real ``llama-server``) read the same lines. Each pattern below is the exact form the runner prints,
anchored at both ends (llama.cpp's ``src/llama.cpp``, ``src/llama-model.cpp``, ``src/llama-kv-cache.cpp``,
``src/llama-memory-recurrent.cpp``, ``src/llama-context.cpp``, ``common/fit.cpp``)::

    llama_prepare_model_devices: using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 142629 MiB free
    cmn  common_param:   - CUDA0   : NVIDIA H200 (143155 MiB, 142629 MiB free)
    load_tensors: offloaded 49/49 layers to GPU
    load_tensors:        CUDA0 model buffer size =  6314.23 MiB
    load_tensors:   CPU_Mapped model buffer size =   540.00 MiB
    llama_kv_cache:      CUDA0 KV buffer size =  2560.00 MiB
    llama_memory_recurrent:      CUDA0 RS buffer size =    75.38 MiB        (hybrid and recurrent models)
    llama_context:  CUDA_Host  output buffer size =     2.00 MiB
    sched_reserve:      CUDA0 compute buffer size =   874.02 MiB
    common_memory_breakdown_print: |   - CUDA0 (H200) | 143155 = 142629 + (10708 =  6314 +    3520 +     874) +      -10181 |
    load_tensors: layer  12 assigned to device CUDA1, is_swa = 0      (debug verbosity only)

Device names are the backends' own: ``CUDA0`` (ROCm builds say ``ROCm0``, MUSA ``MUSA0``), ``Vulkan0``, ``MTL0``
(Metal; its weights buffer is ``MTL0_Mapped``), ``SYCL0``; host buffers are ``CPU``, ``CPU_Mapped``,
``CPU_REPACK`` and ``<backend>_Host``. "offloaded N/M" counts the output layer as one of M (n_layer + 1), and
the input embedding always stays in system memory: it is read one row per token, so it does not count against
``gpu_fraction``, which is N ÷ M. A line counts only in that form, printed by the function named, after the prefix
``analysis.log_grammar`` splits off; a line longer than ``MAX_LINE_CHARS`` is not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from analysis.log_grammar import MAX_LINE_CHARS, RunnerLine, runner_line

MIB = 1024 * 1024

_DEV = r"(?P<dev>[A-Za-z][A-Za-z0-9_]{0,31})"
DEVICE_NAME = _DEV  # a backend's device name ("CUDA0", "MTL0"), as a named group: sim's device list reads it too
_MIB = r"(?P<mib>\d{1,9}\.\d{2}) MiB"
# Each load line's message after its printing function (analysis.log_grammar), and the functions that print it,
# named exactly (across llama.cpp versions): a line from another function (``xload_tensors:``) is none of them.
_DESC = r"(?P<desc>[^()]{1,160}(?:\([^()]{0,32}\)[^()]{0,64}){0,4})"  # "NVIDIA H200", "Intel(R) Xeon(R) Processor"
_USING = re.compile(r"using device " + _DEV + r" \(" + _DESC + r"\)(?: \((?P<id>[^()]{0,64})\))? - (?P<free>\d{1,9}) MiB free")
_USING_FUNCS = frozenset({"llama_prepare_model_devices", "llama_model_load_from_file_impl"})
_LISTED = re.compile(r"  - " + _DEV + r" *: " + _DESC + r" \((?P<total>\d{1,9}) MiB, (?P<free>\d{1,9}) MiB free\)")
_LISTED_FUNC = ("cmn", "common_param")  # common_params_print_info's device_info, tagged and cut to 12
_OFFLOADED = re.compile(r"offloaded (?P<n>\d{1,4})/(?P<m>\d{1,4}) layers to GPU")
_TENSOR_FUNCS = frozenset({"load_tensors", "llm_load_tensors"})
# Every kind Ollama's own pattern takes, ``(model|KV|compute|output|RS)`` (its llm/llama_server.go). The formats:
# "%s: %12s model buffer size", "%s: %10s KV buffer size", "%s: %10s RS buffer size", "%s: %10s compute buffer
# size" and, with two spaces, "%s: %10s  output buffer size" (each "= %8.2f MiB"; checked against the strings of
# the llama-server this project builds). The separator is captured so that "output" takes exactly its two.
_BUFFER = re.compile(
    r" *(?P<buf>[A-Za-z][A-Za-z0-9_]{0,47})(?P<sep> {1,2})(?P<what>model|KV|compute|output|RS) buffer size = +" + _MIB
)
BUFFER_KINDS = ("model", "KV", "RS", "compute", "output")
_BUFFER_FUNCS = {
    "model": _TENSOR_FUNCS,
    "KV": frozenset({"llama_kv_cache", "llama_kv_cache_unified", "llama_kv_cache_init"}),
    # The recurrent state of hybrid and recurrent models (Mamba, qwen3-next, nemotron-h, lfm2, granite4): its own
    # class since mid-2025, named llama_kv_cache_recurrent before.
    "RS": frozenset({"llama_memory_recurrent", "llama_kv_cache_recurrent"}),
    "compute": frozenset({"sched_reserve", "graph_reserve", "llama_context", "llama_new_context_with_model"}),
    # The logits and embeddings of a step, printed by the context's constructor after its first output_reserve.
    "output": frozenset({"llama_context", "llama_new_context_with_model"}),
}
_BREAKDOWN = re.compile(
    r"\| +- " + _DEV + r" \((?P<desc>[^()|]{1,160})\) +\| +(?P<total>\d{1,9}) = (?P<free>\d{1,9}) \+ "
    r"\( *(?P<self>\d{1,9}) = +(?P<model>\d{1,9}) \+ +(?P<context>\d{1,9}) \+ +(?P<compute>\d{1,9})\) \+ +-?\d{1,9} \|"
)
_BREAKDOWN_FUNCS = frozenset({"common_memory_breakdown_print", "llama_memory_breakdown_print"})
_LAYER = re.compile(r"layer +(?P<layer>\d{1,4}) assigned to device " + _DEV + r", is_swa = \d")
# Cheap first test: every load line carries one of these.
_HINTS = ("MiB", "offloaded", "assigned to device", " + (", "loading draft model")
# A runner with a draft model (speculative decoding) loads it after its own: "srv    load_model: loading draft model
# '%s'" (tools/server, SRV_INF) or, in today's builds, "common_speculative_init_result: loading draft model '%s'".
# Every load line after it is the draft's.
_DRAFT = re.compile(r"loading draft model '(?P<path>[^'\x00-\x1f]{1,4096})'")
_DRAFT_FUNCS = frozenset({("srv", "load_model"), ("", "common_speculative_init_result")})
# The last line of the runner's start (tools/server/server.cpp): from here on it serves, and prints no load line.
# Older builds: "main: server is listening on http://127.0.0.1:8080 - starting the main loop".
_HOST = r"(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:]{2,39}\]|localhost)"
_LISTENING = re.compile(r"listening on http://" + _HOST + r":(?P<port>[0-9]{1,5})")
_LISTENING_OLD = re.compile(r"server is listening on http://" + _HOST + r":(?P<port>[0-9]{1,5}) - starting the main loop")


class LoadLineKind(StrEnum):
    """What a load line says (``LoadLine.kind``)."""

    DEVICE = "device"  # using device / device list / breakdown row
    OFFLOADED = "offloaded"  # N of M layers offloaded
    BUFFER = "buffer"  # one of ``BUFFER_KINDS``: model, KV, RS, compute, output
    LAYER = "layer"  # a debug line: one layer's device
    DRAFT = "draft"  # the draft model's load begins: the lines after it are the draft's


@dataclass(frozen=True)
class LoadLine:
    """One understood load line, of a ``LoadLineKind``."""

    kind: LoadLineKind
    device: str | None = None  # "CUDA0"; for buffer lines the buffer's name ("CPU_Mapped", "MTL0_Mapped")
    description: str | None = None  # "NVIDIA H200"
    free_bytes: int | None = None
    total_bytes: int | None = None
    what: str | None = None  # buffer lines: model | KV | RS | compute | output
    size_bytes: int | None = None
    layers: int | None = None  # offloaded: N; layer: the layer's index
    layers_total: int | None = None  # offloaded: M
    breakdown: tuple[int, int, int] | None = None  # the table's model, context, compute MiB for the device, in bytes


def _mib(text: str) -> int:
    return round(float(text) * MIB)


def parse_load_line(line: str) -> LoadLine | None:
    """The load fact a runner's line carries, or None (also for a line over ``MAX_LINE_CHARS``)."""
    if len(line) > MAX_LINE_CHARS or not any(h in line for h in _HINTS):
        return None
    split = runner_line(line.rstrip("\r\n "))
    return load_of(split) if split is not None else None


def load_of(line: RunnerLine) -> LoadLine | None:
    """The load fact one of the runner's lines, already split (``analysis.log_grammar``), carries; None for another."""
    if (line.tag, line.func) in _DRAFT_FUNCS and _DRAFT.fullmatch(line.message.rstrip(" ")):
        return LoadLine(LoadLineKind.DRAFT)
    if line.tag:
        return _listed(line.message) if (line.tag, line.func) == _LISTED_FUNC else None
    text = line.message.rstrip(" ")
    if m := _BUFFER.fullmatch(text):
        if line.func not in _BUFFER_FUNCS[m.group("what")] or (m.group("sep") == "  ") != (m.group("what") == "output"):
            return None
        return LoadLine(LoadLineKind.BUFFER, device=m.group("buf"), what=m.group("what"), size_bytes=_mib(m.group("mib")))
    if line.func in _TENSOR_FUNCS:
        if m := _OFFLOADED.fullmatch(text):
            return LoadLine(LoadLineKind.OFFLOADED, layers=int(m.group("n")), layers_total=int(m.group("m")))
        if m := _LAYER.fullmatch(text):
            return LoadLine(LoadLineKind.LAYER, device=m.group("dev"), layers=int(m.group("layer")))
        return None
    if line.func in _USING_FUNCS and (m := _USING.fullmatch(text)):
        return LoadLine(
            LoadLineKind.DEVICE, device=m.group("dev"), description=m.group("desc"), free_bytes=int(m.group("free")) * MIB
        )
    if line.func in _BREAKDOWN_FUNCS and (m := _BREAKDOWN.fullmatch(text)):
        parts = (int(m.group("model")) * MIB, int(m.group("context")) * MIB, int(m.group("compute")) * MIB)
        return LoadLine(
            LoadLineKind.DEVICE,
            device=m.group("dev"),
            total_bytes=int(m.group("total")) * MIB,
            free_bytes=int(m.group("free")) * MIB,
            breakdown=parts,
        )
    return None


def listening_port(line: RunnerLine) -> int | None:
    """The port of the runner's "listening on" line (the end of its start), or None for any other line."""
    if (line.tag, line.func) == ("srv", "llama_server"):
        m = _LISTENING.fullmatch(line.message.rstrip(" "))
    elif (line.tag, line.func) == ("", "main"):
        m = _LISTENING_OLD.fullmatch(line.message.rstrip(" "))
    else:
        return None
    port = int(m.group("port")) if m else 0
    return port if 0 < port < 65536 else None


def _listed(text: str) -> LoadLine | None:
    m = _LISTED.fullmatch(text.rstrip(" "))
    if m is None:
        return None
    return LoadLine(
        LoadLineKind.DEVICE,
        device=m.group("dev"),
        description=m.group("desc").strip(),
        total_bytes=int(m.group("total")) * MIB,
        free_bytes=int(m.group("free")) * MIB,
    )


def is_host_buffer(name: str) -> bool:
    """A buffer in system memory: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host, Vulkan_Host, ..."""
    return name.startswith("CPU") or name.endswith("_Host") or name == "CPU"


def buffer_device(name: str) -> str | None:
    """The device a buffer lives on ("CUDA0" for CUDA0, "MTL0" for MTL0_Mapped); None for a host buffer or one
    split across devices (CUDA_Split)."""
    if is_host_buffer(name):
        return None
    m = re.fullmatch(r"([A-Za-z]+\d+)(?:_Mapped)?", name)
    return m.group(1) if m else None


def is_gpu_device(name: str) -> bool:
    return not name.startswith("CPU") and re.fullmatch(r"[A-Za-z]+\d+", name) is not None
