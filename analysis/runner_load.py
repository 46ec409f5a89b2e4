"""Where a runner put its model, in its own words: the load lines llama.cpp's ``llama-server`` prints.

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
from dataclasses import dataclass, field, replace
from enum import StrEnum

from analysis.log_grammar import MAX_LINE_CHARS, RunnerLine, runner_line

MIB = 1024 * 1024
MAX_DEVICES = 16  # devices and buffers one load's lines may name; more are not a load's (dropped, counted)
MAX_LAYERS = 1024  # layers one load's debug lines may place (the largest models have under 200)

_DEV = r"(?P<dev>[A-Za-z][A-Za-z0-9_]{0,31})"
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


@dataclass(frozen=True)
class DevicePlacement:
    """What one device holds of a runner's model, as the runner said. None: the runner did not say."""

    device: str  # "CUDA0", "ROCm1", "Vulkan0", "MTL0"
    description: str | None  # "NVIDIA H200"
    layers: int | None  # layers on it: said by debug lines, or all offloaded ones when it is the only GPU
    layers_estimated: bool  # layers shared out among several GPUs by their model bytes (the runner did not say)
    model_bytes: int | None
    kv_bytes: int | None
    compute_bytes: int | None
    free_bytes_at_load: int | None  # free on the device when the runner looked, before it loaded
    total_bytes: int | None
    rs_bytes: int | None = None  # recurrent state (hybrid and recurrent models' "RS" buffers)
    output_bytes: int | None = None  # the step's logits ("output" buffer)

    @property
    def buffer_sizes(self) -> tuple[int | None, ...]:
        """Every buffer kind the runner prints for this device (``BUFFER_KINDS``' order), None where it said none."""
        return (self.model_bytes, self.kv_bytes, self.rs_bytes, self.compute_bytes, self.output_bytes)


def sum_known(*parts: int | None) -> int | None:
    """The sum of the sizes said; None when none was (unknown is never 0)."""
    said = [p for p in parts if p is not None]
    return sum(said) if said else None


@dataclass(frozen=True)
class RunnerPlacement:
    """Where one runner put its model: layers offloaded of all, each GPU's share, what stayed in system memory."""

    layers_offloaded: int | None  # N of "offloaded N/M layers to GPU"; 0 for a build with no GPU backend
    layers_total: int | None  # M (the model's layers + the output layer)
    devices: tuple[DevicePlacement, ...]  # GPUs only
    host_model_bytes: int | None  # weights kept in system memory (CPU_Mapped, CPU, CPU_REPACK buffers)
    host_kv_bytes: int | None
    host_rs_bytes: int | None = None
    host_output_bytes: int | None = None  # llama.cpp keeps the logits in host memory (CUDA_Host, CPU)
    draft: RunnerPlacement | None = None  # the draft model's own placement (speculative decoding), loaded after this

    @property
    def gpu_fraction(self) -> float | None:
        """Share of the model's layers on GPUs (N ÷ M); None when the runner did not say."""
        if self.layers_offloaded == 0:
            return 0.0
        if self.layers_offloaded is None or not self.layers_total:
            return None
        return min(max(self.layers_offloaded / self.layers_total, 0.0), 1.0)

    @property
    def gpu_model_bytes(self) -> int | None:
        sizes = [d.model_bytes for d in self.devices if d.model_bytes is not None]
        return sum(sizes) if sizes else None

    @property
    def gpu_bytes(self) -> int | None:
        """Everything the runner put on its GPUs: weights, KV cache, recurrent state, compute and output buffers, its
        draft model's included."""
        draft = self.draft.gpu_bytes if self.draft is not None else None
        return sum_known(*(b for d in self.devices for b in d.buffer_sizes), draft)

    @property
    def host_bytes(self) -> int | None:
        """What the runner's buffer lines put in system memory, its draft model's included (host compute buffers are
        not kept)."""
        draft = self.draft.host_bytes if self.draft is not None else None
        return sum_known(self.host_model_bytes, self.host_kv_bytes, self.host_rs_bytes, self.host_output_bytes, draft)


