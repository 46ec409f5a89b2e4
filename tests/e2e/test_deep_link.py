"""A page opened by its own URL on a fresh server still runs through app.py (sidebar, navigation)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.e2e.support import run_app, screenshot, wait_ready, wait_until

pytestmark = pytest.mark.browser


def test_deep_link_to_why_on_a_fresh_server_runs_through_app(page: Page, tmp_path: Path) -> None:
    # A new server each time: Streamlit's legacy pages/ mode only applies before app.py's first run.
    with run_app(tmp_path / "data", tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(url + "/why")
        nav = page.locator('[data-testid="stSidebarNav"] a')
        expected = ["Live", "Requests", "Why", "Lab"]

        def labels() -> list[str]:
            return [t.split()[-1] for t in nav.all_inner_texts()]

        # Only app.py's pages, from the first moment: Streamlit used to draw its legacy pages/ list (every helper
        # module, clickable) until app.py's first run handed over to st.navigation; app.py now says so up front.
        seen: set[str] = set()

        def settled() -> bool:
            now = labels()
            seen.update(now)
            return now == expected

        wait_until(settled, 60, "app.py's sidebar navigation")
        assert seen <= set(expected), f"pages/ helper modules offered as pages: {sorted(seen - set(expected))}"
        wait_ready(page)

        assert page.get_by_text("Sources", exact=True).first.is_visible()  # app.py's sidebar ran
        assert page.locator("h1").first.inner_text().strip() == "Why"
        # Streamlit's legacy pages/ mode answered a first deep link with a "Page not found" dialog.
        assert page.get_by_text("Page not found").count() == 0
        screenshot(page, "deep_link_why")


def test_a_collector_that_cannot_start_is_reported_without_a_click(page: Page, tmp_path: Path) -> None:
    # The proxy's port is taken: the collector the app starts exits at once. Requests draws once, so it must be
    # told to look again; the user should read why without touching anything.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with run_app(tmp_path / "data", tmp_path / "app.log", {"PHASEWATCH_LISTEN": busy}) as url:
            page.goto(url + "/requests")
            wait_ready(page)
            wait_until(lambda: page.get_by_text("The collector could not start").count() > 0, 30, "the collector's failure")
            wait_ready(page)
            assert page.get_by_text("address already in use").count() > 0
            screenshot(page, "collector_cannot_start")


def test_live_by_its_name_as_a_first_visit_opens_live_without_page_not_found(page: Page, tmp_path: Path) -> None:
    # Live is the default page, served at the root: /live as a fresh server's first visit said "Page not found"
    # (issue 34 item 2), a bookmark or a link to it must not.
    with run_app(tmp_path / "data", tmp_path / "app.log", {"PHASEWATCH_COLLECTOR": "off"}) as url:
        page.goto(url + "/live")
        wait_until(lambda: page.locator("h1").first.inner_text().strip() == "Live", 60, "the Live page")
        wait_ready(page)
        assert page.get_by_text("Page not found").count() == 0
        assert page.get_by_text("does not seem to exist").count() == 0
        current = page.locator('[data-testid="stSidebarNav"] a[aria-current="page"]')
        assert current.inner_text().split()[-1] == "Live"  # the sidebar says where the user is
        assert [t.split()[-1] for t in page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()] == [
            "Live",
            "Requests",
            "Why",
            "Lab",
        ]
        screenshot(page, "deep_link_live")
