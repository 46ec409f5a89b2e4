"""The Requests page's figures (Plotly, no Streamlit): each request's prefill and decode rate over time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from analysis.ceilings import MIN_RATE_TOKENS
from analysis.phases import Flag
from pages.shared import charts, fmt
from store.tables import RequestSummary

# Flags that say a rate cannot be true: such readings are drawn apart and set no axis range.
IMPOSSIBLE_RATE_FLAGS = {"decode": Flag.IMPLAUSIBLE_DECODE_RATE, "prefill": Flag.IMPLAUSIBLE_PREFILL_RATE}
SERIES = (("decode", "decode (output) tok/s", "circle"), ("prefill", "prefill (prompt) tok/s", "diamond"))
# The least span of time the x axis shows: one request alone (or a burst within a second) was drawn on an axis of
# milliseconds ("06:39:51.1665"), which reads as noise. Its points are centred in this span instead.
MIN_TIME_SPAN_S = 60.0


@dataclass
class _Part:
    """One series of points: a kind's rates kept for the axis range, or those set apart (drawn hollow)."""

    kind: str
    label: str
    symbol: str
    apart: bool
    rows: list[RequestSummary] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


def _timed_tokens(row: RequestSummary, kind: str) -> int:
    if kind == "prefill":
        return row.computed_prompt_tokens or 0
    return max((row.output_tokens or 0) - 1, 0)


def _split(rows: Sequence[RequestSummary]) -> tuple[list[_Part], dict[str, int]]:
    """Per kind, the rates kept and those set apart (too short to time well, or impossible), and how many of each."""
    parts: list[_Part] = []
    apart_n = {"too short": 0, "impossible": 0}
    for kind, label, symbol in SERIES:
        ok, apart = _Part(kind, label, symbol, False), _Part(kind, label, symbol + "-open", True)
        for r in rows:
            v = r.decode_tok_s if kind == "decode" else r.prefill_tok_s
            if not v or v <= 0:
                continue
            impossible = IMPOSSIBLE_RATE_FLAGS[kind] in (r.flags or ())
            short = _timed_tokens(r, kind) < MIN_RATE_TOKENS
            into = apart if impossible or short else ok
            into.rows.append(r)
            into.rates.append(v)
            if into is apart:
                apart_n["impossible" if impossible else "too short"] += 1
        parts += [ok, apart]
    return parts, apart_n


def _add_traces(fig: go.Figure, rows: Sequence[RequestSummary], parts: list[_Part], lo: float | None, hi: float | None) -> None:
    """A trace per series and model (the model's name once, in ``meta``; never copied per point: issue 25 #7)."""
    group_names, group_of = charts.model_groups([r.model for r in rows])
    group_by_id = {r.id: g for r, g in zip(rows, group_of, strict=True)}
    for part in parts:
        if part.apart and not part.rows:
            continue
        series = f"{part.label}, set apart (hollow)" if part.apart else part.label
        for g, group_name in enumerate(group_names):
            picked = [i for i, r in enumerate(part.rows) if group_by_id[r.id] == g]
            if not picked and (part.apart or g > 0):
                continue  # an empty trace only where the series would otherwise miss from the legend
            ys = part.rates
            shown = [min(max(ys[i], lo), hi) if lo is not None and hi is not None else ys[i] for i in picked]
            hover = [[ys[i], _timed_tokens(part.rows[i], part.kind)] for i in picked]
            fig.add_trace(
                go.Scatter(
                    x=charts.local_times([part.rows[i].started_at_unix_s for i in picked]),
                    y=np.asarray(shown, dtype=np.float64),
                    mode="markers",
                    name=series,
                    legendgroup=series,
                    showlegend=not any(t.legendgroup == series for t in fig.data),
                    marker={"symbol": part.symbol, "size": 7, "color": charts.PHASE_COLOURS[part.kind]},
                    meta=charts.plain(group_name),
                    customdata=np.asarray(hover, dtype=np.float64).reshape(-1, 2),
                    hovertemplate="%{meta}: %{customdata[0]:,.0f} tok/s over %{customdata[1]:,} tokens<extra></extra>",
                )
            )


def time_range_unix_s(starts_unix_s: Sequence[float], min_span_s: float = MIN_TIME_SPAN_S) -> tuple[float, float] | None:
    """An x range of at least ``min_span_s`` centred on starts that span less (None: they span enough, or none)."""
    if not starts_unix_s:
        return None
    t0, t1 = min(starts_unix_s), max(starts_unix_s)
    if t1 - t0 >= min_span_s:
        return None  # Plotly's own range, with its margins
    mid_s = (t0 + t1) / 2
    return mid_s - min_span_s / 2, mid_s + min_span_s / 2


def _lay_out(fig: go.Figure, lo: float | None, hi: float | None, x_unix_s: tuple[float, float] | None) -> None:
    x_axis: dict[str, object] = {"title_text": "local time"}
    if x_unix_s is not None:
        x_axis["range"] = list(charts.local_times(x_unix_s))
    fig.update_xaxes(**x_axis)
    y_axis: dict[str, object] = {"title_text": "tokens per second (log scale)", "type": "log", "dtick": 1, "tickformat": ",.0f"}
    if lo is not None and hi is not None:
        y_axis["range"] = [math.log10(lo), math.log10(hi)]
    fig.update_yaxes(**y_axis)
    fig.update_layout(
        title={"text": "Rates of the requests shown"},
        height=340,
        margin={"l": 70, "r": 20, "t": 70, "b": 40},
        hovermode="closest",
        uirevision="history",
    )
    charts.legend_below(fig)  # four entries: two rows at 1280 px, which ran over the title above the plot


def _apart_note(apart_n: dict[str, int]) -> str | None:
    """What the hollow points are, in counts (None: there are none)."""
    bits = []
    if n := apart_n["too short"]:
        bits.append(f"{fmt.count(n)} {'rate' if n == 1 else 'rates'} timed over fewer than {MIN_RATE_TOKENS} tokens")
    if n := apart_n["impossible"]:
        bits.append(f"{fmt.count(n)} {'rate' if n == 1 else 'rates'} beyond any hardware, which cannot be true")
    if not bits:
        return None
    return (
        "Drawn hollow and left out of the axis range (at its edge when beyond it, value in the hover): "
        + " and ".join(bits)
        + "."
    )


def rates_figure(rows: Sequence[RequestSummary]) -> tuple[go.Figure, str | None]:
    """Each request's decode and prefill rate over time (log scale: they differ by 10-100×).

    Rates timed over fewer than ``MIN_RATE_TOKENS`` tokens, and rates flagged as beyond any hardware,
    are drawn hollow and set no axis range: one beyond the range sits at its edge, its value in the hover.
    """
    parts, apart_n = _split(rows)
    kept = [v for p in parts if not p.apart for v in p.rates]
    lo, hi = (min(kept) / 1.5, max(kept) * 1.5) if kept else (None, None)
    fig = go.Figure()
    _add_traces(fig, rows, parts, lo, hi)
    _lay_out(fig, lo, hi, time_range_unix_s([r.started_at_unix_s for p in parts for r in p.rows]))
    return fig, _apart_note(apart_n)
