"""Why's "What if" section: the settings in force, and what other settings would hold and run at (no Streamlit).

Everything comes from the Why model already built for the page: its hardware, the model's facts, the
efficiencies calibrated on the user's own requests and their typical lengths; the prediction is
``analysis.whatif``'s, over the same ceiling model as the rest of the page.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from analysis.memory import DEFAULT_UBATCH_TOKENS, KV_TYPE_BYTES, RunnerSettings
from analysis.prompt_fit import CTX_SOURCE_WORDS, CtxSource
from analysis.records import LoadedModel, RunnerFlags
from analysis.whatif import QUANT_LADDER, Prediction, Suggestion, Workload, predict, suggest
from pages.shared import fmt
from pages.why.view import WhyModel
from store.tables import OllamaSettingRow

NUM_CTX_CHOICES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
ASSUMED_NUM_CTX = 4096  # Ollama's default context where nothing loaded says otherwise (docs/ollama-api.md §7)
DEFAULT_NOTE = "Ollama's default assumed"
P90 = 0.9


@dataclass(frozen=True)
class Setting:
    """One setting in force: its name, its value as shown, and where the value comes from."""

    name: str
    value: str
    source: str


@dataclass(frozen=True)
class InForce:
    """The settings the model runs with now, and where each figure comes from."""

    settings: RunnerSettings
    quantization: str | None
    rows: list[Setting]  # every setting shown, with its source (some, as threads, only shown)
    free_vram_bytes: float | None
    free_vram_source: str


def _read(flag: str, runner: RunnerFlags) -> str:
    # The runner may have exited since (the store keeps it): when it was read says which one served the requests.
    return f"the runner's command line ({flag}, pid {runner.pid}, read {fmt.when(runner.ts_unix_s)})"


def _unset(default: str, runner: RunnerFlags | None) -> str:
    if runner is None:
        return f"no runner read: {DEFAULT_NOTE} ({default})"
    return f"not on the runner's command line: llama-server's default ({default})"


def _kv_type(runner: RunnerFlags | None) -> tuple[str, Setting]:
    """The KV cache type to predict with, and its row. Where K and V differ, the larger one (memory is not
    under-counted)."""
    k = runner.cache_type_k if runner is not None else None
    v = runner.cache_type_v if runner is not None else None
    if runner is None or (k is None and v is None):
        return "f16", Setting("KV cache type", "f16", _unset("f16", runner))
    k, v = k or "f16", v or "f16"
    known = [t for t in (k, v) if t in KV_TYPE_BYTES]
    kv = max(known, key=KV_TYPE_BYTES.__getitem__) if known else "f16"
    return kv, Setting("KV cache type", k if k == v else f"K {k}, V {v}", _read("-ctk/-ctv", runner))


def _flash_attn(runner: RunnerFlags | None) -> tuple[bool, Setting]:
    """On, off, or llama.cpp's auto: on wherever the backend has the kernels (CUDA, Metal, ROCm, Vulkan, CPU)."""
    given = runner.flash_attn if runner is not None else None
    if runner is not None and given in ("on", "off"):
        return given == "on", Setting("flash attention", given, _read("-fa", runner))
    source = _read("-fa auto", runner) if runner is not None and given == "auto" else _unset("auto", runner)
    return True, Setting("flash attention", "auto (on)", source + "; auto turns it on where the backend has it")


