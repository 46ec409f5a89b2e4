"""``/phasewatch/metrics``: the collector's state as Prometheus metrics, through ``prometheus_client``.

``RequestStats`` accumulates finished requests (histograms with fixed buckets, counters), the service
gathers the latest readings into a ``MetricsSnapshot``, and ``PhasewatchCollector`` (a custom
``prometheus_client`` collector) turns a snapshot into metric families; ``render`` writes them in the
text format through a ``CollectorRegistry``.

Names: the OpenTelemetry GenAI semantic conventions in Prometheus form where they exist
(``gen_ai.server.time_to_first_token`` → ``gen_ai_server_time_to_first_token_seconds``; attributes
``gen_ai.operation.name`` → label ``gen_ai_operation_name``), ``phasewatch_*`` for what they lack,
modelled on vLLM's (``vllm:request_prefill_time_seconds`` → ``phasewatch_request_prefill_time_seconds``).
Histograms, never summaries: quantiles of histograms aggregate across hosts.

Cardinality: histograms carry the operation and the upstream address, not the model (one host's
histograms stay a few hundred lines however many models it serves); per-model figures are counters,
whose model label passes a ``LabelSet`` (at most ``LABEL_VALUES_MAX`` names, each at most
``LABEL_MAX_CHARS`` characters). Unknown readings are absent, never 0.
"""

from __future__ import annotations

import bisect
import math
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from analysis.records import GpuSample, HostSample, LoadedModel, OllamaStatus, Outcome
from analysis.reloads import QUEUE_FULL, is_queue_full
from analysis.wait_split import WaitSplit
from collectors.wait_metrics import WaitSplits
from store.tables import RequestRow

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PROVIDER = "ollama"  # gen_ai.provider.name
# Label values come from clients (any page can POST a model name): bound their length and number,
# or per-model counters and the exposition grow with every new name.
LABEL_MAX_CHARS = 128  # a longer model or endpoint is cut to this many characters, marker included
LABEL_CUT_MARKER = "…"
LABEL_VALUES_MAX = 100  # distinct models (and endpoints) counted by name; later ones count as OTHER_LABEL
OTHER_LABEL = "other"

# Bucket boundaries (upper bounds, seconds unless named). The OpenTelemetry GenAI advisory buckets, extended:
# theirs stop at 10 s (TTFT) or ~82 s (durations), and at home a long prompt on a small GPU or a CPU takes
# minutes to prefill, and a model load from a slow disk as long. Past the last advisory bound the series
# goes on roughly doubling (15, 30, 60 s, … 10 min for TTFT; up to ~22 min for whole requests).
_OTEL_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS_S = (*_OTEL_TTFT_BUCKETS_S, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)  # long home prompts
_OTEL_TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TPOT_BUCKETS_S = (*_OTEL_TPOT_BUCKETS_S, 5.0, 10.0)
_OTEL_DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
DURATION_BUCKETS_S = (*_OTEL_DURATION_BUCKETS_S, 163.84, 327.68, 655.36, 1310.72)  # minutes-long generations at home
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)  # OTel advisory, to 1 M tokens
# vLLM's inter-token latency buckets, to 10 s.
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
RATE_BUCKETS_TOK_S = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000, 20000, 50000)
RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5)

# Which OpenTelemetry operation each recorded endpoint is (gen_ai.operation.name).
OPERATIONS = {
    "/api/chat": "chat",
    "/v1/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/api/generate": "text_completion",
    "/v1/completions": "text_completion",
    "/api/embed": "embeddings",
    "/api/embeddings": "embeddings",
    "/v1/embeddings": "embeddings",
}

# NVML clocks-event (throttle) reason bits, decoded: PromQL has no bitwise operators.
THROTTLE_REASONS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}


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
class Histogram:
    """Cumulative-on-output bucket counts for one label set; ``bounds`` ascending, +Inf implied."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bound >= value (+Inf past the last)
        self.total += value
        self.count += 1

    def observe_many(self, values: Sequence[float]) -> None:
        """``observe`` each value (finite, non-negative: the caller checked), in one call: a reply's token gaps."""
        if not values:
            return
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        counts, bounds, total = self.counts, self.bounds, self.total
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value  # added in order, as observe() would
        self.total = total
        self.count += len(values)

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        counts = self.counts or [0] * (len(self.bounds) + 1)
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            running += n
            out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), running))
        return out


