"""Record types shared by the collectors, the store, the analysis and the pages.

These are plain data: no I/O, no clock. Times named ``*_ns`` are
``time.monotonic_ns()`` of the collector process; times named ``*_unix_s``
are wall-clock seconds since the epoch, for display only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    """How a proxied request ended."""

    IN_FLIGHT = "in_flight"  # still running (written periodically for the Live page)
    OK = "ok"  # final chunk received, forwarded to the client
    HTTP_ERROR = "http_error"  # upstream answered with a status >= 400
    UPSTREAM_FAILED = "upstream_failed"  # upstream unreachable, cut mid-stream, or a final {"error"} line
    CANCELLED = "cancelled"  # the client went away before the final chunk


class SeenFrom(StrEnum):
    """Where a request record comes from (stored as ``requests.seen_from``)."""

    PROXY = "proxy"  # the recording proxy saw the request and its reply
    RUNNER = "runner"  # "direct": a client talked to Ollama itself; the runner's task (its /slots, Ollama's log) was seen


class GpuKind(StrEnum):
    """What the collector's GPU side samples (stored as ``heartbeat.gpu_state``)."""

    NVML = "nvml"  # NVIDIA GPUs through NVML
    AMDSMI = "amdsmi"  # AMD GPUs through ROCm's amdsmi library
    AMD_SYSFS = "amd-sysfs"  # AMD GPUs through the amdgpu driver's sysfs files
    MACMON = "macmon"  # Apple Silicon through macmon-lib (IOReport, no sudo)
    IOREG = "ioreg"  # Apple Silicon through the IORegistry's PerformanceStatistics
    SIMULATED = "simulated"  # the simulator's virtual GPU (demo mode)
    NONE = "none"  # no GPU sampled: no supported GPU, or not started yet


# How the sidebar and the metrics name each source.
GPU_SOURCE_NAMES: dict[str, str] = {
    GpuKind.NVML: "NVIDIA (NVML)",
    GpuKind.AMDSMI: "AMD (amdsmi)",
    GpuKind.AMD_SYSFS: "AMD (amdgpu sysfs)",
    GpuKind.MACMON: "Apple Silicon (macmon)",
    GpuKind.IOREG: "Apple Silicon (IORegistry)",
    GpuKind.SIMULATED: "simulated",
    GpuKind.NONE: "none",
}
# Sources whose GPU shares the system memory: their "VRAM" line is what Ollama's models hold of it.
UNIFIED_MEMORY_KINDS = frozenset({GpuKind.MACMON, GpuKind.IOREG})
UNIFIED_MEMORY_NOTE = "unified memory: the VRAM line is what Ollama's models hold of system memory"


class RequestKind(StrEnum):
    """What a recorded request asked Ollama to do (stored as ``requests.kind``)."""

    GENERATE = "generate"  # a prompt evaluated and a reply decoded (/api/generate, /api/chat, /v1 completions)
    EMBED = "embed"  # embeddings: the prompt evaluated, nothing decoded (/api/embed, /api/embeddings, /v1/embeddings)
    LOAD = "load"  # an empty prompt: only loads the model
    UNLOAD = "unload"  # an empty prompt with keep_alive 0: unloads the model


EMBED_ENDPOINTS = frozenset({"/api/embed", "/api/embeddings", "/v1/embeddings"})
# The coding agents' chat routes: Anthropic's Messages API (Claude Code) and OpenAI's Responses API (Codex).
AGENT_ENDPOINTS = frozenset({"/v1/messages", "/v1/responses"})


@dataclass(frozen=True)
class FinalMetrics:
    """Ollama's final-chunk numbers, exactly as sent (absent keys are None).

    Durations are integer nanoseconds, as on the wire.
    """

    total_duration_ns: int | None = None
    load_duration_ns: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_cached_count: int | None = None  # only from Ollama >= 0.33.3
    prompt_eval_duration_ns: int | None = None
    eval_count: int | None = None
    eval_duration_ns: int | None = None
    done_reason: str | None = None


