"""Why: prefill against decode for the selected model on this GPU, each rate set against its ceiling.

Everything is built by ``pages.why.view.build_why``; this file only lays it out. Sentences
carry model and GPU names, so they go through ``st.text`` or escaped Markdown, never HTML.
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from analysis import wording as w
from analysis.ceilings import MIN_CALIBRATION_SAMPLES, MIN_RATE_TOKENS
from analysis.diagnose import Severity
from analysis.hardware import BY_KEY
from analysis.model_facts import TYPICAL_8B_Q4_K_M, TYPICAL_MODEL_NAME
from analysis.records import InstalledModel
from collectors import api
from pages.shared import common, data, fmt
from pages.shared.settings import client_host_line
from pages.why.view import WhyModel, build_why, facts_line, hardware_line, model_choices, preview_choices

LAB_PAGE = "pages/lab/page.py"


@st.cache_resource
def _apple_chip() -> tuple[str, int | None] | None:
    return api.detect_apple_gpu()  # None at once on anything but Apple Silicon macOS


def _num(value: float | None) -> str:
    return w.num(value) if value else "—"


def text(sentence: str) -> None:
    """A sentence with names in it, as literal text in the page's normal font."""
    st.markdown(fmt.md_escape(sentence))


def how_to_make_requests(model: str | None) -> None:
    who = f"for {fmt.md_escape(model)} " if model else ""
    st.info(
        f"**No requests {who}recorded yet.** Point a client at Phasewatch's proxy and send a few prompts of "
        "different lengths; each one becomes a point on the charts below" + ", or run an experiment on the Lab page.",
        icon=":material/hourglass_empty:",
    )
    st.code(client_host_line(ctx.launch.listen or ctx.settings.listen), language="bash")


def lab_link() -> None:
    """One click to the experiment that fills in the measured points."""
    st.page_link(LAB_PAGE, label="Measure them: run a prompt-length experiment on the Lab page", icon=":material/science:")


def _installed_label(m: InstalledModel) -> str:
    parts = [m.name, *(p for p in (m.parameter_size, m.quantization_level) if p)]
    if m.size_bytes:
        parts.append(w.gb(m.size_bytes))
    return " · ".join(parts)


def preview(db: Path) -> None:
    """Before any request: the physics for the detected GPU (or one picked) and an installed model (or a typical 8B)."""
    keys = list(BY_KEY)
    picked = st.selectbox(
        "GPU", ["the one detected here", *keys], key="why_gpu",
        format_func=lambda k: k if k == "the one detected here" else f"{BY_KEY[k].name} ({k})",
        help="Pick a GPU from Phasewatch's hardware table to see its ceilings.",
    )  # fmt: skip
    spec = BY_KEY.get(picked)
    choices = preview_choices(db, spec)
    if choices is None:
        common.no_store_state(ctx)
        st.stop()
    if not choices.offered:
        why = build_why(db, TYPICAL_MODEL_NAME, time.time(), ctx.window_s, apple_chip=_apple_chip(),
                        preview=(spec, TYPICAL_8B_Q4_K_M))  # fmt: skip
        what = "an installed model that writes text" if choices.embedding else "an installed model"
        caption = (
            f"Until Ollama lists {what}, the ceilings are for {TYPICAL_MODEL_NAME}: the lines below come "
            "from the ceilings alone; your requests become the points."
        )
    else:
        by_name = {m.name: m for m in choices.offered}
        names = list(by_name)
        fits = f" that fits the GPU's {w.gb(choices.memory_bytes)}" if choices.memory_bytes else ""
        model = st.selectbox(
            "Model", names, index=names.index(choices.default) if choices.default in by_name else 0,
            key="why_preview_model", format_func=lambda n: fmt.label(_installed_label(by_name[n]), fmt.SENTENCE_MAX_CHARS),
            help=f"The models Ollama has installed (ollama list), newest first; it starts on the largest{fits}.",
        )  # fmt: skip
        why = build_why(db, model, time.time(), ctx.window_s, apple_chip=_apple_chip(), preview=(spec, None))
        read = f", read {fmt.clock(why.facts_read_at_unix_s)}" if why is not None and why.facts_read_at_unix_s is not None else ""
        caption = (
            f"Ceilings for {fmt.label(model)}, installed but not loaded: its facts come from Ollama's own description of it "
            f"(/api/show{read}). The lines below come from the ceilings alone; your requests become the points."
        )
    if why is None:
        common.no_store_state(ctx)
        st.stop()
    st.caption(fmt.md_escape(caption))
    if choices.embedding:
        st.caption(
            fmt.md_escape(
                f"Left out: {', '.join(choices.embedding)} (embedding: reads a prompt and writes nothing, so there is "
                "no decode to set against prefill)."
            )
        )
    show_why(why)


