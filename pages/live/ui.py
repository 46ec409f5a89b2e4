"""The Live page's drawing (Streamlit): the cards and "now" strip, the GPU timeline, loaded models and host, from
the view-models of ``pages/live/view.py``.

Cards are drawn as text and Streamlit's own progress bars: no chart per card, so a card costs the server and
the browser little each second. Model names, client addresses and replies are shown literally (``st.text`` or
Markdown-escaped); a reply appears only when the collector records text.
"""

from __future__ import annotations

import streamlit as st

from analysis.model_names import is_cloud
from analysis.records import UNIFIED_MEMORY_KINDS, UNIFIED_MEMORY_NOTE
from pages.live.cards import Card, PrefillView
from pages.live.queue import ModelQueue, queue_caption
from pages.live.view import BANDS_LIMIT, CardsModel, LiveModel
from pages.shared import fmt

# "behind others": another request's prompt read with a slot free; "before prefill": the runner's work or unexplained.
PHASE_MD_COLOURS = {
    "queue": "gray",
    "behind others": "red",
    "before prefill": "orange",
    "load": "violet",
    "prefill": "blue",
    "decode": "green",
}
PHASE_WORDS = {
    "queued": "waiting for a free slot",
    "other_load": "waiting for another model to load",
    "unload_wait": "waiting for another model to unload",
    "loading": "loading its model",
    "waiting": "waiting for a slot or reading the prompt",
    "prefill": "reading the prompt (prefill)",
    "decoding": "writing the reply (decode)",
    "finished": "finished",
}
REQUESTS_PAGE = "pages/requests/page.py"
DIRECT_NOTE = (
    "Sent to Ollama directly, seen from its runner: the model, the prompt read, the tokens written and their rate. "
    "Only the proxy adds the client's own time to first token, every gap between tokens and the client's address."
)
SPARK_WIDTH_PX = 240
CLOUD_NO_CEILING = "a cloud model: it runs on ollama.com, so no ceiling of this machine applies"


def sparkline_svg(values: tuple[float, ...], ceiling: float | None, width: int = 240, height: int = 44) -> str | None:
    """tok/s per second as a small SVG line (numbers only: no text from elsewhere), with the ceiling as a dashed
    line on top when known; the vertical scale runs from 0 to the ceiling (else to the fastest second)."""
    if len(values) < 2:
        return None  # one point draws no line
    top = max(ceiling or 0.0, max(values), 1e-9)
    pad = 3
    n = len(values)
    step = (width - 2 * pad) / max(n - 1, 1)
    points = " ".join(f"{pad + k * step:.1f},{height - pad - (height - 2 * pad) * v / top:.1f}" for k, v in enumerate(values))
    ceiling_line = (
        f'<line x1="0" y1="{pad}" x2="{width}" y2="{pad}" stroke="#ef5350" stroke-width="1.5" stroke-dasharray="4 3"/>'
        if ceiling
        else ""
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="none" stroke="#8888" />{ceiling_line}'
        f'<polyline points="{points}" fill="none" stroke="#66bb6a" stroke-width="2"/></svg>'
    )


def phase_bar(phase_s: dict[str, float], width: int = 40) -> str:
    """The phases as one bar of coloured blocks in proportion to their durations (Streamlit Markdown colours)."""
    total = sum(phase_s.values())
    if total <= 0:
        return ""
    parts = []
    for name in ("queue", "behind others", "before prefill", "load", "prefill", "decode"):
        n = round(width * phase_s.get(name, 0.0) / total)
        if phase_s.get(name, 0.0) > 0:
            n = max(n, 1)  # a phase that happened is always visible
        if n:
            parts.append(f":{PHASE_MD_COLOURS[name]}[{'█' * n}]")
    return "".join(parts)


def _share(rate: float | None, ceiling: float) -> str:
    return "now —" if rate is None else f"now {100 * rate / ceiling:.0f}% of it"


def _tok_s(rate: float | None) -> str:
    """A rate in a narrow metric: the unit is in its label."""
    if rate is None:
        return "—"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}"


