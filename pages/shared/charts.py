"""Chart builders: plain functions from records to Plotly figures (no Streamlit, no I/O).

Every figure has a title, axis titles with units and a legend. Times on the
x axis are shown in the machine's local time zone. ``uirevision`` keeps a
user's zoom and hidden traces across the Live page's refreshes.
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.records import GpuSample, HostSample, LoadedModel
from pages.shared import fmt
from pages.shared.derive import PHASE_ORDER, Band, Interval, stall_threshold_ms

T = TypeVar("T")
OTHERS_ROW = "other requests"  # the waterfall's row for other requests' prefills beside this one
PHASE_COLOURS = {
    "queue": "#9e9e9e",
    "waiting for another request's batches": "#e53935",  # a free slot, another prompt being read (wait_split)
    "another request's prefill": "#ef9a9a",
    "wait (unexplained)": "#cfd8dc",
    "runner": "#ef6c00",  # the runner's own work before prefill, named from its log (analysis.runner_wait_lines)
    "load": "#ab47bc",
    "prefill": "#42a5f5",
    "decode": "#66bb6a",
    "thinking": "#c5e1a5",  # decode spent on a thinking model's reasoning
    "answer": "#2e7d32",  # decode spent on the answer
    "in flight": "#bdbdbd",
    "transport": "#ffb74d",
    "waiting for first byte": "#78909c",
    "first byte to first token": "#5c6bc0",
    "streaming tokens": "#26a69a",
    "streaming thinking": "#80cbc4",
    "streaming answer": "#00695c",
    "after last token": "#ffb74d",
}
GIB = 1024**3
MAX_POINTS = 1500  # per trace; a 24 h window of 1 Hz samples is averaged down to this
# A step between two samples this many times the usual one (their median), and at least MIN_GAP_S, is a gap:
# nothing was sampled (the collector stopped, the machine slept). Lines stop there instead of drawing a slope.
GAP_FACTOR = 5.0
MIN_GAP_S = 5.0


@dataclass(frozen=True)
class Span:
    """A stretch of one request, in milliseconds since the proxy received it."""

    label: str
    start_ms: float
    end_ms: float


def plain(text: str) -> str:
    """Text from users or models, made safe for Plotly, which renders a subset of HTML in labels."""
    return html.escape(text, quote=False)


def _local_offset_s() -> float:
    return float(time.localtime().tm_gmtoff)


def local_times(ts_unix_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """Unix seconds → naive datetime64 in local time (Plotly shows naive times as they are)."""
    arr = np.asarray(ts_unix_s, dtype=np.float64) + _local_offset_s()
    return (arr * 1000).astype("datetime64[ms]")


def downsample(
    x: np.ndarray, ys: dict[str, np.ndarray], max_points: int = MAX_POINTS
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Average consecutive samples into at most ``max_points`` buckets (NaN-aware)."""
    n = len(x)
    if n <= max_points:
        return x, ys
    per = int(np.ceil(n / max_points))
    cut = (n // per) * per
    x_out = x[:cut].reshape(-1, per)[:, 0]
    out: dict[str, np.ndarray] = {}
    for name, y in ys.items():
        block = y[:cut].reshape(-1, per)
        # All-NaN buckets (a sensor NVML does not support) are expected; nanmean warns on them.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            out[name] = np.nanmean(block, axis=1)
    return x_out, out


def evenly(items: Sequence[T], limit: int) -> list[T]:
    """At most ``limit`` of ``items``, evenly spaced in their order, the first and the last kept: what a chart of a
    long window draws, so that the browser lays out a bounded number of markers whatever the store holds."""
    n = len(items)
    if n <= limit:
        return list(items)
    if limit <= 1:
        return list(items[-1:]) if limit == 1 else []
    return [items[round(i * (n - 1) / (limit - 1))] for i in range(limit)]


def gap_ends(ts_s: np.ndarray, factor: float = GAP_FACTOR, min_gap_s: float = MIN_GAP_S) -> np.ndarray:
    """Indices of the points that end a gap: a step over ``factor`` times the median step and over ``min_gap_s``
    (none with fewer than three points: two give no usual step to judge by)."""
    if len(ts_s) < 3:
        return np.zeros(0, dtype=np.int64)
    steps_s = np.diff(ts_s)
    return np.flatnonzero(steps_s > max(min_gap_s, factor * float(np.median(steps_s)))) + 1


def break_gaps(x: np.ndarray, ys: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A NaN in every series in the middle of each gap between samples (local datetime64 ``x``, oldest first).

    Plotly joins consecutive points: across a collector that was stopped for ten minutes it drew a ramp from the
    last value before to the first after (the CPU "rising" to 100%, VRAM "draining"), values nobody measured.
    A NaN breaks the line and its fill. Applied to what is drawn (after ``downsample``), so the usual step is
    that of the points shown, raw samples or buckets alike.
    """
    at = gap_ends(x.astype("datetime64[ms]").astype(np.int64) / 1000)
    if len(at) == 0:
        return x, ys
    middles = x[at - 1] + (x[at] - x[at - 1]) // 2
    return np.insert(x, at, middles), {name: np.insert(y, at, np.nan) for name, y in ys.items()}


def area_to_zero(x: np.ndarray, y: np.ndarray) -> tuple[list[object], list[float | None]]:
    """The area under ``y`` as one closed shape per run of known values, for a ``fill="toself"`` trace.

    Plotly's ``fill="tozeroy"`` spans the NaNs that break its line (plotly.js #1132, #7448): across a gap it
    shaded an area nobody measured. ``toself`` closes each stretch between gaps on its own.
    """
    xs: list[object] = []
    ys: list[float | None] = []
    known = np.flatnonzero(np.isfinite(y))
    if len(known) == 0:
        return xs, ys
    for run in np.split(known, np.flatnonzero(np.diff(known) > 1) + 1):
        xs += [*x[run], x[run[-1]], x[run[0]], None]
        ys += [*y[run].tolist(), 0.0, 0.0, None]
    return xs, ys


def _col(samples: Sequence[object], attr: str, scale: float = 1.0) -> np.ndarray:
    values = [getattr(s, attr) for s in samples]
    return np.array([np.nan if v is None else float(v) * scale for v in values], dtype=np.float64)


LEGEND_BELOW_PX = 70  # room under the plot for a legend of up to three rows (legend_below)


def legend_below(fig: go.Figure) -> go.Figure:
    """The legend at the foot of the figure, in room of its own, for a figure whose legend may wrap to several rows:
    above the plot a second row ran over the title (issue 42: "Where the time went", the Requests rates)."""
    margin = fig.layout.margin
    fig.update_layout(
        height=(fig.layout.height or 300) + LEGEND_BELOW_PX,
        margin={"b": (margin.b or 40) + LEGEND_BELOW_PX},
        legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "xanchor": "left", "x": 0},
    )
    return fig


def _base_layout(fig: go.Figure, title: str, height: int, revision: str) -> go.Figure:
    fig.update_layout(
        title={"text": plain(title)},
        height=height,
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
        hovermode="x unified",
        uirevision=revision,
    )
    return fig


GB = 1e9  # bytes shown in GB (10^9), as ``ollama ps`` shows them
# What each line means, in its hover.
EXPLAIN = {
    "util_gpu": "GPU busy: % of the sample period in which at least one kernel ran (not how much of the GPU it used)",
    "util_mem": "memory busy: % of the sample period in which VRAM was being read or written (not the bandwidth used)",
    "mem_used": "VRAM used by every process on this GPU",
    "ollama_mem": "VRAM held by Ollama's processes",
    "mem_total": "the GPU's whole VRAM",
    "power": "power the GPU draws now",
    "power_limit": "the power limit the driver holds it under",
    "sm_clock": "SM clock: the clock of the streaming multiprocessors, the GPU's compute cores",
    "mem_clock": "memory clock: the clock of the VRAM",
}
LANE_HELP = "lane: one row of this chart; requests that run at the same time get separate lanes"


def _legends_at(fig: go.Figure, row_tops: Sequence[float]) -> None:
    """A legend of its own beside each panel (Plotly's numbered legends), its top at the panel's top; one
    layout update for all (each update costs Plotly a validation pass)."""
    fig.update_layout(
        {
            ("legend" if row == 1 else f"legend{row}"): {
                "orientation": "v",
                "yanchor": "top",
                "y": top,
                "xanchor": "left",
                "x": 1.06,
                "bgcolor": "rgba(0,0,0,0)",
            }
            for row, top in enumerate(row_tops, start=1)
        }
    )


def min_band_ms(window_start_unix_s: float, window_end_unix_s: float) -> float:
    """The least width a phase is drawn with: a 400th of the window (a pixel or two), so short requests show."""
    return max(window_end_unix_s - window_start_unix_s, 1.0) * 1000 / 400


def gpu_timeline_figure(
    samples: Sequence[GpuSample],
    bands: Sequence[Band],
    window_start_unix_s: float,
    window_end_unix_s: float,
    unexplained: Sequence[Interval] = (),
    title: str | None = None,
) -> go.Figure:
    """One GPU over the window in four panels, each with its own legend: busy, memory, power and clocks,
    then request phases as bands. Every line's hover says what it measures."""
    samples = sorted(samples, key=lambda s: s.ts_unix_s)
    name = samples[0].name if samples else "GPU"
    index = samples[0].index if samples else 0
    heights = [0.24, 0.2, 0.2, 0.36]
    spacing = 0.06
    fig = make_subplots(
        rows=4,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=spacing,
        row_heights=heights,
        subplot_titles=("Busy (% of time)", "VRAM (GB)", "Power (W) and clocks (MHz)", "Request phases"),
        specs=[[{}], [{}], [{"secondary_y": True}], [{}]],
    )
    x = local_times([s.ts_unix_s for s in samples])
    columns = {
        "util_gpu": _col(samples, "util_gpu_pct"),
        "util_mem": _col(samples, "util_mem_pct"),
        "mem_used": _col(samples, "mem_used_bytes", 1 / GB),
        "mem_total": _col(samples, "mem_total_bytes", 1 / GB),
        "ollama_mem": _col(samples, "ollama_mem_bytes", 1 / GB),
        "power": _col(samples, "power_w"),
        "power_limit": _col(samples, "power_limit_w"),
        "sm_clock": _col(samples, "sm_clock_mhz"),
        "mem_clock": _col(samples, "mem_clock_mhz"),
    }
    x, columns = break_gaps(*downsample(x, columns))
    # (key, label, row, colour, dash, area under it, secondary y, unit)
    lines = [
        ("util_gpu", "GPU busy (% of time)", 1, "#66bb6a", None, True, False, "%"),
        ("util_mem", "memory busy (% of time)", 1, "#42a5f5", "dot", False, False, "%"),
        ("mem_used", "VRAM used", 2, "#ab47bc", None, True, False, "GB"),
        ("ollama_mem", "VRAM used by Ollama", 2, "#ce93d8", "dot", False, False, "GB"),
        ("mem_total", "VRAM total", 2, "#757575", "dash", False, False, "GB"),
        ("power", "power draw", 3, "#ffa726", None, False, False, "W"),
        ("power_limit", "power limit", 3, "#757575", "dash", False, False, "W"),
        ("sm_clock", "SM clock", 3, "#26c6da", "dot", False, True, "MHz"),
        ("mem_clock", "memory clock", 3, "#ec407a", "dot", False, True, "MHz"),
    ]
    for key, label, row, colour, dash, fill, secondary, unit in lines:
        y = columns[key]
        if np.all(np.isnan(y)):  # also true when empty
            continue  # a sensor this GPU does not report: leave it out rather than draw nothing
        legend = "legend" if row == 1 else f"legend{row}"
        if fill:  # drawn under its line, shown and hidden with it from the legend
            area_x, area_y = area_to_zero(x, y)
            fig.add_trace(
                go.Scatter(
                    x=area_x,
                    y=area_y,
                    name=f"{label}, area",
                    mode="lines",
                    line={"width": 0},
                    fill="toself",
                    fillcolor=colour + "33",
                    legend=legend,
                    legendgroup=label,
                    showlegend=False,
                    hoverinfo="skip",
                ),
                row=row,
                col=1,
                secondary_y=secondary if row == 3 else None,
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=label,
                mode="lines",
                line={"color": colour, "width": 1.5 if dash else 2, "dash": dash},
                legend=legend,
                legendgroup=label,
                hovertemplate=f"%{{y:,.1f}} {unit}<br><i>{plain(EXPLAIN[key])}</i>",
            ),
            row=row,
            col=1,
            secondary_y=secondary if row == 3 else None,
        )
    _add_band_traces(fig, bands, row=4, min_ms=min_band_ms(window_start_unix_s, window_end_unix_s), legend="legend4")
    if unexplained:
        # One filled trace for all stretches (shapes cost Plotly a layout validation each: hundreds make it crawl).
        xs: list[object] = []
        ys: list[float | None] = []
        ends = local_times([v for u in unexplained for v in (u.start_unix_s, u.end_unix_s)])
        for a, b in zip(ends[0::2], ends[1::2], strict=True):
            xs += [a, a, b, b, None]
            ys += [0.0, 100.0, 100.0, 0.0, None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                fill="toself",
                fillcolor="rgba(255,112,67,0.3)",
                line={"width": 0},
                name="GPU busy, no recorded generation",
                hoverinfo="skip",
            ),
            row=1,
            col=1,
        )
    x0, x1 = local_times([window_start_unix_s, window_end_unix_s])
    # Explicit: the band row's x values are durations (ms on a date axis), which would make Plotly guess "linear".
    fig.update_xaxes(type="date", range=[x0, x1])
    fig.update_xaxes(title_text="local time", row=4, col=1)
    fig.update_yaxes(title_text="%", range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text="GB", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="W", rangemode="tozero", row=3, col=1, secondary_y=False)
    fig.update_yaxes(title_text="MHz", rangemode="tozero", row=3, col=1, secondary_y=True, showgrid=False)
    fig.update_yaxes(title_text="lane", row=4, col=1)
    _base_layout(fig, title or f"GPU {index}: {fmt.label(name)}", 980, f"gpu-{index}")
    # Each panel's legend beside it, its top at the panel's top (row 1 is at the top of the paper).
    tops = [1.0]
    for h in heights[:-1]:
        tops.append(tops[-1] - h * (1 - spacing * (len(heights) - 1)) - spacing)
    _legends_at(fig, tops)
    fig.update_layout(margin={"l": 60, "r": 10, "t": 60, "b": 40}, hovermode="x")
    return fig


def phase_bands_figure(bands: Sequence[Band], window_start_unix_s: float, window_end_unix_s: float, title: str) -> go.Figure:
    """Request phases alone, for machines without GPU samples."""
    fig = go.Figure()
    _add_band_traces(fig, bands, row=None, min_ms=min_band_ms(window_start_unix_s, window_end_unix_s))
    x0, x1 = local_times([window_start_unix_s, window_end_unix_s])
    fig.update_xaxes(type="date", range=[x0, x1], title_text="local time")
    fig.update_yaxes(title_text="lane")
    _base_layout(fig, title, 220 + 30 * len({b.lane for b in bands}), "bands")
    fig.update_layout(hovermode="closest")
    return fig


MAX_MODEL_GROUPS = 8  # models drawn apart in one chart (a trace each per phase); the rest share "other models"
OTHER_MODELS = "other models"


def model_groups(models: Sequence[str], max_groups: int = MAX_MODEL_GROUPS) -> tuple[list[str], list[int]]:
    """The label of each model group (``fmt.labels``: cut, kept apart) and each item's group index.

    The ``max_groups - 1`` models with the most items get a group each, the rest one shared group, so a chart
    holds a bounded number of traces and names whatever arrives. A chart then names each group once, in its
    traces (``meta``, ``name``), never once per bar or point: a long name copied into every bar is what
    made one 1 MB model name cost seconds per refresh (issue 25 #7).
    """
    counts: dict[str, int] = {}
    for m in models:
        counts[m] = counts.get(m, 0) + 1
    ranked = sorted(counts, key=lambda m: -counts[m])  # stable: ties keep first-seen order
    own = ranked if len(ranked) <= max_groups else ranked[: max_groups - 1]
    names = fmt.labels(own) + ([] if len(own) == len(ranked) else [f"{fmt.count(len(ranked) - len(own))} {OTHER_MODELS}"])
    index = {m: i for i, m in enumerate(own)}
    return names, [index.get(m, len(own)) for m in models]


def _add_band_traces(
    fig: go.Figure, bands: Sequence[Band], row: int | None, min_ms: float = 0.0, legend: str | None = None
) -> None:
    """One bar trace per phase and model; a phase shorter than ``min_ms`` is drawn ``min_ms`` wide (its hover says
    how long). Each trace carries its model's name once (``meta``, in the hover); a phase's traces share one
    legend entry."""
    group_names, group_of = model_groups([b.model for b in bands])
    by_trace: dict[tuple[str, int], list[Band]] = {}
    for phase in PHASE_ORDER:  # legend in phase order
        for g in range(len(group_names)):
            by_trace[(phase, g)] = []
    for b, g in zip(bands, group_of, strict=True):
        by_trace.setdefault((b.phase, g), []).append(b)
    lanes = sorted({b.lane for b in bands})
    in_legend: set[str] = set()
    for (phase, g), items in by_trace.items():
        if not items:
            continue
        starts = local_times([b.start_unix_s for b in items])
        durations_ms = np.array([max(b.end_unix_s - b.start_unix_s, 0.0) * 1000 for b in items])
        # Flat numpy arrays throughout: Plotly validates Python lists element by element, which is slow.
        hover = [
            f"request {plain(b.request_id[:8])}<br>{phase}: {d:,.0f} ms · lane {b.lane + 1}"
            for b, d in zip(items, durations_ms, strict=True)
        ]
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=starts,
                x=np.maximum(durations_ms, min_ms),
                y=np.array([f"lane {b.lane + 1}" for b in items]),
                name=phase,
                legendgroup=phase,
                showlegend=phase not in in_legend,
                marker={"color": PHASE_COLOURS.get(phase, "#bdbdbd")},
                meta=plain(group_names[g]),
                hovertext=np.array(hover),
                hovertemplate=f"%{{meta}} · %{{hovertext}}<br><i>{LANE_HELP}</i><extra></extra>",
                **({} if legend is None else {"legend": legend}),
            ),
            **({} if row is None else {"row": row, "col": 1}),
        )
        in_legend.add(phase)
    fig.update_layout(barmode="overlay")
    if lanes:
        order = {"categoryorder": "array", "categoryarray": [f"lane {n + 1}" for n in reversed(lanes)]}
        fig.update_yaxes(**order, **({} if row is None else {"row": row, "col": 1}))


