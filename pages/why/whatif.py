"""Why's "What if" section: the settings in force, and what other settings would hold and run at (no Streamlit).

Everything comes from the Why model already built for the page: its hardware, the model's facts, the
efficiencies calibrated on the user's own requests and their typical lengths; the prediction is
``analysis.whatif``'s, over the same ceiling model as the rest of the page.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from analysis.memory import DEFAULT_UBATCH_TOKENS, RunnerSettings
from analysis.whatif import QUANT_LADDER, Prediction, Suggestion, Workload, predict, suggest
from pages.why.view import WhyModel

NUM_CTX_CHOICES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
ASSUMED_NUM_CTX = 4096  # Ollama's default context where nothing loaded says otherwise (docs/ollama-api.md §7)
P90 = 0.9


@dataclass(frozen=True)
class InForce:
    """The settings the model runs with now, and where each figure comes from."""

    settings: RunnerSettings
    quantization: str | None
    sources: dict[str, str]  # setting → "read from /api/ps", "Ollama's default (not read)", ...
    free_vram_bytes: float | None
    free_vram_source: str


def in_force(m: WhyModel) -> InForce:
    loaded = m.loaded
    sources = {}
    if loaded is not None and loaded.context_length:
        num_ctx = loaded.context_length
        sources["num_ctx"] = "read from /api/ps (context_length)"
    else:
        num_ctx = ASSUMED_NUM_CTX
        sources["num_ctx"] = "not loaded: Ollama's default assumed"
    for name in ("KV cache type", "flash attention", "num_parallel"):
        sources[name] = "not read from the runner yet: Ollama's default assumed"
    sources["batch"] = f"Ollama's micro-batch for this context ({m.ubatch_tokens})"
    free, free_source = _free_vram(m)
    settings = RunnerSettings(num_ctx=num_ctx, ubatch_tokens=m.ubatch_tokens or DEFAULT_UBATCH_TOKENS)
    return InForce(settings, m.facts.quantization if m.facts else None, sources, free, free_source)


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
class WhatIf:
    now: Prediction
    picked: Prediction
    suggestions: list[Suggestion]
    workload: Workload
    in_force: InForce


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
    return WhatIf(now, at(picked, picked_quant), found, work, force)


def memory_figure(w: WhatIf) -> go.Figure:
    """Stacked bars, in GB: what the model holds now and under the picked settings, against the free GPU memory."""
    fig = go.Figure()
    rows = [("now", w.now), ("picked", w.picked)]
    parts = (
        ("weights", "weights_bytes", "#4c78a8"),
        ("KV cache", "kv_bytes", "#f58518"),
        ("compute and output buffers", None, "#9d755d"),
    )
    for label, attr, color in parts:
        xs = []
        for _, p in rows:
            mem = p.memory
            xs.append((getattr(mem, attr) if attr else mem.compute_bytes + mem.output_bytes) / 1e9)
        fig.add_bar(y=[r for r, _ in rows], x=xs, name=label, orientation="h", marker_color=color)
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
