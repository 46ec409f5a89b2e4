"""The Why page's two charts: measured readings against the ceiling model's lines (no Streamlit).

Axis ranges come from the ceiling lines and the readings that count. A reading that cannot be true
is drawn as a marker at the top edge with its value in the hover; a reading timed over too few tokens
is drawn hollow. Neither sets a range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from analysis import wording as w
from analysis.ceilings import MIN_RATE_TOKENS, CurvePoint, Efficiencies
from analysis.story import Reading, Status
from pages.shared import fmt
from pages.shared.charts import evenly, plain

MEASURED_COLOUR = "#1e88e5"
CEILING_COLOUR = "#e53935"
EXPECTED_COLOUR = "#fb8c00"
PRIOR_COLOUR = "#9e9e9e"  # the prior: grey and dotted beside the calibrated line
FULL_GPU_COLOUR = "#8e24aa"
IMPOSSIBLE_COLOUR = "#6d4c41"
EMBED_COLOUR = "#2e7d32"
HEADROOM = 1.1  # the y axis ends this far above the highest ceiling or counted reading
EDGE = 0.98  # impossible readings sit at this share of the y range
# Markers drawn per series at most: past this the browser's layout of the page's two charts, not the reading, is
# what a visit waits for (5,000 readings each took seconds to mount, issue 48); the medians, the calibration and the
# axes still use every reading.
POINTS_DRAWN_MAX = 1000

MEASURED_NAME = "measured (one per request)"
TINY_NAME = f"under {MIN_RATE_TOKENS} tokens: too short to time well, not in medians"
IMPOSSIBLE_NAME = "cannot be true: above its ceiling (value in hover)"
EMBED_NAME = "embeddings (prefill only, one per request; not in medians)"


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Powers of ten from ``lo`` to ``hi`` and their labels ("1", "10", "1,000"): no minor-tick labels."""
    vals = [10.0**k for k in range(math.floor(math.log10(max(lo, 1))), math.ceil(math.log10(max(hi, 1))) + 1)]
    return vals, [f"{v:,.0f}" for v in vals]


def y_top(curve: Sequence[CurvePoint], readings: Sequence[Reading]) -> float | None:
    """Top of the y axis: the ceiling line and the counted readings, never a flagged one."""
    tops = [p.ceiling_tok_s for p in curve] + [r.rate_tok_s for r in readings if r.status is Status.COUNTED]
    return HEADROOM * max(tops) if tops else None


def _line(curve: Sequence[CurvePoint], attr: str, name: str, colour: str, dash: str, x_label: str) -> go.Scatter:
    return go.Scatter(
        x=[p.tokens for p in curve],
        y=[getattr(p, attr) for p in curve],
        mode="lines",
        name=name,
        line={"color": colour, "width": 2, "dash": dash},
        hovertemplate=f"%{{x:,.0f}} {x_label}: %{{y:,.0f}} tok/s<extra>" + name.split(" (")[0] + "</extra>",
    )


def _points(
    readings: Sequence[Reading],
    name: str,
    x_label: str,
    marker: dict[str, object],
    y: Sequence[float] | None = None,
) -> go.Scatter:
    # numpy arrays: Plotly validates a list element by element, an array at once (5,000 points: ~1 s vs ~ms).
    rates = [r.rate_tok_s for r in readings]
    return go.Scatter(
        x=np.asarray([r.tokens for r in readings], dtype=np.float64),
        y=np.asarray(rates if y is None else y, dtype=np.float64),
        mode="markers",
        name=name,
        marker=marker,
        customdata=np.asarray([[r.request_id[:8], r.rate_tok_s, r.timed_tokens] for r in readings], dtype=object).reshape(-1, 3),
        hovertemplate=f"%{{x:,.0f}} {x_label}<br>%{{customdata[1]:,.0f}} tok/s over %{{customdata[2]:,}} tokens"
        "<br>request %{customdata[0]}<extra></extra>",
    )


def expected_label(eff: Efficiencies, kind: str) -> str:
    """Legend name of the expected line: which efficiency it uses and where that came from."""
    eta, source = (eff.eta_compute, eff.source_compute) if kind == "prefill" else (eff.eta_bw, eff.source_bw)
    fitted = eff.prefill_samples if kind == "prefill" else eff.decode_samples
    # The prior (first principles, never fitted) and the model calibrated on the user's readings are told apart.
    name = "expected, calibrated" if fitted else "expected, prior"
    if kind == "decode" and eff.fixed_s_per_token > 0:  # docs/physics.md §5: bytes at η of the bandwidth, plus a fixed cost
        return f"{name} (the bytes at {w.pct(eta)} of the bandwidth + {w.secs(eff.fixed_s_per_token)} per token: {source})"
    return f"{name} ({w.pct(eta)} of ceiling: {source})"


