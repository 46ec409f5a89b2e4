"""Live: generations in flight, the GPU timeline with request phases under it, loaded models, host."""

from __future__ import annotations

import time

import streamlit as st

from pages import common, data
from pages.hosts_view import alert_banner
from pages.live_view import build_live, show_context, show_flight, show_timeline, timeline_refresh_s
from pages.settings import client_host_line

ctx = common.context()
st.title("Live")
status = data.load_status(ctx.db_path)
common.demo_banner(ctx, status)
common.ollama_down_panel(ctx, status)
alert_banner(status.heartbeat.listen if status.heartbeat else ctx.launch.listen)  # issue 17: alerts for this host
proxy_line = client_host_line((status.heartbeat.listen if status.heartbeat else None) or ctx.launch.listen or ctx.settings.listen)

if ctx.paused:
    st.caption("Live updates are paused (sidebar). Zoom and pan freely; switch the pause off to follow again.")


# Three fragments, each redrawn only as often as it changes: redrawing charts costs the browser.
@st.fragment(run_every=None if ctx.paused else 1)
def flight_part() -> None:
    model = build_live(ctx.db_path, time.time(), ctx.window_s, timeline=False, context=False)
    if model is None:
        common.no_store_state(ctx)
        return
    show_flight(model)


refresh_s = timeline_refresh_s(ctx.window_s)


@st.fragment(run_every=None if ctx.paused else refresh_s)
def timeline_part() -> None:
    model = build_live(ctx.db_path, time.time(), ctx.window_s, flight=False, context=False)
    if model is not None:
        show_timeline(model, proxy_line, refresh_s)


@st.fragment(run_every=None if ctx.paused else 5)
def context_part() -> None:
    model = build_live(ctx.db_path, time.time(), ctx.window_s, flight=False, timeline=False)
    if model is not None:
        show_context(model)


flight_part()
timeline_part()
context_part()
