"""A generation sent to Ollama directly (not through the proxy) on Live and in Requests, in Chromium, on the real
llama-server.

``python -m sim --engine llama-server`` runs llama.cpp's server as a child, as Ollama does (Gemma 3 270M);
``python -m collectors`` finds it as Ollama's runner and reads its ``/slots`` and Ollama's log. A client sends a
~2,000-token prompt to sim itself. The Live page must show its card marked direct with a progress bar read from
the runner (not estimated) that advances, then its token count; its finished card's link opens its record in
Requests, marked direct. Screenshots: ``live_direct_prefill.png``, ``live_direct_finished.png``,
``requests_direct.png`` under ``$PHASEWATCH_ARTIFACTS``. Without the llama-server build or the GGUF it skips, and
fails under ``PHASEWATCH_REQUIRE_ENGINE=1``.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from tests.e2e.engine_stack import engine_stack, generate
from tests.e2e.support import cards_state, quick_shot, screenshot, wait_ready, wait_until
from tests.support.engine_process import words_prompt

pytestmark = [pytest.mark.browser, pytest.mark.engine, pytest.mark.timeout(900)]
__all__ = ["engine_stack"]  # the fixture, shared with the proxied engine test

PROMPT_WORDS = 2000
PREFILL_TIMEOUT_S = 240


def test_a_direct_generation_on_live_then_in_requests(engine_stack: tuple[str, str, Path], page: Page) -> None:
    app_url, _proxy, data_dir = engine_stack
    lock = read_lock(data_dir)
    assert lock is not None
    sim_host = lock.ollama_url.removeprefix("http://").rstrip("/")
    page.goto(app_url)
    wait_ready(page)
    wait_until(lambda: "finished" not in str(cards_state(page)["text"]), 60, "the warm-up's card to go")
    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def send() -> None:
        try:
            generate(sim_host, words_prompt(PROMPT_WORDS, seed=21), 20, out)  # to sim itself: no proxy
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()

    values: list[int] = []
    texts: list[str] = []
    shot = None
    deadline = time.monotonic() + PREFILL_TIMEOUT_S
    text = ""
    while time.monotonic() < deadline and not errors:
        state = cards_state(page)
        text = str(state["text"])
        if "writing the reply (decode)" in text or "finished" in text:
            break
        bars = [int(v) for v in state["bars"]]  # type: ignore[attr-defined]
        if bars and (not values or bars[0] != values[-1]):
            values.append(bars[0])
            texts.append(text)
            if len(values) == 2 and shot is None:
                shot = quick_shot(page, "live_direct_prefill")
        time.sleep(0.2)
    assert not errors, errors
    print(f"\ndirect card's bar values: {values}")
    assert len(values) >= 2 and values == sorted(values), f"the runner's bar must advance: {values}"
    for seen in texts:
        assert seen.startswith("direct") and "reading the prompt (prefill)" in seen, seen
        assert "estimated" not in seen and "prompt tokens read" in seen, seen
        assert "Only the proxy adds the client's own time to first token" in seen, seen

    sender.join(300)
    assert not errors and "final" in out, (errors, out.keys())
    assert out.get("id") is None  # no proxy saw it
    link = page.locator('[class*="st-key-card_direct-"] a', has_text="Details in Requests")
    href = wait_until(lambda: link.count() and link.first.get_attribute("href"), 60, "the direct generation's finished card")
    finished = str(cards_state(page)["text"])
    assert finished.startswith("direct") and "finished" in finished, finished
    quick_shot(page, "live_direct_finished")

    page.goto(href if href.startswith("http") else app_url + "/" + href.lstrip("/"))  # the card's link, as clicked
    wait_ready(page)
    # The detail's line: model · route · kind · where · outcome · where its figures come from (requests.view.seen_from).
    line = page.get_by_text(re.compile(r"· direct · (Ollama's log \(exact\)|/slots readings \(bounded\))"))
    wait_until(lambda: line.count() > 0, 60, "the direct record's detail in Requests")
    detail = line.first.inner_text()
    assert "gemma3:270m" in detail, detail
    assert page.get_by_text("Sent to Ollama directly (not through the proxy)").count() > 0
    screenshot(page, "requests_direct")