def _add_lines(
    fig: go.Figure,
    kind: str,
    curve: Sequence[CurvePoint],
    full_gpu_curve: Sequence[CurvePoint],
    eff: Efficiencies | None,
    ceiling_name: str,
    x_label: str,
) -> None:
    """The ceiling and expected lines, and the all-in-VRAM ceiling where the model is partly offloaded."""
    if curve and eff is not None:
        fig.add_trace(_line(curve, "ceiling_tok_s", ceiling_name, CEILING_COLOUR, "dash", x_label))
        fig.add_trace(_line(curve, "expected_tok_s", expected_label(eff, kind), EXPECTED_COLOUR, "solid", x_label))
    if full_gpu_curve:
        fig.add_trace(
            _line(full_gpu_curve, "ceiling_tok_s", "ceiling if the model were all in VRAM", FULL_GPU_COLOUR, "dot", x_label)
        )


def _at_edge(readings: Sequence[Reading], top: float | None) -> list[float]:
    """Their rates, those beyond the y axis held at its top edge (the value stays in the hover)."""
    return [min(r.rate_tok_s, EDGE * top) if top else r.rate_tok_s for r in readings]


def _add_points(
    fig: go.Figure, readings: Sequence[Reading], embed: Sequence[Reading], top: float | None, x_label: str
) -> float | None:
    """The readings that count, then those drawn apart (embeddings, too short, impossible); returns the y axis's top."""
    counted = evenly([r for r in readings if r.status is Status.COUNTED], POINTS_DRAWN_MAX)
    tiny = evenly([r for r in readings if r.status is Status.TINY], POINTS_DRAWN_MAX)
    # Embeddings: their own diamonds; one above its ceiling joins the impossible markers at the edge.
    embed_drawn = evenly([r for r in embed if r.status is not Status.IMPOSSIBLE], POINTS_DRAWN_MAX)
    impossible = evenly([r for r in (*readings, *embed) if r.status is Status.IMPOSSIBLE], POINTS_DRAWN_MAX)
    fig.add_trace(_points(counted, MEASURED_NAME, x_label, {"color": MEASURED_COLOUR, "size": 7, "opacity": 0.75}))
    if embed_drawn:
        marker = {"color": EMBED_COLOUR, "size": 9, "symbol": "diamond", "line": {"color": "white", "width": 1}}
        fig.add_trace(_points(embed_drawn, EMBED_NAME, x_label, marker, y=_at_edge(embed_drawn, top)))
    if top is None and tiny:
        top = HEADROOM * max(r.rate_tok_s for r in readings if r.status is Status.TINY)  # nothing else to scale by
    if tiny:
        marker = {"color": MEASURED_COLOUR, "size": 7, "symbol": "circle-open"}
        fig.add_trace(_points(tiny, TINY_NAME, x_label, marker, y=_at_edge(tiny, top)))
    if impossible and top is not None:
        marker = {"color": IMPOSSIBLE_COLOUR, "size": 11, "symbol": "triangle-up"}
        fig.add_trace(_points(impossible, IMPOSSIBLE_NAME, x_label, marker, y=[EDGE * top] * len(impossible)))
    return top


def _lay_out(fig: go.Figure, title: str, x_title: str, xs: Sequence[float], top: float | None) -> None:
    """Title and legend; a log x axis labelled at powers of ten over what is drawn; y from 0 to ``top``."""
    fig.update_layout(
        title={"text": title},
        height=440,
        margin={"l": 70, "r": 20, "t": 70, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0},
        hovermode="closest",
    )
    drawn = [x for x in xs if x and x > 0]
    x_axis: dict[str, object] = {"title_text": x_title, "type": "log"}
    if drawn:
        lo, hi = min(drawn), max(drawn)
        vals, text = log_ticks(lo, hi)
        x_axis.update(tickvals=vals, ticktext=text, range=[math.log10(lo) - 0.05, math.log10(hi) + 0.05])
    fig.update_xaxes(**x_axis)
    y_axis: dict[str, object] = {"title_text": "tokens per second (tok/s)", "tickformat": ",.0f"}
    if top is not None:
        y_axis["range"] = [0, top]
    else:
        y_axis["rangemode"] = "tozero"
    fig.update_yaxes(**y_axis)