@dataclass
class PlacementReader:
    """Folds one runner's load lines, in order, into its ``RunnerPlacement`` (``placement()``). A new load of the
    same runner starts with ``reset()``."""

    offloaded: tuple[int, int] | None = None
    descriptions: dict[str, str] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)  # by buffer name
    kv: dict[str, int] = field(default_factory=dict)  # by buffer name, summed (a sliding-window model has two caches)
    rs: dict[str, int] = field(default_factory=dict)  # by buffer name, summed (one per buffer type, as the KV cache)
    compute: dict[str, int] = field(default_factory=dict)  # by buffer name, the latest
    output: dict[str, int] = field(default_factory=dict)  # by buffer name, the latest
    layer_devices: dict[int, str] = field(default_factory=dict)
    breakdown: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # the memory table's, by device
    lines: int = 0
    dropped: int = 0  # facts beyond MAX_DEVICES names or MAX_LAYERS layers
    draft: PlacementReader | None = None  # the draft model's lines, once its load began

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def _names(self) -> set[str]:
        buffers = (*self.model, *self.kv, *self.rs, *self.compute, *self.output)
        return {*self.descriptions, *self.free, *self.total, *buffers, *self.breakdown}

    def _room_for(self, fact: LoadLine) -> bool:
        """Whether the fact names no device or buffer beyond the ``MAX_DEVICES`` this load already named, and no
        layer beyond ``MAX_LAYERS``."""
        dev = fact.device
        if dev is not None and dev not in self._names() and len(self._names()) >= MAX_DEVICES:
            return False
        new_layer = fact.kind is LoadLineKind.LAYER and fact.layers is not None and fact.layers not in self.layer_devices
        return not (new_layer and len(self.layer_devices) >= MAX_LAYERS)

    def feed(self, fact: LoadLine) -> bool:
        """Fold one fact in; False (and counted in ``dropped``) when there is no room for it (``_room_for``): more
        devices or layers than a load has are not a load's."""
        if self.draft is not None:  # the draft's load: its figures are its own, never this model's
            return self.draft.feed(fact)
        if fact.kind is LoadLineKind.DRAFT:
            self.draft = PlacementReader()
            self.lines += 1
            return True
        if not self._room_for(fact):
            self.dropped += 1
            return False
        self.lines += 1
        dev = fact.device
        if fact.kind is LoadLineKind.OFFLOADED and fact.layers is not None and fact.layers_total is not None:
            if self.offloaded is not None or self.model:  # a second model load in the same runner: its own figures
                self.model.clear()
                self.kv.clear()
                self.rs.clear()
            self.offloaded = (fact.layers, fact.layers_total)
        elif fact.kind is LoadLineKind.DEVICE and dev is not None:
            self._device(dev, fact)
        elif fact.kind is LoadLineKind.BUFFER and dev is not None and fact.size_bytes is not None:
            self._buffer(dev, fact.what, fact.size_bytes)
        elif fact.kind is LoadLineKind.LAYER and dev is not None and fact.layers is not None:
            self.layer_devices[fact.layers] = dev
        return True

    def _buffer(self, name: str, what: str | None, size: int) -> None:
        if what == "model":
            self.model[name] = size
        elif what in ("KV", "RS"):  # caches: one line per buffer type, a model may have several (SWA, hybrid)
            cache = self.kv if what == "KV" else self.rs
            cache[name] = cache.get(name, 0) + size
        elif what == "output":
            self.output[name] = size
        else:
            self.compute[name] = size

    def _device(self, dev: str, fact: LoadLine) -> None:
        if fact.description:
            self.descriptions[dev] = fact.description
        if fact.free_bytes is not None:
            self.free.setdefault(dev, fact.free_bytes)  # the first: before this runner took any
        if fact.total_bytes is not None:
            self.total[dev] = fact.total_bytes
        if fact.breakdown is not None:
            self.breakdown[dev] = fact.breakdown

    def feed_line(self, line: str) -> bool:
        """Feed a raw line; True when it was a load line."""
        fact = parse_load_line(line)
        return fact is not None and self.feed(fact)

    def _device_sizes(self) -> tuple[dict[str, int], ...]:
        """Each kind's bytes by device (model, KV, RS, compute, output), the memory table's where no line said."""
        model, kv, rs = _by_device(self.model), _by_device(self.kv), _by_device(self.rs)
        compute, output = _by_device(self.compute), _by_device(self.output)
        for d, (table_model, table_context, table_compute) in self.breakdown.items():
            model.setdefault(d, table_model)
            if d not in rs:  # the table's "context" is the KV cache and the recurrent state together
                kv.setdefault(d, table_context)
            compute.setdefault(d, table_compute)
        return model, kv, rs, compute, output

    def _layers_on(self, device: str, offloaded: int | None, weights: dict[str, int]) -> tuple[int | None, bool]:
        """(layers on the device, estimated): as debug lines said; else all offloaded ones on the only GPU with
        weights; else shared out among the GPUs by their model bytes (estimated). ``weights``: GPUs with weights."""
        if self.layer_devices:
            return sum(1 for v in self.layer_devices.values() if v == device), False
        if offloaded is None:
            return None, False
        if len(weights) <= 1:
            return (offloaded if device in weights or not weights else 0), False
        if device in weights:
            return round(offloaded * weights[device] / sum(weights.values())), True
        return None, False

    def placement(self) -> RunnerPlacement | None:
        """The placement so far; None before any figure of where the model went."""
        if self.offloaded is None and not self.model:
            return None

        model, kv, rs, compute, output = self._device_sizes()
        names = [d for d in dict.fromkeys([*model, *kv, *rs, *self.free]) if is_gpu_device(d)]
        if not model and self.offloaded is None:
            names = []
        offloaded = self.offloaded
        if offloaded is None:  # a build with no GPU backend prints no "offloaded" line: all of it is in system memory
            offloaded = (0, 0) if not names else None
        n = offloaded[0] if offloaded is not None else None
        gpus_with_weights = [d for d in names if model.get(d)]
        devices = []
        for d in names:
            layers, estimated = self._layers_on(d, n, {g: model[g] for g in gpus_with_weights})
            sizes = (model.get(d), kv.get(d), compute.get(d), self.free.get(d), self.total.get(d), rs.get(d), output.get(d))
            devices.append(DevicePlacement(d, self.descriptions.get(d), layers, estimated, *sizes))
        layers_total = offloaded[1] if offloaded is not None and offloaded[1] else None
        placement = RunnerPlacement(
            offloaded[0] if offloaded is not None else None,
            layers_total,
            tuple(devices),
            _on_host(self.model),
            _on_host(self.kv),
            _on_host(self.rs),
            _on_host(self.output),
        )
        if offloaded == (0, 0):
            placement = replace(placement, layers_total=None)
        if self.draft is not None:
            placement = replace(placement, draft=self.draft.placement())
        return placement


