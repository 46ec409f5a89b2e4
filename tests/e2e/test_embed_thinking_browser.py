"""In a real browser: Why with embedding points (their own diamonds and sentence) and a thinking reply's Requests
detail (its story names the thinking and both first tokens). Screenshots ``why_embed.png`` and
``requests_thinking.png``."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from playwright.sync_api import Page

from pages.why.figures import EMBED_NAME
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.e2e.support import run_app, screenshot, wait_ready, wait_until
from tests.support.why_page import EMBEDS, IMPOSSIBLE, PLAIN, build_store, embed_record

pytestmark = pytest.mark.browser


def _store(data_dir: Path) -> str:
    """PLAIN's generations, embed requests of the same model, and one reply that thought; the thinking reply's id."""
    now = time.time()
    recs = build_store(data_dir, now, reqs=PLAIN)
    thinker = next(r for r in recs if len(r.token_chunk_ns) >= 100)
    k = len(thinker.token_chunk_ns) * 2 // 3
    c = thinker.token_chunk_ns
    w_ = StoreWriter(db_path(data_dir))
    try:
        for i, (prompt, prefill_ms) in enumerate([*EMBEDS, IMPOSSIBLE]):
            w_.write(PutRequest(embed_record(i, now, prompt, prefill_ms)))
        w_.write(PutRequest(replace(thinker, thinking_chunks=k, last_thinking_ns=c[k - 1], first_answer_ns=c[k])))
    finally:
        w_.close()
    return thinker.id


def test_why_embed_points_and_a_thinking_detail(page: Page, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    thinker = _store(data_dir)
    with run_app(data_dir, tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.set_viewport_size({"width": 1400, "height": 3600})
        page.goto(url + "/why")
        wait_ready(page)
        main = page.locator('[data-testid="stMain"]')
        wait_until(lambda: "embedding requests" in main.inner_text(), 60, "the embeddings sentence")
        wait_until(lambda: page.locator(".js-plotly-plot").count() >= 2, 30, "both charts")
        legend = page.evaluate(
            """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(gd => (gd.data || []).map(t => t.name))"""
        )
        assert EMBED_NAME in legend
        text = main.inner_text()
        assert "thought before answering" in text and "prefill-only work" in text
        screenshot(page, "why_embed")

        page.goto(url + f"/requests?request={thinker}")
        wait_ready(page)
        wait_until(lambda: "The model thought before it answered" in main.inner_text(), 60, "the thinking sentence")
        text = main.inner_text()
        assert "thinking tokens cost decode time like any other" in text and "first answer token after" in text
        screenshot(page, "requests_thinking")
        assert page.locator('[data-testid="stException"]').count() == 0
