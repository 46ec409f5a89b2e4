"""Why's "What if" section in Debian's Chromium: change num_ctx, num_parallel and the KV type, see fit and rates move.

sim (a simulated RTX 4090, 24 GiB) serves llama3.1:8b loaded with an 8,192-token context through the recording
proxy; the section starts from that context (read from /api/ps) and predicts other settings with the page's own
ceiling model. The screenshot is ``whatif.png`` under ``$PHASEWATCH_ARTIFACTS``.
"""

from __future__ import annotations

import ollama
import pytest
from playwright.sync_api import Page

from store import queries
from store.tables import RequestSummary
from tests.e2e.support import Stack, metric, screenshot, wait_ready, wait_until  # fixtures: tests/e2e/conftest.py

pytestmark = pytest.mark.browser

MODEL = "llama3.1:8b"


def _pick(page: Page, label: str, option: str) -> None:
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first
    box.click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_ready(page)


def _recorded(stack: Stack) -> list[RequestSummary]:
    conn = queries.open_readonly(stack.data_dir)
    try:
        return queries.rate_rows(conn, MODEL, 0.0)
    finally:
        conn.close()


def _fit_text(page: Page) -> str:
    return page.locator('[data-testid="stMarkdownContainer"]').filter(has_text="With these settings").first.inner_text()


def test_what_if_predicts_fit_and_rates_for_other_settings(stack: Stack, page: Page) -> None:
    client = ollama.Client(host=f"http://{stack.proxy}", timeout=120)
    for words in (50, 400):
        prompt = "Summarise: " + " ".join(["the quarterly report was late again"] * words)
        client.generate(model=MODEL, prompt=prompt, options={"num_predict": 40, "num_ctx": 8192})

    wait_until(lambda: len(_recorded(stack)) >= 2, 60, "both requests in the store")
    # Taller than the page: What-if's boxes sit at its foot, and a drop-down opened at the viewport's edge lists
    # no option to click (the page grew past the default 3,400 px with the prior, the window and the waits).
    page.set_viewport_size({"width": 1400, "height": 5200})
    page.goto(stack.app_url + "/why")
    wait_ready(page)
    wait_until(lambda: page.get_by_text("What if", exact=True).count() > 0, 60, "the What if section")
    in_force = wait_until(lambda: page.locator(".st-key-why_in_force").inner_text(), 30, "the settings in force")
    assert "/api/ps (context_length)" in in_force and "8,192" in in_force
    assert "no runner read: Ollama's default assumed" in in_force  # sim's simulated model has no runner process
    start_memory, start_decode = metric(page, "Memory"), metric(page, "Decode, tok/s")
    assert "fits in GPU memory" in _fit_text(page)

    _pick(page, "num_ctx", "131,072")
    page.locator('[data-testid="stNumberInput"]').filter(has_text="num_parallel").locator("input").fill("2")
    page.keyboard.press("Enter")
    wait_ready(page)
    wait_until(lambda: "does not fit" in _fit_text(page), 30, "two 128k contexts not to fit 24 GiB")
    big_memory, big_decode = metric(page, "Memory"), metric(page, "Decode, tok/s")
    assert big_memory != start_memory and big_decode != start_decode  # the spill slows decode

    _pick(page, "KV cache type", "q4_0")
    wait_until(lambda: "fits in GPU memory" in _fit_text(page), 30, "a q4_0 cache to fit again")
    assert metric(page, "Memory") not in (big_memory, start_memory)
    assert page.get_by_text("Changes predicted to help").count() + page.get_by_text("No single change").count() == 1
    screenshot(page, "whatif")