@dataclass
class RequestRecord:
    """One generation, embedding, load or unload request seen by the recording proxy, or one generation a
    client sent Ollama directly, seen from its runner (``seen_from`` RUNNER: see ``collectors.ollama.direct``).

    A direct record has no proxy clock: its stamps are placed on the collector's monotonic clock from the
    runner's readings, ``metrics`` holds the runner's own figures (Ollama's log, else /slots readings), and
    what the runner does not tell (the route, the client, streamed or not) is None, never guessed.
    """

    id: str  # uuid4 hex, assigned by the proxy (direct: "runner-" + the runner's port, pid and task id)
    started_at_unix_s: float  # wall clock when the request arrived (direct: when its task began)
    client_addr: str | None  # None: not known (a direct record without an unambiguous access line)
    # "/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions", an agent route (AGENT_ENDPOINTS) or an
    # embed route; None: not known
    endpoint: str | None
    model: str
    stream: bool | None  # None: not known (direct)
    kind: RequestKind = RequestKind.GENERATE
    batch_size: int | None = None  # embed: how many inputs the request carried
    num_ctx: int | None = None
    num_predict: int | None = None
    keep_alive: str | None = None  # as the client sent it, rendered as text
    # Characters of the prompt (prompt/system, or the messages' content) as the request body gave them: counted
    # always, so the Live page can estimate prefill progress; the text itself only with --record-text.
    prompt_chars: int | None = None
    # Monotonic timestamps (collector clock).
    received_ns: int = 0
    forwarded_ns: int | None = None
    first_byte_ns: int | None = None
    first_token_ns: int | None = None  # first chunk carrying content
    token_chunk_ns: list[int] = field(default_factory=list)  # every chunk carrying content, first included
    # Thinking models stream their reasoning before the answer. None: not known (recorded before it was kept).
    thinking_chunks: int | None = 0  # content chunks that carried thinking (one token each)
    last_thinking_ns: int | None = None  # the last chunk carrying thinking
    first_answer_ns: int | None = None  # the first chunk carrying answer content (text or tool calls)
    final_chunk_ns: int | None = None
    closed_ns: int | None = None
    # Result.
    status_code: int | None = None
    outcome: Outcome = Outcome.IN_FLIGHT
    error: str | None = None  # error body or failure description
    metrics: FinalMetrics | None = None
    # Only with --record-text.
    prompt_text: str | None = None
    response_text: str | None = None
    # Direct records (seen_from RUNNER). The runner's task, and how exact the figures are: each bound is the most
    # the value can be off (a /slots poll interval, a batch), so 5e-6 s for the log's timings printed to 0.01 ms.
    seen_from: SeenFrom = SeenFrom.PROXY
    runner_port: int | None = None
    runner_task_id: int | None = None  # llama-server's id_task (/slots) = "task N" (its log)
    runner_source: str | None = None  # where the figures come from: "log" (exact) or "slots" (bounded)
    # The client address and route came from Ollama's access line (text in a log anyone who reaches the runner can
    # write into), not from a socket this collector saw: shown as unverified.
    client_unverified: bool = False
    ends_bound_s: float | None = None  # start and end times: each within this of the truth
    prefill_bound_s: float | None = None
    decode_bound_s: float | None = None
    output_tokens_bound: int | None = None  # 0: counted exactly
    # A prompt that did not fit, and the context it ran with (analysis.prompt_fit; None: not known): its size as sent,
    # where that size comes from ("log": Ollama's "truncating input prompt" line, "tokenize": the runner's /tokenize,
    # "estimate": from its characters), the tokens kept, the context and who set it (analysis.prompt_fit.CtxSource).
    prompt_sent_tokens: int | None = None
    prompt_sent_source: str | None = None
    prompt_kept_tokens: int | None = None
    num_ctx_in_force: int | None = None
    num_ctx_source: str | None = None
    # Which program sent it (None: not known): its User-Agent's first product and version (analysis.client_program),
    # and, for a client on this machine where the OS shows it, the process behind the client's socket.
    client_program: str | None = None
    client_program_version: str | None = None
    client_process: str | None = None  # the process's name
    client_pid: int | None = None
    client_user: str | None = None  # the process's user (login name, or "uid N")

    @property
    def direct(self) -> bool:
        return self.seen_from == SeenFrom.RUNNER

    def wall_s(self, t_ns: int) -> float:
        """Convert a monotonic timestamp of this request to wall-clock seconds."""
        return self.started_at_unix_s + (t_ns - self.received_ns) / 1e9


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU (NVML, amdsmi, sysfs, macmon, IORegistry or the sim). Any field the source lacks is None."""

    ts_unix_s: float
    index: int
    name: str
    uuid: str
    util_gpu_pct: float | None = None  # % of time a kernel ran (not a fraction of compute)
    util_mem_pct: float | None = None  # % of time memory was read or written (not bandwidth)
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # cumulative counter since driver load
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    mem_bus_width_bits: int | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    pstate: int | None = None
    throttle_reasons: int | None = None  # NVML bitmask
    ollama_mem_bytes: int | None = None  # VRAM used by Ollama's processes
    simulated: bool = False


@dataclass(frozen=True)
class HostSample:
    """One psutil reading of the machine and of Ollama's processes."""

    ts_unix_s: float
    cpu_pct: float
    mem_used_bytes: int
    mem_total_bytes: int
    ollama_cpu_pct: float | None = None
    ollama_rss_bytes: int | None = None
    disk_read_bytes_s: float | None = None


@dataclass(frozen=True)
class LoadedModel:
    """One row of Ollama's /api/ps at one moment."""

    ts_unix_s: float
    name: str
    model: str
    digest: str
    size_bytes: int
    size_vram_bytes: int
    context_length: int | None
    expires_at_unix_s: float | None
    parameter_size: str | None = None
    quantization_level: str | None = None
    family: str | None = None