def show_strip(model: CardsModel) -> None:
    """One row: what runs, what waits, tokens in and out now, and how the last minute's GPU time split."""
    strip = model.strip
    cols = st.columns(6)
    cols[0].metric("Generations in flight", fmt.count(model.running))
    cols[1].metric("Generations waiting", fmt.count(strip.waiting), help="Queued for a slot, or waiting for their model to load.")
    cols[2].metric(
        "Prompt tok/s in",
        _tok_s(strip.prefill_tok_s),
        help="Prefill: prompt tokens read per second now, summed over the generations reading a prompt.",
    )
    cols[3].metric(
        "Reply tok/s out",
        _tok_s(strip.decode_tok_s),
        help="Decode: reply tokens written per second now, summed over the generations writing one.",
    )
    share = "—" if strip.prefill_share is None else f"{100 * strip.prefill_share:.0f} / {100 * (strip.decode_share or 0):.0f}"
    cols[4].metric(
        "Prefill/decode %",
        share,
        help="Over the last minute: of the time generations spent reading prompts or writing replies, the share of each.",
    )
    cols[5].metric(
        "Requests in window", fmt.count(model.requests_in_window), help="Requests that started in the sidebar's time window."
    )
    if model.queues:
        with st.container(key="live_queues"):
            for line in queue_lines(model.queues):
                st.markdown(line)
    with st.container(key="live_updated"):
        st.caption(f"Updated {fmt.clock(model.now_unix_s)}")


def queue_lines(queues: list[ModelQueue]) -> list[str]:
    """One line per model with generations open now: how many run, how many wait, and its slots where known."""
    lines = []
    for q in queues:
        slots = (
            f"{q.slots.slots} slot{'s' if q.slots.slots != 1 else ''} ({q.slots.source})"
            if q.slots is not None
            else "slots not known (no runner read)"
        )
        name = fmt.md_escape(fmt.label(q.model))
        theirs = "" if q.ollama_queued is None else f" · Ollama's /metrics: {q.ollama_queued} queued"
        lines.append(f"**{name}** · {q.running} running · **{q.waiting} waiting** · {slots}{theirs}")
    return lines


def show_cards(model: CardsModel) -> None:
    if not model.cards:
        st.caption(
            "No generation is running. Each one gets a card here while it runs: those of clients that talk to Ollama "
            "directly (seen from its runner, with no change to them), and those sent through the proxy, which adds the "
            "client's own time to first token and every gap between tokens."
        )
        return
    for card in model.cards:
        show_card(card, model.record_text, model.chars_measured.get(card.model), model.last_load_s.get(card.model))


def estimate_note(card: Card, chars_measured: bool | None) -> str:
    """How the estimate came about, in the user's numbers."""
    p = card.prefill
    if p is None or not p.estimated:
        return ""
    if card.prompt_chars and p.prompt_tokens:
        per_char = p.prompt_tokens / card.prompt_chars
        how = (
            "measured on this model's requests"
            if chars_measured
            else "the default: no finished request of this model to measure it on yet"
        )
        size = f"{fmt.count(card.prompt_chars)} characters × {per_char:.2f} tokens per character ({how})"
    else:
        size = "the prompt's length"
    return f" · estimated from {size}, at this model's usual prefill rate"


def wait_caption(card: Card, last_load_s: float | None) -> str | None:
    """What a waiting card says it waits for, with the time in that state (None: the card does not wait).

    Names from clients and Ollama are cut (``fmt.label``) and escaped: literal, and short whatever arrives."""
    so_far = f"{fmt.seconds(card.state_s)} so far"
    model = fmt.md_escape(fmt.label(card.model))
    waits_for = fmt.md_escape(fmt.label(card.waits_for or "", fmt.SENTENCE_MAX_CHARS))
    if card.phase == "queued":
        line = queue_caption(card) or f"Position {card.queue_position} in the queue"
        return f"{line[0].upper()}{line[1:]}, for {waits_for or 'a slot'}: {so_far}."
    if card.phase == "other_load":
        return f"Waiting for {waits_for or 'another model'}: {so_far}."
    if card.phase == "unload_wait":
        room = ""
        if card.room_bytes is not None:
            need, free = card.room_bytes
            room = f" {model} needs at least {fmt.gb(need)}; {fmt.gb(free)} was free."
        return f"Waiting for {waits_for or 'another model'}: {so_far}.{room}"
    if card.phase == "loading":
        wait = f" Position {card.queue_position}, waiting for {waits_for}." if card.queue_position else ""
        last = f" Its last load took {fmt.seconds(last_load_s)}." if last_load_s is not None else ""
        if card.state_s is not None and card.elapsed_s - card.state_s >= 1.0:
            so_far += f" (it waited {fmt.seconds(card.elapsed_s - card.state_s)} before that)"
        return f"Ollama is loading {model} into memory: {so_far}.{last}{wait}"
    if card.phase == "waiting":
        if card.waits_for:
            return f"Waiting for {waits_for}: {so_far}."
        if card.direct:
            return "The runner took it; no reading of its progress yet."
        return "No token yet and no progress reading: it waits for a slot or reads its prompt."
    return None