@dataclass(frozen=True)
class HistogramSpec:
    name: str
    help: str
    bounds: tuple[float, ...]
    labels: tuple[str, ...] = ("gen_ai_operation_name", "gen_ai_provider_name", "server_address", "server_port")


_BASE = ("gen_ai_operation_name", "gen_ai_provider_name", "server_address", "server_port")
# name → spec. The first six are the OpenTelemetry GenAI conventions; the rest Phasewatch's, after vLLM's.
HISTOGRAMS: dict[str, HistogramSpec] = {
    s.name: s
    for s in (
        HistogramSpec(
            "gen_ai_server_time_to_first_token_seconds",
            "Time to first token: request received by the proxy to the first token chunk from Ollama "
            "(OTel GenAI buckets, extended past 10 s up to 600 s for long prompts at home).",
            TTFT_BUCKETS_S,
        ),
        HistogramSpec(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first: Ollama's eval_duration / (eval_count - 1).",
            TPOT_BUCKETS_S,
        ),
        HistogramSpec(
            "gen_ai_server_request_duration_seconds",
            "Ollama's total_duration of a generation (OTel buckets extended to ~22 min).",
            DURATION_BUCKETS_S,
            (*_BASE, "error_type"),
        ),
        HistogramSpec(
            "gen_ai_client_operation_duration_seconds",
            "Request received by the proxy to the final chunk (or the close), as the client saw it.",
            DURATION_BUCKETS_S,
            (*_BASE, "error_type"),
        ),
        HistogramSpec(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "Request received by the proxy to the first response chunk of any kind (extended past 10 s to 600 s).",
            TTFT_BUCKETS_S,
        ),
        HistogramSpec(
            "gen_ai_client_token_usage",
            "Tokens per request, by gen_ai_token_type (input: the prompt, output: the reply).",
            tuple(float(b) for b in TOKEN_BUCKETS),
            (*_BASE, "gen_ai_token_type"),
        ),
        HistogramSpec(
            "phasewatch_request_load_time_seconds", "Model load time of a request (Ollama's load_duration).", DURATION_BUCKETS_S
        ),
        HistogramSpec(
            "phasewatch_request_queue_time_seconds",
            "Ollama's wait before prefill: total_duration - load - prefill - decode (a queue for a slot, other "
            "requests' batches and the runner's own work together; see slot_queue and interference).",
            DURATION_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_slot_queue_seconds",
            "Time every slot of the runner held another request's task before this one's prompt (analysis.wait_split).",
            DURATION_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_interference_seconds",
            "Time other requests' prompts, read on the same runner, cost this request: waiting for their batches, "
            "its own prompt and tokens slowed beside them (analysis.wait_split).",
            DURATION_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_prefill_time_seconds", "Prompt evaluation time (prompt_eval_duration).", TTFT_BUCKETS_S
        ),
        HistogramSpec(
            "phasewatch_request_decode_time_seconds", "Generation time after the first token (eval_duration).", DURATION_BUCKETS_S
        ),
        HistogramSpec(
            "phasewatch_request_thinking_time_seconds",
            "Time a thinking model spent reasoning before its answer.",
            DURATION_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_time_to_first_answer_token_seconds",
            "Thinking replies: request received to the first answer token (after the thinking), as the client saw it.",
            TTFT_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_prefill_tokens_per_second",
            "Prefill rate of computed (not cached) prompt tokens.",
            RATE_BUCKETS_TOK_S,
        ),
        HistogramSpec(
            "phasewatch_request_decode_tokens_per_second", "Decode rate, (eval_count - 1) / eval_duration.", RATE_BUCKETS_TOK_S
        ),
        HistogramSpec(
            "phasewatch_inter_token_latency_seconds",
            "Gap between successive token chunks as the proxy received them.",
            ITL_BUCKETS_S,
        ),
        HistogramSpec(
            "phasewatch_request_decode_ceiling_ratio",
            "Decode rate as a fraction of its memory-bandwidth ceiling for this GPU and model.",
            RATIO_BUCKETS,
        ),
    )
}

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Family:
    """One metric family the collector exposes: declared here once, built from here by ``collect``, documented in
    docs/metrics.md §7 (tests/collectors/test_metric_families.py holds the three to each other)."""

    name: str  # a counter's samples are named ``{name}_total`` (prometheus_client adds it)
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exposed_name(self) -> str:
        """The name a scrape shows: with ``_total`` for a counter."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


_GPU_LABELS = ("gpu", "uuid", "name", "simulated")
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
    ("memory_bus_width_bytes", "Memory bus width (bytes moved per transfer).", "mem_bus_width_bits", 1 / 8),
    ("pcie_tx_bytes_per_second", "PCIe transmit throughput.", "pcie_tx_bytes_s", 1),
    ("pcie_rx_bytes_per_second", "PCIe receive throughput.", "pcie_rx_bytes_s", 1),
    ("performance_state", "Performance state (0 = fastest, 15 = slowest).", "pstate", 1),
    ("clocks_event_reasons", "NVML clocks-event (throttle) reasons bitmask.", "throttle_reasons", 1),
    ("ollama_memory_used_bytes", "GPU memory used by Ollama's processes.", "ollama_mem_bytes", 1),
)

# Every family but the histograms (HISTOGRAMS above, whose buckets are declared with them), in the order a scrape shows.
_FAMILIES = (
    Family("phasewatch_ollama_up", "gauge", "1 when the last poll of Ollama answered.", ("url",)),
    Family("phasewatch_ollama_info", "gauge", "Ollama's version, as a label.", ("version",)),
    Family("phasewatch_ollama_loaded_models", "gauge", "Models loaded in Ollama (/api/ps)."),
    Family(
        "phasewatch_model_loaded_bytes",
        "gauge",
        "Memory a loaded model holds (/api/ps), by where: vram (GPU memory) or ram (system memory: partly offloaded).",
        ("model", "memory"),
    ),
    Family("phasewatch_model_context_tokens", "gauge", "Context length a loaded model was loaded with.", ("model",)),
    Family(
        "phasewatch_model_vram_ratio",
        "gauge",
        "Share of a loaded model held in GPU memory (1: all of it; below 1: partly in system memory).",
        ("model",),
    ),
    Family("phasewatch_model_loads", "counter", "Times a model appeared in /api/ps.", ("model",)),
    Family("phasewatch_model_unloads", "counter", "Times a model left /api/ps.", ("model",)),
    Family("phasewatch_gpu_source_info", "gauge", "Where the GPU readings come from, as a label.", ("source",)),
    *(Family(f"phasewatch_gpu_{suffix}", "gauge", help_text, _GPU_LABELS) for suffix, help_text, _, _ in _GPU_GAUGES),
    Family(
        "phasewatch_gpu_throttled",
        "gauge",
        "1 while the GPU's clocks are held down for this reason (NVML clocks-event reasons).",
        (*_GPU_LABELS, "reason"),
    ),
    Family("phasewatch_gpu_energy_joules", "counter", "Energy used since the driver loaded.", _GPU_LABELS),
    Family("phasewatch_host_cpu_ratio", "gauge", "Machine CPU use (1 = all cores busy)."),
    Family("phasewatch_host_memory_used_bytes", "gauge", "Machine memory in use."),
    Family("phasewatch_host_memory_total_bytes", "gauge", "Machine memory in total."),
    Family("phasewatch_ollama_cpu_ratio", "gauge", "CPU use of Ollama's processes (1 = one core)."),
    Family("phasewatch_ollama_resident_memory_bytes", "gauge", "Resident memory of Ollama's processes."),
    Family("phasewatch_host_disk_read_bytes_per_second", "gauge", "Disk read rate (shows a model loading)."),
    Family(
        "phasewatch_energy_joules",
        "counter",
        "GPU energy (all GPUs, idle draw included) over the "
        "load, prefill and decode of finished requests; requests running at the same "
        "time share it, each counting it.",
        ("phase",),
    ),
    Family(
        "phasewatch_requests",
        "counter",
        "Finished generation requests, by outcome and source: proxy (relayed by the proxy), or sent to Ollama "
        "directly and recorded from its runner with figures from its log (exact) or its /slots (bounded), or from "
        "Ollama's access line alone (access: answered with an error before any runner task).",
        ("endpoint", "model", "outcome", "source"),
    ),
    Family(
        "phasewatch_requests_rejected",
        "counter",
        "Requests Ollama refused without running them, by model and reason: queue_full is its 503 when more "
        "than OLLAMA_MAX_QUEUE requests wait for a load (docs/ollama-api.md §7).",
        ("model", "reason"),
    ),
    Family("phasewatch_prompt_tokens", "counter", "Prompt tokens of finished requests (prompt_eval_count).", ("model",)),
    Family(
        "phasewatch_prompt_cached_tokens",
        "counter",
        "Prompt tokens served from the KV cache (where Ollama reports it).",
        ("model",),
    ),
    Family("phasewatch_generation_tokens", "counter", "Output tokens of finished requests (eval_count).", ("model",)),
    Family(
        "phasewatch_decode_tokens",
        "counter",
        "Decode intervals of rated requests (eval_count - 1): divided by "
        'phasewatch_phase_seconds_total{phase="decode"}, the decode rate.',
        ("model",),
    ),
    Family(
        "phasewatch_thinking_tokens",
        "counter",
        "Thinking tokens of thinking replies (part of the output tokens; they cost decode time like any other).",
        ("model",),
    ),
    Family(
        "phasewatch_phase_seconds",
        "counter",
        "Time finished requests spent in each phase (load, queue, prefill, decode), per model.",
        ("model", "phase"),
    ),
    Family(
        "phasewatch_requests_running",
        "gauge",
        "Generations running now, by phase (prefill includes the wait for a slot).",
        ("phase",),
    ),
    Family("phasewatch_slot_context_tokens", "gauge", "Context tokens a runner slot holds now.", ("model", "slot")),
    Family("phasewatch_slot_context_max_tokens", "gauge", "Context size of a runner slot.", ("model", "slot")),
    Family(
        "phasewatch_proxy_refused",
        "counter",
        "Requests the proxy answered itself, never forwarded (400 malformed, 408 too slow, 431 head too large, "
        "501, 505, 401/403 access, 503 at the connection bound), and requests cut to make room (status none), "
        "by status and reason; each is also a warning in the collector's log.",
        ("status", "reason"),
    ),
    Family("phasewatch_store_pending_records", "gauge", "Records waiting to be written to the store."),
    Family("phasewatch_store_write_failing", "gauge", "1 while the last store write failed (retried)."),
    Family("phasewatch_store_dropped_records", "counter", "Records the store refused and dropped."),
    Family(
        "phasewatch_store_shed_records",
        "counter",
        "Records shed, oldest first, because those waiting for the store passed its byte cap.",
    ),
    Family("phasewatch_store_pending_bytes", "gauge", "Memory held by the records waiting for the store."),
    Family(
        "phasewatch_store_reopened",
        "counter",
        "Times the store file was found deleted or replaced and recording went on in a fresh file.",
    ),
    Family(
        "phasewatch_ollama_log_dropped_lines",
        "counter",
        "Lines of Ollama's log not believed (the runner's /slots did not confirm them), by why.",
        ("reason",),
    ),
)
# name → family: every family the collector may expose, and the only place their type, help and labels are written.
FAMILIES: dict[str, Family] = {
    f.name: f for f in (*_FAMILIES, *(Family(s.name, "histogram", s.help, s.labels) for s in HISTOGRAMS.values()))
}


def _declared(name: str, kind: Kind) -> Family:
    family = FAMILIES[name]  # a KeyError here: declare the family above (and give it its line in docs/metrics.md)
    if family.kind != kind:
        raise TypeError(f"{name} is declared a {family.kind}, built as a {kind}")
    return family


def counter_family(name: str, value: float | None = None) -> CounterMetricFamily:
    """The declared counter ``name``: with ``value``, its one label-less sample; else empty, with its labels."""
    f = _declared(name, "counter")
    if value is not None:
        return CounterMetricFamily(name, f.help, value=value)
    return CounterMetricFamily(name, f.help, labels=list(f.labels))


def gauge_family(name: str, value: float | None = None) -> GaugeMetricFamily:
    """The declared gauge ``name``: with ``value``, its one label-less sample; else empty, with its labels."""
    f = _declared(name, "gauge")
    if value is not None:
        return GaugeMetricFamily(name, f.help, value=value)
    return GaugeMetricFamily(name, f.help, labels=list(f.labels))


def histogram_family(name: str) -> HistogramMetricFamily:
    f = _declared(name, "histogram")
    return HistogramMetricFamily(name, f.help, labels=list(f.labels))


PHASES = ("load", "queue", "prefill", "decode")
# The thinking time of a row; None (a reply that did not think, or not kept apart): unknown, not observed.
ThinkingOf = Callable[[RequestRow], float | None]
# A hook for a row's decode-rate fraction of its ceiling (needs the GPU and the model's facts); None: unknown.
CeilingRatioOf = Callable[[RequestRow], float | None]


def _no_value(row: RequestRow) -> float | None:
    return None


def _thinking_s(row: RequestRow) -> float | None:
    return row.thinking_s


def source_label(row: RequestRow) -> str:
    """``proxy``, or for a direct record where its figures come from (``log``, ``slots``)."""
    return str(row.runner_source or "slots") if row.direct else "proxy"


@dataclass
class RequestStats:
    """Finished requests, counted by endpoint, model, outcome and source, and observed into per-host histograms.

    Source: ``proxy`` for a request the proxy relayed; for one a client sent Ollama directly (recorded from the
    runner), where its figures come from: ``log`` (the runner's own timings) or ``slots`` (/slots readings,
    bounded). A direct record's endpoint is "" where no access line told it.

    Models and endpoints pass through ``LabelSet``s, so the counters stay bounded whatever clients send.
    ``server_address``/``server_port`` label the histograms with the upstream Ollama.
    """

    server_address: str = ""
    server_port: str = ""
    counts: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    models: LabelSet = field(default_factory=LabelSet)
    endpoints: LabelSet = field(default_factory=LabelSet)
    histograms: dict[tuple[str, tuple[str, ...]], Histogram] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    output_tokens: dict[str, int] = field(default_factory=dict)
    decode_tokens: dict[str, int] = field(default_factory=dict)  # eval_count - 1 of rated requests
    thinking_tokens: dict[str, int] = field(default_factory=dict)  # counted thinking tokens of thinking replies
    phase_s: dict[tuple[str, str], float] = field(default_factory=dict)
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, reason) → requests Ollama refused
    thinking_of: ThinkingOf = _thinking_s  # None where a reply did not think or thinking was not kept apart
    ceiling_ratio_of: CeilingRatioOf = _no_value
    waits: WaitSplits = field(default_factory=WaitSplits)  # the recent rows each new one's wait is split against

    @classmethod
    def for_upstream(cls, ollama_url: str) -> RequestStats:
        url = urllib.parse.urlsplit(ollama_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(server_address=url.hostname or "", server_port=str(port))

    def _observe(self, name: str, value: float | None, labels: tuple[str, ...], *extra: str) -> None:
        if value is None or not math.isfinite(value) or value < 0:
            return
        key = (name, (*labels, *extra))
        hist = self.histograms.get(key)
        if hist is None:
            hist = self.histograms[key] = Histogram(HISTOGRAMS[name].bounds)
        hist.observe(value)

    def _observe_gaps(self, token_gaps_s: Iterable[float], labels: tuple[str, ...]) -> None:
        """A reply's gaps between token chunks, into one histogram in one call (not one ``_observe`` per token)."""
        gaps_s = [g for g in token_gaps_s if math.isfinite(g) and g >= 0]  # as _observe keeps them
        if not gaps_s:
            return
        name = "phasewatch_inter_token_latency_seconds"
        hist = self.histograms.get((name, labels))
        if hist is None:
            hist = self.histograms[(name, labels)] = Histogram(HISTOGRAMS[name].bounds)
        hist.observe_many(gaps_s)

    def observe(
        self, row: RequestRow, token_gaps_s: Iterable[float] = (), *, split: WaitSplit | Literal["here"] | None = "here"
    ) -> None:
        """Count one finished request as the store wrote it (its phases as stored, not split again).

        ``token_gaps_s``: the gaps between its token chunks as the proxy received them. ``split``: its wait split
        (``waits.split(row)``) when the caller took it elsewhere (the collector: on the store writer's thread);
        "here" takes it now.
        """
        model = self.models.admit(row.model)
        outcome = Outcome(row.outcome).value
        key = (self.endpoints.admit(row.endpoint) if row.endpoint is not None else "", model, outcome, source_label(row))
        self.counts[key] = self.counts.get(key, 0) + 1
        if is_queue_full(row.status_code, row.error):
            self.rejected[(model, QUEUE_FULL)] = self.rejected.get((model, QUEUE_FULL), 0) + 1
        base = (OPERATIONS.get(row.endpoint or "", OTHER_LABEL), PROVIDER, self.server_address, self.server_port)
        error_type = "" if row.outcome == Outcome.OK else outcome
        self._observe("gen_ai_server_time_to_first_token_seconds", row.ttft_s, base)
        if row.decode_tok_s:
            self._observe("gen_ai_server_time_per_output_token_seconds", 1 / row.decode_tok_s, base)
        self._observe("gen_ai_server_request_duration_seconds", row.total_s, base, error_type)
        self._observe("gen_ai_client_operation_duration_seconds", row.client_s, base, error_type)
        if row.first_byte_ns is not None:
            self._observe(
                "gen_ai_client_operation_time_to_first_chunk_seconds", (row.first_byte_ns - row.received_ns) / 1e9, base
            )
        self._observe("gen_ai_client_token_usage", row.prompt_tokens, base, "input")
        self._observe("gen_ai_client_token_usage", row.output_tokens, base, "output")
        for phase in PHASES:
            self._observe(f"phasewatch_request_{phase}_time_seconds", getattr(row, f"{phase}_s"), base)
        self._observe_split(self.waits.split(row) if isinstance(split, str) else split, base)
        self._observe("phasewatch_request_thinking_time_seconds", self.thinking_of(row), base)
        if row.thinking_tokens:
            self._observe("phasewatch_request_time_to_first_answer_token_seconds", row.ttfa_s, base)
        self._observe("phasewatch_request_prefill_tokens_per_second", row.prefill_tok_s, base)
        self._observe("phasewatch_request_decode_tokens_per_second", row.decode_tok_s, base)
        self.observe_ceiling_ratio(row)
        self._observe_gaps(token_gaps_s, base)

        for counter, value in (
            (self.prompt_tokens, row.prompt_tokens),
            (self.cached_tokens, row.cached_tokens),
            (self.output_tokens, row.output_tokens),
            (self.thinking_tokens, row.thinking_tokens),
        ):
            if value is not None and value >= 0:
                counter[model] = counter.get(model, 0) + value
        if row.decode_tok_s and row.output_tokens:
            self.decode_tokens[model] = self.decode_tokens.get(model, 0) + row.output_tokens - 1
        for phase in PHASES:
            seconds = getattr(row, f"{phase}_s")
            if seconds is not None and seconds > 0:
                self.phase_s[(model, phase)] = self.phase_s.get((model, phase), 0.0) + seconds

    def _observe_split(self, split: WaitSplit | None, base: tuple[str, ...]) -> None:
        """The queue for a slot and the interference, from the one split the pages show (unknown: not observed)."""
        if split is None:
            return
        self._observe("phasewatch_request_slot_queue_seconds", split.queue_s, base)
        self._observe("phasewatch_request_interference_seconds", split.interference_s, base)

    def observe_ceiling_ratio(self, row: RequestRow) -> bool:
        """Observe a finished request's decode rate over its ceiling; False when that is not known (yet)."""
        ratio = self.ceiling_ratio_of(row)
        if ratio is None:
            return False
        base = (OPERATIONS.get(row.endpoint or "", OTHER_LABEL), PROVIDER, self.server_address, self.server_port)
        self._observe("phasewatch_request_decode_ceiling_ratio", ratio, base)
        return True

    def histogram(self, name: str) -> Histogram:
        """All label sets of one histogram merged (tests, the log)."""
        merged = Histogram(HISTOGRAMS[name].bounds)
        merged.counts = [0] * (len(merged.bounds) + 1)
        for (n, _), h in self.histograms.items():
            if n == name and h.counts:
                merged.counts = [a + b for a, b in zip(merged.counts, h.counts, strict=True)]
                merged.total += h.total
                merged.count += h.count
        return merged


