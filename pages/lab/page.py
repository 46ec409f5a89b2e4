"""Lab: run an experiment against Ollama through the proxy, watch it, and compare the results.

Running is an explicit click: the page starts ``python -m collectors.lab`` as a
background process (``collectors.api.start_run``) that talks HTTP to the proxy, so
its probes are recorded like any other request, and keeps its result in
``<data>/lab/<run>.json``. The page only reads that file and the store; the
collector copies finished runs into the store's experiments table.
"""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import streamlit as st

from analysis.accelerator import resolve_hardware
from analysis.hardware import BY_KEY, HardwareSpec
from collectors import api
from collectors.api import EXPERIMENTS, FINAL_STATES, ExperimentResult, RunState, make_params
from pages.lab import view
from pages.lab.figures import figure_for
from pages.shared import common, fmt

PENDING_KEY = "lab_pending"  # (run_id, pid, started_at) of a run started from this session
SELECTED_KEY = "lab_selected"
FOLLOW_KEY = "lab_follow"  # a run started here: show its results as soon as it ends
CRASH_KEY = "lab_crash"  # (exit code, log tail) of a run that ended without a document

ctx = common.context()
st.title("Lab")
status = common.page_status(ctx)  # the reading the sidebar drew this run
common.demo_banner(ctx, status)
common.ollama_down_panel(ctx, status)
st.caption(
    "Experiments that make the phases visible on your own machine. Every probe goes through the proxy, "
    "so it is recorded on the Live and Requests pages like any other request."
)
listen = (status.heartbeat.listen if status.heartbeat else None) or ctx.launch.listen or ctx.settings.listen
proxy_url = f"http://{listen}"


detected = resolve_hardware(status.gpus[0] if status.gpus else None, gpu_count=max(len(status.gpus), 1))
HW_KEY = "lab_hw"
AUTO = "auto"


def hardware() -> HardwareSpec | None:
    """The spec the ceilings are drawn for: the detected one (as on the Why page), or the user's pick."""
    choice = st.session_state.get(HW_KEY, AUTO)
    return detected.spec if choice == AUTO else BY_KEY.get(choice)


def hardware_label(key: str) -> str:
    return f"detected: {detected.label}" if key == AUTO else BY_KEY[key].name


def active_run(runs: list[ExperimentResult]) -> ExperimentResult | None:
    return next((r for r in runs if view.is_running(r) and api.is_alive(r)), None)


runs = view.load_runs(ctx.data_dir, ctx.db_path)
running = active_run(runs)
pending = st.session_state.get(PENDING_KEY)
if pending is not None and any(r.run_id == pending[0] for r in runs):
    pending = None  # its document exists now
    st.session_state.pop(PENDING_KEY, None)

# ---------------------------------------------------------------- a new run
with st.container(border=True, key="lab_new"):
    st.subheader("New run")
    names = list(EXPERIMENTS)
    c1, c2 = st.columns(2)
    exp_name = c1.selectbox(
        "Experiment",
        names,
        format_func=lambda n: EXPERIMENTS[n].title,
        key="lab_exp",
        help="What each experiment answers is written under it.",
    )
    spec = EXPERIMENTS[exp_name]
    models = view.known_models(ctx.db_path)
    if models:
        model = c2.selectbox(
            "Model", models, format_func=fmt.label, key="lab_model", help="Models loaded now or seen in recent requests."
        )
    else:
        model = c2.text_input(
            "Model", key="lab_model_text", placeholder="e.g. llama3.2", help="No model recorded yet: type its name."
        )
    st.markdown(f"**{spec.question}**")
    values: dict[str, int | float] = {}
    with st.expander("Parameters"):
        for f in dataclasses.fields(spec.params_cls):
            label, key, help_text = f.name.replace("_", " "), f"lab_p_{exp_name}_{f.name}", f.metadata.get("help")
            default = f.default
            if isinstance(default, int):
                values[f.name] = st.number_input(label, min_value=1, value=default, step=1, help=help_text, key=key)
            elif isinstance(default, float):
                values[f.name] = st.number_input(label, min_value=0.1, value=default, help=help_text, key=key)
        num_ctx = st.number_input(
            "context (num_ctx)",
            min_value=0,
            value=0,
            step=1024,
            key="lab_num_ctx",
            help="0: whatever context the loaded model has. Another value makes Ollama reload the model with it.",
        )
    try:
        params = make_params(exp_name, values)
    except ValueError as exc:
        st.error(fmt.md_escape(str(exc)), icon=":material/error:")
        st.stop()
    param_values = dataclasses.asdict(params)
    context = num_ctx or (view.loaded_context(ctx.db_path, model) if model else None)
    cost = spec.cost(params, context)
    st.caption(view.cost_sentence(cost, view.recent_rates(ctx.db_path, model or "", window_s=ctx.window_s)))
    if cost.unloads_model:
        st.warning(
            "This experiment unloads the model first: anyone using it waits for it to load again.", icon=":material/warning:"
        )
    busy = running is not None or pending is not None
    clicked = st.button(
        "Run experiment",
        type="primary",
        key="lab_run",
        disabled=busy or not model,
        help="One experiment at a time: its timings would disturb each other." if busy else None,
    )
    if clicked and model and not busy:
        try:
            handle = api.start_run(exp_name, proxy_url, model, ctx.data_dir, param_values, num_ctx or None)
        except OSError as exc:  # e.g. the data folder is not writable
            st.error(fmt.md_escape(f"Could not start the run: {exc}"), icon=":material/error:")
            st.stop()
        st.session_state[PENDING_KEY] = (handle.run_id, handle.pid, time.time())
        st.session_state[FOLLOW_KEY] = handle.run_id
        st.rerun()