def show_card(card: Card, record_text: bool, chars_measured: bool | None = None, last_load_s: float | None = None) -> None:
    model = fmt.md_escape(fmt.label(card.model or "unknown model"))  # cut and escaped, as in wait_caption
    with st.container(border=True, key=f"card_{card.request_id}"):
        direct = ":orange-badge[direct] " if card.direct else ""
        program = f" ({fmt.md_escape(fmt.label(card.program))})" if card.program is not None else ""  # a client's text
        st.markdown(
            f"{direct}**{model}** · {fmt.md_escape(fmt.label(card.client))}{program} · "
            f"{fmt.md_escape(fmt.label(card.endpoint))} — **{PHASE_WORDS.get(card.phase, card.phase)}** · "
            f"{fmt.seconds(card.state_s if card.state_s is not None else card.elapsed_s)}"
        )
        if card.slowed_by:  # another request's prompt read beside it now (pages.live.slowed)
            st.warning(fmt.md_escape(card.slowed_by), icon=":material/hourglass_top:")
        waiting = wait_caption(card, last_load_s)
        if waiting is not None:
            st.caption(waiting)
        elif card.phase == "prefill" and card.prefill is not None:
            _prefill_body(card, card.prefill, chars_measured)
        elif card.phase == "decoding":
            _decoding_body(card, record_text)
        elif card.phase == "finished":
            _finished_body(card)
        if card.direct:
            st.caption(DIRECT_NOTE)


def _prefill_body(card: Card, p: PrefillView, chars_measured: bool | None) -> None:
    """The prompt read so far, as a progress bar with its rate and ETA."""
    about = "~" if p.size_estimated else ""  # the size from the prompt's characters, until the runner says it
    of = f" of {about}{fmt.count(p.prompt_tokens)}" if p.prompt_tokens is not None else ""
    at_end = p.prompt_tokens is not None and p.processed_tokens >= p.prompt_tokens - 1
    eta = "any moment now" if p.estimated and at_end else fmt.seconds(p.eta_s)
    text = f"{fmt.count(p.processed_tokens)}{of} prompt tokens read · {fmt.rate(p.rate_tok_s)} · ETA {eta}"
    text += estimate_note(card, chars_measured)
    st.progress(p.fraction if p.fraction is not None else 0.0, text=text)


def _decoding_body(card: Card, record_text: bool) -> None:
    """Tokens so far, the rate now against the decode ceiling, and the reply's tail when text is recorded."""
    ctx, n_ctx = fmt.count(card.ctx_used_tokens), fmt.count(card.n_ctx)
    counted = " (the runner's count)" if card.counted_by_runner else ""
    so_far = f" · {fmt.rate(card.rate_so_far_tok_s)} so far" if card.rate_so_far_tok_s is not None else ""
    tokens = fmt.count(card.tokens_so_far)
    line = f"{tokens} tokens so far{counted} · {fmt.rate(card.live_tok_s)} now{so_far} · context {ctx} of {n_ctx}"
    if card.silent_s is not None:
        line += f" · no token for {card.silent_s:.0f} s"
    st.markdown(line)
    svg = sparkline_svg(card.spark_tok_s, card.decode_ceiling_tok_s)
    if svg is not None:
        if card.decode_ceiling_tok_s:
            ceiling = card.decode_ceiling_tok_s
            caption = (
                f"tok/s each second, last {len(card.spark_tok_s)} s; dashed: the decode ceiling for this model "
                f"at this context, {fmt.rate(ceiling)} ({_share(card.live_tok_s, ceiling)})"
            )
        elif is_cloud(card.model):
            caption = f"tok/s each second, last {len(card.spark_tok_s)} s ({CLOUD_NO_CEILING})"
        else:
            caption = f"tok/s each second, last {len(card.spark_tok_s)} s (no decode ceiling known for this model and GPU)"
        st.image(svg, caption=caption, width=SPARK_WIDTH_PX)
    if card.reply_text and record_text:
        with st.container(height=120, key=f"reply_{card.request_id}"):
            st.text(card.reply_text[-4000:])