def phase_windows(row: RequestRow) -> list[tuple[str, float, float]]:
    """(phase, start, end) in wall-clock seconds for the load, prefill and decode a stored row knows."""
    edges = (
        ("load", row.load_start_unix_s, row.prefill_start_unix_s),
        ("prefill", row.prefill_start_unix_s, row.decode_start_unix_s),
        ("decode", row.decode_start_unix_s, row.decode_end_unix_s),
    )
    return [(phase, t0, t1) for phase, t0, t1 in edges if t0 is not None and t1 is not None and t1 > t0]


@dataclass(frozen=True)
class SlotUse:
    """One runner slot's context use, as the collector last read it from the runner's /slots."""

    model: str
    slot: int
    context_tokens: int
    context_max_tokens: int


@dataclass
class MetricsSnapshot:
    gpus: Sequence[GpuSample] = ()
    gpu_source: str | None = None  # e.g. "AMD (amdgpu sysfs)", "none"
    host: HostSample | None = None
    ollama: OllamaStatus | None = None
    loaded_models: Sequence[LoadedModel] = ()
    stats: RequestStats = field(default_factory=RequestStats)
    in_flight_by_phase: dict[str, int] = field(default_factory=dict)  # running generations: load, prefill, decode
    store_pending: int = 0
    store_failing: bool | None = None  # the last write failed (it is retried); None: no store
    store_dropped: int | None = None  # records SQLite refused, or shed for the backlog's caps
    store_shed: int | None = None  # records shed, oldest first, because the backlog passed its byte cap
    store_queued_bytes: int | None = None  # memory held by the records waiting
    store_reopened: int | None = None  # times the store file was found deleted or replaced, and a fresh one opened
    # Lines of Ollama's log not believed, by why (collectors.ollama.direct; "progress": a progress line of no task
    # /slots showed a request holding); None: the runners are not read
    log_dropped: dict[str, int] | None = None
    loads: dict[str, int] = field(default_factory=dict)  # model → times it appeared in /api/ps
    unloads: dict[str, int] = field(default_factory=dict)  # model → times it left /api/ps
    energy_j_by_phase: dict[str, float] = field(default_factory=dict)  # GPU energy over requests' phases
    slots: Sequence[SlotUse] = ()  # the runners' slots (collectors.ollama.runners), where they can be read
    # (status, reason) → requests the proxy refused itself since it started; status "none" where no answer went out
    # (a connection cut to make room). None: no proxy running.
    proxy_refused: dict[tuple[str, str], int] | None = None


