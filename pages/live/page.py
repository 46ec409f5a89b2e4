"""Live: a card per generation in flight, the "now" strip, the GPU timeline with request phases, loaded models, host."""

from __future__ import annotations

import time

import streamlit as st

from pages.live.ui import show_cards, show_context, show_strip, show_timeline
from pages.live.view import build_cards, build_live, timeline_refresh_s
from pages.shared import common
from pages.shared.alert_banner import alert_banner
from pages.shared.import_offer import offer_log_import
from pages.shared.settings import client_host_line

BUSY_KEY = "pw_live_busy"
IDLE_AFTER_S = 30.0  # nothing ran for this long: the page refreshes less often

ctx = common.context()
st.title("Live")
status = common.page_status(ctx)  # the reading the sidebar drew this run
common.demo_banner(ctx, status)
common.ollama_down_panel(ctx, status)
# Alerts firing for this host, when PHASEWATCH_PROMETHEUS names a Prometheus.
alert_banner(status.heartbeat.listen if status.heartbeat else ctx.launch.listen)
offer_log_import(ctx)  # nothing recorded at all, and Ollama's log is readable: its history
# A demo's proxy is its synthetic users', never offered to real clients: no line to copy there.
listen = (status.heartbeat.listen if status.heartbeat else None) or ctx.launch.listen or ctx.settings.listen
proxy_line = "" if ctx.demo else client_host_line(listen)

if ctx.paused:
    st.caption("Live updates are paused (sidebar). Zoom and pan freely; switch the pause off to follow again.")

# Each part redraws only as often as it changes; when nothing has run for IDLE_AFTER_S, all of them slow down
# (the cards part notices the change and reruns the page once, which sets the new intervals).
busy = bool(st.session_state.get(BUSY_KEY, True))
refresh_s = timeline_refresh_s(ctx.window_s) if busy else max(5.0, timeline_refresh_s(ctx.window_s))


@st.fragment(run_every=None if ctx.paused else (1 if busy else 2))
def cards_part() -> None:
    now = time.time()
    model = build_cards(ctx.db_path, now, ctx.window_s)
    if model is None:
        common.no_store_state(ctx)
        return
    if model.cards or "pw_live_last_active" not in st.session_state:
        st.session_state["pw_live_last_active"] = now
    active = now - float(st.session_state.get("pw_live_last_active", 0.0)) < IDLE_AFTER_S
    show_strip(model)
    show_cards(model)
    if active != busy and not ctx.paused:
        st.session_state[BUSY_KEY] = active
        st.rerun(scope="app")


@st.fragment(run_every=None if ctx.paused else refresh_s)
def timeline_part() -> None:
    model = build_live(ctx.db_path, time.time(), ctx.window_s, flight=False, context=False)
    if model is not None:
        show_timeline(model, proxy_line, refresh_s)


@st.fragment(run_every=None if ctx.paused else (5 if busy else 15))
def context_part() -> None:
    model = build_live(ctx.db_path, time.time(), ctx.window_s, flight=False, timeline=False)
    if model is not None:
        show_context(model)


cards_part()
timeline_part()
context_part()
