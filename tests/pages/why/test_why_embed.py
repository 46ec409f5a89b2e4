"""Embedding throughput on the Why page: prefill-only work against the prefill ceiling at its own prompt length.

A fixture store (the collector's StoreWriter) holds PLAIN's generations and embed requests of the same model
(Ollama's embed reply: total_duration, load_duration, prompt_eval_count). The page states the embeddings'
rate and the ceiling at their median prompt length; the chart's ceiling line holds that very value there; the
embed points are their own trace; they set no generation median; one above its ceiling sets no axis range.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

from analysis import wording as w
from pages.why.figures import EMBED_NAME
from pages.why.view import build_why
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import (
    EMBEDS,
    IMPOSSIBLE,
    MODEL,
    PLAIN,
    build_store,
    embed_record,
    figures,
    open_why,
    page_text,
    trace,
)


def _store(data_dir: Path, now: float) -> None:
    build_store(data_dir, now, reqs=PLAIN)
    writer = StoreWriter(db_path(data_dir))
    try:
        for i, (prompt, prefill_ms) in enumerate([*EMBEDS, IMPOSSIBLE]):
            writer.write(PutRequest(embed_record(i, now, prompt, prefill_ms)))
    finally:
        writer.close()


def _stated(sentence: str) -> tuple[int, float, float]:
    """(prompt tokens, measured tok/s, ceiling tok/s) as the embed sentence states them."""
    m = re.search(
        r"At ([\d,]+) prompt tokens \(their median\) they ran at ([\d,.]+) tok/s .*? the ([\d,.]+) tok/s prefill "
        r"ceiling there",
        sentence,
    )
    assert m is not None, sentence
    return int(m[1].replace(",", "")), float(m[2].replace(",", "")), float(m[3].replace(",", ""))


def test_embeddings_are_prefill_only_work_against_the_ceiling_at_their_prompt_length(data_dir: Path) -> None:
    now = time.time()
    _store(data_dir, now)
    m = build_why(db_path(data_dir), MODEL, now)
    assert m is not None and m.embed is not None and m.embed_sentence is not None
    print("\n" + m.embed_sentence)
    tokens, rate, ceiling = _stated(m.embed_sentence)
    assert tokens == round(statistics.median(p for p, _ in EMBEDS))
    assert rate == float(w.num(statistics.median(p / (ms / 1e3) for p, ms in EMBEDS)).replace(",", ""))
    assert m.embed_sentence.startswith(f"{len(EMBEDS) + 1} embedding requests")

    fig = m.prefill_fig.to_plotly_json()
    line = trace(fig, "ceiling")
    at = dict(zip(line["x"], line["y"], strict=True))
    assert tokens in at, "the stated prompt length is a point of the line"
    assert w.tok_s(at[tokens]) == w.tok_s(ceiling), (at[tokens], ceiling)

    dots = trace(fig, EMBED_NAME.split(" (")[0])
    assert dots["marker"]["symbol"] == "diamond" and sorted(dots["x"]) == sorted(p for p, _ in EMBEDS)
    # Not in the generations' readings: the median is PLAIN's alone; the impossible one sets no range.
    embed_ids = {f"embed{i}" for i in range(len(EMBEDS) + 1)}
    assert not embed_ids & {r.request_id for r in m.prefill_points}
    top = fig["layout"]["yaxis"]["range"][1]
    assert top < IMPOSSIBLE[0] / (IMPOSSIBLE[1] / 1e3)
    impossible = trace(fig, "cannot be true")
    assert IMPOSSIBLE[0] in impossible["x"]


def test_the_page_states_it_under_the_prefill_chart(data_dir: Path) -> None:
    now = time.time()
    _store(data_dir, now)
    at = open_why()
    text = page_text(at)
    sentence = next(s for s in text.splitlines() if "embedding requests" in s)
    tokens, _rate, ceiling = _stated(sentence)
    chart = figures(at)["Prefill"]
    line = trace(chart, "ceiling")
    assert w.tok_s(dict(zip(line["x"], line["y"], strict=True))[tokens]) == w.tok_s(ceiling)
    assert any(t.get("name") == EMBED_NAME for t in chart["data"])
    assert text.count(sentence) == 1
