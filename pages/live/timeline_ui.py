"""The Live page's work, split in two: ``build_live`` (store → figures and tables, no Streamlit,
timed by ``bench/pages_refresh.py``) and ``show_live`` (draws them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis.records import UNIFIED_MEMORY_KINDS, UNIFIED_MEMORY_NOTE, LoadedModel
from pages.shared import charts, data, derive, fmt
from pages.shared.derive import InFlightView, Interval


@dataclass
class LiveModel:
    now_unix_s: float
    window_start_unix_s: float
    in_flight: list[InFlightView]
    gpu_figures: list[tuple[int, go.Figure]]  # (GPU index, figure)
    bands_figure: go.Figure | None  # phases only, when there is no GPU to draw them under
    unexplained: list[Interval]
    models_table: pd.DataFrame
    models_figure: go.Figure | None
    host_figure: go.Figure | None
    gpu_state: str | None  # the collector's word, a GpuKind value: "nvml", "amd-sysfs", "macmon", "simulated", "none", ...
    gpu_message: str | None
    requests_in_window: int
    notes: list[str] = field(default_factory=list)
    vram_used_bytes: int | None = None  # the latest GPU sample's memory in use (all GPUs)
    direct_in_window: int = 0  # generations sent to Ollama directly (recorded from its runner) in the window


def timeline_refresh_s(window_s: float) -> float:
    """How often the GPU timeline redraws: every second on a 1-minute window, every 2 s up to 5 minutes, then
    less often (on a 24-hour axis one pixel is more than a minute; redrawing each second costs for nothing, and
    each redraw mounts the figure anew in the browser). The cards above follow each generation every second."""
    if window_s <= 60:
        return 1.0
    if window_s <= 900:
        return 2.0
    if window_s <= 3600:
        return 5.0
    return 30.0


def build_live(
    db: Path, now_unix_s: float, window_s: float, *, flight: bool = True, timeline: bool = True, context: bool = True
) -> LiveModel | None:
    """What the Live page shows for one refresh of the chosen parts; None when there is no store yet.

    ``flight`` (every second): generations in flight. ``timeline`` (``timeline_refresh_s``): GPU timelines
    with request bands and bypass warnings. ``context`` (every 5 s): loaded models and host.
    """
    snap = data.load_live(db, now_unix_s, window_s, flight=flight, timeline=timeline, context=context)
    if snap is None:
        return None
    start = now_unix_s - window_s
    names = derive.loaded_names(snap.loaded)
    in_flight = [derive.in_flight_view(r, now_unix_s, names) for r in snap.in_flight]
    bands = derive.assign_lanes(snap.bands)
    # Per GPU: a bypassing client shows up on the GPU it runs on.
    unexplained_by_gpu = {
        i: derive.unexplained_gpu_activity(samples, snap.busy_intervals) for i, samples in snap.gpu_by_index.items()
    }
    unexplained = sorted((u for found in unexplained_by_gpu.values() for u in found), key=lambda u: u.start_unix_s)
    gpu_figures = [
        (index, charts.gpu_timeline_figure(samples, bands, start, now_unix_s, unexplained=unexplained_by_gpu[index]))
        for index, samples in sorted(snap.gpu_by_index.items())
    ]
    bands_figure = None
    if not gpu_figures and bands:
        bands_figure = charts.phase_bands_figure(bands, start, now_unix_s, "Request phases (no GPU samples)")
    models_table = pd.DataFrame(
        [
            {
                "model": fmt.label(m.name),  # cut: a name from Ollama can be any length
                "size": fmt.gb(m.size_bytes),
                "in VRAM": fmt.gb(m.size_vram_bytes),
                "in system memory": fmt.gb(max(m.size_bytes - m.size_vram_bytes, 0)),
                "on GPU %": round(100 * m.size_vram_bytes / m.size_bytes) if m.size_bytes else None,
                "context length": m.context_length,
                "unloads in": _unloads_in(m.expires_at_unix_s, now_unix_s),
                "quantization": fmt.label(m.quantization_level) if m.quantization_level else m.quantization_level,
            }
            for m in snap.loaded
        ]
    )
    return LiveModel(
        now_unix_s=now_unix_s,
        window_start_unix_s=start,
        in_flight=in_flight,
        gpu_figures=gpu_figures,
        bands_figure=bands_figure,
        unexplained=unexplained,
        models_table=models_table,
        models_figure=_models_figure(tuple((m.name, m.size_bytes, m.size_vram_bytes) for m in snap.loaded))
        if snap.loaded and context
        else None,
        host_figure=charts.host_figure(snap.host, start, now_unix_s) if snap.host else None,
        gpu_state=snap.gpu_state,
        gpu_message=snap.gpu_message,
        requests_in_window=snap.requests_in_window,
        vram_used_bytes=snap.vram_used_bytes,
        direct_in_window=snap.direct_in_window,
    )


@functools.lru_cache(maxsize=8)
def _models_figure(models: tuple[tuple[str, int, int], ...]) -> go.Figure:
    """Built again only when what it draws changed (names and sizes), not on every poll."""
    return charts.loaded_models_figure([LoadedModel(0.0, n, n, "", size, vram, None, None) for n, size, vram in models])


def _unloads_in(expires_at_unix_s: float | None, now_unix_s: float) -> str:
    if expires_at_unix_s is None:
        return "—"
    left = expires_at_unix_s - now_unix_s
    if left > 365 * 24 * 3600:
        return "never (kept loaded)"
    if left <= 0:
        return "busy or unloading"  # /api/ps keeps a stale expiry while a request runs
    return fmt.seconds(left)


def show_timeline(model: LiveModel, proxy_line: str, refresh_s: float) -> None:
    """The GPU timelines with the phases of the window's requests, and clients that bypass the proxy."""
    st.subheader("GPU timeline")
    # Notes that come and go sit in one container of their own, so the charts below keep their place in the
    # page between refreshes (a chart that moves is mounted anew, and shows blank until drawn).
    with st.container(key="live_timeline_notes"):
        _timeline_notes(model, proxy_line, refresh_s)
    if model.gpu_figures:
        for index, fig in model.gpu_figures:
            st.plotly_chart(fig, key=f"live_gpu_{index}", config={"displaylogo": False})
    elif model.bands_figure is not None:
        st.plotly_chart(model.bands_figure, key="live_bands", config={"displaylogo": False})