def finished_line(card: Card) -> str:
    """ "ok · 20 tokens · prefill 0.1 s · decode 0.5 s": the outcome, tokens and each phase's time, only the parts
    known (a request that failed before any phase has none, and no dangling separator)."""
    outcome = fmt.md_escape(fmt.label(card.outcome or "", fmt.SENTENCE_MAX_CHARS))
    phases = [f"{name} {fmt.seconds(s)}" for name, s in card.phase_s.items()]
    return " · ".join(part for part in (outcome, f"{fmt.count(card.tokens_so_far)} tokens", *phases) if part)


def _finished_body(card: Card) -> None:
    """The phase bar, the outcome, a cut prompt's warning and the link to the request's details."""
    st.markdown(f"{phase_bar(card.phase_s)}  \n{finished_line(card)}")
    if card.runner_waits:  # the time before prefill, in the runner's own words (not a queue for a slot)
        st.caption(fmt.md_escape(fmt.label(f"before prefill, the runner: {card.runner_waits}", fmt.SENTENCE_MAX_CHARS)))
    if card.prompt_cut:
        st.warning(fmt.md_escape(card.prompt_cut), icon=":material/content_cut:")
    st.page_link(
        REQUESTS_PAGE,
        label="Details in Requests",
        icon=":material/receipt_long:",
        query_params={"request": card.request_id},
    )


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
    if model.bands_left_out:
        st.caption(
            f"Request phases: drawn for the newest {fmt.count(model.bands_drawn)} requests; "
            f"{fmt.count(model.bands_left_out)} older ones in the window are not drawn (a narrower window in the sidebar "
            "shows fewer requests, each wider)."
        )
    if model.direct_in_window:
        n = model.direct_in_window
        st.caption(
            f"{fmt.count(n)} generation{'s' if n != 1 else ''} in this window came to Ollama directly, not through the proxy: "
            "seen from its runner (the model, the prompt read, the tokens written, prefill and decode times). Pointing "
            "a client at the proxy adds its own time to first token, every gap between tokens and its address"
            + (":" if proxy_line else ".")
        )
        if proxy_line:  # none in the demo
            st.code(proxy_line, language="bash")
    if model.unexplained_checked_from_unix_s is not None:
        st.caption(
            f"GPU time is checked against the recorded generations from {fmt.clock(model.unexplained_checked_from_unix_s)} "
            f"on: the window holds more requests than the page reads (the newest {fmt.count(BANDS_LIMIT)}), so the GPU's "
            "earlier busy time is neither explained nor called unexplained. A narrower window in the sidebar checks all of it."
        )
    if model.unexplained:
        total_s = sum(u.duration_s for u in model.unexplained)
        last = model.unexplained[-1]
        st.warning(
            f"The GPU was busy for {fmt.seconds(total_s)} with no generation recorded, neither through the proxy nor "
            f"from Ollama's runner (last at {fmt.clock(last.start_unix_s)}–{fmt.clock(last.end_unix_s)}). Another "
            "program used the GPU, or the runner could not be read (the sidebar says why). A client pointed at the "
            "proxy is recorded whatever the runner shows" + (":" if proxy_line else "."),
            icon=":material/visibility_off:",
        )
        if proxy_line:  # none in the demo
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
        # A static table, not st.dataframe: its canvas cut headers and values at 1280 px ("quantizati…", the
        # placement note); here each cell wraps at its spaces and the row grows instead (issue 42).
        st.table(model.models_table.astype(object).fillna("—"), hide_index=True)
        if model.models_figure is not None:
            st.plotly_chart(model.models_figure, key="live_models_fig", config={"displaylogo": False})

    st.subheader("Host")
    if model.host_figure is not None:
        st.plotly_chart(model.host_figure, key="live_host", config={"displaylogo": False})
    else:
        st.caption("No host samples in this window yet.")