def phase_waterfall_figure(
    ollama_spans: Sequence[Span],
    client_spans: Sequence[Span],
    ttft_ms: float | None,
    title: str,
    *,
    others: Sequence[Span] = (),
    origin: str = "the proxy received the request",
) -> go.Figure:
    """Phases of one request as bars on one time axis: what Ollama reported above what the client saw; ``others``:
    other requests' prefills that slowed it, on a row of their own above (analysis.wait_split). ``origin``: the
    moment the axis counts from, in words (a direct request's is the runner's, not the proxy's)."""
    fig = go.Figure()
    rows = ((OTHERS_ROW, others), ("Ollama reported", ollama_spans), ("client saw (proxy)", client_spans))
    for row_label, spans in rows:
        for span in spans:
            length = max(span.end_ms - span.start_ms, 0.0)
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    base=[span.start_ms],
                    x=[length],
                    y=[row_label],
                    name=span.label,
                    legendgroup=span.label,
                    marker={"color": PHASE_COLOURS.get(span.label, PHASE_COLOURS.get(span.label.split(":")[0], "#bdbdbd"))},
                    text=[f"{span.label} {length:,.0f} ms"],
                    textposition="inside",
                    insidetextanchor="middle",
                    hovertemplate=f"{span.label}: %{{base:,.1f}} → {span.end_ms:,.1f} ms ({length:,.1f} ms)<extra></extra>",
                )
            )
    if ttft_ms is not None:
        fig.add_vline(x=ttft_ms, line={"color": "#ef5350", "dash": "dash", "width": 2})
        fig.add_annotation(
            x=ttft_ms,
            y=1.0,
            yref="paper",
            text=f"first token {ttft_ms:,.0f} ms",
            showarrow=False,
            yanchor="bottom",
            font={"color": "#ef5350"},
        )
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text=f"ms since {origin}", rangemode="tozero")
    order = ["client saw (proxy)", "Ollama reported", *([OTHERS_ROW] if others else [])]
    fig.update_yaxes(categoryorder="array", categoryarray=order)
    _base_layout(fig, title, 300 + (60 if others else 0), "waterfall")
    legend_below(fig)  # one entry per phase and client stage, more with others' prefills: often two rows
    # Labels that do not fit their bar are hidden rather than shrunk to nothing (the legend and hover name them).
    fig.update_layout(hovermode="closest", uniformtext={"minsize": 10, "mode": "hide"})
    return fig