def _gpu_families(gpus: Sequence[GpuSample]) -> Iterator[Metric]:
    if not gpus:
        return
    labels = [[str(g.index), g.uuid, g.name, str(g.simulated).lower()] for g in gpus]
    for suffix, _, attr, scale in _GPU_GAUGES:
        fam = gauge_family(f"phasewatch_gpu_{suffix}")
        for g, lab in zip(gpus, labels, strict=True):
            value = getattr(g, attr)
            if value is not None:  # a reading the source did not give is absent, not zero
                fam.add_metric(lab, value * scale)
        yield fam
    throttle = gauge_family("phasewatch_gpu_throttled")
    for g, lab in zip(gpus, labels, strict=True):
        if g.throttle_reasons is not None:
            for reason, bit in THROTTLE_REASONS.items():
                throttle.add_metric([*lab, reason], 1 if g.throttle_reasons & bit else 0)
    yield throttle
    energy = counter_family("phasewatch_gpu_energy_joules")
    for g, lab in zip(gpus, labels, strict=True):
        if g.energy_j is not None:
            energy.add_metric(lab, g.energy_j)
    yield energy


def _host_families(host: HostSample | None) -> Iterator[Metric]:
    if host is None:
        return
    for name, value in (
        ("phasewatch_host_cpu_ratio", host.cpu_pct / 100),
        ("phasewatch_host_memory_used_bytes", host.mem_used_bytes),
        ("phasewatch_host_memory_total_bytes", host.mem_total_bytes),
        ("phasewatch_ollama_cpu_ratio", None if host.ollama_cpu_pct is None else host.ollama_cpu_pct / 100),
        ("phasewatch_ollama_resident_memory_bytes", host.ollama_rss_bytes),
        ("phasewatch_host_disk_read_bytes_per_second", host.disk_read_bytes_s),
    ):
        if value is not None:
            yield gauge_family(name, value)


