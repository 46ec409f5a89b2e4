"""The sidebar: the sources at a glance (Ollama, proxy, GPU, data folder), the time window, the pause switch."""

from __future__ import annotations

import time

import streamlit as st

from analysis.records import GPU_SOURCE_NAMES, CollectorInfo, GpuKind
from collectors import api
from collectors.api import LaunchStatus
from pages.shared import common, data, fmt
from pages.shared.common import AppContext
from pages.shared.fmt import md_escape
from pages.shared.ollama_state import OllamaKind
from pages.shared.settings import client_host_line

HEARTBEAT_STALE_S = 15.0
_FIRST_READ_KEY = "pw_sidebar_first_read"  # the status this run of the app read, for the fragment's first draw
_DRAWN_KIND_KEY = "pw_sidebar_ollama_kind"  # the Ollama state the app (sidebar and page) last drew
NO_GPU_LINE = "no GPU found: CPU-only machine, Intel GPU or container; the GPU timeline stays empty"


def render(ctx: AppContext) -> AppContext:
    st.html(common.STYLE)  # style tags only: Streamlit applies them without drawing anything
    with st.sidebar:
        labels = list(common.WINDOWS_S)
        window = st.selectbox(
            "Time window",
            labels,
            index=labels.index(common.DEFAULT_WINDOW),
            key="pw_window",
            help="How far back the charts and the request list reach.",
        )
        paused = st.toggle("Pause live updates", key="pw_paused", help="Freeze the Live page to read or zoom in peace.")
        ctx = common.set_view(common.WINDOWS_S[window or common.DEFAULT_WINDOW], paused)
        _status_fragment(ctx)
        if ctx.demo:
            st.button(
                "Leave demo",
                key="pw_leave_demo",
                on_click=common.leave_demo,
                help="Stop the demo (its users, collector and simulator) and go back to your own recordings.",
            )
    return ctx


def _status_fragment(ctx: AppContext) -> None:
    # One reading of the store per run of the app, drawn by the sidebar and the page alike (common.page_status);
    # the fragment's own refreshes read again, and rerun the whole app when Ollama's state changed, so that the
    # page's "not answering" panel comes and goes with the sidebar's line.
    status = data.load_status(ctx.db_path)
    common.share_status(status)
    st.session_state[_FIRST_READ_KEY] = status

    @st.fragment(run_every=None if ctx.paused else 5)
    def sources() -> None:
        if common.demo_changed(ctx):  # started or left in another tab: every page must follow
            st.rerun(scope="app")
        first = st.session_state.pop(_FIRST_READ_KEY, None)
        now_status = first if first is not None else data.load_status(ctx.db_path)
        kind = common.ollama_state_of(ctx, now_status).kind
        if first is None and kind != st.session_state.get(_DRAWN_KIND_KEY):
            st.rerun(scope="app")
        st.session_state[_DRAWN_KIND_KEY] = kind
        render_sources(ctx, now_status, time.time())

    sources()


def _ollama_sources(hb: CollectorInfo | None) -> None:
    """How the collector found Ollama's runners (or exactly why not), and why Ollama's log is not read: each with
    what to do. The collector's texts are plain: escaped, with their `commands` kept as code."""
    if hb is None:
        return
    if hb.runners_found:
        st.caption(f"Runners: {md_escape(hb.runners_found)}")
    elif hb.runners_problem:
        problem = hb.runners_problem
        st.caption(f"Runners: none read. {_with_code(problem[:1].upper() + problem[1:])}")
    if hb.log_problem:
        st.caption(f"Ollama's log: :orange[not read]. {_with_code(hb.log_problem)}")
    elif hb.runner_lines_missing:
        st.caption(f"Ollama's log: :orange[read, the runner's lines missing]: {_with_code(hb.runner_lines_missing)}")


def _with_code(text: str) -> str:
    """Markdown of a collector's text: escaped, except its `backquoted commands`, shown as code."""
    parts = text.split("`")
    return "".join(f"`{p}`" if i % 2 else md_escape(p) for i, p in enumerate(parts))


def _starting_pid(ctx: AppContext, hb: CollectorInfo | None, now_unix_s: float) -> int | None:
    """The collector holding the data folder when the last heartbeat is an earlier one's (yesterday's, before the
    app started this one) and it has not written its own yet; None otherwise."""
    if hb is None or now_unix_s - hb.ts_unix_s <= HEARTBEAT_STALE_S:
        return None
    holder = api.collector_pid(ctx.data_dir)
    return holder if holder is not None and holder != hb.pid else None