def token_gaps_figure(token_chunk_ns: Sequence[int], received_ns: int, title: str = "Gaps between tokens") -> go.Figure:
    """Each content chunk's gap to the one before, over the request's time; stalls in red."""
    t = np.asarray(token_chunk_ns, dtype=np.int64)
    fig = go.Figure()
    if len(t) >= 2:
        x_s = (t[1:] - received_ns) / 1e9
        gaps = np.diff(t) / 1e6
        threshold = stall_threshold_ms(gaps.tolist())
        stall = gaps > threshold if threshold is not None else np.zeros(len(gaps), dtype=bool)
        fig.add_trace(
            go.Scatter(x=x_s[~stall], y=gaps[~stall], mode="markers", name="gap", marker={"color": "#26a69a", "size": 5})
        )
        if stall.any():
            fig.add_trace(
                go.Scatter(
                    x=x_s[stall],
                    y=gaps[stall],
                    mode="markers",
                    name="stall",
                    marker={"color": "#ef5350", "size": 10, "symbol": "x"},
                )
            )
        if threshold is not None:
            fig.add_hline(
                y=threshold,
                line={"color": "#ef5350", "dash": "dot"},
                annotation_text=f"stall above {threshold:,.0f} ms",
                annotation_position="top left",
            )
    fig.update_xaxes(title_text="s since the proxy received the request", rangemode="tozero")
    fig.update_yaxes(title_text="gap to previous token (ms)", rangemode="tozero")
    _base_layout(fig, title, 320, "gaps")
    fig.update_layout(hovermode="closest")
    return fig


