"""Requests: the filterable history with CSV download, one request's phases, gaps, rates and story, and usage
totals per model, per client and per program (with their CSV)."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from analysis.error_notes import capability_advice
from pages.requests.usage import (
    GROUPINGS,
    PERIODS_S,
    UsageRow,
    load_usage,
    usage_csv,
    usage_display,
    usage_frame,
    usage_sources,
)
from pages.requests.view import (
    SHOWN_ROWS,
    DetailModel,
    build_detail,
    build_history,
    csv_bytes,
    detail_heading,
    display_frame,
    history_caption,
    linked_request,
    request_label,
)
from pages.shared import common, fmt
from pages.shared.import_offer import offer_log_import

ANY = "any"

ctx = common.context()
st.title("Requests")
status = common.page_status(ctx)  # the reading the sidebar drew this run
common.demo_banner(ctx, status)
common.ollama_down_panel(ctx, status)

now = time.time()
start = now - ctx.window_s
first = build_history(ctx.db_path, start, now)
if first is None:
    common.no_store_state(ctx)
    st.stop()

f1, f2, f3, f4 = st.columns(4)
# Names from clients are cut in the menus (fmt.label); the value picked stays whole.
model = f1.selectbox("Model", [ANY, *first.options.models], format_func=fmt.label, key="req_model")
endpoint = f2.selectbox("Endpoint", [ANY, *first.options.endpoints], format_func=fmt.label, key="req_endpoint")
outcome = f3.selectbox("Outcome", [ANY, *first.options.outcomes], key="req_outcome")
program = f4.selectbox(
    "Program",
    [ANY, *first.options.programs],
    format_func=fmt.label,
    key="req_program",
    help="The program that sent the request, as its User-Agent names itself (requests that named none are in 'any').",
)
picked = (model, endpoint, outcome, program)
filters = tuple(None if value == ANY else value for value in picked)
history = first if filters == (None, None, None, None) else build_history(ctx.db_path, start, now, *filters)
assert history is not None  # the store existed a moment ago; it is never deleted while the app runs

# A ?request= link (a Live card's "Details in Requests", or one pasted) opens that request whatever the window.
link = linked_request(ctx.db_path, st.query_params.get("request"), [r.id for r in history.rows])
if link is not None and link.label is None:
    st.error(
        f"No request with id “{fmt.md_escape(link.shown_id)}” in this store: the link is mistyped, or it comes from another "
        "Phasewatch (or from the demo's data while real data is shown, or the other way round).",
        icon=":material/link_off:",
    )

if not history.rows and not (link and link.label):
    st.info(
        "No requests in this window"
        + (" match these filters." if filters != (None, None, None, None) else ".")
        + " Widen the time window in the sidebar, or run a prompt with any client: one that talks to Ollama "
        "directly is recorded from its runner with no change to it (marked direct); pointed at the proxy, its own "
        "time to first token, every gap between its tokens and its address are recorded too:",
        icon=":material/search_off:",
    )
    common.point_clients(ctx)
    offer_log_import(ctx)  # nothing recorded at all, and Ollama's log is readable: its history
    st.stop()

window = next((label for label, s in common.WINDOWS_S.items() if s == ctx.window_s), fmt.seconds(ctx.window_s))
st.caption(history_caption(history.rows, window, history.truncated, SHOWN_ROWS))
table = st.dataframe(
    display_frame(history.frame),
    hide_index=True,
    key="req_table",
    on_select="rerun",
    selection_mode="single-row",
    column_config={"time": st.column_config.DatetimeColumn("time", format="YYYY-MM-DD HH:mm:ss")},
)
st.download_button(
    "Download CSV",
    data=lambda: csv_bytes(ctx.db_path, start, now, *filters),
    file_name="phasewatch-requests.csv",
    mime="text/csv",
    key="req_csv",
    on_click="ignore",
    help=(
        "Every request of this window matching these filters, as `python -m store export --format csv --since … "
        "--until …` writes it: the same columns, times in UTC with their zone (started_at); never prompt or reply text."
    ),
)
if history.figure is not None:
    st.plotly_chart(history.figure, key="req_history", config={"displaylogo": False})
    if history.figure_note:
        st.caption(history.figure_note)

# Which request to inspect: the row picked in the table, else the selectbox (newest by default).
ids = [r.id for r in history.rows]
labels = {r.id: request_label(r) for r in history.rows}
picked_rows = table.selection.rows if table is not None else []
if picked_rows and st.session_state.get("req_last_table_pick") != ids[picked_rows[0]]:
    st.session_state["req_last_table_pick"] = ids[picked_rows[0]]
    st.session_state["req_pick"] = ids[picked_rows[0]]
if link is not None and link.label and not link.in_rows:
    ids.insert(0, link.id)
    labels[link.id] = link.label
    st.info(
        "Opened from a link: this request is outside the time window or filters above, so it is not in the table.",
        icon=":material/link:",
    )
if link is not None and link.label is not None and st.session_state.get("req_linked") != link.id:
    st.session_state["req_linked"] = link.id  # once per link: picking another request afterwards sticks
    st.session_state["req_pick"] = link.id
if ids and st.session_state.get("req_pick") not in labels:
    # Default: the newest finished request (an in-flight one has no phases yet).
    finished = [r.id for r in history.rows if r.outcome != "in_flight"]
    st.session_state["req_pick"] = finished[0] if finished else ids[0]
st.subheader("One request")
request_id = st.selectbox("Request to inspect", ids, format_func=labels.__getitem__, key="req_pick")
detail = build_detail(ctx.db_path, request_id) if request_id else None


def show_detail(d: DetailModel) -> None:
    rec = d.record
    st.text(detail_heading(rec))
    common.whole_text_on_demand("model name", rec.model, fmt.LABEL_MAX_CHARS, "req_model_whole")
    for sentence in d.sentences:
        st.text(fmt.label(sentence, fmt.SENTENCE_MAX_CHARS))  # text, not Markdown: the sentences carry model names
    if d.placement:
        st.text(fmt.label(d.placement, fmt.SENTENCE_MAX_CHARS))  # the device names are the runner's own text
    c = st.columns(len(d.headlines))
    for col, h in zip(c, d.headlines, strict=True):
        col.metric(h.label, h.value, help=h.help)
    st.plotly_chart(d.waterfall, key="req_waterfall", config={"displaylogo": False})
    if not d.thinking.empty:
        st.markdown("**Thinking and answer** (thinking tokens cost decode time like any other)")
        st.dataframe(d.thinking, hide_index=True, key="req_thinking")
    with st.expander("Where each number came from"):
        st.dataframe(d.sources, hide_index=True, key="req_sources")
    if d.gaps is not None:
        st.plotly_chart(d.gaps, key="req_gaps", config={"displaylogo": False})
    else:
        st.caption("Fewer than two tokens streamed: no gaps to show.")
    if not d.rates.empty:
        st.markdown("**Rates: ours beside Ollama's**")
        # A static table wraps its cells, so "why they differ" is read whole.
        st.table(d.rates.set_index("phase"))
    for diagnosis in d.diagnoses:
        st.text(f"• {fmt.label(diagnosis.sentence, fmt.SENTENCE_MAX_CHARS)}")
    for text in d.flags:
        st.warning(fmt.md_escape(fmt.label(text, fmt.SENTENCE_MAX_CHARS)), icon=":material/warning:")
    if rec.error:
        st.markdown("**Error**")
        st.code(fmt.excerpt(rec.error), language=None, wrap_lines=True)
        if (advice := capability_advice(rec.status_code, rec.error)) is not None:
            st.info(advice, icon=":material/build:")
        common.whole_text_on_demand("error", rec.error, fmt.TEXT_MAX_CHARS, "req_error_whole")
    if rec.prompt_text is not None or rec.response_text is not None:
        with st.expander("Prompt and reply text (recorded because text recording is on)", expanded=True):
            # Their start only: a 30 MB reply drawn whole took the page 25 s; the whole text is a download.
            for what, text in (("prompt", rec.prompt_text or ""), ("reply", rec.response_text or "")):
                st.markdown(f"**{what.capitalize()}**")
                st.code(fmt.excerpt(text), language=None, wrap_lines=True)
                common.whole_text_on_demand(what, text, fmt.TEXT_MAX_CHARS, f"req_{what}_whole")


if detail is None:
    st.caption("Pick a request above to see its phases.")
else:
    show_detail(detail)

st.subheader("Usage")


@st.cache_data(ttl=60, show_spinner=False, max_entries=4)
def usage_rows(db: str, minute: int) -> list[UsageRow]:
    """Read again once a minute at most (the summary's rows and the newest requests' GPU samples for energy)."""
    return load_usage(Path(db), minute * 60.0) or []


def show_usage() -> None:
    usage = usage_rows(str(ctx.db_path), int(now // 60))
    u1, u2 = st.columns(2)
    period = u1.segmented_control("Over the last", list(PERIODS_S), default="7 days", key="usage_period") or "7 days"
    by = u2.segmented_control("Totals per", list(GROUPINGS), default="model", key="usage_by") or "model"
    frame = usage_frame(usage, by, period)
    if frame.empty:
        st.caption(f"No finished request in the last {period}.")
    else:
        st.dataframe(usage_display(frame), hide_index=True, key="usage_table")
        st.caption(usage_sources(usage, period))
    st.download_button(
        "Download usage CSV",
        data=lambda: usage_csv(usage),
        file_name="phasewatch-usage.csv",
        mime="text/csv",
        key="usage_csv",
        on_click="ignore",
        help="Totals per model, per client and per program over 1, 7 and 30 days, with the records without each figure.",
    )


# Built on demand: the totals read the store's per-day summary (bounded), and the GPU samples over the newest requests
# for energy; the page's first content never waits for them.
if st.toggle(
    "Show usage totals",
    key="usage_show",
    help="Requests, tokens, GPU time and energy per model, per client and per program over the last 1, 7 and 30 days. "
    "Read from the store's per-day summary; energy from the GPU samples of the newest requests.",
):
    show_usage()
else:
    st.caption("Turn on “Show usage totals” for requests, tokens, GPU time and energy per model, client and program.")