def _num_ctx(loaded: LoadedModel | None, runner: RunnerFlags | None) -> tuple[int, Setting]:
    if loaded is not None and loaded.context_length:
        num_ctx = loaded.context_length
        return num_ctx, Setting("num_ctx", fmt.count(num_ctx), "/api/ps (context_length)")
    if runner is not None and runner.ctx_size_tokens:
        num_ctx = max(runner.ctx_size_tokens // (runner.parallel or 1), 1)  # Ollama starts it with -c num_ctx × np
        return num_ctx, Setting("num_ctx", fmt.count(num_ctx), _read("-c ÷ -np", runner))
    return ASSUMED_NUM_CTX, Setting("num_ctx", fmt.count(ASSUMED_NUM_CTX), f"not loaded: {DEFAULT_NOTE}")


def _shown_only(runner: RunnerFlags | None) -> list[Setting]:
    """Settings shown for the record; the prediction does not take them (the layer split is computed from memory)."""
    if runner is None:
        return []
    layers = runner.gpu_layers
    threads = runner.threads
    return [
        Setting("GPU layers", layers or "auto", _read("-ngl", runner) if layers else _unset("auto", runner)),
        Setting("threads", str(threads) if threads else "auto", _read("-t", runner) if threads else _unset("auto", runner)),
    ]


# Ollama's start lines shown in the table (the rest are kept in the store): the ones that decide a load.
STARTED_WITH = (
    "OLLAMA_CONTEXT_LENGTH",
    "vram-based default context",
    "OLLAMA_NUM_PARALLEL",
    "OLLAMA_MAX_LOADED_MODELS",
    "OLLAMA_KV_CACHE_TYPE",
    "OLLAMA_FLASH_ATTENTION",
    "OLLAMA_KEEP_ALIVE",
    "inference compute 0",
)


def _ctx_origin(row: Setting, num_ctx: int, started: list[OllamaSettingRow]) -> Setting:
    """num_ctx's row, with who set it where Ollama's start lines give the same number (analysis.prompt_fit)."""
    by_name = {s.name: s.value for s in started}
    env = by_name.get("OLLAMA_CONTEXT_LENGTH", "")
    default = by_name.get("vram-based default context", "").split(" ", 1)[0]
    if env.isdigit() and int(env) == num_ctx:
        return Setting(row.name, row.value, f"{row.source}: {CTX_SOURCE_WORDS[CtxSource.ENV]}")
    if default.isdigit() and int(default) == num_ctx and not (env.isdigit() and int(env) > 0):
        return Setting(row.name, row.value, f"{row.source}: {CTX_SOURCE_WORDS[CtxSource.VRAM_DEFAULT]}")
    if started:
        note = "not OLLAMA_CONTEXT_LENGTH nor Ollama's default: a client's options.num_ctx (native routes) or the model's"
        return Setting(row.name, row.value, f"{row.source}; {note} PARAMETER num_ctx")
    return row


def _started_with(started: list[OllamaSettingRow]) -> list[Setting]:
    by_name = {s.name: s for s in started}
    shown = [by_name[n] for n in STARTED_WITH if n in by_name]
    return [Setting(s.name, s.value or "(unset)", s.source) for s in shown]


def in_force(m: WhyModel) -> InForce:
    """What the model runs with now: read from /api/ps and its runner's command line where they say, else Ollama's
    defaults, each with its source."""
    runner = m.runner
    num_ctx, ctx_row = _num_ctx(m.loaded, runner)
    parallel = runner.parallel if runner is not None and runner.parallel else 1
    par_row = Setting("num_parallel", str(parallel), _read("-np", runner) if runner and runner.parallel else _unset("1", runner))
    kv_type, kv_row = _kv_type(runner)
    flash, fa_row = _flash_attn(runner)
    ubatch = m.ubatch_tokens or DEFAULT_UBATCH_TOKENS
    if runner is not None and runner.ubatch_tokens:
        batch_row = Setting(
            "batch / micro-batch", f"{fmt.count(runner.batch_tokens or ubatch)} / {fmt.count(ubatch)}", _read("-b/-ub", runner)
        )
    else:
        batch_row = Setting("batch / micro-batch", fmt.count(ubatch), "Ollama's batch for this context")
    ctx_row = _ctx_origin(ctx_row, num_ctx, m.server_settings)
    rows = [ctx_row, par_row, kv_row, fa_row, batch_row, *_shown_only(runner), *_started_with(m.server_settings)]
    free, free_source = _free_vram(m)
    settings = RunnerSettings(num_ctx=num_ctx, num_parallel=parallel, kv_type=kv_type, flash_attn=flash, ubatch_tokens=ubatch)
    return InForce(settings, m.facts.quantization if m.facts else None, rows, free, free_source)


def _free_vram(m: WhyModel) -> tuple[float | None, str]:
    """GPU memory this model may use: the GPU's free memory plus what the model holds now."""
    hw = m.hardware
    if hw.kind == "cpu":
        return None, "no GPU: the model runs in system memory"
    held = m.loaded.size_vram_bytes if m.loaded is not None and m.loaded.size_vram_bytes else 0
    if m.gpu_mem_total_bytes is not None and m.gpu_mem_used_bytes is not None:
        free = m.gpu_mem_total_bytes - m.gpu_mem_used_bytes + held
        return float(free), "the GPU's free memory now, plus what this model holds (latest GPU sample)"
    if hw.spec is not None:
        return hw.spec.memory_bytes, f"the {hw.spec.name}'s whole memory (no GPU sample: assumed free)"
    return None, "unknown GPU memory"


def workload(m: WhyModel) -> Workload:
    """The user's typical lengths: medians from the story, the long end from their own prompts."""
    prompts = sorted(r.tokens for r in m.prefill_points)
    p90 = prompts[min(int(P90 * len(prompts)), len(prompts) - 1)] if prompts else 4 * m.typical_prompt_tokens
    longest = prompts[-1] if prompts else p90
    return Workload(m.typical_prompt_tokens, max(p90, m.typical_prompt_tokens), m.typical_context_tokens, longest)


def quant_choices(current: str | None) -> list[str]:
    known = list(QUANT_LADDER)
    if current and current.upper() not in known:
        known.insert(0, current.upper())
    return known


@dataclass(frozen=True)
class LoadedSizes:
    """What the runner said it allocated when it loaded the model (every device and system memory), in bytes."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


def loaded_sizes(m: WhyModel) -> LoadedSizes | None:
    """The runner's own buffer sizes from its load lines; None when they were not read (then only the prediction)."""
    p = m.placement
    r = p.runner if p is not None and p.from_runner else None
    if r is None:
        return None
    weights = sum(d.model_bytes or 0 for d in r.devices) + (r.host_model_bytes or 0)
    kv = sum(d.kv_bytes or 0 for d in r.devices) + (r.host_kv_bytes or 0)
    compute = sum(d.compute_bytes or 0 for d in r.devices)
    return LoadedSizes(weights, kv, compute) if weights else None


@dataclass(frozen=True)
class WhatIf:
    now: Prediction
    picked: Prediction
    suggestions: list[Suggestion]
    workload: Workload
    in_force: InForce
    loaded: LoadedSizes | None = None  # what the runner allocated for the settings in force, in its own words


def build_whatif(m: WhyModel, picked: RunnerSettings, picked_quant: str | None) -> WhatIf | None:
    """The prediction for the settings in force, for the picked ones, and the suggestions; None without ceilings."""
    hw, facts = m.hardware, m.facts
    if hw.spec is None or facts is None:
        return None
    force = in_force(m)
    work = workload(m)
    spec = hw.spec

    def at(settings: RunnerSettings, quant: str | None) -> Prediction:
        return predict(
            facts,
            spec,
            settings,
            work,
            free_vram_bytes=force.free_vram_bytes,
            efficiencies=m.efficiencies,
            host_bandwidth_bytes_s=hw.host_bandwidth_bytes_s,
            bandwidth_bytes_s=hw.bandwidth_bytes_s,
            quant=quant,
        )

    now = at(force.settings, None)
    found = suggest(
        now,
        facts,
        spec,
        work,
        free_vram_bytes=force.free_vram_bytes,
        efficiencies=m.efficiencies,
        host_bandwidth_bytes_s=hw.host_bandwidth_bytes_s,
        bandwidth_bytes_s=hw.bandwidth_bytes_s,
    )
    return WhatIf(now, at(picked, picked_quant), found, work, force, loaded_sizes(m))


def memory_figure(w: WhatIf) -> go.Figure:
    """Stacked bars, in GB: what the model holds now and under the picked settings, against the free GPU memory."""
    fig = go.Figure()
    # Each row: (label, weights, KV cache, buffers) in bytes; the runner's own sizes first when it printed them.
    rows = [
        (label, m.weights_bytes, m.kv_bytes, m.compute_bytes + m.output_bytes)
        for label, m in (("now, predicted", w.now.memory), ("picked, predicted", w.picked.memory))
    ]
    if w.loaded is not None:
        rows.insert(0, ("loaded (the runner's words)", w.loaded.weights_bytes, w.loaded.kv_bytes, w.loaded.compute_bytes))
    parts = (("weights", "#4c78a8"), ("KV cache", "#f58518"), ("compute and output buffers", "#9d755d"))
    for i, (label, color) in enumerate(parts):
        xs = [float(row[i + 1]) / 1e9 for row in rows]
        fig.add_bar(y=[row[0] for row in rows], x=xs, name=label, orientation="h", marker_color=color)
    if w.in_force.free_vram_bytes is not None:
        fig.add_vline(
            x=w.in_force.free_vram_bytes / 1e9,
            line_dash="dash",
            line_color="#e45756",
            annotation_text="GPU memory free for it",
            annotation_position="top",
        )
    fig.update_layout(
        barmode="stack",
        title="Memory the model needs (GB)",
        xaxis_title="GB",
        height=230,
        legend={"orientation": "h", "y": -0.35},
        margin={"t": 50, "b": 10},
    )
    return fig