def _model_families(models: Sequence[LoadedModel]) -> Iterator[Metric]:
    loaded = gauge_family("phasewatch_model_loaded_bytes")
    context = gauge_family("phasewatch_model_context_tokens")
    vram_ratio = gauge_family("phasewatch_model_vram_ratio")
    for m in models[:LABEL_VALUES_MAX]:
        name = bound_label(m.name)
        loaded.add_metric([name, "vram"], m.size_vram_bytes)
        loaded.add_metric([name, "ram"], max(m.size_bytes - m.size_vram_bytes, 0))
        if m.context_length is not None:
            context.add_metric([name], m.context_length)
        if m.size_bytes > 0:
            vram_ratio.add_metric([name], min(m.size_vram_bytes / m.size_bytes, 1.0))
    yield from (loaded, context, vram_ratio)


def _counter_of(name: str, values: Mapping[Any, float]) -> CounterMetricFamily:
    """The declared counter ``name`` with one sample per key (a label value, or a tuple of them in label order)."""
    fam = counter_family(name)
    for key, value in sorted(values.items()):
        fam.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return fam


def _stats_families(stats: RequestStats) -> Iterator[Metric]:
    yield _counter_of("phasewatch_requests", stats.counts)
    yield _counter_of("phasewatch_requests_rejected", stats.rejected)
    yield _counter_of("phasewatch_prompt_tokens", stats.prompt_tokens)
    yield _counter_of("phasewatch_prompt_cached_tokens", stats.cached_tokens)
    yield _counter_of("phasewatch_generation_tokens", stats.output_tokens)
    yield _counter_of("phasewatch_decode_tokens", stats.decode_tokens)
    yield _counter_of("phasewatch_thinking_tokens", stats.thinking_tokens)
    phases = counter_family("phasewatch_phase_seconds")
    for (model, phase), seconds in sorted(stats.phase_s.items()):
        phases.add_metric([model, phase], seconds)
    yield phases
    by_name: dict[str, HistogramMetricFamily] = {}
    for (name, labels), hist in sorted(stats.histograms.items()):
        fam = by_name.get(name)
        if fam is None:
            fam = by_name[name] = histogram_family(name)
        fam.add_metric(list(labels), hist.buckets(), hist.total)
    for name in HISTOGRAMS:  # declared even before the first observation, so dashboards find them
        yield by_name.get(name) or histogram_family(name)