# ---------------------------------------------------------------- the run in progress
def show_figure(selected: list[ExperimentResult], key: str) -> None:
    if any(r.points for r in selected):
        st.plotly_chart(figure_for(selected, hardware()), key=key, config={"displaylogo": False})


def progress_panel(run_id: str) -> None:
    doc = api.read_run(ctx.data_dir, run_id)
    if doc is None or doc.state in FINAL_STATES:
        code = api.exit_code(run_id)
        if doc is None and code is not None:  # died before writing anything: show why
            st.session_state[CRASH_KEY] = (code, api.log_tail(ctx.data_dir, run_id))
        if doc is not None or code is not None:
            st.session_state.pop(PENDING_KEY, None)
            st.rerun(scope="app")  # finished: show it with the history
        st.progress(0.0, text="Starting…")
        return
    with st.container(border=True, key="lab_progress"):
        st.markdown(f"**Running: {EXPERIMENTS[doc.name].title}**")
        st.text(f"model {fmt.label(doc.model)} · through {fmt.label(doc.ollama_url)}")  # text: names come from users
        st.progress(doc.progress.fraction, text=f"{doc.progress.done}/{doc.progress.total or '?'} · {doc.progress.message}")
        stop_help = "Stops its requests at once; keeps what it measured."
        if st.button("Cancel", key="lab_cancel", icon=":material/stop:", help=stop_help):
            api.cancel_run(doc)
        show_figure([doc], key="lab_live_chart")


crash = st.session_state.pop(CRASH_KEY, None)
if crash is not None:
    st.error(f"The run ended with exit code {crash[0]} before it could write a result. Its last words:", icon=":material/error:")
    st.code(crash[1] or "(nothing)", language=None)

live_id: str | None = running.run_id if running is not None else (str(pending[0]) if pending is not None else None)
if live_id is not None:
    following: str = live_id

    @st.fragment(run_every=1)
    def live() -> None:
        progress_panel(following)

    live()

# ---------------------------------------------------------------- results and history
done = [r for r in runs if r.state in FINAL_STATES or api.interrupted(r)]
if not done:
    if live_id is not None:
        st.caption("Results appear here when the run ends; the chart above fills in as it goes.")
    else:
        st.info(
            "No runs yet. Choose an experiment and a model above, check what it will cost, then run it.",
            icon=":material/science:",
        )
    st.stop()

st.subheader("Results")
labels = {r.run_id: view.run_label(r, api.interrupted(r)) for r in done}
ids = list(labels)
if st.session_state.get(FOLLOW_KEY) in labels:
    st.session_state[SELECTED_KEY] = st.session_state.pop(FOLLOW_KEY)
if st.session_state.get(SELECTED_KEY) not in labels:
    st.session_state[SELECTED_KEY] = ids[0]
picked_id = st.selectbox("Run", ids, format_func=labels.__getitem__, key=SELECTED_KEY)
picked = next(r for r in done if r.run_id == picked_id)
same_kind = [r for r in done if r.name == picked.name and r.run_id != picked.run_id]
compare_ids = st.multiselect(
    "Compare with earlier runs of this experiment",
    [r.run_id for r in same_kind],
    format_func=labels.__getitem__,
    key=f"lab_compare_{picked.run_id}",
)
shown = [picked, *[r for r in same_kind if r.run_id in compare_ids]]
st.selectbox(
    "Ceilings for",
    [AUTO, *BY_KEY],
    format_func=hardware_label,
    key=HW_KEY,
    help="The hardware whose roofline ceilings are drawn with the measurements.",
)

if picked.state == RunState.FAILED or api.interrupted(picked):
    st.error(fmt.md_escape(picked.error or "The run's process ended without a result."), icon=":material/error:")
st.info(fmt.md_escape(picked.conclusion or "No conclusion."), icon=":material/lightbulb:")
show_figure(shown, key="lab_result_chart")
m = st.columns(4)
m[0].metric("Experiment", EXPERIMENTS[picked.name].title)
m[1].metric("State", "interrupted" if api.interrupted(picked) else picked.state)
m[2].metric("Duration", fmt.seconds((picked.finished_at_unix_s or time.time()) - picked.started_at_unix_s))
m[3].metric("Server", picked.server_version or "—")
if picked.points:
    st.markdown("**Measured points**")
    st.dataframe(view.points_frame(picked.points), hide_index=True, key="lab_points")
with st.expander("Parameters and key figures"):
    st.json({"parameters": picked.parameters, "summary": picked.summary, "ollama_url": picked.ollama_url}, expanded=True)

st.subheader("History")
table = pd.DataFrame(
    [
        {
            "started": pd.Timestamp(r.started_at_unix_s, unit="s", tz="UTC").tz_convert(None),
            "experiment": EXPERIMENTS[r.name].title if r.name in EXPERIMENTS else r.name,
            "model": fmt.label(r.model),
            "state": "interrupted" if api.interrupted(r) else r.state,
            "points": len(r.points),
            "conclusion": r.conclusion,
        }
        for r in done
    ]
)
st.dataframe(
    table,
    hide_index=True,
    key="lab_history",
    column_config={"started": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
)