def rate_figure(
    kind: str,
    readings: Sequence[Reading],
    curve: Sequence[CurvePoint],
    eff: Efficiencies | None,
    title: str,
    x_title: str,
    *,
    ceiling_name: str,
    full_gpu_curve: Sequence[CurvePoint] = (),
    embed: Sequence[Reading] = (),
    prior: tuple[Sequence[CurvePoint], Efficiencies] | None = None,
) -> go.Figure:
    x_label = "prompt tokens" if kind == "prefill" else "tokens of context"
    fig = go.Figure()
    _add_lines(fig, kind, curve, full_gpu_curve, eff, ceiling_name, x_label)
    if prior is not None and prior[0]:  # the prior beside the calibrated line: first principles, never fitted
        fig.add_trace(_line(prior[0], "expected_tok_s", expected_label(prior[1], kind), PRIOR_COLOUR, "dot", x_label))
    top = _add_points(fig, readings, embed, y_top([*curve, *full_gpu_curve], [*readings, *embed]), x_label)
    xs = [p.tokens for p in (*curve, *full_gpu_curve)] + [r.tokens for r in (*readings, *embed)]
    _lay_out(fig, title, x_title, xs, top)
    return fig


def prefill_figure(
    readings: Sequence[Reading],
    curve: Sequence[CurvePoint],
    eff: Efficiencies | None,
    model: str,
    hw_label: str,
    ubatch_tokens: int,
    *,
    embed: Sequence[Reading] = (),
    prior: tuple[Sequence[CurvePoint], Efficiencies] | None = None,
) -> go.Figure:
    what = f"{plain(fmt.label(model))} on {plain(fmt.label(hw_label, fmt.SENTENCE_MAX_CHARS))}"  # names cut
    return rate_figure(
        "prefill",
        readings,
        curve,
        eff,
        f"Prefill: prompt tokens/s against prompt length<br><sup>{what}, micro-batch {fmt.count(ubatch_tokens)} tokens</sup>",
        "prompt length (tokens computed, cache hits excluded; log scale)",
        ceiling_name="ceiling (memory, then compute)",
        embed=embed,
        prior=prior,
    )


def decode_figure(
    readings: Sequence[Reading],
    curve: Sequence[CurvePoint],
    full_gpu_curve: Sequence[CurvePoint],
    eff: Efficiencies | None,
    model: str,
    hw_label: str,
    *,
    prior: tuple[Sequence[CurvePoint], Efficiencies] | None = None,
) -> go.Figure:
    blended = " blended with system memory" if full_gpu_curve else ""
    what = f"{plain(fmt.label(model))} on {plain(fmt.label(hw_label, fmt.SENTENCE_MAX_CHARS))}"  # names cut
    return rate_figure(
        "decode",
        readings,
        curve,
        eff,
        f"Decode: output tokens/s against context length<br><sup>{what}</sup>",
        "context length (prompt + half the reply, tokens; log scale)",
        ceiling_name=f"ceiling (memory bandwidth{blended})",
        full_gpu_curve=full_gpu_curve,
        prior=prior,
    )


def flagged_note(kind: str, readings: Sequence[Reading]) -> str | None:
    """The line under a chart counting what it draws apart; None when nothing was set apart."""
    impossible = sum(1 for r in readings if r.status is Status.IMPOSSIBLE)
    tiny = sum(1 for r in readings if r.status is Status.TINY)
    counted = len(readings) - impossible - tiny
    if not impossible and not tiny:
        return None
    bits = [f"{fmt.count(counted)} {kind} reading counts" if counted == 1 else f"{fmt.count(counted)} {kind} readings count"]
    if tiny:
        bits.append(f"{fmt.count(tiny)} timed over fewer than {MIN_RATE_TOKENS} tokens (hollow)")
    if impossible:
        bits.append(
            f"{fmt.count(impossible)} above the ceiling, which cannot be true (triangles at the top edge, value in the hover)"
        )
    return "; ".join(bits) + ". Only the readings that count set the medians, the calibration and the axes."


def points_note(kind_counts: dict[str, int], where: str) -> str:
    """The line under the charts: how many readings they come from, and how many of them are drawn."""
    counts = " and ".join(f"{fmt.count(n)} {kind}" for kind, n in kind_counts.items())
    if all(n <= POINTS_DRAWN_MAX for n in kind_counts.values()):
        return f"{counts} points from the requests of {where}; one point per request."
    return (
        f"{counts} readings from the requests of {where}; each kind of point is drawn for at most {fmt.count(POINTS_DRAWN_MAX)} "
        "of them, evenly spread over the readings (the medians, the expected lines and the axes use them all)."
    )
