"""The Live page's cards and "now" strip: store → view-model (``build_cards``, no Streamlit) and drawing (``show_*``).

Cards are drawn as text and Streamlit's own progress bars: no chart per card, so a card costs the server and
the browser little each second. Model names, client addresses and replies are shown literally (``st.text`` or
Markdown-escaped); a reply appears only when the collector records text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from analysis.accelerator import resolve_hardware
from analysis.ceilings import ceilings_for, vram_fraction
from analysis.model_facts import ModelFactsError, model_facts_from_show
from analysis.model_names import value_for_model
from pages.live.cards import Card, DecodeCeiling, LoadContext, NowStrip, finished_cards, in_flight_cards, now_strip
from pages.shared import data, fmt

PHASE_MD_COLOURS = {"queue": "gray", "load": "violet", "prefill": "blue", "decode": "green"}
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


@dataclass(frozen=True)
class CardsModel:
    cards: list[Card]  # running first (oldest first), then the finished ones still shown
    strip: NowStrip
    record_text: bool
    requests_in_window: int
    now_unix_s: float
    chars_measured: dict[str, bool] = field(default_factory=dict)
    last_load_s: dict[str, float] = field(default_factory=dict)

    @property
    def running(self) -> int:
        return sum(1 for c in self.cards if c.phase != "finished")

    def signature(self) -> tuple[object, ...]:
        """Changes whenever what the cards show changes (the page redraws less when it does not)."""
        return tuple((c.request_id, c.phase, c.tokens_so_far, c.prefill) for c in self.cards)


def decode_ceiling_fn(snap: data.CardsSnapshot) -> DecodeCeiling:
    """The decode ceiling for a model at a context length, on the GPU of the latest sample (None: unknown)."""
    hw = resolve_hardware(snap.gpu) if snap.gpu is not None else None
    loaded = {m.name: m for m in snap.loaded} | {m.model: m for m in snap.loaded}

    def ceiling(model: str, context_tokens: int) -> float | None:
        show = snap.shows.get(model)
        if hw is None or hw.spec is None or show is None:
            return None
        try:
            facts = model_facts_from_show(show, None)
        except ModelFactsError:
            return None
        m = value_for_model(loaded, model)
        frac = vram_fraction(m.size_bytes, m.size_vram_bytes) if m else 1.0
        c = ceilings_for(
            hw.spec,
            facts,
            context_tokens=context_tokens,
            prompt_tokens=context_tokens,
            vram_fraction=frac,
            bandwidth_bytes_s=hw.bandwidth_bytes_s,
        )
        return c.decode_ceiling_tok_s

    return ceiling


def build_cards(db: Path, now_unix_s: float, window_s: float) -> CardsModel | None:
    snap = data.load_cards(db, now_unix_s, window_s)
    if snap is None:
        return None
    loaded = {name: m.context_length for m in snap.loaded for name in (m.name, m.model)}
    loads = LoadContext(snap.loaded_since, snap.model_size_bytes, snap.vram_free_bytes)
    running = in_flight_cards(snap.in_flight, snap.progress, loaded, now_unix_s, decode_ceiling_fn(snap), loads)
    done = finished_cards(snap.recent, now_unix_s)
    strip = now_strip(running, snap.recent, now_unix_s)
    return CardsModel(
        running + done, strip, snap.record_text, snap.requests_in_window, now_unix_s, snap.chars_measured, snap.last_load_s
    )


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
    for name in ("queue", "load", "prefill", "decode"):
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
    cols[0].metric("Generations in flight", model.running)
    cols[1].metric("Generations waiting", strip.waiting, help="Queued for a slot, or waiting for their model to load.")
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
    cols[5].metric("Requests in window", model.requests_in_window, help="Requests that started in the sidebar's time window.")
    with st.container(key="live_updated"):
        st.caption(f"Updated {fmt.clock(model.now_unix_s)}")


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
        size = f"{card.prompt_chars:,} characters × {per_char:.2f} tokens per character ({how})"
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
        return f"Position {card.queue_position} in the queue, waiting for {waits_for or 'a slot'}: {so_far}."
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
        if card.direct:
            return "The runner took it; no reading of its progress yet."
        return "No token yet and no progress reading: it waits for a slot or reads its prompt."
    return None


def show_card(card: Card, record_text: bool, chars_measured: bool | None = None, last_load_s: float | None = None) -> None:
    model = fmt.md_escape(fmt.label(card.model or "unknown model"))  # cut and escaped, as in wait_caption
    with st.container(border=True, key=f"card_{card.request_id}"):
        direct = ":orange-badge[direct] " if card.direct else ""
        st.markdown(
            f"{direct}**{model}** · {fmt.md_escape(fmt.label(card.client))} · "
            f"{fmt.md_escape(fmt.label(card.endpoint))} — **{PHASE_WORDS.get(card.phase, card.phase)}** · "
            f"{fmt.seconds(card.state_s if card.state_s is not None else card.elapsed_s)}"
        )
        waiting = wait_caption(card, last_load_s)
        if waiting is not None:
            st.caption(waiting)
        elif card.phase == "prefill" and card.prefill is not None:
            p = card.prefill
            of = f" of {p.prompt_tokens:,}" if p.prompt_tokens is not None else ""
            at_end = p.prompt_tokens is not None and p.processed_tokens >= p.prompt_tokens - 1
            eta = "any moment now" if p.estimated and at_end else fmt.seconds(p.eta_s)
            text = f"{p.processed_tokens:,}{of} prompt tokens read · {fmt.rate(p.rate_tok_s)} · ETA {eta}"
            text += estimate_note(card, chars_measured)
            st.progress(p.fraction if p.fraction is not None else 0.0, text=text)
        elif card.phase == "decoding":
            ctx = "—" if card.ctx_used_tokens is None else f"{card.ctx_used_tokens:,}"
            n_ctx = "—" if card.n_ctx is None else f"{card.n_ctx:,}"
            counted = " (the runner's count)" if card.direct else ""
            line = f"{card.tokens_so_far:,} tokens so far{counted} · {fmt.rate(card.live_tok_s)} now · context {ctx} of {n_ctx}"
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
                else:
                    caption = (
                        f"tok/s each second, last {len(card.spark_tok_s)} s (no decode ceiling known for this model and GPU)"
                    )
                st.image(svg, caption=caption, width=SPARK_WIDTH_PX)
            if card.reply_text and record_text:
                with st.container(height=120, key=f"reply_{card.request_id}"):
                    st.text(card.reply_text[-4000:])
        elif card.phase == "finished":
            bar = phase_bar(card.phase_s)
            words = " · ".join(f"{name} {fmt.seconds(s)}" for name, s in card.phase_s.items())
            outcome = fmt.md_escape(fmt.label(card.outcome or "", fmt.SENTENCE_MAX_CHARS))
            st.markdown(f"{bar}  \n{outcome} · {card.tokens_so_far:,} tokens · {words}")
            st.page_link(
                REQUESTS_PAGE,
                label="Details in Requests",
                icon=":material/receipt_long:",
                query_params={"request": card.request_id},
            )
        if card.direct:
            st.caption(DIRECT_NOTE)