def _by_device(sizes: dict[str, int]) -> dict[str, int]:
    """Buffer sizes by the device each buffer lives on (host and split buffers left out)."""
    out: dict[str, int] = {}
    for buf, size in sizes.items():
        d = buffer_device(buf)
        if d is not None:
            out[d] = out.get(d, 0) + size
    return out


def _on_host(sizes: dict[str, int]) -> int | None:
    host = [size for buf, size in sizes.items() if is_host_buffer(buf)]
    return sum(host) if host else None


def placement_from_lines(lines: list[str] | tuple[str, ...]) -> RunnerPlacement | None:
    """One runner's placement from its output lines (the last load, when it loaded more than once)."""
    reader = PlacementReader()
    for line in lines:
        reader.feed_line(line)
    return reader.placement()


HOST_DEVICE = "CPU"  # the stored row of what a runner kept in system memory
SOURCE_LOG = "runner log"  # the runner's own load lines, read from Ollama's log


@dataclass(frozen=True)
class RunnerDeviceRow:
    """One device's share of a runner's model as the runner's own load lines said: one row per (runner port,
    device), replaced at each load. The ``HOST_DEVICE`` row holds what stayed in system memory. The runner-wide
    ``layers_offloaded``/``layers_total`` repeat on each row. None: the runner did not say (never 0).

    The store keeps three sizes a device: ``kv_bytes`` is llama.cpp's own "context" (its memory table's column: the KV
    cache and the recurrent state together) and ``compute_bytes`` holds the output buffer too, so that every byte
    the runner allocated is in some row (``placement_rows``)."""

    ts_unix_s: float  # when the load lines were read
    port: int
    model: str | None  # the /api/ps name the runner serves, once matched
    digest: str | None
    device: str
    description: str | None
    layers_offloaded: int | None
    layers_total: int | None
    layers: int | None
    layers_estimated: bool
    model_bytes: int | None
    kv_bytes: int | None
    compute_bytes: int | None
    free_bytes_at_load: int | None
    total_bytes: int | None
    source: str


def placement_rows(
    p: RunnerPlacement, *, ts_unix_s: float, port: int, model: str | None, digest: str | None, source: str = SOURCE_LOG
) -> list[RunnerDeviceRow]:
    """The store's rows of one runner's placement."""
    common = dict(ts_unix_s=ts_unix_s, port=port, model=model, digest=digest, source=source)
    rows = [
        RunnerDeviceRow(
            device=d.device,
            description=d.description,
            layers_offloaded=p.layers_offloaded,
            layers_total=p.layers_total,
            layers=d.layers,
            layers_estimated=d.layers_estimated,
            model_bytes=d.model_bytes,
            kv_bytes=sum_known(d.kv_bytes, d.rs_bytes),
            compute_bytes=sum_known(d.compute_bytes, d.output_bytes),
            free_bytes_at_load=d.free_bytes_at_load,
            total_bytes=d.total_bytes,
            **common,  # type: ignore[arg-type]
        )
        for d in p.devices
    ]
    rows.append(
        RunnerDeviceRow(
            device=HOST_DEVICE,
            description=None,
            layers_offloaded=p.layers_offloaded,
            layers_total=p.layers_total,
            layers=None,
            layers_estimated=False,
            model_bytes=p.host_model_bytes,
            kv_bytes=sum_known(p.host_kv_bytes, p.host_rs_bytes),
            compute_bytes=p.host_output_bytes,
            free_bytes_at_load=None,
            total_bytes=None,
            **common,  # type: ignore[arg-type]
        )
    )
    return rows