def _timeline_notes(model: LiveModel, proxy_line: str, refresh_s: float) -> None:
    if refresh_s > 1:
        st.caption(f"Redrawn every {refresh_s:.0f} s (less often at wide windows, or while nothing runs).")
    if model.direct_in_window:
        n = model.direct_in_window
        st.caption(
            f"{n:,} generation{'s' if n != 1 else ''} in this window came to Ollama directly, not through the proxy: "
            "seen from its runner (the model, the prompt read, the tokens written, prefill and decode times). Pointing "
            "a client at the proxy adds its own time to first token, every gap between tokens and its address:"
        )
        st.code(proxy_line, language="bash")
    if model.unexplained:
        total_s = sum(u.duration_s for u in model.unexplained)
        last = model.unexplained[-1]
        st.warning(
            f"The GPU was busy for {fmt.seconds(total_s)} with no generation recorded, neither through the proxy nor "
            f"from Ollama's runner (last at {fmt.clock(last.start_unix_s)}–{fmt.clock(last.end_unix_s)}). Another "
            "program used the GPU, or the runner could not be read (the sidebar says why). A client pointed at the "
            "proxy is recorded whatever the runner shows:",
            icon=":material/visibility_off:",
        )
        st.code(proxy_line, language="bash")
    if model.gpu_figures and model.gpu_state in UNIFIED_MEMORY_KINDS:
        st.caption(
            UNIFIED_MEMORY_NOTE[0].upper() + UNIFIED_MEMORY_NOTE[1:] + " (Ollama's size_vram); the total is the system memory."
        )
    elif not model.gpu_figures and model.gpu_state == "none":
        # Once here; the sidebar names the GPU source and why none was found.
        st.caption("No GPU found (NVIDIA, AMD or Apple): no GPU timeline. Phases and rates still come from Ollama's timings.")
    elif not model.gpu_figures:
        st.caption("No GPU samples in this window yet.")


def show_context(model: LiveModel) -> None:
    """The slower part of the Live page: loaded models and the host."""
    st.subheader("Loaded models")
    if model.models_table.empty:
        line = (
            "No model is loaded in Ollama (its /api/ps lists none). "
            "It loads one on the first request and unloads it after keep_alive (5 min by default)."
        )
        if model.vram_used_bytes:
            line += (
                f" The GPU still shows {fmt.gb(model.vram_used_bytes)} of memory in use: other programs, "
                "or memory a model just unloaded has not given back yet."
            )
        st.caption(line)
    else:
        st.dataframe(model.models_table, hide_index=True, key="live_models")
        if model.models_figure is not None:
            st.plotly_chart(model.models_figure, key="live_models_fig", config={"displaylogo": False})

    st.subheader("Host")
    if model.host_figure is not None:
        st.plotly_chart(model.host_figure, key="live_host", config={"displaylogo": False})
    else:
        st.caption("No host samples in this window yet.")
