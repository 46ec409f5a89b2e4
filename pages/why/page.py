"""Why: prefill against decode for the selected model on this GPU, each rate set against its ceiling.

Everything is built by ``pages.why.view.build_why``; this file only lays it out. Sentences
carry model and GPU names, so they go through ``st.text`` or escaped Markdown, never HTML.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from analysis import wording as w
from analysis.ceilings import MIN_CALIBRATION_SAMPLES, MIN_RATE_TOKENS
from analysis.diagnose import Severity
from analysis.hardware import BY_KEY
from analysis.memory import KV_TYPE_BYTES, KV_TYPES_NEEDING_FLASH_ATTN, RunnerSettings, SettingsError
from analysis.model_facts import TYPICAL_8B_Q4_K_M, TYPICAL_MODEL_NAME
from analysis.records import InstalledModel
from pages.shared import common, fmt
from pages.shared.window import window_words
from pages.why import whatif
from pages.why.figures import points_note
from pages.why.report import build_report
from pages.why.view import (
    WhyModel,
    build_why,
    facts_line,
    hardware_line,
    model_choices,
    preview_choices,
)

LAB_PAGE = "pages/lab/page.py"


def _num(value: float | None) -> str:
    return w.num(value) if value else "—"


def text(sentence: str) -> None:
    """A sentence with names in it, as literal text in the page's normal font; cut if a name made it long."""
    st.markdown(fmt.md_escape(fmt.label(sentence, fmt.SENTENCE_MAX_CHARS)))


def how_to_make_requests(model: str | None) -> None:
    who = f"for {fmt.md_escape(fmt.label(model))} " if model else ""
    st.info(
        f"**No requests {who}recorded yet.** Send a few prompts of different lengths with any client (one that talks "
        "to Ollama directly is recorded from its runner, with no change to it; pointed at the proxy, its client-side "
        "times are recorded too); each one becomes a point on the charts below, or run an experiment on the Lab page.",
        icon=":material/hourglass_empty:",
    )
    common.point_clients(ctx)


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
        "GPU",
        ["the one detected here", *keys],
        key="why_gpu",
        format_func=lambda k: k if k == "the one detected here" else f"{BY_KEY[k].name} ({k})",
        help="Pick a GPU from Phasewatch's hardware table to see its ceilings.",
    )
    spec = BY_KEY.get(picked)
    choices = preview_choices(db, spec)
    if choices is None:
        common.no_store_state(ctx)
        st.stop()
    if not choices.offered:
        why = build_why(db, TYPICAL_MODEL_NAME, time.time(), ctx.window_s, preview=(spec, TYPICAL_8B_Q4_K_M))
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
            "Model",
            names,
            index=names.index(choices.default) if choices.default in by_name else 0,
            key="why_preview_model",
            format_func=lambda n: fmt.label(_installed_label(by_name[n]), fmt.SENTENCE_MAX_CHARS),
            help=f"The models Ollama has installed (ollama list), newest first; it starts on the largest{fits}.",
        )
        why = build_why(db, model, time.time(), ctx.window_s, preview=(spec, None))
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
    if choices.cloud:
        st.caption(
            fmt.md_escape(f"Left out: {', '.join(choices.cloud)} (cloud: runs on ollama.com, so no ceiling of this GPU applies).")
        )
    show_why(why)


def show_why(m: WhyModel) -> None:
    _show_window(m)
    _show_sources(m)
    if m.requests_total == 0:
        how_to_make_requests(None if m.model == TYPICAL_MODEL_NAME else m.model)
    _show_medians(m)
    _show_charts(m)
    if m.requests_total == 0:
        lab_link()
    _show_explanation(m)
    _show_diagnoses(m)
    _show_energy(m)
    _show_whatif(m)


def _show_window(m: WhyModel) -> None:
    """Which requests every number comes from; when the sidebar's window held none, that it moved and where to."""
    win = m.window
    if win is None or not win.moved:
        return
    st.info(
        fmt.md_escape(
            f"No request of {fmt.label(m.model)} finished in the last {fmt.seconds(win.length_s)}: every number below comes "
            f"from {window_words(win)} (the newest request and those before it). Pick a longer window in the sidebar "
            "to see more."
        ),
        icon=":material/history:",
    )