def _refused_families(counts: dict[tuple[str, str], int] | None) -> Iterator[Metric]:
    if counts is None:  # no proxy: unknown, not zero
        return
    yield _counter_of("phasewatch_proxy_refused", counts)


def _ollama_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    if snap.ollama is None:
        return
    up = gauge_family("phasewatch_ollama_up")
    up.add_metric([snap.ollama.base_url], 1 if snap.ollama.up else 0)
    yield up
    if snap.ollama.version:
        info = gauge_family("phasewatch_ollama_info")
        info.add_metric([bound_label(snap.ollama.version)], 1)
        yield info
    if snap.ollama.up:  # the list is known only while Ollama answers
        yield gauge_family("phasewatch_ollama_loaded_models", len(snap.loaded_models))


def _slot_families(slots: Sequence[SlotUse]) -> Iterator[Metric]:
    held = gauge_family("phasewatch_slot_context_tokens")
    size = gauge_family("phasewatch_slot_context_max_tokens")
    for s in slots:
        held.add_metric([bound_label(s.model), str(s.slot)], s.context_tokens)
        size.add_metric([bound_label(s.model), str(s.slot)], s.context_max_tokens)
    yield from (held, size)


class PhasewatchCollector(Collector):
    """A ``prometheus_client`` collector over the collector's state: ``snapshot()`` is read at each scrape.

    Every family comes from FAMILIES (``counter_family``, ``gauge_family``, ``histogram_family``): an undeclared
    one cannot be built.
    """

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from _ollama_families(snap)
        yield from _model_families(snap.loaded_models)
        yield _counter_of("phasewatch_model_loads", snap.loads)
        yield _counter_of("phasewatch_model_unloads", snap.unloads)
        if snap.gpu_source is not None:
            src = gauge_family("phasewatch_gpu_source_info")
            src.add_metric([snap.gpu_source], 1)
            yield src
        yield from _gpu_families(snap.gpus)
        yield from _host_families(snap.host)
        yield _counter_of("phasewatch_energy_joules", snap.energy_j_by_phase)
        yield from _stats_families(snap.stats)
        running = gauge_family("phasewatch_requests_running")
        for phase in ("load", "prefill", "decode"):
            running.add_metric([phase], snap.in_flight_by_phase.get(phase, 0))
        yield running
        yield from _slot_families(snap.slots)
        yield from _refused_families(snap.proxy_refused)
        yield gauge_family("phasewatch_store_pending_records", snap.store_pending)
        yield from _drop_metrics(snap)


def registry_for(snapshot: Callable[[], MetricsSnapshot]) -> CollectorRegistry:
    """A registry holding only Phasewatch's collector (no process/platform defaults: they describe the collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PhasewatchCollector(snapshot))
    return registry


def render(snap: MetricsSnapshot) -> str:
    """Prometheus text exposition (0.0.4) of a snapshot."""
    return generate_latest(registry_for(lambda: snap)).decode()


def _drop_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The store's write health and what it, and the log reader, dropped or shed."""
    if snap.store_failing is not None:
        yield gauge_family("phasewatch_store_write_failing", 1 if snap.store_failing else 0)
    for name, value in (
        ("phasewatch_store_dropped_records", snap.store_dropped),
        ("phasewatch_store_shed_records", snap.store_shed),
        ("phasewatch_store_pending_bytes", snap.store_queued_bytes),
        ("phasewatch_store_reopened", snap.store_reopened),
    ):
        if value is not None:  # None: no store, unknown
            yield (gauge_family if FAMILIES[name].kind == "gauge" else counter_family)(name, value)
    if snap.log_dropped is not None:
        yield _counter_of("phasewatch_ollama_log_dropped_lines", snap.log_dropped)
