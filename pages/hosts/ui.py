"""Draw the Hosts page's rows and the Live page's banner of alerts firing for this host (data: ``pages/fleet``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from pages.shared import charts, fleet, fmt
from pages.shared.fleet import HostRow

COLUMNS = (2.2, 2.2, 0.8, 1.6, 1.2, 1.4, 1.3, 1.6, 1.6)
HEADERS = (
    "Host",
    "Model loaded",
    "In flight",
    "TTFT p50 / p95 (1 h)",
    "Decode (1 h)",
    "GPU busy / VRAM",
    "GPU power",
    "Alerts firing",
    "Up to 15 min",
)


SPARK_GAP_STEPS = 1.5  # Prometheus gives one point a step: a step this much longer is a gap


def _faint(color: str) -> str:
    """The line's colour at half its strength, for the area under it (the tint Plotly's own fill gave it)."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},0.5)"


def _utc(ts_unix_s: float) -> datetime:
    return datetime.fromtimestamp(ts_unix_s, tz=UTC)


def sparkline(points: list[tuple[float, float]], color: str, start_s: float, now_s: float) -> go.Figure:
    """One figure over time, the x axis the same for every host (from ``start_s`` to now).

    Prometheus returns no point where a collector was not scraped: the line and its shading stop there (a point
    every step, so a step over 1.5 steps is a gap) instead of sloping across a time nobody measured.
    """
    ts_s = np.array([t for t, _ in points], dtype=np.float64)
    y = np.array([v for _, v in points], dtype=np.float64)
    at = charts.gap_ends(ts_s, factor=SPARK_GAP_STEPS, min_gap_s=0.0)
    ts_s, y = np.insert(ts_s, at, (ts_s[at - 1] + ts_s[at]) / 2), np.insert(y, at, np.nan)  # a NaN mid-gap
    x = np.array([_utc(t) for t in ts_s], dtype=object)
    area_x, area_y = charts.area_to_zero(x, y)
    fig = go.Figure(
        [
            go.Scatter(x=area_x, y=area_y, mode="lines", line={"width": 0}, fill="toself", hoverinfo="skip"),
            go.Scatter(x=x, y=y, mode="lines", line={"width": 1.5, "color": color}, hoverinfo="y"),
        ]
    )
    fig.data[0].fillcolor = _faint(color)
    fig.update_layout(
        height=44,
        margin={"l": 0, "r": 0, "t": 0, "b": 0},
        showlegend=False,
        xaxis={"visible": False, "type": "date", "range": [_utc(start_s), _utc(now_s)]},
        yaxis={"visible": False, "rangemode": "tozero"},
    )
    return fig


def _host_cell(row: HostRow) -> str:
    name = fmt.md_escape(row.host)
    if row.dashboard_url and row.dashboard_reachable:
        name = f"[{name}]({row.dashboard_url})"
    state = "" if row.up else " · :red[collector down]"
    return f"**{name}**{state}  \n:gray[{fmt.md_escape(row.instance)}]"


def show_rows(rows: list[HostRow], now_s: float) -> None:
    header = st.columns(COLUMNS)
    for col, text in zip(header, HEADERS, strict=True):
        col.markdown(f"**{text}**")
    for row in rows:
        cells = st.columns(COLUMNS, vertical_alignment="center")
        cells[0].markdown(_host_cell(row))
        cells[1].markdown(", ".join(fmt.md_escape(m) for m in row.models) if row.models else "—")
        cells[2].markdown("—" if row.in_flight is None else f"{row.in_flight:.0f}")
        cells[3].markdown(f"{fmt.seconds(row.ttft_p50_s)} / {fmt.seconds(row.ttft_p95_s)}")
        cells[4].markdown(fmt.rate(row.decode_tok_s))
        vram = f"{fmt.gb(row.vram_used_bytes)} of {fmt.gb(row.vram_total_bytes)}" if row.vram_total_bytes else "—"
        cells[5].markdown(f"{fleet.percent(row.gpu_busy_ratio)}  \n{vram}")
        cells[6].markdown(fleet.watts(row.power_w))
        cells[7].markdown("  \n".join(f":red[{fmt.md_escape(a)}]" for a in row.alerts) if row.alerts else "none")
        with cells[8]:
            for (name, points), color in zip(row.sparks.items(), ("#4C78A8", "#E45756"), strict=False):
                if len(points) >= 2:
                    st.caption(name)
                    start_s = row.spark_start_s or now_s - fleet.SPARK_RANGE_S
                    st.plotly_chart(
                        sparkline(points, color, start_s, now_s),
                        key=f"spark_{row.instance}_{name}",
                        config={"displayModeBar": False, "staticPlot": True},
                    )


def show_hosts(base_url: str) -> None:
    now_s = time.time()
    try:
        rows = fleet.host_rows(base_url, now_s)
    except fleet.PrometheusError as exc:
        st.error(str(exc))
        return
    if not rows:
        st.info(f"Prometheus at {base_url} scrapes no target of job `{fleet.JOB}` yet: see deploy/prometheus.yml.")
        return
    st.caption(f"{len(rows)} hosts, from Prometheus at {base_url}. A host's name links to its own dashboard when it answers.")
    show_rows(rows, now_s)