@dataclass(frozen=True)
class RunnerFlags:
    """The settings a runner process was started with, read from its command line (``llama-server`` as Ollama
    starts it, or Ollama's own ``ollama runner``). ``None`` where the flag was not given: the runner's own
    default holds, which the command line does not tell (never stored as 0)."""

    ts_unix_s: float  # when the command line was read
    pid: int
    port: int
    kind: str  # "llama-server" or "ollama runner"
    digest: str | None  # of the model blob it serves (its --model path), when that is an Ollama blob
    model: str | None  # the /api/ps name it serves, once matched
    ctx_size_tokens: int | None  # -c: the whole context, num_ctx × num_parallel as Ollama starts it
    parallel: int | None  # -np
    batch_tokens: int | None  # -b
    ubatch_tokens: int | None  # -ub
    cache_type_k: str | None  # -ctk (the Go runner's --kv-cache-type sets both)
    cache_type_v: str | None  # -ctv
    flash_attn: str | None  # -fa: "on", "off" or "auto"
    gpu_layers: str | None  # -ngl: a number, "auto" or "all"
    threads: int | None  # -t


@dataclass(frozen=True)
class InstalledModel:
    """One model of Ollama's /api/tags (installed, loaded or not) as the latest poll listed it.

    ``None`` where Ollama gave no value (never 0): ``size_bytes`` is the GGUF file's size.
    """

    ts_unix_s: float  # when the list was read
    name: str
    model: str
    digest: str
    size_bytes: int | None
    parameter_size: str | None
    quantization_level: str | None
    family: str | None
    modified_at_unix_s: float | None
    capabilities: tuple[str, ...] = ()  # () where Ollama lists none (older versions)


@dataclass(frozen=True)
class OllamaStatus:
    """One poll of the Ollama server: reachable or not, and which version."""

    ts_unix_s: float
    up: bool
    base_url: str
    version: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class CollectorInfo:
    """Heartbeat of the collector process, written every interval, read by the sidebar."""

    ts_unix_s: float
    pid: int
    listen: str  # proxy address, e.g. "127.0.0.1:11435"
    ollama_url: str  # upstream, e.g. "http://127.0.0.1:11434"
    data_dir: str
    gpu_state: str  # a GpuKind value
    gpu_message: str | None = None  # e.g. why no NVIDIA GPU was found
    demo: bool = False  # upstream is sim/, not a real Ollama
    record_text: bool = False
    runners_found: str | None = None  # e.g. "1 runner found by process (same user)"; None: none found (yet)
    runners_problem: str | None = None  # why no runner was found, with what to do
    log_problem: str | None = None  # why Ollama's log is not read, with the command that fixes it
    proxy_refused: str | None = None  # requests the proxy refused itself in the last hour, e.g. "2 × 400 malformed"
    runner_lines_missing: str | None = None  # the log is read but the runner's per-request lines never come; the fix
    ollama_queued: str | None = None  # JSON {model: requests waiting} from Ollama's own /metrics; None: not served


class ProgressSource(StrEnum):
    """Where a reading of a generation's progress came from."""

    SLOTS = "slots"  # the runner's /slots endpoint (llama-server), read while it ran
    LOG = "log"  # a line of Ollama's log (llama-server's "prompt processing progress")
    ESTIMATE = "estimate"  # computed: prompt size from its characters, progress at the calibrated prefill rate


@dataclass(frozen=True)
class ProgressSample:
    """One reading of a generation's progress while it runs (prompt read so far, tokens decoded so far).

    Counts only: the runner's /slots can carry prompt text, which is never kept. Any count the source
    does not give is None.
    """

    request_id: str
    ts_unix_s: float  # wall clock of the reading
    source: ProgressSource
    processed_tokens: int  # prompt tokens evaluated so far (cached tokens not included)
    prompt_tokens: int | None = None  # the prompt's size, when known
    cached_tokens: int | None = None  # prompt tokens reused from the runner's cache
    decoded_tokens: int | None = None  # output tokens so far
    ctx_used_tokens: int | None = None  # tokens in the slot's context now
    n_ctx: int | None = None  # the slot's context size


@dataclass(frozen=True)
class HostBandwidth:
    """The host's memory bandwidth as the collector measured it (a copy with threads, best of a few runs)."""

    bandwidth_bytes_s: float
    measured_unix_s: float
    buffer_bytes: int
    threads: int
    runs: int
    cpu_count: int
    mem_total_bytes: int
    method: str = "numpy copyto, threads, best of runs; bytes moved = 2 × buffer"
    # Apple Silicon (read by the collector with sysctl and system_profiler, never by a page): the chip and its GPU
    # cores, which tell variants of different bandwidth apart; None elsewhere, or where it could not be read.
    apple_chip: str | None = None
    apple_gpu_cores: int | None = None
