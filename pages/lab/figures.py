"""Plotly figures of Lab results, with the hardware's ceilings where the explainer provides them.

Pure: results (and an optional hardware spec) in, ``go.Figure`` out. Several runs
of the same experiment overlay, one colour per run, so runs can be compared.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.ceilings import ceilings_for, curve_tokens, decode_curve, prefill_curve, vram_fraction
from analysis.hardware import HardwareSpec
from analysis.model_facts import ModelFacts, ModelFactsError, model_facts_from_show
from collectors.api import ExperimentResult
from pages.shared import fmt

COLORS = ("#4C9BE8", "#F2A541", "#59C3A0", "#E86A6A", "#B48EE0", "#9AA5B1")
CEILING_DASH = "dot"
EXPECTED_DASH = "dash"
_CONFIG_HEIGHT = 420


def run_label(r: ExperimentResult) -> str:
    return f"{r.model} · {time.strftime('%m-%d %H:%M', time.localtime(r.started_at_unix_s))}"


def model_facts_of(r: ExperimentResult) -> ModelFacts | None:
    show = r.model_facts.get("show")
    if not isinstance(show, dict):
        return None
    try:
        return model_facts_from_show(show, r.model_facts.get("model_bytes"))
    except ModelFactsError:
        return None


def _xy(points: Sequence[dict[str, Any]], x: str, y: str) -> tuple[list[Any], list[Any]]:
    pts = sorted((p for p in points if p.get(x) is not None and p.get(y) is not None), key=lambda p: p[x])
    return [p[x] for p in pts], [p[y] for p in pts]


def _layout(fig: go.Figure, title: str, note: str | None = None) -> go.Figure:
    fig.update_layout(
        title={"text": title + (f"<br><sup>{note}</sup>" if note else "")},
        height=_CONFIG_HEIGHT,
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="x unified",
    )
    return fig


def _ceiling_note(spec: HardwareSpec | None, facts: ModelFacts | None) -> str:
    if spec is None:
        return "No ceiling: the GPU is unknown (no NVML reading matched the hardware table)."
    if facts is None:
        return "No ceiling: the model's architecture facts are missing."
    return f"Ceilings for {spec.name}."


def prompt_length_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Prefill speed", "Time to first token"), horizontal_spacing=0.12)
    max_tokens = 0
    for i, r in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        x, y = _xy(r.points, "prompt_tokens", "prefill_tok_s")
        max_tokens = max([max_tokens, *x])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"prefill · {run_label(r)}", line={"color": c}), 1, 1)
        x2, y2 = _xy(r.points, "prompt_tokens", "ttft_s")
        fig.add_trace(
            go.Scatter(x=x2, y=y2, mode="lines+markers", name=f"TTFT · {run_label(r)}", line={"color": c, "dash": "dash"}), 1, 2
        )
    facts = model_facts_of(runs[0]) if runs else None
    if spec is not None and facts is not None and max_tokens:
        curve = prefill_curve(spec, facts, curve_tokens(max_tokens, min_tokens=8))
        xs = [p.tokens for p in curve]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.ceiling_tok_s for p in curve],
                mode="lines",
                name="ceiling (memory, then compute)",
                line={"color": "#bbbbbb", "dash": CEILING_DASH},
            ),
            1,
            1,
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.expected_tok_s for p in curve],
                mode="lines",
                name="expected (η × ceiling)",
                line={"color": "#888888", "dash": EXPECTED_DASH},
            ),
            1,
            1,
        )
    fig.update_xaxes(type="log", title_text="prompt length (tokens)")
    fig.update_yaxes(title_text="prefill (tokens/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="time to first token (s)", rangemode="tozero", row=1, col=2)
    return _layout(fig, "Prefill speed and time to first token vs prompt length", _ceiling_note(spec, facts))


def context_depth_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = go.Figure()
    max_ctx = 0
    for i, r in enumerate(runs):
        x, y = _xy(r.points, "context_tokens", "decode_tok_s")
        max_ctx = max([max_ctx, *x])
        fig.add_trace(
            go.Scatter(x=x, y=y, mode="lines+markers", name=f"decode · {run_label(r)}", line={"color": COLORS[i % len(COLORS)]})
        )
    facts = model_facts_of(runs[0]) if runs else None
    if spec is not None and facts is not None and max_ctx:
        frac = vram_fraction(runs[0].model_facts.get("loaded_size_bytes"), runs[0].model_facts.get("size_vram_bytes"))
        curve = decode_curve(spec, facts, curve_tokens(max_ctx, min_tokens=64), vram_fraction=frac)
        xs = [p.tokens for p in curve]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.ceiling_tok_s for p in curve],
                mode="lines",
                name="bandwidth ceiling",
                line={"color": "#bbbbbb", "dash": CEILING_DASH},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[p.expected_tok_s for p in curve],
                mode="lines",
                name="expected (η × ceiling)",
                line={"color": "#888888", "dash": EXPECTED_DASH},
            )
        )
    fig.update_xaxes(title_text="context (tokens in the conversation)")
    fig.update_yaxes(title_text="decode (tokens/s)", rangemode="tozero")
    return _layout(fig, "Decode speed as the conversation grows", _ceiling_note(spec, facts))


def concurrency_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = go.Figure()
    max_streams = 1
    for i, r in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        x, y = _xy(r.points, "streams", "total_tok_s")
        max_streams = max([max_streams, *x])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"total · {run_label(r)}", line={"color": c}))
        x2, y2 = _xy(r.points, "streams", "per_stream_tok_s")
        fig.add_trace(
            go.Scatter(x=x2, y=y2, mode="lines+markers", name=f"each stream · {run_label(r)}", line={"color": c, "dash": "dash"})
        )
    facts = model_facts_of(runs[0]) if runs else None
    if spec is not None and facts is not None:
        p = runs[0].parameters
        ctx_tokens = int(p.get("prompt_tokens") or 64) + int(p.get("num_predict") or 48) // 2
        ceil = ceilings_for(spec, facts, context_tokens=ctx_tokens, prompt_tokens=ctx_tokens)
        xs = list(range(1, int(max_streams) + 1))
        agg = [ceil.batched_decode_tok_s(n) for n in xs]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[a for a, _ in agg],
                mode="lines",
                name="expected total (roofline)",
                line={"color": "#bbbbbb", "dash": CEILING_DASH},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[s for _, s in agg],
                mode="lines",
                name="expected each stream (roofline)",
                line={"color": "#888888", "dash": EXPECTED_DASH},
            )
        )
    fig.update_xaxes(title_text="streams at once", dtick=1)
    fig.update_yaxes(title_text="output (tokens/s)", rangemode="tozero")
    return _layout(fig, "Output speed with several streams at once", _ceiling_note(spec, facts))


def interference_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(runs):
        x, y = _xy(r.points, "t_s", "gap_ms")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines+markers",
                name=f"chat's gaps · {run_label(r)}",
                line={"color": COLORS[i % len(COLORS)]},
                marker={"size": 5},
            )
        )
    if len(runs) == 1:
        s = runs[0].summary
        start, end = s.get("long_prefill_start_s"), s.get("long_prefill_end_s")
        if start is not None and end is not None and not s.get("served_serially"):
            fig.add_vrect(
                x0=start,
                x1=end,
                fillcolor="#F2A541",
                opacity=0.18,
                line_width=0,
                annotation_text=f"long prompt prefill ({fmt.count(int(s.get('long_prompt_tokens') or 0))} tokens)",
                annotation_position="top left",
            )
        if s.get("long_prompt_sent_s") is not None:
            fig.add_vline(
                x=s["long_prompt_sent_s"],
                line_dash="dot",
                line_color="#999999",
                annotation_text="long prompt sent",
                annotation_position="bottom right",
            )
        if s.get("baseline_gap_ms") is not None:
            fig.add_hline(
                y=s["baseline_gap_ms"],
                line_dash="dash",
                line_color="#59C3A0",
                annotation_text="usual gap",
                annotation_position="top right",
            )
    fig.update_xaxes(title_text="time since the chat's first token (s)")
    fig.update_yaxes(title_text="gap before this token (ms)", rangemode="tozero")
    return _layout(fig, "The chat's gaps between tokens while a long prompt arrives")


def cold_warm_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(runs):
        by = {p.get("state"): p for p in r.points}
        states = [s for s in ("cold", "warm") if s in by]
        fig.add_trace(
            go.Bar(
                x=states,
                y=[by[s].get("load_s") for s in states],
                name=f"load · {run_label(r)}",
                marker_color=COLORS[i % len(COLORS)],
            )
        )
        fig.add_trace(
            go.Bar(
                x=states,
                y=[by[s].get("ttft_s") for s in states],
                name=f"first token · {run_label(r)}",
                marker_color=COLORS[i % len(COLORS)],
                opacity=0.5,
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="model state when the request arrived")
    fig.update_yaxes(title_text="seconds", rangemode="tozero")
    return _layout(fig, "Loading the model: cold versus warm")


def prompt_cache_figure(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(runs):
        pts = sorted(r.points, key=lambda p: p.get("attempt", 0))
        labels = ["first (nothing cached)" if p.get("attempt") == 1 else "second (same prefix)" for p in pts]
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[p.get("prefill_s") for p in pts],
                name=f"prefill · {run_label(r)}",
                marker_color=COLORS[i % len(COLORS)],
            )
        )
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[p.get("ttft_s") for p in pts],
                name=f"first token · {run_label(r)}",
                marker_color=COLORS[i % len(COLORS)],
                opacity=0.5,
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="seconds", rangemode="tozero")
    return _layout(fig, "What the prompt cache saves on a repeated prefix")


FIGURES = {
    "prompt-length": prompt_length_figure,
    "context-depth": context_depth_figure,
    "concurrency": concurrency_figure,
    "interference": interference_figure,
    "cold-warm": cold_warm_figure,
    "prompt-cache": prompt_cache_figure,
}


def figure_for(runs: Sequence[ExperimentResult], spec: HardwareSpec | None = None) -> go.Figure:
    """The chart of one experiment's runs (all of the same experiment)."""
    names = {r.name for r in runs}
    if len(names) != 1:
        raise ValueError(f"runs of one experiment only, got {sorted(names)}")
    return FIGURES[runs[0].name](runs, spec)
