"""``/phasewatch/metrics``: the collector's latest readings in Prometheus text format (0.0.4).

Collection is separate from exposition (as in prometheus/client_python): ``RequestStats``
accumulates finished requests, ``MetricsSnapshot`` gathers the latest readings, and
``render`` turns a snapshot into text. Hand-written because the format is tiny.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from analysis.phases import percentile
from analysis.records import GpuSample, HostSample, LoadedModel, OllamaStatus, Outcome
from store.tables import RequestRow

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUANTILES = (0.5, 0.9, 0.99)
SUMMARY_WINDOW = 1000  # quantiles over the latest this-many requests; _sum and _count over all
# Label values come from clients (any page can POST a model name): bound their length and number,
# or per-model counters and the exposition grow with every new name.
LABEL_MAX_CHARS = 128  # a longer model or endpoint is cut to this many characters, marker included
LABEL_CUT_MARKER = "…"
LABEL_VALUES_MAX = 100  # distinct models (and endpoints) counted by name; later ones count as OTHER_LABEL
OTHER_LABEL = "other"


@dataclass
class Summary:
    """A Prometheus summary: running sum and count, quantiles over a sliding window."""

    window: deque[float] = field(default_factory=lambda: deque(maxlen=SUMMARY_WINDOW))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.window.append(value)
        self.total += value
        self.count += 1

    def quantiles(self) -> list[tuple[float, float]]:
        values = sorted(self.window)
        return [(q, percentile(values, q * 100) if values else math.nan) for q in QUANTILES]


def bound_label(value: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """A label value of at most ``max_chars`` characters; a cut one ends with the marker."""
    if len(value) <= max_chars:
        return value
    return value[: max_chars - len(LABEL_CUT_MARKER)] + LABEL_CUT_MARKER


@dataclass
class LabelSet:
    """The values one label may take: the first ``max_values`` seen by name, the rest as ``other``."""

    max_values: int = LABEL_VALUES_MAX
    max_chars: int = LABEL_MAX_CHARS
    seen: set[str] = field(default_factory=set)

    def admit(self, value: str) -> str:
        value = bound_label(value, self.max_chars)
        if value in self.seen:
            return value
        if len(self.seen) < self.max_values:
            self.seen.add(value)
            return value
        return OTHER_LABEL


@dataclass
class RequestStats:
    """Counts of finished requests by endpoint, model and outcome; TTFT and decode-rate summaries.

    Models and endpoints pass through ``LabelSet``s, so the counters stay bounded whatever clients send.
    """

    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    ttft_s: Summary = field(default_factory=Summary)  # streamed replies only: a whole body shows the client no token
    ttfa_s: Summary = field(default_factory=Summary)  # thinking replies: request → first answer token
    thinking_tokens: int = 0  # counted thinking tokens (they cost decode time like any other)
    decode_tok_s: Summary = field(default_factory=Summary)
    models: LabelSet = field(default_factory=LabelSet)
    endpoints: LabelSet = field(default_factory=LabelSet)

    def observe(self, row: RequestRow) -> None:
        """Count one finished request as the store wrote it (its phases as stored, not split again)."""
        key = (self.endpoints.admit(row.endpoint), self.models.admit(row.model), Outcome(row.outcome).value)
        self.counts[key] = self.counts.get(key, 0) + 1
        if row.ttft_s is not None and row.ttft_s >= 0:
            self.ttft_s.observe(row.ttft_s)
        if row.thinking_tokens and row.ttfa_s is not None and row.ttfa_s >= 0:
            self.ttfa_s.observe(row.ttfa_s)
            self.thinking_tokens += row.thinking_tokens
        if row.outcome == Outcome.OK and row.decode_tok_s is not None and math.isfinite(row.decode_tok_s):
            self.decode_tok_s.observe(row.decode_tok_s)


@dataclass
class MetricsSnapshot:
    gpus: Sequence[GpuSample] = ()
    gpu_source: str | None = None  # e.g. "AMD (amdgpu sysfs)", "none"
    host: HostSample | None = None
    ollama: OllamaStatus | None = None
    loaded_models: Sequence[LoadedModel] = ()
    stats: RequestStats = field(default_factory=RequestStats)
    in_flight: int = 0
    store_pending: int = 0


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float | None, labels: dict[str, str] | None = None) -> None:
        if value is None:
            return  # a reading the source did not give is absent, not zero
        label_text = ""
        if labels:
            label_text = "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"
        self.lines.append(f"{name}{label_text} {format_value(value)}")


# (metric suffix, help, GpuSample attribute, unit multiplier)
_GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("utilization_ratio", "Share of the last sample period a kernel ran (not a share of compute).", "util_gpu_pct", 0.01),
    (
        "memory_utilization_ratio",
        "Share of the last sample period memory was read or written (not bandwidth).",
        "util_mem_pct",
        0.01,
    ),
    ("memory_used_bytes", "GPU memory in use.", "mem_used_bytes", 1),
    ("memory_total_bytes", "GPU memory in total.", "mem_total_bytes", 1),
    ("power_watts", "Board power draw.", "power_w", 1),
    ("power_limit_watts", "Enforced power limit.", "power_limit_w", 1),
    ("temperature_celsius", "GPU temperature.", "temperature_c", 1),
    ("sm_clock_hertz", "Current SM clock.", "sm_clock_mhz", 1e6),
    ("sm_clock_max_hertz", "Maximum SM clock.", "sm_clock_max_mhz", 1e6),
    ("memory_clock_hertz", "Current memory clock.", "mem_clock_mhz", 1e6),
    ("memory_clock_max_hertz", "Maximum memory clock.", "mem_clock_max_mhz", 1e6),
    ("memory_bus_width_bits", "Memory bus width.", "mem_bus_width_bits", 1),
    ("pcie_tx_bytes_per_second", "PCIe transmit throughput.", "pcie_tx_bytes_s", 1),
    ("pcie_rx_bytes_per_second", "PCIe receive throughput.", "pcie_rx_bytes_s", 1),
    ("performance_state", "Performance state (0 = fastest, 15 = slowest).", "pstate", 1),
    ("clocks_event_reasons", "NVML clocks-event (throttle) reasons bitmask.", "throttle_reasons", 1),
    ("ollama_memory_used_bytes", "GPU memory used by Ollama's processes.", "ollama_mem_bytes", 1),
)


def _render_gpus(w: _Writer, gpus: Sequence[GpuSample]) -> None:
    if not gpus:
        return
    labels = [{"gpu": str(g.index), "uuid": g.uuid, "name": g.name, "simulated": str(g.simulated).lower()} for g in gpus]
    for suffix, help_text, attr, scale in _GPU_GAUGES:
        name = f"phasewatch_gpu_{suffix}"
        w.family(name, "gauge", help_text)
        for g, lab in zip(gpus, labels, strict=True):
            value = getattr(g, attr)
            w.sample(name, None if value is None else value * scale, lab)
    w.family("phasewatch_gpu_energy_joules_total", "counter", "Energy used since the driver loaded.")
    for g, lab in zip(gpus, labels, strict=True):
        w.sample("phasewatch_gpu_energy_joules_total", g.energy_j, lab)


def _render_host(w: _Writer, host: HostSample | None) -> None:
    if host is None:
        return
    for name, help_text, value in (
        ("phasewatch_host_cpu_ratio", "Machine CPU use (1 = all cores busy).", host.cpu_pct / 100),
        ("phasewatch_host_memory_used_bytes", "Machine memory in use.", host.mem_used_bytes),
        ("phasewatch_host_memory_total_bytes", "Machine memory in total.", host.mem_total_bytes),
        (
            "phasewatch_ollama_cpu_ratio",
            "CPU use of Ollama's processes (1 = one core).",
            None if host.ollama_cpu_pct is None else host.ollama_cpu_pct / 100,
        ),
        ("phasewatch_ollama_resident_memory_bytes", "Resident memory of Ollama's processes.", host.ollama_rss_bytes),
        ("phasewatch_host_disk_read_bytes_per_second", "Disk read rate (shows a model loading).", host.disk_read_bytes_s),
    ):
        if value is not None:
            w.family(name, "gauge", help_text)
            w.sample(name, value)


def _render_summary(w: _Writer, name: str, help_text: str, summary: Summary) -> None:
    w.family(name, "summary", help_text)
    for q, v in summary.quantiles():
        w.sample(name, v, {"quantile": format_value(q)})
    w.sample(f"{name}_sum", summary.total)
    w.sample(f"{name}_count", summary.count)


def render(snap: MetricsSnapshot) -> str:
    """Prometheus text exposition of a snapshot (ends with a newline)."""
    w = _Writer()
    if snap.ollama is not None:
        w.family("phasewatch_ollama_up", "gauge", "1 when the last poll of Ollama answered.")
        w.sample("phasewatch_ollama_up", 1 if snap.ollama.up else 0, {"url": snap.ollama.base_url})
        if snap.ollama.version:
            w.family("phasewatch_ollama_info", "gauge", "Ollama's version, as a label.")
            w.sample("phasewatch_ollama_info", 1, {"version": snap.ollama.version})
    w.family("phasewatch_ollama_loaded_models", "gauge", "Models loaded in Ollama (/api/ps).")
    w.sample("phasewatch_ollama_loaded_models", len(snap.loaded_models))
    if snap.loaded_models:
        w.family("phasewatch_ollama_model_vram_bytes", "gauge", "Part of a loaded model held in GPU memory.")
        for m in snap.loaded_models:
            w.sample("phasewatch_ollama_model_vram_bytes", m.size_vram_bytes, {"model": bound_label(m.name)})
        w.family("phasewatch_ollama_model_size_bytes", "gauge", "Memory a loaded model uses in total.")
        for m in snap.loaded_models:
            w.sample("phasewatch_ollama_model_size_bytes", m.size_bytes, {"model": bound_label(m.name)})
    if snap.gpu_source is not None:
        w.family("phasewatch_gpu_source_info", "gauge", "Where the GPU readings come from, as a label.")
        w.sample("phasewatch_gpu_source_info", 1, {"source": snap.gpu_source})
    _render_gpus(w, snap.gpus)
    _render_host(w, snap.host)

    w.family("phasewatch_requests_total", "counter", "Finished generation requests seen by the proxy.")
    for (endpoint, model, outcome), n in sorted(snap.stats.counts.items()):
        w.sample("phasewatch_requests_total", n, {"endpoint": endpoint, "model": model, "outcome": outcome})
    w.family("phasewatch_requests_in_flight", "gauge", "Generation requests running now.")
    w.sample("phasewatch_requests_in_flight", snap.in_flight)
    _render_summary(w, "phasewatch_ttft_seconds", "Time to first token as the client saw it.", snap.stats.ttft_s)
    _render_summary(
        w, "phasewatch_ttfa_seconds", "Time to the first answer token of thinking replies, as the client saw it.",
        snap.stats.ttfa_s,
    )  # fmt: skip
    w.family("phasewatch_thinking_tokens_total", "counter", "Thinking tokens streamed by thinking models.")
    w.sample("phasewatch_thinking_tokens_total", snap.stats.thinking_tokens)
    _render_summary(
        w, "phasewatch_decode_tokens_per_second", "Decode rate, (eval_count - 1) / eval_duration.", snap.stats.decode_tok_s
    )
    w.family("phasewatch_store_pending_records", "gauge", "Records waiting to be written to the store.")
    w.sample("phasewatch_store_pending_records", snap.store_pending)
    return "\n".join(w.lines) + "\n"


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Read text exposition back into {(name, sorted labels): value}; for tests and debugging.

    Understands what ``render`` writes: escaped label values, NaN and ±Inf.
    """
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value_text = line.rpartition(" ")
        labels: list[tuple[str, str]] = []
        if "{" in name_part:
            name, _, rest = name_part.partition("{")
            rest = rest.removesuffix("}")
            labels = list(_parse_labels(rest))
        else:
            name = name_part
        out[(name, tuple(sorted(labels)))] = float(value_text.replace("+Inf", "inf"))
    return out


def _parse_labels(text: str) -> Iterable[tuple[str, str]]:
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq]
        j = eq + 2  # skip ="
        value: list[str] = []
        while text[j] != '"':
            if text[j] == "\\":
                value.append({"n": "\n", "\\": "\\", '"': '"'}[text[j + 1]])
                j += 2
            else:
                value.append(text[j])
                j += 1
        yield key, "".join(value)
        i = j + 2 if j + 1 < len(text) and text[j + 1] == "," else j + 1
