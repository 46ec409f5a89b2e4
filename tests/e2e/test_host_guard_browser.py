"""DNS rebinding in a real browser: Chromium resolves ``evil.example`` to 127.0.0.1 (``--host-resolver-rules``),
as a rebinding attacker's DNS would; the dashboard refuses the page and its WebSocket, and still serves 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser

from tests.e2e.support import CHROMIUM, CHROMIUM_ARGS, run_app, screenshot, wait_ready

pytestmark = pytest.mark.browser

REBIND_ARGS = [*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.example 127.0.0.1"]

# Open a WebSocket to Streamlit's stream endpoint; "open" or "refused" (closed before it opened).
WS_PROBE = """url => new Promise(resolve => {
    const ws = new WebSocket(url, ["streamlit"]);
    ws.onopen = () => { ws.close(); resolve("open"); };
    ws.onclose = () => resolve("refused");
})"""


def test_rebinding_name_is_refused_while_loopback_works(browser: Browser, tmp_path: Path) -> None:
    with run_app(tmp_path / "data", tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        port = urlsplit(url).port
        rebinding = browser.browser_type.launch(executable_path=CHROMIUM, args=REBIND_ARGS)
        try:
            page = rebinding.new_context(viewport={"width": 1400, "height": 900}).new_page()
            for path in ("/", "/lab"):
                resp = page.goto(f"http://evil.example:{port}{path}")
                # The name reached this app (the refusal is its own text) and was refused.
                assert resp is not None and resp.status == 403, path
                assert f"Host 'evil.example:{port}' is not allowed" in page.inner_text("body")
                assert page.locator('[data-testid="stApp"]').count() == 0
            screenshot(page, "host_guard_rebinding_refused")

            page.goto(f"{url}/lab")
            wait_ready(page)
            assert page.locator("h1").first.inner_text().strip() == "Lab"
            screenshot(page, "host_guard_loopback_lab")
            assert page.evaluate(WS_PROBE, f"ws://127.0.0.1:{port}/_stcore/stream") == "open"
            assert page.evaluate(WS_PROBE, f"ws://evil.example:{port}/_stcore/stream") == "refused"
        finally:
            rebinding.close()
