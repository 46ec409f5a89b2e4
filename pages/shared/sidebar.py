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
from pages.shared.settings import client_host_line

HEARTBEAT_STALE_S = 15.0


def render(ctx: AppContext) -> AppContext:
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
    @st.fragment(run_every=None if ctx.paused else 5)
    def sources() -> None:
        if common.demo_changed(ctx):  # started or left in another tab: every page must follow
            st.rerun(scope="app")
        render_sources(ctx, data.load_status(ctx.db_path), time.time())

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
    # Ollama
    if status.ollama is None:
        st.markdown("**Ollama** · not polled yet")
        st.text(ctx.settings.ollama_url if not ctx.demo else common.demo_upstream(ctx))
    elif status.ollama.up:
        version = f" · version {md_escape(status.ollama.version)}" if status.ollama.version else ""
        st.markdown(f"**Ollama** · :green[reachable]{version}")
        st.text(status.ollama.base_url)
    else:
        since = status.ollama_down_since_unix_s
        st.markdown("**Ollama** · :red[not answering]" + (f" since {fmt.clock(since)}" if since is not None else ""))
        st.text(status.ollama.base_url)
    _ollama_sources(hb)
    if hb is not None and not hb.log_problem and (reads := api.collector_log(ctx.data_dir)):
        st.caption(f"Ollama's log: reads {_with_code(f'`{reads}`')}")
    # Proxy
    listen = (hb.listen if hb else None) or ctx.launch.listen or ctx.settings.listen
    st.markdown("**Proxy** · point your clients at it:")
    st.code(client_host_line(listen), language="bash", wrap_lines=True)
    if hb is not None and hb.proxy_refused:
        refused = md_escape(hb.proxy_refused)
        st.caption(f"Refused in the last hour: :orange[{refused}]. The collector's log says why, with each client's address.")
    _gpu_lines(status, hb)
    _collector_line(ctx, hb, starting, now_unix_s)
    st.markdown("**Data folder**")
    st.text(str(ctx.data_dir))


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
        st.markdown("**GPU** · no GPU found")
        # The collector's message already says what it means; show the default only when it sent none.
        st.caption(
            hb.gpu_message
            or "GPU charts stay empty, but every request's phases and rates are still recorded from Ollama's own timings."
        )
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
