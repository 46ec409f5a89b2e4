"""Commands and addresses are never broken inside a token (issue 42): in Debian's Chromium at 1280 and 1920 px,
every code element on every page, the sidebar's proxy line above all ("127.0.0.1:11 / 435" before), wraps only
at a space, and is not cut off where it cannot be scrolled to. The app runs with its own collector against an
Ollama that does not answer, so the sidebar, the "not answering" panel and its commands are all on screen.
Screenshots: ``tokens-<page>-<width>.png`` under ``$PHASEWATCH_ARTIFACTS``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from analysis.error_notes import CAPABILITY_ADVICE
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.e2e.engine_stack import engine_stack, generate
from tests.e2e.support import Stack, pick_request, post_json, run_app, screenshot, wait_ready, wait_until
from tests.support.engine_process import MODEL, words_prompt
from tests.support.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["engine_stack"]  # the fixture (tests/e2e/engine_stack.py), used by name

WIDTHS_PX = (1280, 1920)
PAGES = ("", "requests", "why", "lab")  # Live is the root

# Each code element's text, and where a line ends between two characters that are not spaces; and whether it
# overflows its box with no way to scroll to the rest. Read from the browser's own layout: a Range per character.
BROKEN_TOKENS_JS = """(sel) => Array.from(document.querySelectorAll(sel)).map(el => {
    const text = el.textContent;
    const breaks = [];
    let prevTop = null, prevChar = null, seen = 0;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (let i = 0; i < node.length; i++, seen++) {
            const r = document.createRange();
            r.setStart(node, i);
            r.setEnd(node, i + 1);
            const rects = r.getClientRects();
            if (!rects.length) continue;
            const top = rects[0].top, ch = node.data[i];
            if (prevTop !== null && top > prevTop + 2 && !/\\s/.test(ch) && !/\\s/.test(prevChar)) {
                breaks.push(text.slice(Math.max(0, seen - 12), seen) + ' / ' + text.slice(seen, seen + 12));
            }
            prevTop = top;
            prevChar = ch;
        }
    }
    const box = el.closest('pre') || el;
    const overflowX = getComputedStyle(box).overflowX;
    const cut = box.scrollWidth > box.clientWidth + 1 && !['auto', 'scroll'].includes(overflowX);
    return {text, breaks, cut, fits: box.scrollWidth <= box.clientWidth + 1};
})"""


def _codes(page: Page, selector: str) -> list[dict[str, object]]:
    return list(page.evaluate(BROKEN_TOKENS_JS, selector))


def test_no_command_or_port_wraps_inside_a_token(browser: Browser, tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    env = {"OLLAMA_HOST": f"127.0.0.1:{free_port()}", "PHASEWATCH_LISTEN": listen}  # nothing answers there
    with run_app(tmp_path / "data", tmp_path / "app.log", env) as url:
        for width in WIDTHS_PX:
            context = browser.new_context(viewport={"width": width, "height": 1400})
            page = context.new_page()
            try:
                for name in PAGES:
                    page.goto(f"{url}/{name}")
                    wait_ready(page)
                    # The collector's first failed poll: the sidebar and the panel both say "not answering".
                    main = page.locator('[data-testid="stMain"]')
                    wait_until(lambda: "Ollama is not answering" in main.inner_text(), 60, "the panel")  # noqa: B023
                    wait_ready(page)
                    proxy = wait_until(
                        lambda: [c for c in _codes(page, '[data-testid="stSidebar"] code') if listen in str(c["text"])],  # noqa: B023
                        30,
                        "the sidebar's proxy line",
                    )
                    assert proxy[0]["fits"] and not proxy[0]["breaks"], (width, name, proxy)  # one whole line, seen
                    for code in _codes(page, "code"):
                        assert not code["breaks"] and not code["cut"], (width, name or "live", code)
                    screenshot(page, f"tokens-{name or 'live'}-{width}")
            finally:
                context.close()


# Each header and cell of a static table: whether its text runs past its cell, or the table past the page.
CELLS_JS = """(sel) => Array.from(document.querySelectorAll(sel)).map(el => {
    const range = document.createRange();
    range.selectNodeContents(el);
    const box = el.getBoundingClientRect(), ink = range.getBoundingClientRect();
    const table = el.closest('table').getBoundingClientRect();
    const main = document.querySelector('[data-testid="stMain"] .block-container').getBoundingClientRect();
    return {text: el.textContent.trim(), overflows: el.scrollWidth > el.clientWidth + 1 || ink.right > box.right + 1,
            tableOut: table.right > main.right + 1};
})"""


def test_the_loaded_models_table_shows_every_header_and_value_whole(browser: Browser, stack: Stack) -> None:
    """The Live page's Loaded models at 1280 and 1920 px: every column's header whole ("quantizati…" was cut by
    st.dataframe's canvas, and so was the placement note), no cell's text past its cell, the table inside the page,
    and no word broken across lines. Screenshots ``loaded-models-<width>.png``."""
    post_json(f"http://{stack.proxy}/api/generate", {"model": "llama3.2", "prompt": "hi", "stream": False})
    for width in WIDTHS_PX:
        context = browser.new_context(viewport={"width": width, "height": 1400})
        page = context.new_page()
        try:
            page.goto(stack.app_url)
            wait_ready(page)
            table = page.locator('[data-testid="stTable"]')
            wait_until(lambda: table.count() > 0 and "llama3.2" in table.first.inner_text(), 60, "the models table")  # noqa: B023
            wait_ready(page)
            cells = page.evaluate(CELLS_JS, '[data-testid="stTable"] th, [data-testid="stTable"] td')
            headers = [c["text"] for c in page.evaluate(CELLS_JS, '[data-testid="stTable"] th')]
            assert {"model", "quantization", "placement from", "unloads in"} <= set(headers), headers
            for cell in cells:
                assert not cell["overflows"] and not cell["tableOut"], (width, cell)
            for cell in _codes(page, '[data-testid="stTable"] th, [data-testid="stTable"] td'):
                assert not cell["breaks"], (width, cell)  # wrapped at spaces only
            table.first.scroll_into_view_if_needed()
            screenshot(page, f"loaded-models-{width}")
        finally:
            context.close()


def _post_image(proxy: str) -> str:
    """A chat with an image for the text-only Gemma GGUF, as Open WebUI sends one; its record's id."""
    message = {"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}
    body = json.dumps({"model": MODEL, "messages": [message], "stream": False}).encode()
    req = urllib.request.Request(f"http://{proxy}/api/chat", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 400
    return str(refused.value.headers[RECORD_ID_HEADER])


@pytest.mark.engine
def test_every_page_with_a_real_runner_keeps_its_tokens_and_table_cells_whole(
    browser: Browser, engine_stack: tuple[str, str, Path]
) -> None:
    """After one generation on the real llama-server (and one refused for an image), every page at 1280 and 1920 px:
    no code element broken inside a token or cut, no static table's cell past its cell or the page; the Requests
    page with the generation picked. Screenshots ``runner-<page>-<width>.png``."""
    url, proxy, _ = engine_stack
    out: dict[str, Any] = {}
    generate(proxy, words_prompt(40, seed=3), 16, out)
    assert "final" in out and out["id"], out
    refused = _post_image(proxy)
    for width in WIDTHS_PX:
        context = browser.new_context(viewport={"width": width, "height": 2400})
        page = context.new_page()
        try:
            for name in PAGES:
                page.goto(f"{url}/{name}")
                wait_ready(page)
                if name == "requests":
                    pick_request(page, str(out["id"]))
                elif name == "why":  # both charts drawn before the checks and the screenshot
                    plots = page.locator('[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg')
                    wait_until(lambda: plots.count() >= 2, 60, "the Why page's charts")  # noqa: B023
                    wait_ready(page)
                elif name == "":
                    table = page.locator('[data-testid="stTable"]')
                    wait_until(lambda: table.count() > 0, 60, "the loaded models")  # noqa: B023
                    wait_ready(page)
                for code in _codes(page, "code"):
                    assert not code["breaks"] and not code["cut"], (width, name or "live", code)
                cells = '[data-testid="stTable"] th, [data-testid="stTable"] td'
                for cell in page.evaluate(CELLS_JS, cells):
                    assert not cell["overflows"] and not cell["tableOut"], (width, name or "live", cell)
                for cell in _codes(page, cells):
                    assert not cell["breaks"], (width, name or "live", cell)
                screenshot(page, f"runner-{name or 'live'}-{width}")
            page.goto(f"{url}/requests")
            wait_ready(page)
            pick_request(page, refused)
            main = page.locator('[data-testid="stMain"]')
            assert CAPABILITY_ADVICE["vision"] in main.inner_text(), main.inner_text()[:3000]
            page.get_by_text(CAPABILITY_ADVICE["vision"][:60]).scroll_into_view_if_needed()
            for code in _codes(page, "code"):
                assert not code["cut"], (width, "requests (vision)", code)
            screenshot(page, f"runner-requests-vision-{width}")
        finally:
            context.close()