def render_sources(ctx: AppContext, status: data.Status, now_unix_s: float) -> None:
    st.subheader("Sources")
    starting = _starting_pid(ctx, status.heartbeat, now_unix_s)
    hb = None if starting is not None else status.heartbeat  # an earlier collector's words are not this one's
    _ollama_line(ctx, status)
    _ollama_sources(hb)
    if hb is not None and not hb.log_problem and (reads := api.collector_log(ctx.data_dir)):
        st.caption(f"Ollama's log: reads {_with_code(f'`{reads}`')}")
    _proxy_line(ctx, hb)
    if hb is not None and hb.proxy_refused:
        refused = md_escape(hb.proxy_refused)
        st.caption(f"Refused in the last hour: :orange[{refused}]. The collector's log says why, with each client's address.")
    _gpu_lines(status, hb)
    _collector_line(ctx, hb, starting, now_unix_s)
    st.markdown("**Data folder**")
    st.text(str(ctx.data_dir))


def _ollama_line(ctx: AppContext, status: data.Status) -> None:
    """Ollama's state as the page's panel says it (common.ollama_state_of), and the address polled."""
    state = common.ollama_state_of(ctx, status)
    if state.kind is OllamaKind.UP:
        version = f" · version {md_escape(state.version)}" if state.version else ""
        st.markdown(f"**Ollama** · :green[reachable]{version}")
    elif state.kind is OllamaKind.DOWN:
        since = f" since {fmt.clock(state.down_since_unix_s)}" if state.down_since_unix_s is not None else ""
        st.markdown(f"**Ollama** · :red[not answering]{since}")
    elif state.kind is OllamaKind.STARTING:
        st.markdown("**Ollama** · not polled yet: " + ("the demo is starting" if ctx.demo else "the collector is starting"))
    else:
        st.markdown("**Ollama** · not polled: no collector runs")
    st.text(state.address)


def _proxy_line(ctx: AppContext, hb: CollectorInfo | None) -> None:
    """Where to point clients: this data folder's proxy, one line that never wraps inside its address. A demo's
    proxy is its synthetic users' (on a port of its own): never offered to real clients."""
    if ctx.demo:
        st.markdown("**Proxy** · the demo's own, for its synthetic users. To record your clients, leave the demo.")
        return
    listen = (hb.listen if hb else None) or ctx.launch.listen or ctx.settings.listen
    st.markdown("**Proxy** · point your clients at it:")
    common.command_line(client_host_line(listen), key="pw_proxy_line")


def _gpu_lines(status: data.Status, hb: CollectorInfo | None) -> None:
    """The GPUs of the last minute's samples and how they are read; else why there are none."""
    if status.gpus:
        for g in status.gpus:
            sim = " (simulated)" if g.simulated else ""
            st.markdown(f"**GPU {g.index}** · {md_escape(g.name)}{sim}")
        source = hb.gpu_state if hb is not None else None
        if source and source not in (GpuKind.SIMULATED, GpuKind.NONE):
            # Our own names are plain text (st.caption renders Markdown; escaping would show the backslashes).
            st.caption(f"read through {GPU_SOURCE_NAMES.get(source) or md_escape(source)}")
    elif hb is not None and hb.gpu_state == GpuKind.NONE:
        st.markdown(f"**GPU** · {NO_GPU_LINE}")
        # The collector's reason per GPU source (one clause each) is for whoever wants it, not on every page.
        if hb.gpu_message:
            with st.expander("Why, per GPU source"):
                st.text(hb.gpu_message)
    else:
        st.markdown("**GPU** · no samples yet")


def _collector_line(ctx: AppContext, hb: CollectorInfo | None, starting: int | None, now_unix_s: float) -> None:
    """Whether the collector runs, starts, fell silent or failed to start."""
    if starting is not None:  # not "silent for 14 h": that was the collector before this one
        st.markdown(f"**Collector** · starting (process {starting}): no heartbeat from it yet")
    elif hb is not None and now_unix_s - hb.ts_unix_s > HEARTBEAT_STALE_S:
        st.markdown(f"**Collector** · :orange[silent for {fmt.seconds(now_unix_s - hb.ts_unix_s)}]")
    elif hb is not None and ctx.launch.state != LaunchStatus.FAILED:
        st.markdown(f"**Collector** · running (process {hb.pid})" + (" for the demo" if hb.demo else ""))
    else:
        st.markdown(f"**Collector** · {md_escape(ctx.launch.message)}")
    if ctx.launch.state == LaunchStatus.FAILED:
        st.code(ctx.launch.message, language=None)
