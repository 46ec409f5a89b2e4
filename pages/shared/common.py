"""What every page shares: the app context, the demo banner, the "Ollama down" panel, empty states.

Text that comes from users or models (model names, errors, replies) never goes
through Markdown here: it is shown with ``st.text``/``st.code`` or in dataframes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st

from collectors import api
from collectors.api import LaunchState, LaunchStatus, engine_problem, ensure_collector, ensure_demo
from pages.shared import data, fmt
from pages.shared.ollama_state import OllamaKind, OllamaState, ollama_state
from pages.shared.settings import AppSettings, client_host_line, resolve_settings
from pages.shared.window import DEFAULT_WINDOW as DEFAULT_WINDOW  # the sidebar's windows: pages/shared/window.py
from pages.shared.window import WINDOWS_S as WINDOWS_S
from store.queries import StoreState, store_state

_CTX_KEY = "pw_ctx"
_STATUS_KEY = "pw_status_this_run"  # the sidebar's reading of the store, for the page drawn in the same run
STYLE = Path(__file__).with_name("style.css")  # the app's few CSS rules (commands that never wrap inside a token)
# How the README starts Phasewatch: hints quote it as it is written there.
README_START = ".venv/bin/streamlit run app.py"
DEMO_KEY = "pw_demo"
DEMO_ENGINE_KEY = "pw_demo_engine"  # the demo runs the real llama.cpp engine rather than the simulator
ENGINE_DEMO_LABEL = "real llama.cpp engine running Gemma 3 270M on this CPU (no GPU)"


@dataclass(frozen=True)
class AppContext:
    settings: AppSettings
    demo: bool
    data_dir: Path
    launch: LaunchState
    window_s: float = WINDOWS_S[DEFAULT_WINDOW]
    paused: bool = False
    demo_engine: bool = False  # with demo: the real llama.cpp engine, not the simulator

    @property
    def db_path(self) -> Path:
        return data.db_path(self.data_dir)


def server_demo(settings: AppSettings) -> tuple[bool, bool]:
    """(demo, on the real engine) as the running processes say: the same in every tab, reload and deep link."""
    if api.demo_runs(settings.demo_engine_data_dir):
        return True, True
    return api.demo_runs(settings.demo_data_dir), False


def _demo_folder(settings: AppSettings, engine: bool) -> Path:
    return settings.demo_engine_data_dir if engine else settings.demo_data_dir


def app_context() -> AppContext:
    """Resolve settings, make sure a collector (or the demo) runs, and remember the result for the pages.

    Whether the demo is on is the server's to say (``server_demo``), never this session's: a
    new tab or a reload shows the demo that runs. Only with ``PHASEWATCH_COLLECTOR=off``, where
    the app may start nothing, does a session remember its own demo switch.
    """
    settings = resolve_settings()
    demo, demo_engine = server_demo(settings)
    if not demo and settings.start_collector and settings.demo_at_start:
        engine = settings.demo_engine_at_start
        if api.start_demo_at_start(_demo_folder(settings, engine), "llama-cpp" if engine else "sim"):
            demo, demo_engine = True, engine
    if not demo and not settings.start_collector:
        if DEMO_KEY not in st.session_state:
            st.session_state[DEMO_KEY] = settings.demo_at_start
            st.session_state[DEMO_ENGINE_KEY] = settings.demo_engine_at_start
        demo = bool(st.session_state[DEMO_KEY])
        demo_engine = demo and bool(st.session_state.get(DEMO_ENGINE_KEY, False))
    st.session_state[DEMO_KEY] = demo
    st.session_state[DEMO_ENGINE_KEY] = demo_engine
    data_dir = _demo_folder(settings, demo_engine) if demo else settings.data_dir
    if demo and settings.start_collector:
        launch = ensure_demo(data_dir, "llama-cpp" if demo_engine else "sim")
    elif demo:
        launch = LaunchState(LaunchStatus.OFF, "demo mode, but PHASEWATCH_COLLECTOR=off: the app starts no simulator")
    else:
        launch = ensure_collector(data_dir, settings.ollama_url, settings.listen, settings.start_collector)
    ctx = AppContext(settings=settings, demo=demo, data_dir=data_dir, launch=launch, demo_engine=demo_engine)
    st.session_state[_CTX_KEY] = ctx
    return ctx


def demo_changed(ctx: AppContext) -> bool:
    """Whether the demo started or ended elsewhere (another tab, a terminal) since this run resolved ``ctx``."""
    if not ctx.settings.start_collector:
        return False
    return server_demo(ctx.settings) != (ctx.demo, ctx.demo_engine)


@st.fragment(run_every=1)
def follow_start() -> None:
    """While the collector (or demo) starts, draw the page again every 2 s: it learns when it runs, or failed and why.

    Pages that draw once (Requests, Why, Lab) would otherwise show "starting" until the user clicks something.
    """
    now = time.monotonic()
    if now - st.session_state.get("pw_follow_start_at", now) >= 2:
        st.session_state["pw_follow_start_at"] = now
        st.rerun()
    st.session_state.setdefault("pw_follow_start_at", now)


def set_view(window_s: float, paused: bool) -> AppContext:
    ctx: AppContext = st.session_state[_CTX_KEY]
    ctx = replace(ctx, window_s=window_s, paused=paused)
    st.session_state[_CTX_KEY] = ctx
    return ctx


def context() -> AppContext:
    """The context app.py resolved for this run, brought up to date with the sidebar's widgets.

    Rebuilt when the demo switch changed since it was stored (a page can run without app.py
    running first: AppTest's reruns under st.navigation do that).
    """
    ctx: AppContext | None = st.session_state.get(_CTX_KEY)
    switched = ctx is not None and (
        ctx.demo != bool(st.session_state.get(DEMO_KEY, ctx.demo))
        or (ctx.demo and ctx.demo_engine != bool(st.session_state.get(DEMO_ENGINE_KEY, ctx.demo_engine)))
    )
    if ctx is None or switched:
        ctx = app_context()
    window = str(st.session_state.get("pw_window", ""))
    paused = st.session_state.get("pw_paused")
    if window in WINDOWS_S or paused is not None:
        ctx = set_view(WINDOWS_S.get(window, ctx.window_s), bool(paused) if paused is not None else ctx.paused)
    return ctx


def _start_demo(engine: bool) -> None:
    st.session_state[DEMO_KEY] = True
    st.session_state[DEMO_ENGINE_KEY] = engine
    settings = resolve_settings()
    if settings.start_collector:
        api.start_demo(_demo_folder(settings, engine), "llama-cpp" if engine else "sim")


def start_demo() -> None:
    _start_demo(engine=False)


def start_engine_demo() -> None:
    _start_demo(engine=True)


def leave_demo() -> None:
    """End the demo for every session: its users, its collector and its simulator (or engine) stop."""
    st.session_state[DEMO_KEY] = False
    st.session_state[DEMO_ENGINE_KEY] = False
    settings = resolve_settings()
    for folder in (settings.demo_data_dir, settings.demo_engine_data_dir):
        if api.demo_runs(folder) and not api.stop_demo(folder):
            st.toast(f"The demo of {folder} did not stop in time; see {folder / 'demo.log'}", icon=":material/error:")


def demo_upstream(ctx: AppContext) -> str:
    """What answers the demo's requests, in a few words."""
    return ENGINE_DEMO_LABEL if ctx.demo_engine else "the simulator"


def share_status(status: data.Status) -> None:
    """The sidebar's reading of the store, handed to the page of the same run (``page_status``)."""
    st.session_state[_STATUS_KEY] = status


def page_status(ctx: AppContext) -> data.Status:
    """The reading the sidebar drew this run (taken once), so that the page says of Ollama what the sidebar
    says; a fresh one where no sidebar ran before the page."""
    shared: data.Status | None = st.session_state.pop(_STATUS_KEY, None)
    return shared if shared is not None else data.load_status(ctx.db_path)


def ollama_state_of(ctx: AppContext, status: data.Status) -> OllamaState:
    """Ollama's state for the sidebar and the page's panel alike (``pages.shared.ollama_state``)."""
    return ollama_state(status, ctx.launch, demo_upstream(ctx) if ctx.demo else ctx.settings.ollama_url)


def command_line(text: str, key: str) -> None:
    """A command or an address to copy, as code that never wraps inside a token (style.css: smaller type in the
    sidebar, a scroll bar rather than a break where it still does not fit)."""
    with st.container(key=key):
        st.code(text, language="bash")


def point_clients(ctx: AppContext, listen: str | None = None) -> None:
    """The line that points a client at the proxy; in the demo, that its synthetic users are the clients (its
    proxy is never offered to real ones)."""
    if ctx.demo:
        st.caption("In the demo, its synthetic users are the clients. To record your own, leave the demo (sidebar).")
        return
    st.code(client_host_line(listen or ctx.launch.listen or ctx.settings.listen), language="bash")


def demo_banner(ctx: AppContext, status: data.Status) -> None:
    """Say plainly when what a page shows comes from a demo, and whether its engine is real or simulated."""
    if ctx.demo and ctx.demo_engine:
        st.info(
            f"**Demo mode — {ENGINE_DEMO_LABEL}.** Two synthetic users send short completions, one through the proxy "
            "and one to the engine directly (recorded from its runner, marked direct), like real traffic; the model, "
            "its prefill and its decode are real. It is not your Ollama.",
            icon=":material/memory:",
        )
        return
    simulated = ctx.demo or (status.heartbeat is not None and status.heartbeat.demo)
    if simulated:
        st.info(
            "**Demo mode:** everything on this page comes from the built-in simulator (`sim/`) and its simulated GPU, "
            "recorded through the proxy like real traffic. It is not your Ollama and not your GPU.",
            icon=":material/science:",
        )


def ollama_down_panel(ctx: AppContext, status: data.Status) -> bool:
    """When Ollama does not answer, or nothing polls it: say so as the sidebar does (one ``OllamaState``), say how to
    fix it, offer the demo. True when shown."""
    if ctx.demo:
        return False
    state = ollama_state_of(ctx, status)
    if state.kind not in (OllamaKind.DOWN, OllamaKind.UNWATCHED):
        return False
    engine_ok = engine_problem() is None  # llama-server is built and the Gemma model is installed
    demo_offer = "Try the demo: a simulated GPU and model with synthetic users, recorded into a separate data folder." + (
        " Or the demo on a real tiny model: llama.cpp running Gemma 3 270M on this CPU." if engine_ok else ""
    )
    with st.container(border=True, key="ollama_down"):
        if state.kind is OllamaKind.UNWATCHED:  # nothing polls Ollama: the collector is what failed, or may not start
            what = "could not start" if ctx.launch.state == LaunchStatus.FAILED else "is not running"
            st.error(f"**The collector {what},** so nothing can be recorded.", icon=":material/error:")
            st.code(ctx.launch.message, language=None, wrap_lines=True)
            st.markdown(f"Fix what it says, then reload this page. Or: {demo_offer}")
        else:
            when = f" since {fmt.clock(state.down_since_unix_s)}" if state.down_since_unix_s is not None else ""
            st.error(
                f"**Ollama is not answering{when}.** Nothing new can be recorded until it does.", icon=":material/power_off:"
            )
            st.text(f"Address tried: {state.address}")
            if state.error:
                st.text(f"Last error: {state.error}")
            st.markdown(
                "- Start it: run `ollama serve` in a terminal (or open the Ollama app), then wait a few seconds.\n"
                "- Ollama runs elsewhere? Set `OLLAMA_HOST` before starting Phasewatch, for example "
                f"`OLLAMA_HOST=192.168.1.20:11434 {README_START}`.\n"
                f"- No Ollama at all? {demo_offer}"
            )
        st.button("Start demo", key="pw_start_demo", on_click=start_demo, type="primary")
        if engine_ok:
            st.button(
                "Start demo on a real tiny model",
                key="pw_start_engine_demo",
                on_click=start_engine_demo,
                help="The real llama.cpp engine running Gemma 3 270M on this CPU (no GPU), with one synthetic user.",
            )
    return True


def no_store_state(ctx: AppContext) -> None:
    """Empty state: no store file yet. The demo says that it is filling it: its synthetic users are the clients."""
    if ctx.demo:
        starting = ctx.launch.state in (LaunchStatus.STARTING, LaunchStatus.RUNNING)
        st.info(
            "**Nothing recorded yet: the demo is filling it.** "
            + (
                "Its collector and synthetic users are starting; their first requests show here within "
                "a few seconds, with nothing to do on your side."
                if starting
                else fmt.md_escape(ctx.launch.message[:1].upper() + ctx.launch.message[1:]) + "."
            ),
            icon=":material/hourglass_empty:",
        )
        return
    st.info(
        "**Nothing recorded yet.** The collector creates its store when it starts"
        + (" — it is starting now." if ctx.launch.state == LaunchStatus.STARTING else ".")
        + " Then run a prompt with any client: one that talks to Ollama directly is seen from its runner, with no "
        "change to it. Pointed at the proxy, a client's own time to first token, every gap between its tokens and "
        "its address are recorded too:",
        icon=":material/hourglass_empty:",
    )
    point_clients(ctx)


# A store this Phasewatch cannot read: what happened and what to do (the file is never touched from here).
STORE_PROBLEMS = {
    StoreState.OLDER: (
        "was written by an older Phasewatch. The collector migrates it when it starts, keeping every record. "
        "If an older collector is still running (a service, another terminal), stop it with "
        "`python -m collectors --stop` and start this version's: this page follows as soon as the store is ready."
    ),
    StoreState.NEWER: (
        "was written by a newer Phasewatch than this one. Upgrade this Phasewatch, or point `PHASEWATCH_DATA` at "
        "another folder; the store is left as it is."
    ),
    StoreState.CORRUPT: (
        "is not a readable SQLite store. Move the file aside (nothing here deletes it) and the collector starts a "
        "new store on its next start."
    ),
}


def store_problem(ctx: AppContext) -> str | None:
    """Why the pages cannot read the store now, in words for the person; None when they can (or it is not there yet)."""
    why = STORE_PROBLEMS.get(store_state(ctx.db_path))
    return None if why is None else f"The store at {fmt.md_escape(str(ctx.db_path))} {why}"


def show_store_problem(ctx: AppContext, problem: str) -> None:
    """The problem instead of the pages, looked at again every 2 s: the page comes back once the store is readable."""
    st.title("Phasewatch")
    st.error(problem, icon=":material/database:")

    @st.fragment(run_every=2)
    def follow() -> None:
        if store_problem(ctx) is None:
            st.rerun(scope="app")

    follow()


def whole_text_on_demand(what: str, text: str, shown_chars: int, key: str) -> None:
    """The whole of a text the page shows cut (``fmt.label``/``fmt.excerpt``), as a download fetched only when
    clicked: nothing of it goes to the browser before (issue 25 #7: a 30 MB reply shown whole took 25 s)."""
    if len(text) > shown_chars:
        st.download_button(
            f"Download the whole {what} ({fmt.count(len(text))} characters)",
            data=lambda: text.encode("utf-8", "replace"),
            file_name=f"{what.replace(' ', '-')}.txt",
            mime="text/plain",
            key=key,
            on_click="ignore",
        )