def placement_from_rows(rows: list[RunnerDeviceRow] | tuple[RunnerDeviceRow, ...]) -> RunnerPlacement | None:
    """A runner's placement back from its stored rows (one port's); None for none. The recurrent state comes back
    inside ``kv_bytes`` and the output buffer inside ``compute_bytes``, as they were stored."""
    if not rows:
        return None
    first = rows[0]
    host = next((r for r in rows if r.device == HOST_DEVICE), None)
    devices = tuple(
        DevicePlacement(
            r.device,
            r.description,
            r.layers,
            r.layers_estimated,
            r.model_bytes,
            r.kv_bytes,
            r.compute_bytes,
            r.free_bytes_at_load,
            r.total_bytes,
        )
        for r in rows
        if r.device != HOST_DEVICE
    )
    return RunnerPlacement(
        first.layers_offloaded,
        first.layers_total,
        devices,
        host.model_bytes if host is not None else None,
        host.kv_bytes if host is not None else None,
        host_output_bytes=host.compute_bytes if host is not None else None,
    )


# /api/ps and the runner's own lines disagreeing by more than this share of the model: both are shown.
PS_DISAGREE_FRACTION = 0.10
SOURCE_RUNNER_WORDS = "so say the runner's own load lines"
SOURCE_PS = "so says Ollama's /api/ps"
SOURCE_ASSUMED = "assumed: nothing said where the model sits"


@dataclass(frozen=True)
class PlacementInUse:
    """The share of the model on the GPU that the ceilings use, where it comes from, and what the other source said."""

    gpu_fraction: float
    source: str  # one of the SOURCE_* texts
    runner: RunnerPlacement | None  # the runner's own figures, when its load lines were read
    ps_fraction: float | None  # /api/ps's size_vram ÷ size, when the model is loaded
    disagreement: str | None  # a sentence when both are known and differ by more than PS_DISAGREE_FRACTION

    @property
    def from_runner(self) -> bool:
        return self.source == SOURCE_RUNNER_WORDS


def placement_in_use(runner: RunnerPlacement | None, ps_size_bytes: int | None, ps_vram_bytes: int | None) -> PlacementInUse:
    """The runner's own placement when it said one (it loaded the model; /api/ps is Ollama's estimate, and a runner
    Ollama did not size, like sim's llama-server, answers 0), else /api/ps, else all on the GPU (said so)."""
    ps = None
    if ps_size_bytes and ps_size_bytes > 0 and ps_vram_bytes is not None:
        ps = min(max(ps_vram_bytes / ps_size_bytes, 0.0), 1.0)
    said = runner.gpu_fraction if runner is not None else None
    if said is None:
        if ps is None:
            return PlacementInUse(1.0, SOURCE_ASSUMED, runner, None, None)
        return PlacementInUse(ps, SOURCE_PS, runner, ps, None)
    text = None
    if ps is not None and abs(said - ps) > PS_DISAGREE_FRACTION:
        text = (
            f"Ollama's /api/ps says {ps:.0%} of the model is in GPU memory; the runner's own load lines say "
            f"{describe_layers(runner)}. The runner's figures are used: it is the one that placed the model."
        )
    return PlacementInUse(said, SOURCE_RUNNER_WORDS, runner, ps, text)


def describe_layers(p: RunnerPlacement | None) -> str:
    """ "49/49 layers on CUDA0 (NVIDIA H200)", "30/49 layers on the GPUs: 20 on CUDA0 (…), 10 on CUDA1 (…)"."""
    if p is None:
        return "nothing"
    if p.layers_offloaded == 0:
        return "every layer in system memory (no GPU backend)"

    def name(d: DevicePlacement) -> str:
        return f"{d.device} ({d.description})" if d.description else d.device

    share = f"{p.layers_offloaded}/{p.layers_total} layers" if p.layers_total else f"{p.layers_offloaded} layers"
    gpus = [d for d in p.devices if d.model_bytes]
    if len(gpus) == 1:
        return f"{share} on {name(gpus[0])}"
    parts = [f"{'≈' if d.layers_estimated else ''}{d.layers if d.layers is not None else '?'} on {name(d)}" for d in gpus]
    return f"{share} on the GPUs: " + ", ".join(parts)


# ``llama-server --list-devices`` (common/arg.cpp): "  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)", GPUs only.
_AVAILABLE = re.compile(r"^ {2}" + _DEV + r": (?P<desc>.{1,160}) \((?P<total>\d{1,9}) MiB, (?P<free>\d{1,9}) MiB free\)$")


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
