"""Clickjacking (issue 25 #8): a page on another origin frames each dashboard page that has a button, in real
Chromium, and the frame is refused: the dashboard never loads in it, so no button of it can be clicked.

The other origin is a second loopback server reached as ``http://localhost:PORT`` (the dashboard is
``http://127.0.0.1:PORT``): another host and port, as an attacker's site would be.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Frame, Page

from tests.e2e.support import Stack, screenshot

pytestmark = pytest.mark.browser

# The pages with a button: Live and Why (the sidebar's "Leave demo"), Requests (CSV download), Lab (Run experiment).
FRAMED_PATHS = ["/live", "/requests", "/why", "/lab"]
FRAME_VERDICT_TIMEOUT_S = 45.0  # a loaded dashboard shows its buttons well within this on a busy 2-core box
CHROME_ERROR_URL = "chrome-error://chromewebdata/"


class _Framer(BaseHTTPRequestHandler):
    """The attacker's page: ``/?target=URL`` shows URL in a half-transparent frame."""

    def do_GET(self) -> None:
        target = parse_qs(urlsplit(self.path).query).get("target", [""])[0]
        frame = f'<iframe id="victim" src="{target}" width="1300" height="800" style="opacity:0.6"></iframe>'
        body = f"<!doctype html><title>elsewhere</title><p>Another site, framing {target}:</p>{frame}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def other_origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Framer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _victim(page: Page) -> Frame | None:
    return next((f for f in page.frames if f.parent_frame is page.main_frame), None)


def _frame_verdict(page: Page) -> tuple[str, list[str]]:
    """("refused", []) once Chromium replaced the frame with its error page; ("loaded", the buttons' texts) once the
    dashboard shows a button inside it."""
    deadline = time.monotonic() + FRAME_VERDICT_TIMEOUT_S
    while time.monotonic() < deadline:
        frame = _victim(page)
        if frame is not None:
            if frame.url == CHROME_ERROR_URL:
                return "refused", []
            buttons = frame.locator('[data-testid="stApp"] button:visible')
            try:
                if buttons.count() > 0:
                    return "loaded", buttons.evaluate_all(
                        "els => els.map(e => e.innerText.trim() || e.getAttribute('aria-label') || e.dataset.testid)"
                    )
            except Exception:  # the frame navigated away (to the error page) between the two looks
                pass
        page.wait_for_timeout(200)
    raise AssertionError(f"the frame neither loaded nor was refused in {FRAME_VERDICT_TIMEOUT_S:.0f} s")


@pytest.mark.parametrize("path", FRAMED_PATHS)
def test_another_origin_cannot_frame_a_page_with_a_button(stack: Stack, page: Page, other_origin: str, path: str) -> None:
    target = f"{stack.app_url}{path}"
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    with page.expect_response(lambda r: r.url == target) as answer:
        page.goto(f"{other_origin}/?target={target}")
    verdict, buttons = _frame_verdict(page)
    assert verdict == "refused", f"{path} loaded inside another origin's frame; reachable buttons: {buttons}"
    headers = answer.value.all_headers()
    assert headers.get("x-frame-options") == "DENY" and headers.get("content-security-policy") == "frame-ancestors 'none'"
    # Nothing of the dashboard ran in the frame: no Streamlit app, no WebSocket to it.
    frame = _victim(page)
    assert frame is not None and frame.locator('[data-testid="stApp"]').count() == 0
    assert sockets == []
    screenshot(page, f"clickjacking_refused{path.replace('/', '_')}")
