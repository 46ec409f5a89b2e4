"""The Why page in Debian's Chromium over the whole path: sim → recording proxy → store → page.

Uses the dashboard's browser fixtures from ``tests/e2e/conftest.py`` (``stack``: sim with a simulated RTX 4090, the
collector in demo mode, ``streamlit run app.py``). Sends prompts of several lengths through
the proxy with the official ``ollama`` client, then checks that the page draws both charts
with their ceiling and expected lines and one point per request, and that the ratio
sentence quotes the medians the store holds. The screenshot is ``why.png`` under
``$PHASEWATCH_ARTIFACTS`` (default ``artifacts/``).
"""

from __future__ import annotations

import re
import statistics
import threading
from typing import Any

import ollama
import pytest
from playwright.sync_api import Page

from analysis import wording as w
from analysis.ceilings import MIN_DECODE_INTERVALS_FOR_CALIBRATION, MIN_PROMPT_TOKENS_FOR_CALIBRATION
from store import queries
from store.tables import RequestSummary
from tests.e2e.support import Stack, screenshot, wait_ready, wait_until  # fixtures: tests/e2e/conftest.py

pytestmark = pytest.mark.browser

MODEL = "llama3.2:latest"
PROMPT_WORDS = (40, 150, 400, 900, 1800, 3000)
REPLY_TOKENS = (40, 60, 80, 50, 70, 30)


def _send(stack: Stack) -> None:
    client = ollama.Client(host=f"http://{stack.proxy}", timeout=120)
    for words, reply in zip(PROMPT_WORDS, REPLY_TOKENS, strict=True):
        prompt = "Summarise this: " + " ".join(["quarterly revenue grew in every region"] * (words // 6 + 1))
        list(client.generate(model=MODEL, prompt=prompt, stream=True, options={"num_predict": reply, "num_ctx": 8192}))
    # Two at once: a long prompt arriving while another reply streams.
    long_prompt = "Read this: " + " ".join(["the committee reviewed the budget line by line"] * 600)
    streaming = threading.Event()

    def stream_reply() -> None:
        for i, _ in enumerate(client.generate(model=MODEL, prompt="Write a poem.", stream=True,
                                              options={"num_predict": 300, "num_ctx": 8192})):
            if i == 5:
                streaming.set()

    threads = [
        threading.Thread(target=stream_reply),
        threading.Thread(target=lambda: list(client.generate(model=MODEL, prompt=long_prompt, stream=True,
                                                             options={"num_predict": 20, "num_ctx": 8192}))),
    ]  # fmt: skip
    threads[0].start()
    # The long prompt must arrive while the reply streams (a fixed sleep can end before a busy machine starts it).
    assert streaming.wait(60)
    threads[1].start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()


def _store_rows(stack: Stack) -> list[RequestSummary]:
    conn = queries.open_readonly(stack.data_dir)
    try:
        return queries.rate_rows(conn, MODEL, 0.0)
    finally:
        conn.close()


def _store_ready(stack: Stack, n: int) -> bool:
    conn = queries.open_readonly(stack.data_dir)
    try:
        rows = queries.rate_rows(conn, MODEL, 0.0)
        return len(rows) >= n and queries.model_info(conn, MODEL) is not None and bool(queries.latest_loaded_models(conn))
    finally:
        conn.close()


def _charts(page: Page) -> dict[str, Any]:
    """Each Plotly chart's title → its traces' names, point counts and markers drawn, as the browser has them."""
    charts: list[dict[str, Any]] = page.evaluate("""() => Array.from(document.querySelectorAll(
        '[data-testid="stPlotlyChart"] .js-plotly-plot')).map(gd => ({
            title: (gd.layout.title && gd.layout.title.text) || '',
            traces: gd._fullData.map((t, i) => ({name: t.name, n: t._length,
                drawn: (gd.querySelectorAll('.scatterlayer .trace')[i] || gd).querySelectorAll('.point').length})),
            legend: Array.from(gd.querySelectorAll('.legendtext')).map(e => e.textContent)}))""")
    # Streamlit's theme wraps titles in <b>; the key is the plain text before the colon.
    return {re.sub(r"<[^>]+>", "", c["title"]).split(":")[0]: c for c in charts}


def test_why_page_in_the_browser(stack: Stack, page: Page) -> None:
    _send(stack)
    n_requests = len(PROMPT_WORDS) + 2
    wait_until(lambda: _store_ready(stack, n_requests), 60, "the requests, model facts and /api/ps in the store")

    page.set_viewport_size({"width": 1400, "height": 3600})  # the whole page in one screenshot
    page.goto(stack.app_url)
    wait_ready(page)
    # Through the navigation, as a user does: opening /why directly makes Streamlit 1.67 run pages/why.py
    # on its own as an old-style page from the pages/ folder, without app.py's sidebar.
    page.locator('[data-testid="stSidebarNav"] a', has_text="Why").click()
    wait_ready(page)
    main = page.locator('[data-testid="stMain"]')
    wait_until(lambda: "faster than decode." in main.inner_text(), 60, "the ratio sentence")
    wait_until(lambda: len(_charts(page)) >= 2, 30, "both charts")
    shot = screenshot(page, "why")
    assert shot.stat().st_size > 20_000

    text = main.inner_text()
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "Simulated data" in text and "Demo mode" in text
    assert "Simulated NVIDIA GeForce RTX 4090" in text and "table row rtx-4090" in text

    charts = _charts(page)
    rows = _store_rows(stack)
    assert {"Prefill", "Decode"} <= set(charts), charts
    for title, kind in (("Prefill", "memory, then compute"), ("Decode", "memory bandwidth")):
        names = {t["name"]: t["n"] for t in charts[title]["traces"]}
        measured = next(t for t in charts[title]["traces"] if t["name"] == "measured (one per request)")
        assert measured["n"] == measured["drawn"] == len(rows)  # one marker drawn per stored request
        assert names[next(k for k in names if k.startswith(f"ceiling ({kind}"))] >= 20
        assert any(k.startswith("expected (") for k in names)
        legend = " ".join(charts[title]["legend"])
        assert "ceiling" in legend and "expected" in legend and "measured" in legend

    # The ratio sentence quotes the store's medians (requests long enough to time well).
    prefill = [
        r.prefill_tok_s
        for r in rows
        if r.prefill_tok_s and (r.prompt_tokens or 0) - (r.cached_tokens or 0) >= MIN_PROMPT_TOKENS_FOR_CALIBRATION
    ]
    decode = [r.decode_tok_s for r in rows
              if r.decode_tok_s and (r.output_tokens or 0) - 1 >= MIN_DECODE_INTERVALS_FOR_CALIBRATION]  # fmt: skip
    pp, tg = statistics.median(prefill), statistics.median(decode)
    sentence = next(line for line in text.splitlines() if line.startswith("On your") and "faster than decode" in line)
    assert w.tok_s(pp) in sentence and w.tok_s(tg) in sentence and w.times(pp / tg) in sentence
    assert "one token at a time" in text and "time to first token" in text
    assert "What held requests back" in text