def _show_sources(m: WhyModel) -> None:
    """Where the hardware and model figures come from, and what is simulated or missing."""
    if m.simulated:
        st.info(
            "**Simulated data:** this GPU and these requests come from the demo's simulator, not from your hardware.",
            icon=":material/science:",
        )
    st.caption(fmt.md_escape(hardware_line(m.hardware)))
    if m.viewer_note:
        st.caption(fmt.md_escape(m.viewer_note))
    line = facts_line(m)
    if line:
        st.caption(fmt.md_escape(line))
    for note in m.notes:
        st.caption(fmt.md_escape(note))
    for doubt in m.doubts:  # most readings contradict an input: said before any figure computed from it
        st.warning(fmt.md_escape(doubt.text), icon=":material/help:")
    if m.facts_error:
        st.info(fmt.md_escape(m.facts_error), icon=":material/info:")


def _show_medians(m: WhyModel) -> None:
    short = f"Readings timed over fewer than {MIN_RATE_TOKENS} tokens, and readings above their ceiling, are left out."
    c = st.columns(4)
    c[0].metric(
        "Prefill, tok/s (median)", _num(m.prefill_median_tok_s), help="Prompt tokens per second, cache hits excluded. " + short
    )
    c[1].metric("Decode, tok/s (median)", _num(m.decode_median_tok_s), help="(output tokens − 1) ÷ eval_duration. " + short)
    c[2].metric("Prefill ÷ decode", w.times(m.ratio) if m.ratio else "—", help="How many times faster prompts are read.")
    prior = m.expected_ratio
    c[3].metric(
        "Prior ratio",
        w.times(prior) if prior else "—",
        help="Prefill ÷ decode expected from first principles and the hardware table alone (never fitted to your "
        "readings), for the same prompt lengths and contexts as the measured requests.",
    )


def _show_charts(m: WhyModel) -> None:
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
        pending = (
            ""
            if eff.decode_samples and eff.prefill_samples
            else (
                f" A starting value gives way to the median of your own requests once {MIN_CALIBRATION_SAMPLES} of that kind are "
                "long enough to time well."
            )
        )
        st.caption(
            fmt.md_escape(
                "Expected lines: decode at "
                + (
                    f"{w.pct(eff.eta_bw)} of its ceiling ({eff.source_bw})"
                    if eff.fixed_s_per_token <= 0
                    else f"the bytes at {w.pct(eff.eta_bw)} of the bandwidth ({eff.source_bw}) plus "
                    f"{w.secs(eff.fixed_s_per_token)} per token ({eff.source_fixed})"
                )
                + ", prefill at "
                f"{w.pct(eff.eta_compute)} of its ceiling ({eff.source_compute}).{pending}"
            )
        )
    where = window_words(m.window) if m.window else "the window"
    st.caption(points_note({"prefill": len(m.prefill_points), "decode": len(m.decode_points)}, where))


def _show_explanation(m: WhyModel) -> None:
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


def _show_diagnoses(m: WhyModel) -> None:
    st.subheader("What held requests back")
    window = window_words(m.window) if m.window else f"the last {fmt.seconds(ctx.window_s)}"
    if not m.diagnosed_requests:
        st.caption(f"No finished requests of this model in {window}.")
    elif not m.diagnoses:
        st.success(f"Nothing held back the {fmt.count(m.diagnosed_requests)} requests of {window}.", icon=":material/check:")
    else:
        st.caption(f"Over the {fmt.count(m.diagnosed_requests)} finished requests of {window}, with the newest case's numbers:")
        with st.container(key="why_diagnoses"):
            for g in m.diagnoses:
                mark = ":material/warning:" if g.severity == Severity.WARNING else ":material/info:"
                head = f"{mark} **{fmt.count(g.requests)} of {fmt.count(m.diagnosed_requests)}** · {fmt.md_escape(g.what)}"
                st.markdown(f"{head}  \n{fmt.md_escape(g.latest)}")


