"""Nothing leaves the machine: while every page loads, the browser asks no host but 127.0.0.1.

Watched through Playwright's request and websocket events (every request the page makes, its
icon, fonts, scripts and Streamlit's own calls included), and the page icon's address read
from the document.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser

from tests.e2e.support import Stack, screenshot, wait_ready, wait_until

pytestmark = pytest.mark.browser

PAGES = ("Requests", "Why", "Lab", "Live")  # the app opens on Live
LOCAL_SCHEMES = {"data", "blob", "about"}


def foreign(urls: list[str]) -> list[str]:
    """The URLs that would reach another host than 127.0.0.1."""
    out = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in LOCAL_SCHEMES:
            continue
        if parts.hostname != "127.0.0.1":
            out.append(url)
    return out


def test_pages_ask_no_host_but_loopback(stack: Stack, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 2000})
    urls: list[str] = []
    context.on("request", lambda req: urls.append(req.url))
    page = context.new_page()
    page.on("websocket", lambda ws: urls.append(ws.url))
    try:
        page.goto(stack.app_url)
        wait_ready(page)
        for title in PAGES:  # through the sidebar, as a user clicks
            # A click from inside the page: Live redraws every second, which Playwright's stability wait can miss.
            page.locator('[data-testid="stSidebarNav"] a', has_text=title).evaluate("a => a.click()")
            wait_until(lambda: page.locator("h1").first.inner_text().strip() == title, 60, f"the {title} page")  # noqa: B023
            wait_ready(page)
            page.wait_for_timeout(1500)  # charts draw, fragments refresh, lazy chunks load
        for path in ("requests", "why", "lab"):  # and by their own URLs
            page.goto(f"{stack.app_url}/{path}")
            wait_ready(page)
            page.wait_for_timeout(1500)
        icons = page.evaluate("() => Array.from(document.querySelectorAll('link[rel~=\"icon\"]')).map(l => l.href)")
        screenshot(page, "no-external-requests-lab")
    finally:
        context.close()
    assert icons and not foreign(icons), icons  # the page icon is drawn inline, not fetched from a font CDN
    assert any(urlsplit(u).path.startswith("/_stcore/stream") for u in urls)  # the watch saw the app's own traffic
    assert len(urls) > 20
    assert foreign(urls) == [], foreign(urls)