def loaded_models_figure(models: Sequence[LoadedModel]) -> go.Figure:
    """Each loaded model's size split into VRAM and system memory, in GB (10^9 bytes, as ``ollama ps``)."""
    names = [plain(n) for n in fmt.labels([m.name for m in models])]  # categories: each name once, cut
    vram = [m.size_vram_bytes / GB for m in models]
    system = [max(m.size_bytes - m.size_vram_bytes, 0) / GB for m in models]
    fig = go.Figure(
        [
            go.Bar(orientation="h", y=names, x=vram, name="in VRAM", marker={"color": "#66bb6a"}),
            go.Bar(orientation="h", y=names, x=system, name="in system memory (slower)", marker={"color": "#ffa726"}),
        ]
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="GB", rangemode="tozero")
    fig.update_yaxes(title_text="model")
    _base_layout(fig, "Loaded models: where the weights sit", 140 + 40 * max(len(models), 1), "models")
    fig.update_layout(hovermode="closest")
    return fig


def host_figure(samples: Sequence[HostSample], window_start_unix_s: float, window_end_unix_s: float) -> go.Figure:
    """The machine's CPU and memory, with Ollama's own share where known. Whole-machine CPU (% of all cores) and
    Ollama's CPU (% of one core, up to 100 × cores) are on separate axes: one scale would mislead."""
    samples = sorted(samples, key=lambda s: s.ts_unix_s)
    x = local_times([s.ts_unix_s for s in samples])
    cols = {
        "cpu": _col(samples, "cpu_pct"),
        "ollama_cpu": _col(samples, "ollama_cpu_pct"),
        "mem": _col(samples, "mem_used_bytes", 1 / GB),
        "mem_total": _col(samples, "mem_total_bytes", 1 / GB),
        "ollama_rss": _col(samples, "ollama_rss_bytes", 1 / GB),
    }
    x, cols = break_gaps(*downsample(x, cols))
    has_ollama = not np.all(np.isnan(cols["ollama_cpu"]))
    rows = 3 if has_ollama else 2
    titles = ["CPU, whole machine (% of all cores)"] + (["CPU, Ollama (% of one core)"] if has_ollama else []) + ["Memory (GB)"]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=titles)
    mem_row = rows
    hover = {
        "cpu": "% of all cores' time, every process",
        "ollama_cpu": "% of one core's time used by Ollama's processes (200 = two cores busy)",
        "mem": "system memory in use",
        "ollama_rss": "system memory Ollama's processes hold (resident)",
        "mem_total": "the machine's memory",
    }
    for key, label, row, colour, dash in (
        ("cpu", "all processes", 1, "#42a5f5", None),
        ("ollama_cpu", "Ollama", 2, "#ffa726", None),
        ("mem", "used", mem_row, "#42a5f5", None),
        ("ollama_rss", "Ollama resident", mem_row, "#ffa726", None),
        ("mem_total", "total", mem_row, "#757575", "dash"),
    ):
        y = cols[key]
        if np.all(np.isnan(y)):
            continue
        unit = "GB" if row == mem_row else "%"
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=label,
                mode="lines",
                line={"color": colour, "dash": dash},
                legend="legend" if row == 1 else f"legend{row}",
                hovertemplate=f"%{{y:,.1f}} {unit}<br><i>{hover[key]}</i>",
            ),
            row=row,
            col=1,
        )
    x0, x1 = local_times([window_start_unix_s, window_end_unix_s])
    fig.update_xaxes(range=[x0, x1])
    fig.update_xaxes(title_text="local time", row=rows, col=1)
    fig.update_yaxes(title_text="% of all cores", range=[0, 105], row=1, col=1)
    if has_ollama:
        fig.update_yaxes(title_text="% of one core", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="GB", rangemode="tozero", row=mem_row, col=1)
    _base_layout(fig, "Host: CPU and memory", 220 + 180 * rows, "host")
    _legends_at(fig, [1.0 - (row - 1) / rows for row in range(1, rows + 1)])
    fig.update_layout(hovermode="x")
    return fig