def _show_energy(m: WhyModel) -> None:
    e = m.energy
    if not m.energy_sentence or e is None:
        return
    st.subheader("Energy per token")
    e1, e2 = st.columns(2)
    # Unknown is shown as unknown, never as 0 J.
    e1.metric("Per prompt token", "—" if e.j_per_prompt_token is None else f"{w.num(e.j_per_prompt_token)} J")
    e2.metric("Per output token", "—" if e.j_per_output_token is None else f"{w.num(e.j_per_output_token)} J")
    text(m.energy_sentence)


def _calibrated_error(m: WhyModel) -> str:
    """The what-if's rates come from the calibrated model: its measured error on readings it was not fitted on."""
    h = m.story.held_out_error("decode") if m.story is not None else None
    if h is None:
        return "the calibrated model's error not measured yet"
    return f"the calibrated model was off by a median of {w.pct(h.median_abs_error)} on {fmt.count(h.readings)} later requests"


def _show_whatif(m: WhyModel) -> None:
    """Other settings, predicted before trying them: memory, fit, rates, and the changes worth making."""
    st.subheader("What if")
    if m.hardware.spec is None or m.facts is None:
        st.caption("Predictions need this GPU's and this model's figures (see above).")
        return
    force = whatif.in_force(m)
    st.markdown("**Settings in force**, and where each comes from:")
    # The table wraps its cells at spaces and hyphens: a date keeps its hyphens unbroken ("2026- / 12-07" at 1280 px).
    rows = [{"setting": r.name, "value": r.value, "from": fmt.unbroken_dates(r.source)} for r in force.rows]
    table = pd.DataFrame(rows)
    with st.container(key="why_in_force"):
        st.table(table.set_index("setting"))  # a small static table: its text is in the page, not drawn on a canvas
    st.caption(fmt.md_escape(f"GPU memory for it: {force.free_vram_source}. Pick other settings below to see their effect."))
    key = f"whatif_{hashlib.sha256(m.model.encode('utf-8', 'replace')).hexdigest()[:16]}"  # the name can be any length
    c = st.columns(5)
    ctx_choices = sorted({*whatif.NUM_CTX_CHOICES, force.settings.num_ctx})
    num_ctx = c[0].selectbox(
        "num_ctx",
        ctx_choices,
        index=ctx_choices.index(force.settings.num_ctx),
        key=key + "_ctx",
        format_func=fmt.count,
        help="Context per request (Ollama's num_ctx)",
    )
    kv_types = sorted({"f16", "q8_0", "q4_0", force.settings.kv_type}, key=lambda t: -KV_TYPE_BYTES.get(t, 0))
    kv_type = c[1].selectbox(
        "KV cache type", kv_types, index=kv_types.index(force.settings.kv_type), key=key + "_kv", help="OLLAMA_KV_CACHE_TYPE"
    )
    flash = c[2].toggle("Flash attention", value=force.settings.flash_attn, key=key + "_fa", help="OLLAMA_FLASH_ATTENTION")
    parallel = int(
        c[3].number_input(
            "num_parallel",
            1,
            16,
            force.settings.num_parallel,
            key=key + "_np",
            help="Requests served at once (OLLAMA_NUM_PARALLEL)",
        )
    )
    quants = whatif.quant_choices(force.quantization)
    now_q = (force.quantization or quants[0]).upper()
    quant = c[4].selectbox("Quantization", quants, index=quants.index(now_q) if now_q in quants else 0, key=key + "_q")
    if kv_type in KV_TYPES_NEEDING_FLASH_ATTN and not flash:
        st.warning(f"A {kv_type} KV cache needs flash attention: Ollama turns it back to f16 without it.")
        kv_type = "f16"
    kv_type = kv_type if kv_type in KV_TYPE_BYTES else "f16"
    picked = RunnerSettings(num_ctx, parallel, kv_type, flash, force.settings.ubatch_tokens)
    try:
        result = whatif.build_whatif(m, picked, quant)
    except (SettingsError, ValueError) as e:
        st.error(fmt.md_escape(str(e)))
        return
    if result is None:
        return
    p, mem = result.picked, result.picked.memory
    work = result.workload
    if mem.fits is None:
        fit = "runs in system memory"
    elif mem.fits:
        fit = "fits in GPU memory"
    else:
        on_gpu = f"{mem.layers_on_gpu} of {mem.layers} layers on the GPU"
        fit = f"does not fit: {w.gb(mem.spill_bytes)} spill to system memory ({on_gpu})"
    m1, m2, m3, m4, m5 = st.columns(5)
    m1.metric("Memory", w.gb(mem.total_bytes), help=fit)
    m2.metric("Prefill, tok/s", w.num(p.prefill_tok_s), help=f"For your median prompt, {fmt.count(work.prompt_tokens)} tokens")
    m3.metric("Decode, tok/s", w.num(p.decode_tok_s), help=f"At your median context, {fmt.count(work.context_tokens)} tokens")
    prompts = f"{fmt.count(work.prompt_tokens)} and {fmt.count(work.prompt_p90_tokens)} tokens"
    m4.metric(
        "First token, s", f"{p.ttft_s():.2g} / {p.ttft_s(p90=True):.2g}", help=f"Reading your median and p90 prompts ({prompts})"
    )
    m5.metric(f"{parallel} at once, tok/s", w.num(p.concurrent_tok_s), help="All streams together")
    loaded = result.loaded
    said = (
        f"{w.gb(loaded.total_bytes)} loaded by the runner's own load lines (weights {w.gb(loaded.weights_bytes)}, KV cache "
        f"{w.gb(loaded.kv_bytes)}, buffers {w.gb(loaded.compute_bytes)}), "
        if loaded is not None
        else ""
    )
    text(
        f"With these settings {m.model} {fit}: weights {w.gb(mem.weights_bytes)}, KV cache {w.gb(mem.kv_bytes)}, "
        f"buffers {w.gb(mem.compute_bytes + mem.output_bytes)}. Now: {said}predicted "
        f"{w.gb(result.now.memory.total_bytes)} for the settings in force, decode {w.num(result.now.decode_tok_s)} tok/s "
        f"({_calibrated_error(m)})."
    )
    st.plotly_chart(whatif.memory_figure(result), key="why_whatif_memory", config={"displaylogo": False})
    st.caption("Rates from the same ceiling model as the charts above, at the share of it your requests reach.")
    if result.suggestions:
        st.markdown("**Changes predicted to help** (each alone, from the settings in force):")
        with st.container(key="why_suggestions"):
            for sug in result.suggestions[:5]:
                text(f"• {sug.sentence}")
    else:
        st.caption("No single change of these settings is predicted to help by more than 10%.")


ctx = common.context()
st.title("Why")
st.caption("Why prompt tokens per second run so far ahead of output tokens per second, on this machine, in your numbers.")
status = common.page_status(ctx)  # the reading the sidebar drew this run
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
why = build_why(ctx.db_path, model, time.time(), ctx.window_s)
if why is None:
    common.no_store_state(ctx)
    st.stop()
show_why(why)


def show_report(data_dir: Path) -> None:
    """The report to paste into an issue or a forum post (pages/why/report.py): st.code gives it a copy button."""
    st.subheader("A report to paste")
    st.caption(
        "Ollama's version and settings, the GPU, rates against ceilings, loads and flags over the last 24 h. "
        "No prompt or reply, no path but the data folder's name, no address beyond loopback. "
        "Also: python -m pages.report --data DIR [--since 24h]."
    )
    # Built on demand: it diagnoses every model of the last 24 h, too much for each rerun of the page.
    if st.toggle("Show the report", key="why_report"):
        text = build_report(data_dir)
        # Wrapped at spaces, never scrolled sideways: its long lines (the GPU's) were cut at the block's edge.
        st.code(text or "No store yet.", language=None, wrap_lines=True)


show_report(ctx.data_dir)