def show_why(m: WhyModel) -> None:
    hw = m.hardware
    if m.simulated:
        st.info(
            "**Simulated data:** this GPU and these requests come from the demo's simulator, not from your hardware.",
            icon=":material/science:",
        )
    st.caption(fmt.md_escape(hardware_line(hw)))
    line = facts_line(m)
    if line:
        st.caption(fmt.md_escape(line))
    for note in m.notes:
        st.caption(fmt.md_escape(note))
    if m.facts_error:
        st.info(fmt.md_escape(m.facts_error), icon=":material/info:")

    if m.requests_total == 0:
        how_to_make_requests(None if m.model == TYPICAL_MODEL_NAME else m.model)

    short = f"Readings timed over fewer than {MIN_RATE_TOKENS} tokens, and readings above their ceiling, are left out."
    c = st.columns(4)
    c[0].metric("Prefill, tok/s (median)", _num(m.prefill_median_tok_s),
                help="Prompt tokens per second, cache hits excluded. " + short)  # fmt: skip
    c[1].metric("Decode, tok/s (median)", _num(m.decode_median_tok_s),
                help="(output tokens − 1) ÷ eval_duration. " + short)  # fmt: skip
    c[2].metric("Prefill ÷ decode", w.times(m.ratio) if m.ratio else "—", help="How many times faster prompts are read.")
    expected = m.expected_ratio
    c[3].metric("Expected ratio", w.times(expected) if expected else "—",
                help="Expected prefill ÷ decode for the same prompt lengths and contexts as the measured requests "
                "(the medians of the expected line at each of them).")  # fmt: skip

    st.plotly_chart(m.prefill_fig, key="why_prefill", config={"displaylogo": False})
    if m.prefill_note:
        st.caption(m.prefill_note)
    if m.embed_sentence:
        text(m.embed_sentence)
    st.plotly_chart(m.decode_fig, key="why_decode", config={"displaylogo": False})
    if m.decode_note:
        st.caption(m.decode_note)
    eff = m.efficiencies
    if eff is not None:
        pending = "" if eff.decode_samples and eff.prefill_samples else (
            f" A starting value gives way to the median of your own requests once {MIN_CALIBRATION_SAMPLES} of that kind are "
            "long enough to time well."
        )  # fmt: skip
        st.caption(
            fmt.md_escape(
                f"Expected lines: decode at {w.pct(eff.eta_bw)} of its ceiling ({eff.source_bw}), prefill at "
                f"{w.pct(eff.eta_compute)} of its ceiling ({eff.source_compute}).{pending}"
            )
        )
    st.caption(
        f"{len(m.prefill_points):,} prefill and {len(m.decode_points):,} decode points from every stored request of this "
        "model; one point per request."
    )
    if m.requests_total == 0:
        lab_link()

    if m.sentences:
        st.subheader("Why prefill is so much faster than decode")
        text(m.sentences[0])
        with st.container(border=True, key="why_explanation"):
            for sentence in m.sentences[1:]:
                text(sentence)

    # The worst event is already the explanation's last sentence; list the next ones.
    more = m.interference_sentences[1:] if m.sentences else m.interference_sentences
    if more:
        st.subheader("More interference measured here")
        for sentence in more:
            text(sentence)

    st.subheader("What held requests back")
    window = fmt.seconds(ctx.window_s)
    if not m.diagnosed_requests:
        st.caption(f"No finished requests of this model in the last {window} (the sidebar's window).")
    elif not m.diagnoses:
        st.success(f"Nothing held back the {m.diagnosed_requests:,} requests of the last {window}.", icon=":material/check:")
    else:
        st.caption(f"Over the {m.diagnosed_requests:,} finished requests of the last {window}, with the newest case's numbers:")
        with st.container(key="why_diagnoses"):
            for g in m.diagnoses:
                mark = ":material/warning:" if g.severity == Severity.WARNING else ":material/info:"
                head = f"{mark} **{g.requests:,} of {m.diagnosed_requests:,}** · {fmt.md_escape(g.what)}"
                st.markdown(f"{head}  \n{fmt.md_escape(g.latest)}")

    if m.energy_sentence:
        st.subheader("Energy per token")
        e = m.energy
        assert e is not None
        e1, e2 = st.columns(2)
        e1.metric("Per prompt token", f"{w.num(e.j_per_prompt_token or 0)} J")
        e2.metric("Per output token", f"{w.num(e.j_per_output_token or 0)} J")
        text(m.energy_sentence)


ctx = common.context()
st.title("Why")
st.caption("Why prompt tokens per second run so far ahead of output tokens per second, on this machine, in your numbers.")
status = data.load_status(ctx.db_path)
common.demo_banner(ctx, status)
common.ollama_down_panel(ctx, status)

models = model_choices(ctx.db_path)
if models is None:
    common.no_store_state(ctx)
    st.stop()
if not models:
    preview(ctx.db_path)
    st.stop()

model = st.selectbox(
    "Model", models, format_func=fmt.label, key="why_model", help="Models with recorded requests, newest first, then loaded ones."
)
why = build_why(ctx.db_path, model, time.time(), ctx.window_s, apple_chip=_apple_chip())
if why is None:
    common.no_store_state(ctx)
    st.stop()
show_why(why)
